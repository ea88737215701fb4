//! The floor the harness is compared with: N tokio clients, each sending the same framed ADT^A01 and reading
//! one MLLP frame back, with no message building, no ACK parsing, no timer, no histogram. What `hl7gw-load`
//! adds on top of this is its overhead.
//!
//! ```text
//! cargo run --release -p hl7gw-load --example bare_client -- HOST:PORT CLIENTS MESSAGES_PER_CLIENT
//! ```

use bytes::BytesMut;
use hl7gw_load::messages::{Fixture, MessageId, MessageSet};
use hl7v2::MllpCodec;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bare_client HOST:PORT CLIENTS MESSAGES_PER_CLIENT";
    let to = args.next().ok_or_else(|| anyhow::anyhow!(usage))?;
    let clients: u32 = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let per_client: u64 = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let mut frame = Vec::new();
    MessageSet::fixture(Fixture::Adt, false)
        .pick(0)
        .write_frame(
            &mut frame,
            MessageId {
                run: b"BARE",
                client: 0,
                seq: 0,
                warmup: false,
            },
        );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let mut conns = Vec::new();
        for _ in 0..clients {
            let s = TcpStream::connect(&to).await?;
            s.set_nodelay(true)?;
            conns.push(s);
        }
        let start = Instant::now();
        let tasks: Vec<_> = conns
            .into_iter()
            .map(|mut s| {
                let frame = frame.clone();
                tokio::spawn(async move {
                    let mut codec = MllpCodec::default();
                    let mut rbuf = BytesMut::with_capacity(8192);
                    for _ in 0..per_client {
                        s.write_all(&frame).await?;
                        while codec.decode(&mut rbuf)?.is_none() {
                            rbuf.reserve(4096);
                            if s.read_buf(&mut rbuf).await? == 0 {
                                anyhow::bail!("connection closed");
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for t in tasks {
            t.await??;
        }
        let secs = start.elapsed().as_secs_f64();
        let n = u64::from(clients) * per_client;
        println!(
            "{clients} x {per_client}: {n} in {secs:.3} s = {:.0} msg/s",
            n as f64 / secs
        );
        Ok(())
    })
}
