//! Text decoding by MSH-18 (HL7 table 0211), with a configurable fallback for unlabelled messages.
//!
//! The parser never decodes: values are bytes. Decode only where text is needed (display, JSON output).

use encoding_rs::Encoding;
use std::borrow::Cow;

/// A character set of HL7 table 0211 that can be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Charset {
    /// `ASCII`, `ISO IR6`: 7-bit only.
    Ascii,
    /// `8859/1`: every byte is the code point of the same value.
    Latin1,
    /// `UNICODE UTF-8`, and the deprecated `UNICODE`, which senders use for UTF-8 in practice.
    Utf8,
    /// `UNICODE UTF-16` (byte order from a BOM, big-endian without one).
    Utf16,
    /// `UNICODE UTF-32` (byte order from a BOM, big-endian without one).
    Utf32,
    /// The other table 0211 values, through `encoding_rs`.
    Other(&'static Encoding),
}

/// Why text could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CharsetError {
    /// MSH-18 names a character set this build does not know or cannot decode.
    #[error("unsupported character set in MSH-18")]
    Unsupported,
    /// The bytes are not valid in the declared character set.
    #[error("bytes not valid in {0}")]
    Malformed(&'static str),
}

impl CharsetError {
    /// A short, bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unsupported => "unsupported_charset",
            Self::Malformed(_) => "malformed_text",
        }
    }
}

impl Charset {
    /// Reads an MSH-18 value (table 0211). Unknown values give `Unsupported`.
    pub fn from_msh18(label: &[u8]) -> Result<Self, CharsetError> {
        let label = trim(label);
        let upper: Vec<u8> = label.to_ascii_uppercase();
        Ok(match upper.as_slice() {
            b"ASCII" | b"ISO IR6" => Self::Ascii,
            b"8859/1" | b"ISO IR100" => Self::Latin1,
            b"UNICODE UTF-8" | b"UNICODE" | b"UTF-8" => Self::Utf8,
            b"UNICODE UTF-16" => Self::Utf16,
            b"UNICODE UTF-32" => Self::Utf32,
            b"8859/2" => Self::Other(encoding_rs::ISO_8859_2),
            b"8859/3" => Self::Other(encoding_rs::ISO_8859_3),
            b"8859/4" => Self::Other(encoding_rs::ISO_8859_4),
            b"8859/5" => Self::Other(encoding_rs::ISO_8859_5),
            b"8859/6" => Self::Other(encoding_rs::ISO_8859_6),
            b"8859/7" => Self::Other(encoding_rs::ISO_8859_7),
            b"8859/8" => Self::Other(encoding_rs::ISO_8859_8),
            // encoding_rs decodes ISO-8859-9 as its superset windows-1254.
            b"8859/9" => Self::Other(encoding_rs::WINDOWS_1254),
            b"8859/15" => Self::Other(encoding_rs::ISO_8859_15),
            b"ISO IR14" => Self::Other(encoding_rs::SHIFT_JIS),
            b"ISO IR87" => Self::Other(encoding_rs::ISO_2022_JP),
            b"GB 18030-2000" => Self::Other(encoding_rs::GB18030),
            b"KS X 1001" => Self::Other(encoding_rs::EUC_KR),
            b"BIG-5" => Self::Other(encoding_rs::BIG5),
            _ => return Err(CharsetError::Unsupported),
        })
    }

    /// The name used in errors and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ascii => "ASCII",
            Self::Latin1 => "ISO-8859-1",
            Self::Utf8 => "UTF-8",
            Self::Utf16 => "UTF-16",
            Self::Utf32 => "UTF-32",
            Self::Other(e) => e.name(),
        }
    }

    /// Decodes strictly: invalid bytes are an error. Borrows when the bytes are already valid UTF-8 text of
    /// the same meaning.
    pub fn decode(self, bytes: &[u8]) -> Result<Cow<'_, str>, CharsetError> {
        let bad = || CharsetError::Malformed(self.name());
        match self {
            Self::Ascii => {
                if bytes.is_ascii() {
                    std::str::from_utf8(bytes)
                        .map(Cow::Borrowed)
                        .map_err(|_| bad())
                } else {
                    Err(bad())
                }
            }
            Self::Latin1 => Ok(latin1(bytes)),
            Self::Utf8 => std::str::from_utf8(bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes))
                .map(Cow::Borrowed)
                .map_err(|_| bad()),
            Self::Utf16 => {
                let (enc, body) = match bytes {
                    [0xFF, 0xFE, rest @ ..] => (encoding_rs::UTF_16LE, rest),
                    [0xFE, 0xFF, rest @ ..] => (encoding_rs::UTF_16BE, rest),
                    _ => (encoding_rs::UTF_16BE, bytes),
                };
                enc.decode_without_bom_handling_and_without_replacement(body)
                    .map(|c| Cow::Owned(c.into_owned()))
                    .ok_or_else(bad)
            }
            Self::Utf32 => utf32(bytes).map(Cow::Owned).ok_or_else(bad),
            Self::Other(e) => e
                .decode_without_bom_handling_and_without_replacement(bytes)
                .ok_or_else(bad),
        }
    }
}

