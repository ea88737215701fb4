//! A JSON writer into a reused buffer: objects and arrays with their commas tracked, strings escaped as they
//! are written. The converter writes each Bundle straight into its output, with no tree in between.

/// Writes JSON into `out`. Keys and values are written in the order called; the caller keeps the nesting.
#[derive(Debug)]
pub struct Writer<'o> {
    out: &'o mut Vec<u8>,
    /// Per open object or array: whether a member has been written (the next one needs a comma).
    stack: Vec<bool>,
}

impl<'o> Writer<'o> {
    pub fn new(out: &'o mut Vec<u8>) -> Self {
        Self {
            out,
            stack: Vec::with_capacity(16),
        }
    }

    /// The bytes written so far.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Drops what was written after `len` (a member started and found empty) and restores the comma state.
    pub fn truncate(&mut self, len: usize, had_members: bool) {
        self.out.truncate(len);
        if let Some(top) = self.stack.last_mut() {
            *top = had_members;
        }
    }

    /// Replaces every `"reference":"<from>"` written after `start` by `"reference":"<to>"` (`to` needs no
    /// escaping): references to an entry that was left out become its condition; any other string equal to
    /// `from` (a value a sender wrote) stays as it is.
    pub fn replace_references(&mut self, start: usize, from: &str, to: &str) {
        const KEY: &[u8] = b"\"reference\":\"";
        let mut pat = Vec::with_capacity(from.len() + KEY.len() + 1);
        pat.extend_from_slice(KEY);
        pat.extend_from_slice(from.as_bytes());
        pat.push(b'"');
        let tail = self.out.split_off(start.min(self.out.len()));
        let mut at = 0;
        for i in memchr::memmem::find_iter(&tail, &pat) {
            self.out.extend_from_slice(&tail[at..i]);
            self.out.extend_from_slice(KEY);
            self.out.extend_from_slice(to.as_bytes());
            self.out.push(b'"');
            at = i + pat.len();
        }
        self.out.extend_from_slice(&tail[at..]);
    }

    /// Whether the innermost object or array has a member already.
    pub fn has_members(&self) -> bool {
        self.stack.last().copied().unwrap_or(false)
    }

    /// Whether the next member needs a comma before it (and marks the innermost container as having one).
    #[inline]
    fn needs_comma(&mut self) -> bool {
        match self.stack.last_mut() {
            Some(top) => std::mem::replace(top, true),
            None => false,
        }
    }

    #[inline]
    fn comma(&mut self) {
        if self.needs_comma() {
            self.out.push(b',');
        }
    }

