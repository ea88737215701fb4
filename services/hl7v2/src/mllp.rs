//! MLLP framing (`0x0B` payload `0x1C 0x0D`) as a `tokio_util` codec.
//!
//! Several frames in one read and a frame split over many reads decode the same; bytes before a start block
//! are skipped and counted; a frame longer than the limit is refused as soon as the limit is passed, without
//! buffering past it. After an error the decoder has resynchronised (it skips to the next end block), so a
//! caller that drives `decode` itself may go on reading; `FramedRead` ends the stream at the first error.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Start block.
pub const SB: u8 = 0x0B;
/// End block.
pub const EB: u8 = 0x1C;
/// Carriage return that follows the end block.
pub const CR: u8 = 0x0D;

/// Default maximum payload size: 1 MiB.
pub const DEFAULT_MAX_FRAME: usize = 1024 * 1024;

/// Framing violations (and I/O errors, which `tokio_util` routes through the decoder's error type).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MllpError {
    /// The payload passed the configured maximum; the rest of the frame is discarded.
    #[error("MLLP frame larger than the {limit}-byte limit")]
    FrameTooLarge { limit: usize },
    /// A start block arrived inside a frame; the partial frame is dropped and a new one begins.
    #[error("MLLP start block inside a frame after {discarded} bytes")]
    StartBlockInFrame { discarded: usize },
    /// The end block was followed by something other than CR.
    #[error("MLLP end block not followed by CR")]
    MissingCarriageReturn,
    /// The connection ended inside a frame.
    #[error("connection closed inside an MLLP frame ({buffered} bytes buffered)")]
    Truncated { buffered: usize },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl MllpError {
    /// A short, bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::FrameTooLarge { .. } => "frame_too_large",
            Self::StartBlockInFrame { .. } => "start_block_in_frame",
            Self::MissingCarriageReturn => "missing_cr",
            Self::Truncated { .. } => "truncated",
            Self::Io(_) => "io",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Looking for a start block.
    Idle,
    /// Inside a frame; `scanned` payload bytes already searched for the end block.
    InFrame { scanned: usize },
    /// Dropping an oversized frame up to its end block.
    Discarding,
}

/// The MLLP codec. Decodes payloads as `BytesMut` split from the read buffer (no copy); encodes any `AsRef<[u8]>`.
#[derive(Debug, Clone)]
pub struct MllpCodec {
    max_frame: usize,
    state: State,
    skipped: u64,
    /// The payload of the last frame refused for its framing (end block not followed by CR).
    rejected: Option<BytesMut>,
}

impl Default for MllpCodec {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME)
    }
}

impl MllpCodec {
    /// A codec refusing payloads longer than `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame,
            state: State::Idle,
            skipped: 0,
            rejected: None,
        }
    }

    /// The payload of the frame the last [`MllpError::MissingCarriageReturn`] refused: whole, so the
    /// receiver can record it (the ingress puts it in the DLQ) instead of losing it silently.
    pub fn take_rejected(&mut self) -> Option<BytesMut> {
        self.rejected.take()
    }

    /// Bytes skipped outside frames so far (before start blocks, and of discarded frames).
    pub fn skipped_bytes(&self) -> u64 {
        self.skipped
    }

    /// True when no partial frame is pending.
    pub fn is_idle(&self) -> bool {
        self.state == State::Idle
    }

    /// The configured maximum payload size.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }
}

