//! Fuzz the MLLP decoder: arbitrary bytes fed in arbitrary chunks never panic, never yield a frame over the
//! limit, and never buffer past it.
#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else { return };
    let max = usize::from(cfg) * 4;
    let chunk = usize::from(cfg % 13) + 1;
    let mut codec = hl7v2::MllpCodec::new(max);
    let mut buf = BytesMut::new();
    for piece in rest.chunks(chunk) {
        buf.put_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => assert!(frame.len() <= max),
                Ok(None) => break,
                Err(_) => {}
            }
        }
        assert!(buf.len() <= max + 2);
    }
    let _ = codec.decode_eof(&mut buf);
});