/// Decodes message text by MSH-18, using `fallback` when MSH-18 is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextDecoder {
    /// What an unlabelled message is read as.
    pub fallback: Charset,
}

impl Default for TextDecoder {
    /// Unlabelled input is read as UTF-8 (ASCII is a subset of it).
    fn default() -> Self {
        Self {
            fallback: Charset::Utf8,
        }
    }
}

impl TextDecoder {
    /// The character set for an MSH-18 value.
    pub fn charset(&self, msh18: &[u8]) -> Result<Charset, CharsetError> {
        if trim(msh18).is_empty() {
            Ok(self.fallback)
        } else {
            Charset::from_msh18(msh18)
        }
    }

    /// Decodes `bytes` of a message whose MSH-18 is `msh18`.
    pub fn decode<'b>(&self, msh18: &[u8], bytes: &'b [u8]) -> Result<Cow<'b, str>, CharsetError> {
        self.charset(msh18)?.decode(bytes)
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

fn latin1(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) if bytes.is_ascii() => Cow::Borrowed(s),
        _ => Cow::Owned(bytes.iter().map(|&b| char::from(b)).collect()),
    }
}

fn utf32(bytes: &[u8]) -> Option<String> {
    let (le, body) = match bytes {
        [0xFF, 0xFE, 0, 0, rest @ ..] => (true, rest),
        [0, 0, 0xFE, 0xFF, rest @ ..] => (false, rest),
        _ => (false, bytes),
    };
    if body.len() % 4 != 0 {
        return None;
    }
    body.chunks_exact(4)
        .map(|c| {
            let a = [c[0], c[1], c[2], c[3]];
            char::from_u32(if le {
                u32::from_le_bytes(a)
            } else {
                u32::from_be_bytes(a)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_0211_values() {
        assert_eq!(Charset::from_msh18(b"8859/1").unwrap(), Charset::Latin1);
        assert_eq!(
            Charset::from_msh18(b"UNICODE UTF-8").unwrap(),
            Charset::Utf8
        );
        assert_eq!(Charset::from_msh18(b" ascii ").unwrap(), Charset::Ascii);
        for v in [
            "8859/2",
            "8859/5",
            "8859/7",
            "8859/9",
            "8859/15",
            "GB 18030-2000",
            "KS X 1001",
            "BIG-5",
            "ISO IR87",
        ] {
            assert!(Charset::from_msh18(v.as_bytes()).is_ok(), "{v}");
        }
        assert_eq!(
            Charset::from_msh18(b"KLINGON"),
            Err(CharsetError::Unsupported)
        );
        assert_eq!(
            Charset::from_msh18(b"CNS 11643-1992"),
            Err(CharsetError::Unsupported)
        );
    }

    #[test]
    fn decodes_each_family() {
        assert_eq!(Charset::Latin1.decode(b"Caf\xe9").unwrap(), "Café");
        assert_eq!(Charset::Utf8.decode("Café".as_bytes()).unwrap(), "Café");
        assert!(matches!(
            Charset::Utf8.decode(b"ok"),
            Ok(Cow::Borrowed("ok"))
        ));
        assert!(Charset::Utf8.decode(b"Caf\xe9").is_err());
        assert!(Charset::Ascii.decode(b"Caf\xe9").is_err());
        let greek = Charset::from_msh18(b"8859/7").unwrap();
        assert_eq!(greek.decode(b"\xe1\xe2").unwrap(), "αβ");
        assert_eq!(Charset::Utf16.decode(b"\xff\xfeA\x00").unwrap(), "A");
        assert_eq!(Charset::Utf16.decode(b"\x00A").unwrap(), "A");
        assert_eq!(Charset::Utf32.decode(b"\x00\x00\x00A").unwrap(), "A");
        assert!(Charset::Utf32.decode(b"\x00\x00A").is_err());
    }

    #[test]
    fn fallback_applies_only_to_unlabelled() {
        let d = TextDecoder {
            fallback: Charset::Latin1,
        };
        assert_eq!(d.decode(b"", b"\xe9").unwrap(), "é");
        assert!(d.decode(b"UNICODE UTF-8", b"\xe9").is_err());
        assert_eq!(TextDecoder::default().charset(b"").unwrap(), Charset::Utf8);
    }
}