impl Decoder for MllpCodec {
    type Item = BytesMut;
    type Error = MllpError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, MllpError> {
        loop {
            match self.state {
                State::Idle => match memchr::memchr(SB, buf) {
                    Some(i) => {
                        self.skipped += i as u64;
                        buf.advance(i + 1);
                        self.state = State::InFrame { scanned: 0 };
                    }
                    None => {
                        self.skipped += buf.len() as u64;
                        buf.clear();
                        return Ok(None);
                    }
                },
                State::Discarding => match memchr::memchr(EB, buf) {
                    Some(i) if i + 1 < buf.len() => {
                        self.skipped += (i + 1) as u64;
                        buf.advance(i + 1);
                        if buf[0] == CR {
                            buf.advance(1);
                            self.skipped += 1;
                            self.state = State::Idle;
                        }
                    }
                    Some(i) => {
                        // Keep the end block until we see what follows it.
                        self.skipped += i as u64;
                        buf.advance(i);
                        return Ok(None);
                    }
                    None => {
                        self.skipped += buf.len() as u64;
                        buf.clear();
                        return Ok(None);
                    }
                },
                State::InFrame { scanned } => {
                    let window = &buf[scanned..];
                    match memchr::memchr2(EB, SB, window) {
                        Some(j) if window[j] == SB => {
                            let discarded = scanned + j;
                            self.skipped += discarded as u64;
                            buf.advance(discarded + 1);
                            self.state = State::InFrame { scanned: 0 };
                            return Err(MllpError::StartBlockInFrame { discarded });
                        }
                        Some(j) => {
                            let end = scanned + j;
                            if end > self.max_frame {
                                return Err(self.too_large(buf, end));
                            }
                            if end + 1 >= buf.len() {
                                // End block seen; wait for the byte after it.
                                self.state = State::InFrame { scanned: end };
                                return Ok(None);
                            }
                            if buf[end + 1] != CR {
                                self.rejected = Some(buf.split_to(end));
                                buf.advance(1);
                                self.state = State::Idle;
                                return Err(MllpError::MissingCarriageReturn);
                            }
                            let frame = buf.split_to(end);
                            buf.advance(2);
                            self.state = State::Idle;
                            return Ok(Some(frame));
                        }
                        None => {
                            if buf.len() > self.max_frame {
                                let all = buf.len();
                                return Err(self.too_large(buf, all));
                            }
                            self.state = State::InFrame { scanned: buf.len() };
                            buf.reserve(4096.min(self.max_frame + 2 - buf.len()));
                            return Ok(None);
                        }
                    }
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, MllpError> {
        match self.decode(buf)? {
            Some(frame) => Ok(Some(frame)),
            None => match self.state {
                State::InFrame { .. } => {
                    let buffered = buf.len();
                    buf.clear();
                    self.state = State::Idle;
                    Err(MllpError::Truncated { buffered })
                }
                _ => {
                    buf.clear();
                    Ok(None)
                }
            },
        }
    }
}

impl MllpCodec {
    /// Drops the first `upto` bytes of an oversized frame and discards the rest of it as it arrives.
    fn too_large(&mut self, buf: &mut BytesMut, upto: usize) -> MllpError {
        self.skipped += upto as u64;
        buf.advance(upto);
        self.state = State::Discarding;
        MllpError::FrameTooLarge {
            limit: self.max_frame,
        }
    }
}

impl<T: AsRef<[u8]>> Encoder<T> for MllpCodec {
    type Error = MllpError;

    fn encode(&mut self, item: T, dst: &mut BytesMut) -> Result<(), MllpError> {
        let payload = item.as_ref();
        dst.reserve(payload.len() + 3);
        dst.put_u8(SB);
        dst.put_slice(payload);
        dst.put_slice(&[EB, CR]);
        Ok(())
    }
}

/// Wraps a payload in an MLLP frame.
pub fn frame(payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(payload.len() + 3);
    b.put_u8(SB);
    b.put_slice(payload);
    b.put_slice(&[EB, CR]);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut MllpCodec, input: &[u8]) -> Vec<Result<Vec<u8>, String>> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(f)) => out.push(Ok(f.to_vec())),
                Ok(None) => break,
                Err(e) => out.push(Err(e.kind().to_owned())),
            }
        }
        out
    }

    #[test]
    fn several_frames_in_one_read_and_garbage_skipped() {
        let mut c = MllpCodec::default();
        let input = b"noise\x0bA\x1c\x0d\r\n\x0bB\x1c\x0d";
        let got = decode_all(&mut c, input);
        assert_eq!(got, [Ok(b"A".to_vec()), Ok(b"B".to_vec())]);
        assert_eq!(c.skipped_bytes(), 7);
    }

    #[test]
    fn frame_split_byte_by_byte() {
        let mut c = MllpCodec::default();
        let input = b"\x0bMSH|x\x1c\x0d\x0bsecond\x1c\x0d";
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for &b in input.iter() {
            buf.put_u8(b);
            while let Some(f) = c.decode(&mut buf).unwrap() {
                got.push(f.to_vec());
            }
        }
        assert_eq!(got, [b"MSH|x".to_vec(), b"second".to_vec()]);
    }

    #[test]
    fn oversize_refused_without_buffering_then_resyncs() {
        let mut c = MllpCodec::new(8);
        let mut buf = BytesMut::from(&b"\x0b0123456789"[..]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(MllpError::FrameTooLarge { limit: 8 })
        ));
        assert!(buf.is_empty());
        // More of the oversized frame, then a good one.
        buf.extend_from_slice(b"more bytes\x1c\x0d\x0bok\x1c\x0d");
        assert_eq!(c.decode(&mut buf).unwrap().unwrap(), &b"ok"[..]);
        // An end block found past the limit is refused too.
        let got = decode_all(&mut MllpCodec::new(3), b"\x0babcdef\x1c\x0d\x0bxy\x1c\x0d");
        assert_eq!(got, [Err("frame_too_large".into()), Ok(b"xy".to_vec())]);
    }

    #[test]
    fn violations() {
        let got = decode_all(&mut MllpCodec::default(), b"\x0bAB\x0bCD\x1c\x0d");
        assert_eq!(
            got,
            [Err("start_block_in_frame".into()), Ok(b"CD".to_vec())]
        );
        let got = decode_all(&mut MllpCodec::default(), b"\x0bAB\x1cX\x0bCD\x1c\x0d");
        assert_eq!(got, [Err("missing_cr".into()), Ok(b"CD".to_vec())]);
        // The refused frame's payload is kept whole for the caller to record.
        let mut c = MllpCodec::default();
        let mut buf = BytesMut::from(&b"\x0bMSH|AB\x1cX"[..]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(MllpError::MissingCarriageReturn)
        ));
        assert_eq!(c.take_rejected().unwrap(), &b"MSH|AB"[..]);
        assert_eq!(c.take_rejected(), None);
        let mut c = MllpCodec::default();
        let mut buf = BytesMut::from(&b"\x0bpartial"[..]);
        assert!(c.decode(&mut buf).unwrap().is_none());
        assert!(matches!(
            c.decode_eof(&mut buf),
            Err(MllpError::Truncated { buffered: 7 })
        ));
    }

    #[test]
    fn encode_round_trips() {
        let mut c = MllpCodec::default();
        let mut buf = BytesMut::new();
        c.encode(&b"MSH|^~\\&"[..], &mut buf).unwrap();
        assert_eq!(&buf[..], &frame(b"MSH|^~\\&")[..]);
        assert_eq!(c.decode(&mut buf).unwrap().unwrap(), &b"MSH|^~\\&"[..]);
    }
}
