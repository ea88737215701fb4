//! Turning bytes from the wire (a control id) into something safe for a file name or a log line.

/// The longest sanitised value kept.
pub const MAX_LEN: usize = 64;

/// Keeps `[A-Za-z0-9_.-]`, replaces every other byte with `_`, and cuts at [`MAX_LEN`] bytes; empty input
/// gives `none`. The result never contains a path separator and is never `.` or `..` (those become `_` and
/// `__`), so it cannot name another directory.
pub fn sanitise(raw: &[u8]) -> String {
    if raw.is_empty() {
        return "none".to_owned();
    }
    let s: String = raw
        .iter()
        .take(MAX_LEN)
        .map(|&b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
                char::from(b)
            } else {
                '_'
            }
        })
        .collect();
    if s.bytes().all(|b| b == b'.') {
        "_".repeat(s.len())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_safe_characters() {
        assert_eq!(sanitise(b"DEMO0001"), "DEMO0001");
        assert_eq!(sanitise(b"a-b_c.9"), "a-b_c.9");
    }

    #[test]
    fn replaces_everything_else() {
        assert_eq!(sanitise(b"../../etc/passwd"), ".._.._etc_passwd");
        assert_eq!(sanitise(b"a/b\\c d\r\n\x00\xff"), "a_b_c_d____");
        assert_eq!(sanitise("é".as_bytes()), "__");
    }

    #[test]
    fn never_a_relative_directory_or_empty() {
        assert_eq!(sanitise(b""), "none");
        assert_eq!(sanitise(b"."), "_");
        assert_eq!(sanitise(b".."), "__");
        assert_eq!(sanitise(b"..."), "___");
    }

    #[test]
    fn bounded_length() {
        let long = vec![b'x'; 1000];
        assert_eq!(sanitise(&long).len(), MAX_LEN);
    }
}
