//! HL7 escape sequences: decoding (`\F\`, `\S\`, `\T\`, `\R\`, `\E\`, `\Xhh..\`) and encoding on write.

use crate::Delimiters;
use std::borrow::Cow;

/// Copies `raw` with each escape sequence replaced by what `decode` writes: `decode` gets the bytes from an
/// escape character `e` on and returns how many of them it consumed (at least one). Borrows when `raw` holds no
/// escape character; runs between escapes are copied whole.
fn decode_escapes<'a>(
    raw: &'a [u8],
    e: u8,
    mut decode: impl FnMut(&[u8], &mut Vec<u8>) -> usize,
) -> Cow<'a, [u8]> {
    let Some(first) = memchr::memchr(e, raw) else {
        return Cow::Borrowed(raw);
    };
    let mut out = Vec::with_capacity(raw.len());
    let (mut i, mut at) = (0, Some(first));
    while let Some(j) = at {
        out.extend_from_slice(&raw[i..j]);
        i = j + decode(&raw[j..], &mut out).max(1);
        at = memchr::memchr(e, &raw[i..]).map(|k| i + k);
    }
    out.extend_from_slice(&raw[i..]);
    Cow::Owned(out)
}

/// Resolves escape sequences in a raw value: the delimiter escapes and `\Xhh..\` become bytes; formatting
/// sequences (`\.br\`, `\H\`, `\N\`, `\Z..\`, `\C..\`, `\M..\`) and anything unknown are kept as written.
/// Borrows when the value holds no escape character.
pub fn unescape<'a>(raw: &'a [u8], d: &Delimiters) -> Cow<'a, [u8]> {
    decode_escapes(raw, d.escape, |s, out| {
        // Up to the closing escape character; a lone one is kept with the rest.
        let Some(len) = memchr::memchr(d.escape, &s[1..]) else {
            out.extend_from_slice(s);
            return s.len();
        };
        let whole = &s[..len + 2];
        match &s[1..=len] {
            b"F" => out.push(d.field),
            b"S" => out.push(d.component),
            b"T" => out.push(d.subcomponent),
            b"R" => out.push(d.repetition),
            b"E" => out.push(d.escape),
            b"P" if d.truncation.is_some() => out.extend(d.truncation),
            [b'X', hex @ ..] if is_hex(hex) => out.extend(
                hex.chunks_exact(2)
                    .map(|p| (nibble(p[0]) << 4) | nibble(p[1])),
            ),
            _ => out.extend_from_slice(whole),
        }
        whole.len()
    })
}

/// Decodes a value the way the canonical flat view does (docs/flat-format.md): delimiter escapes and the literal
/// `\X000d\` resolve; `\.`, `\C`, `\M`, `\X`, `\Z` sequences and exactly `\H\`/`\N\` are kept; any other escape
/// character is dropped.
pub fn unescape_flat<'a>(raw: &'a [u8], d: &Delimiters) -> Cow<'a, [u8]> {
    let e = d.escape;
    decode_escapes(raw, e, |s, out| {
        let rest = &s[1..];
        if rest.len() >= 2 && rest[1] == e {
            let mapped = match rest[0] {
                b'F' => Some(d.field),
                b'S' => Some(d.component),
                b'T' => Some(d.subcomponent),
                b'R' => Some(d.repetition),
                b'E' => Some(d.escape),
                _ => None,
            };
            if let Some(m) = mapped {
                out.push(m);
                return 3;
            }
            if rest[0] == b'H' || rest[0] == b'N' {
                out.extend_from_slice(&s[..3]);
                return 3;
            }
        }
        if e == b'\\' && rest.starts_with(b"X000d\\") {
            out.push(b'\r');
            return 7;
        }
        if let Some(&c) = rest.first()
            && matches!(c, b'.' | b'C' | b'M' | b'X' | b'Z')
            && let Some(end) = memchr::memchr(e, rest)
        {
            out.extend_from_slice(&s[..end + 2]);
            return end + 2;
        }
        // Unknown, lone or trailing escape character: drop it.
        1
    })
}