    /// `,"key":` (the comma when needed), reserving room for a short value too.
    #[inline]
    fn key(&mut self, key: &str) {
        let comma = self.needs_comma();
        self.out.reserve(key.len() + 32);
        if comma {
            self.out.push(b',');
        }
        self.out.push(b'"');
        small_copy(self.out, key.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    /// `{` as a value in an array (or the document).
    pub fn begin_object(&mut self) {
        self.comma();
        self.out.push(b'{');
        self.stack.push(false);
    }

    /// `"key":{`.
    pub fn object(&mut self, key: &str) {
        self.key(key);
        self.out.push(b'{');
        self.stack.push(false);
    }

    /// `}`.
    pub fn end_object(&mut self) {
        self.stack.pop();
        self.out.push(b'}');
    }

    /// `"key":[`.
    pub fn array(&mut self, key: &str) {
        self.key(key);
        self.out.push(b'[');
        self.stack.push(false);
    }

    /// `]`.
    pub fn end_array(&mut self) {
        self.stack.pop();
        self.out.push(b']');
    }

    /// `"key":"value"` (escaped).
    pub fn string(&mut self, key: &str, value: &str) {
        let comma = self.needs_comma();
        let out = &mut *self.out;
        out.reserve(key.len() + value.len() + 8);
        if comma {
            out.push(b',');
        }
        out.push(b'"');
        small_copy(out, key.as_bytes());
        out.extend_from_slice(b"\":\"");
        escape_into(out, value);
        out.push(b'"');
    }

    /// `"key":"<a><b>..."`: the pieces concatenated into one string value.
    pub fn string_parts(&mut self, key: &str, parts: &[&str]) {
        self.key(key);
        self.out.push(b'"');
        for p in parts {
            escape_into(self.out, p);
        }
        self.out.push(b'"');
    }

    /// `"key":"<what write appends>"` when `write` appends a value (and returns true), else nothing. For
    /// values that need no escaping (dates, ids), written without a String of their own.
    pub fn string_with(&mut self, key: &str, write: impl FnOnce(&mut Vec<u8>) -> bool) -> bool {
        let (mark, had) = (self.out.len(), self.has_members());
        self.key(key);
        self.out.push(b'"');
        if write(self.out) {
            self.out.push(b'"');
            true
        } else {
            self.truncate(mark, had);
            false
        }
    }

    /// A string as an array item.
    pub fn item_string(&mut self, value: &str) {
        self.comma();
        self.quoted(value);
    }

    /// `"key":true|false`.
    pub fn bool(&mut self, key: &str, value: bool) {
        self.key(key);
        self.out
            .extend_from_slice(if value { b"true" } else { b"false" });
    }

    /// `"key":<number>`: `text` must already be a JSON number (checked by the caller).
    pub fn number(&mut self, key: &str, text: &str) {
        self.key(key);
        self.out.extend_from_slice(text.as_bytes());
    }

    /// `"key":<n>`.
    pub fn integer(&mut self, key: &str, n: u64) {
        self.key(key);
        let mut b = itoa::Buffer::new();
        self.out.extend_from_slice(b.format(n).as_bytes());
    }

    fn quoted(&mut self, value: &str) {
        self.out.push(b'"');
        escape_into(self.out, value);
        self.out.push(b'"');
    }
}

/// Appends a short slice (a key, a piece of text) byte by byte: cheaper than a call to `memcpy` for the few
/// bytes most of them have.
#[inline]
fn small_copy(out: &mut Vec<u8>, bytes: &[u8]) {
    if bytes.len() <= 16 {
        out.extend(bytes.iter().copied());
    } else {
        out.extend_from_slice(bytes);
    }
}

/// Bytes JSON needs escaped: control characters, `"` and `\\`.
static NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// The index of the first byte of `bytes` that JSON needs escaped, or its length: eight bytes at a time
/// (a quote, a backslash or a control character in a word sets its byte's high bit), the tail one by one.
#[inline]
fn first_escape(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        // A byte below 0x20; a byte equal to `"`; to `\\` (each: a zero byte test, exact for "any").
        let ctrl = x.wrapping_sub(ONES * 0x20) & !x;
        let q = x ^ (ONES * u64::from(b'"'));
        let q = q.wrapping_sub(ONES) & !q;
        let b = x ^ (ONES * u64::from(b'\\'));
        let b = b.wrapping_sub(ONES) & !b;
        if (ctrl | q | b) & HIGH != 0 {
            break;
        }
        i += 8;
    }
    i + bytes[i..]
        .iter()
        .position(|&b| NEEDS_ESCAPE[b as usize])
        .unwrap_or(bytes.len() - i)
}

/// True when `s` has a byte JSON needs escaped.
pub fn needs_escape(s: &str) -> bool {
    first_escape(s.as_bytes()) < s.len()
}

/// `s` JSON-escaped onto `out` (quotes, backslashes, control characters; the rest as UTF-8). Text without an
/// escape (nearly all of it) is found so a word at a time and copied whole.
pub fn escape_into(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let first = first_escape(bytes);
    if first == bytes.len() {
        small_copy(out, bytes);
        return;
    }
    out.extend_from_slice(&bytes[..first]);
    let mut start = first;
    let mut i = first;
    while i < bytes.len() {
        let b = bytes[i];
        if !NEEDS_ESCAPE[b as usize] {
            i += 1;
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
        }
        i += 1;
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_commas_and_escapes() {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        w.begin_object();
        w.string("a", "x\"y\\z\n\u{1}é");
        w.array("b");
        w.item_string("1");
        w.begin_object();
        w.integer("n", 7);
        w.end_object();
        w.end_array();
        w.bool("c", true);
        w.end_object();
        let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(v["a"], "x\"y\\z\n\u{1}é");
        assert_eq!(v["b"][1]["n"], 7);
        assert_eq!(v["c"], true);
    }

    #[test]
    fn the_word_scan_finds_every_byte_to_escape() {
        for special in [b'"', b'\\', b'\n', 0x00, 0x1f] {
            for at in 0..20 {
                let mut text = vec![b'a'; 20];
                text.extend_from_slice("é~\x7f".as_bytes());
                text[at] = special;
                let s = std::str::from_utf8(&text).expect("utf-8");
                assert_eq!(first_escape(s.as_bytes()), at, "{s:?}");
                let mut out = Vec::new();
                escape_into(&mut out, s);
                let back: String =
                    serde_json::from_slice(&[b"\"", &out[..], b"\""].concat()).expect("JSON");
                assert_eq!(back, s);
            }
        }
        assert_eq!(
            first_escape("plain text, no escapes: é ~ \x7f".as_bytes()),
            30
        );
    }
}
