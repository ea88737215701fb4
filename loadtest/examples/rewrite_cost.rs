//! What giving every message its own MSH-10 costs: the harness's byte splice (`Template::write_frame`, what
//! the clients do) against parse + `Edit::set("MSH-10")` + encode with the `hl7v2` crate.
//!
//! ```text
//! cargo run --release -p hl7gw-load --example rewrite_cost
//! ```

use hl7gw_load::ids::{new_run_id, push_control_id};
use hl7gw_load::messages::{Fixture, MessageId, MessageSet};
use hl7v2::Message;
use std::hint::black_box;
use std::time::Instant;

const N: u64 = 1_000_000;

fn main() -> anyhow::Result<()> {
    let run = new_run_id();
    let run = run.as_bytes();
    for (name, fixture) in [("ADT^A01", Fixture::Adt), ("ORU^R01", Fixture::Oru)] {
        let set = MessageSet::fixture(fixture, false);
        let template = set.pick(0);
        let mut buf = Vec::with_capacity(4096);

        let t = Instant::now();
        for seq in 0..N {
            buf.clear();
            black_box(template.write_frame(&mut buf, id(run, seq)));
            black_box(&buf);
        }
        let splice = t.elapsed().as_nanos() as f64 / N as f64;
        let size = buf.len() - 3;

        let mut original = Vec::new();
        template.write_payload(&mut original, id(run, 0));
        let mut cid = Vec::with_capacity(32);
        let t = Instant::now();
        for seq in 0..N {
            cid.clear();
            push_control_id(&mut cid, run, 3, seq, false);
            let msg = Message::parse(black_box(&original))?;
            let mut edit = msg.edit();
            edit.set("MSH-10", &cid)?;
            buf.clear();
            edit.encode_into(&mut buf);
            black_box(&buf);
        }
        let edit = t.elapsed().as_nanos() as f64 / N as f64;
        println!(
            "{name} ({size} bytes): splice {splice:.0} ns/message, parse+Edit::set+encode {edit:.0} ns/message"
        );
    }
    Ok(())
}

/// Message `seq` of client 3 in `run`.
fn id(run: &[u8], seq: u64) -> MessageId<'_> {
    MessageId {
        run,
        client: 3,
        seq,
        warmup: false,
    }
}