/// Appends `value` to `out` with every delimiter, CR and LF escaped, so the value reads back unchanged.
pub fn escape_into(value: &[u8], d: &Delimiters, out: &mut Vec<u8>) {
    // With MSH-2 repeating its escape character as a separator (`^~\\&`), an escape sequence would read back
    // as separators: delimiters in the value become spaces instead.
    let ambiguous = [d.field, d.component, d.repetition, d.subcomponent].contains(&d.escape)
        || d.truncation == Some(d.escape);
    if ambiguous {
        out.extend(value.iter().map(|&b| {
            if b == d.field
                || b == d.component
                || b == d.repetition
                || b == d.subcomponent
                || Some(b) == d.truncation
                || b == b'\r'
                || b == b'\n'
            {
                b' '
            } else {
                b
            }
        }));
        return;
    }
    for &b in value {
        let code: &[u8] = if b == d.escape {
            b"E"
        } else if b == d.field {
            b"F"
        } else if b == d.component {
            b"S"
        } else if b == d.subcomponent {
            b"T"
        } else if b == d.repetition {
            b"R"
        } else if Some(b) == d.truncation {
            b"P"
        } else if b == b'\r' {
            b"X0D"
        } else if b == b'\n' {
            b"X0A"
        } else {
            out.push(b);
            continue;
        };
        out.push(d.escape);
        out.extend_from_slice(code);
        out.push(d.escape);
    }
}

/// Returns `value` escaped, borrowing when nothing needed escaping.
pub fn escape<'a>(value: &'a [u8], d: &Delimiters) -> Cow<'a, [u8]> {
    if value
        .iter()
        .any(|&b| d.is_delimiter(b) || b == b'\r' || b == b'\n')
    {
        let mut out = Vec::with_capacity(value.len() + 8);
        escape_into(value, d, &mut out);
        Cow::Owned(out)
    } else {
        Cow::Borrowed(value)
    }
}

fn is_hex(hex: &[u8]) -> bool {
    !hex.is_empty() && hex.len().is_multiple_of(2) && hex.iter().all(u8::is_ascii_hexdigit)
}

fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

#[cfg(test)]
mod tests {
    /// Review of issue 10: with MSH-2 `^~\\&` the escape character is also the subcomponent separator, so an
    /// escape sequence would read back as subcomponents; delimiters become spaces instead.
    #[test]
    fn an_escape_character_that_is_also_a_separator_is_not_used() {
        let d = Delimiters::from_msh(b'|', b"^~\\\\&").unwrap();
        let mut out = Vec::new();
        escape_into(b"a|b^c\\d~e&f", &d, &mut out);
        assert_eq!(out, b"a b c d e f");
    }

    use super::*;

    fn d() -> Delimiters {
        Delimiters::default()
    }

    #[test]
    fn delimiter_escapes_resolve() {
        assert_eq!(&*unescape(br"a\F\b\S\c\T\d\R\e\E\f", &d()), b"a|b^c&d~e\\f");
    }

    #[test]
    fn hex_resolves_and_formatting_is_kept() {
        assert_eq!(&*unescape(br"x\X0D0A\y", &d()), b"x\r\ny");
        assert_eq!(
            &*unescape(br"a\.br\b\H\c\N\d\Zxy\", &d()),
            br"a\.br\b\H\c\N\d\Zxy\"
        );
        assert_eq!(&*unescape(br"bad\XZZ\hex", &d()), br"bad\XZZ\hex");
        assert_eq!(&*unescape(br"trailing\", &d()), br"trailing\");
    }

    #[test]
    fn no_escape_borrows() {
        assert!(matches!(unescape(b"plain", &d()), Cow::Borrowed(_)));
        assert!(matches!(escape(b"plain", &d()), Cow::Borrowed(_)));
    }

    #[test]
    fn flat_rules() {
        assert_eq!(&*unescape_flat(br"a\L\b", &d()), b"aLb");
        assert_eq!(&*unescape_flat(br"\Q\ x", &d()), b"Q x");
        assert_eq!(&*unescape_flat(br"x\X000d\y", &d()), b"x\ry");
        assert_eq!(&*unescape_flat(br"x\X0D0A\y", &d()), br"x\X0D0A\y");
        assert_eq!(&*unescape_flat(br"x\.br\y\H\z", &d()), br"x\.br\y\H\z");
        assert_eq!(&*unescape_flat(br"x\.br", &d()), b"x.br");
        assert_eq!(&*unescape_flat(br"end\", &d()), b"end");
        assert_eq!(&*unescape_flat(br"x\F\y", &d()), b"x|y");
    }

    #[test]
    fn escape_round_trips_every_delimiter() {
        let mut dl = d();
        dl.truncation = Some(b'#');
        let v = b"a|b^c~d\\e&f#g\rh\ni";
        let esc = escape(v, &dl);
        assert!(!esc.iter().any(|&b| b == b'|' || b == b'\r' || b == b'#'));
        assert_eq!(&*unescape(&esc, &dl), v);
    }
}
