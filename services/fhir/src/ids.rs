//! Derived resource ids (`Uuid`, stable per business key), OIDs, and the encoding of search tokens and URL
//! query values: what ids and references are made of, with no dependency on the maps.

use sha2::{Digest, Sha256};

/// True for an OID FHIR accepts: `[0-2]` and at least two more arcs, each a number without leading zeros.
pub(crate) fn is_oid(s: &str) -> bool {
    let arcs: Vec<&str> = s.split('.').collect();
    arcs.len() >= 3
        && matches!(arcs[0], "0" | "1" | "2")
        && arcs.iter().all(|a| {
            !a.is_empty()
                && a.bytes().all(|b| b.is_ascii_digit())
                && (a.len() == 1 || !a.starts_with('0'))
        })
}

/// A UUID (version 5 layout) from the SHA-256 of the resource type and key: stable across conversions.
pub(crate) fn uuid_of(rtype: &str, key: &[&str]) -> Uuid {
    let mut h = Sha256::new();
    h.update(rtype.as_bytes());
    for k in key {
        h.update([0x1f]);
        h.update(k.as_bytes());
    }
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.finalize()[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = [0u8; 36];
    let mut at = 0;
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s[at] = b'-';
            at += 1;
        }
        s[at] = HEX[(byte >> 4) as usize];
        s[at + 1] = HEX[(byte & 0xf) as usize];
        at += 2;
    }
    Uuid(s)
}

/// A resource id made by [`uuid_of`]: its 36 characters in place (a Bundle has dozens; none is a `String`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Uuid([u8; 36]);

impl Uuid {
    pub fn as_str(&self) -> &str {
        // Hex digits and hyphens only (see `uuid_of`): always UTF-8.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::ops::Deref for Uuid {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One side of a search token (`system|code`), escaped as FHIR search says (`\` before `\`, `|`, `,` and `$`,
/// which would otherwise split it or make it an OR) and percent-encoded.
pub(crate) fn token_encode(out: &mut String, s: &str) {
    if !s.contains(['\\', '|', ',', '$']) {
        percent_encode(out, s);
        return;
    }
    let mut escaped = String::with_capacity(s.len() + 4);
    for c in s.chars() {
        if matches!(c, '\\' | '|' | ',' | '$') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    percent_encode(out, &escaped);
}

/// Appends `s` percent-encoded for a URL query value (unreserved characters kept).
pub(crate) fn percent_encode(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let keep =
        |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':' | b'/');
    let mut rest = s;
    while !rest.is_empty() {
        // A run of kept characters (ASCII, so a char boundary where it ends) in one piece.
        let run = rest.bytes().position(|b| !keep(b)).unwrap_or(rest.len());
        out.push_str(&rest[..run]);
        let Some(&b) = rest.as_bytes().get(run) else {
            break;
        };
        out.push('%');
        out.push(char::from(HEX[(b >> 4) as usize]));
        out.push(char::from(HEX[(b & 0xf) as usize]));
        // Past the one byte (a multi-byte character's bytes are encoded one by one).
        rest = match rest.get(run + 1..) {
            Some(r) => r,
            None => {
                // Inside a multi-byte character: its remaining bytes, each encoded.
                for &b in &rest.as_bytes()[run + 1..] {
                    if keep(b) {
                        out.push(char::from(b));
                    } else {
                        out.push('%');
                        out.push(char::from(HEX[(b >> 4) as usize]));
                        out.push(char::from(HEX[(b & 0xf) as usize]));
                    }
                }
                break;
            }
        };
    }
}
