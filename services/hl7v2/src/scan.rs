//! Byte-level scanning that the message parser, the header reader, batches and ACKs share: where a message
//! starts, its delimiters from MSH-1/MSH-2, the n-th piece of a value. Depends on nothing but the delimiters
//! and the error type, so `message` and `header` both build on it without needing each other.

use crate::{Delimiters, ParseError};
use memchr::{memchr, memchr_iter, memchr2};

/// Where the message starts: after a UTF-8 BOM, then leading space, tab, CR and LF.
pub(crate) fn body_start(input: &[u8]) -> usize {
    let mut i = if input.starts_with(b"\xEF\xBB\xBF") {
        3
    } else {
        0
    };
    while i < input.len() && matches!(input[i], b' ' | b'\t' | b'\r' | b'\n') {
        i += 1;
    }
    i
}

/// Reads MSH-1 and MSH-2 of a header segment starting at `start`.
pub(crate) fn read_delimiters(input: &[u8], start: usize) -> Result<Delimiters, ParseError> {
    let b = &input[start..];
    let fs = match b.get(3) {
        Some(&c) if c != b'\r' && c != b'\n' => c,
        _ => return Err(ParseError::MissingFieldSeparator { offset: start + 3 }),
    };
    let line = memchr2(b'\r', b'\n', b).unwrap_or(b.len());
    let enc_end = memchr(fs, &b[4..line]).map_or(line, |i| 4 + i);
    Delimiters::from_msh(fs, &b[4..enc_end])
        .ok_or(ParseError::BadEncodingCharacters { offset: start + 4 })
}

/// The `n`-th (1-based) piece of `raw` split on `sep`.
#[inline]
pub(crate) fn nth(raw: &[u8], sep: u8, n: usize) -> Option<&[u8]> {
    let mut start = 0;
    let mut idx = 1;
    for pos in memchr_iter(sep, raw) {
        if idx == n {
            return Some(&raw[start..pos]);
        }
        idx += 1;
        start = pos + 1;
    }
    (idx == n).then(|| &raw[start..])
}
