//! A bare MLLP receiver for measuring the harness's own overhead: it answers every frame with a fixed AA
//! without parsing the message (MSA-2 echoes MSH-10, found by counting field separators, so the harness's
//! control-id check passes). Binds 127.0.0.1 only; runs until killed. With an IDS file it is also the
//! pipeline bench's receiver: every MSH-10 it answers is appended to that file, one per line (buffered, flushed
//! every 100 ms), so what reached it can be checked at next to no cost per message.
//!
//! ```text
//! cargo run --release -p hl7gw-load --example fixed_ack_server -- [PORT (0 = any)] [WORKER THREADS (2)] [IDS]
//! ```

use bytes::BytesMut;
use hl7v2::MllpCodec;
use hl7v2::mllp::{CR, EB, SB};
use std::io::Write;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Decoder;

/// Where the answered control ids go (none: not recorded).
type Ids = Option<Arc<Mutex<std::io::BufWriter<std::fs::File>>>>;

const ACK_HEAD: &[u8] = b"MSH|^~\\&|FIXED|ACK|LOADGEN|LOADFAC|20260101000000||ACK|1|P|2.5\rMSA|AA|";

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().map_or(Ok(0), |p| p.parse())?;
    let threads: usize = args.next().map_or(Ok(2), |t| t.parse())?;
    let ids: Ids = match args.next() {
        Some(path) => Some(Arc::new(Mutex::new(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        )))),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        println!("fixed-ack server listening on {}", listener.local_addr()?);
        if let Some(ids) = ids.clone() {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    let _ = ids.lock().map(|mut f| f.flush());
                }
            });
        }
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            tokio::spawn(serve(stream, ids.clone()));
        }
    })
}

async fn serve(mut stream: TcpStream, ids: Ids) {
    let mut codec = MllpCodec::default();
    let mut rbuf = BytesMut::with_capacity(16 * 1024);
    let mut wbuf = Vec::with_capacity(4 * 1024);
    let mut seen = Vec::with_capacity(1024);
    loop {
        match stream.read_buf(&mut rbuf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        wbuf.clear();
        seen.clear();
        loop {
            match codec.decode(&mut rbuf) {
                Ok(Some(frame)) => {
                    let id = msh10(&frame);
                    wbuf.push(SB);
                    wbuf.extend_from_slice(ACK_HEAD);
                    wbuf.extend_from_slice(id);
                    wbuf.extend_from_slice(&[CR, EB, CR]);
                    if ids.is_some() {
                        seen.extend_from_slice(id);
                        seen.push(b'\n');
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        // Recorded before the ACK is written: what was ACKed is in the file.
        if let Some(f) = &ids
            && !seen.is_empty()
            && !matches!(f.lock().map(|mut f| f.write_all(&seen)), Ok(Ok(())))
        {
            return;
        }
        if !wbuf.is_empty() && stream.write_all(&wbuf).await.is_err() {
            return;
        }
    }
}

/// MSH-10: after the 9th field separator of the first segment, up to the next separator or segment end.
fn msh10(msg: &[u8]) -> &[u8] {
    let Some(&fs) = msg.get(3) else {
        return b"";
    };
    let mut seps = 0;
    let mut start = None;
    for (i, &b) in msg.iter().enumerate() {
        if b == b'\r' || b == b'\n' {
            return start.map_or(&b""[..], |s| &msg[s..i]);
        }
        if b == fs {
            seps += 1;
            if seps == 9 {
                start = Some(i + 1);
            } else if seps == 10 {
                return start.map_or(&b""[..], |s| &msg[s..i]);
            }
        }
    }
    start.map_or(&b""[..], |s| &msg[s..])
}
