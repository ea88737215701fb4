//! hl7gw-load: the MLLP load harness (being written).

fn main() -> anyhow::Result<()> {
    anyhow::bail!("hl7gw-load is not implemented yet")
}
