//! Editing and re-encoding. Unedited segments stay borrowed from the input, so an unedited message encodes
//! byte-identical to it and an edited one copies only what changed plus the untouched slices.

use crate::escape::escape_into;
use crate::message::is_header_name;
use crate::path::{Path, PathError};
use crate::{Delimiters, Message};
use std::borrow::Cow;

/// Why an edit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EditError {
    #[error(transparent)]
    Path(#[from] PathError),
    /// No segment with that name and occurrence.
    #[error("no segment {name} occurrence {occurrence}")]
    NoSuchSegment { name: String, occurrence: usize },
    /// MSH-1 and MSH-2 define the delimiters and cannot be set.
    #[error("MSH-1 and MSH-2 cannot be edited")]
    Delimiters,
    /// The first segment (MSH) cannot be removed, renamed or preceded.
    #[error("the header segment cannot be removed, renamed or moved")]
    Header,
    /// A raw value or segment holds a field separator, CR or LF, or a segment name is not 3 letters/digits.
    #[error("invalid raw content: {0}")]
    Invalid(&'static str),
}

#[derive(Debug, Clone)]
struct EditSeg<'a> {
    content: Cow<'a, [u8]>,
    /// What followed the segment in the input (terminator, blank lines, next segment's indent).
    trailer: &'a [u8],
}

/// A message being edited. Build one with [`Message::edit`].
#[derive(Debug, Clone)]
pub struct Edit<'a> {
    delims: Delimiters,
    prefix: &'a [u8],
    segs: Vec<EditSeg<'a>>,
}

impl<'a> Message<'a> {
    /// Starts editing a copy-on-write view of the message.
    pub fn edit(&self) -> Edit<'a> {
        let input = self.as_bytes();
        let spans = self.spans();
        let segs = spans
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let next = spans.get(i + 1).map_or(input.len(), |n| n.start as usize);
                EditSeg {
                    content: Cow::Borrowed(&input[s.start as usize..s.end as usize]),
                    trailer: &input[s.end as usize..next],
                }
            })
            .collect();
        Edit {
            delims: *self.delimiters(),
            prefix: &input[..spans[0].start as usize],
            segs,
        }
    }
}

impl<'a> Edit<'a> {
    /// Sets the value at a terser path, escaping every delimiter in `value`. Missing fields, repetitions,
    /// components and subcomponents are created.
    pub fn set(&mut self, path: &str, value: &[u8]) -> Result<(), EditError> {
        let p = Path::parse(path)?;
        let d = self.delims;
        self.replace(&p, |out| escape_into(value, &d, out))
    }

    /// Sets the value at a path to `raw` as written (it may carry component or repetition separators).
    pub fn set_raw(&mut self, path: &str, raw: &[u8]) -> Result<(), EditError> {
        let p = Path::parse(path)?;
        check_raw(raw, self.delims.field)?;
        self.replace(&p, |out| out.extend_from_slice(raw))
    }

    /// Empties the value at a path (the positions after it keep their numbers).
    pub fn clear(&mut self, path: &str) -> Result<(), EditError> {
        let p = Path::parse(path)?;
        if self.find(p.segment(), p.occurrence).is_none() {
            return Ok(());
        }
        self.replace(&p, |_| {})
    }

    fn find(&self, name: &[u8], occurrence: usize) -> Option<usize> {
        let fs = self.delims.field;
        self.segs
            .iter()
            .enumerate()
            .filter(|(_, s)| seg_name(&s.content, fs) == name)
            .nth(occurrence.checked_sub(1)?)
            .map(|(i, _)| i)
    }

    fn replace(&mut self, p: &Path, write: impl FnOnce(&mut Vec<u8>)) -> Result<(), EditError> {
        let name = p.segment();
        let idx = self
            .find(name, p.occurrence)
            .ok_or_else(|| EditError::NoSuchSegment {
                name: String::from_utf8_lossy(name).into_owned(),
                occurrence: p.occurrence,
            })?;
        let header = is_header_name(name);
        if header && p.field <= 2 {
            return Err(EditError::Delimiters);
        }
        let d = self.delims;
        let piece = if header { p.field } else { p.field + 1 };
        let old = &self.segs[idx].content;
        let mut out = Vec::with_capacity(old.len() + 16);
        replace_nth(old, d.field, piece, &mut out, |field, out| {
            replace_nth(field, d.repetition, p.repetition, out, |rep, out| {
                match p.component {
                    None => write(out),
                    Some(c) => {
                        replace_nth(rep, d.component, c, out, |comp, out| match p.subcomponent {
                            None => write(out),
                            Some(s) => {
                                replace_nth(comp, d.subcomponent, s, out, |_, out| write(out))
                            }
                        })
                    }
                }
            })
        });
        self.segs[idx].content = Cow::Owned(out);
        Ok(())
    }

    /// Appends a segment given as raw bytes (`ZXY|1|...`), ended with CR on encoding.
    pub fn push_segment(&mut self, raw: &[u8]) -> Result<(), EditError> {
        let at = self.segs.len();
        self.insert_segment(at, raw)
    }

    /// Inserts a raw segment at wire position `index` (1 or more: MSH stays first).
    pub fn insert_segment(&mut self, index: usize, raw: &[u8]) -> Result<(), EditError> {
        if index == 0 || index > self.segs.len() {
            return Err(EditError::Header);
        }
        check_segment(raw, self.delims.field)?;
        let prev = &mut self.segs[index - 1];
        if prev.trailer.is_empty() {
            prev.trailer = b"\r";
        }
        self.segs.insert(
            index,
            EditSeg {
                content: Cow::Owned(raw.to_vec()),
                trailer: b"\r",
            },
        );
        Ok(())
    }

    /// Removes the `occurrence`-th segment called `name`.
    pub fn remove_segment(&mut self, name: &str, occurrence: usize) -> Result<(), EditError> {
        let idx = self.index_of(name, occurrence)?;
        if idx == 0 {
            return Err(EditError::Header);
        }
        let removed = self.segs.remove(idx);
        // Keep the message's last terminator style when the last segment goes.
        if idx == self.segs.len()
            && let Some(last) = self.segs.last_mut()
        {
            last.trailer = removed.trailer;
        }
        Ok(())
    }

    /// Renames the `occurrence`-th segment called `name` to `new_name` (three letters or digits).
    pub fn rename_segment(
        &mut self,
        name: &str,
        occurrence: usize,
        new_name: &str,
    ) -> Result<(), EditError> {
        let idx = self.index_of(name, occurrence)?;
        if idx == 0 {
            return Err(EditError::Header);
        }
        let nn = new_name.as_bytes();
        if nn.len() != 3 || !nn.iter().all(u8::is_ascii_alphanumeric) {
            return Err(EditError::Invalid(
                "segment names are three letters or digits",
            ));
        }
        let seg = &mut self.segs[idx];
        let old_len = seg_name(&seg.content, self.delims.field).len();
        let mut out = Vec::with_capacity(seg.content.len() + 3);
        out.extend_from_slice(nn);
        out.extend_from_slice(&seg.content[old_len..]);
        seg.content = Cow::Owned(out);
        Ok(())
    }

    fn index_of(&self, name: &str, occurrence: usize) -> Result<usize, EditError> {
        self.find(name.as_bytes(), occurrence)
            .ok_or_else(|| EditError::NoSuchSegment {
                name: name.to_owned(),
                occurrence,
            })
    }

    /// True when the message has an `occurrence`-th segment called `name`.
    pub fn has_segment(&self, name: &str, occurrence: usize) -> bool {
        self.find(name.as_bytes(), occurrence).is_some()
    }

    /// Number of segments.
    pub fn segment_count(&self) -> usize {
        self.segs.len()
    }

    /// True when any segment was changed, added or removed... as far as content goes: segments still
    /// borrowed from the input were not touched.
    pub fn is_edited(&self) -> bool {
        self.segs.iter().any(|s| matches!(s.content, Cow::Owned(_)))
    }

    /// Appends the encoded message to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.prefix);
        for s in &self.segs {
            out.extend_from_slice(&s.content);
            out.extend_from_slice(s.trailer);
        }
    }

    /// The encoded message.
    pub fn encode(&self) -> Vec<u8> {
        let len = self.prefix.len()
            + self
                .segs
                .iter()
                .map(|s| s.content.len() + s.trailer.len())
                .sum::<usize>();
        let mut out = Vec::with_capacity(len);
        self.encode_into(&mut out);
        out
    }
}

fn seg_name(content: &[u8], fs: u8) -> &[u8] {
    &content[..memchr::memchr(fs, content).unwrap_or(content.len())]
}

fn check_raw(raw: &[u8], fs: u8) -> Result<(), EditError> {
    if raw.iter().any(|&b| b == fs || b == b'\r' || b == b'\n') {
        return Err(EditError::Invalid(
            "raw values cannot hold the field separator, CR or LF",
        ));
    }
    Ok(())
}

fn check_segment(raw: &[u8], fs: u8) -> Result<(), EditError> {
    let name_ok = raw.len() >= 3
        && raw[..3].iter().all(u8::is_ascii_alphanumeric)
        && (raw.len() == 3 || raw[3] == fs);
    if !name_ok || raw.iter().any(|&b| b == b'\r' || b == b'\n') {
        return Err(EditError::Invalid(
            "a segment is a three-character name, then the field separator, and no CR or LF",
        ));
    }
    if is_header_name(&raw[..3]) {
        return Err(EditError::Header);
    }
    Ok(())
}

/// Writes `raw` into `out` with its `n`-th (1-based) piece on `sep` replaced by what `f` writes; missing
/// pieces are added as empty ones.
fn replace_nth(
    raw: &[u8],
    sep: u8,
    n: usize,
    out: &mut Vec<u8>,
    f: impl FnOnce(&[u8], &mut Vec<u8>),
) {
    let mut start = 0;
    let mut idx = 1;
    for pos in memchr::memchr_iter(sep, raw) {
        if idx == n {
            out.extend_from_slice(&raw[..start]);
            f(&raw[start..pos], out);
            out.extend_from_slice(&raw[pos..]);
            return;
        }
        idx += 1;
        start = pos + 1;
    }
    if idx == n {
        out.extend_from_slice(&raw[..start]);
        f(&raw[start..], out);
        return;
    }
    out.extend_from_slice(raw);
    for _ in idx..n {
        out.push(sep);
    }
    f(b"", out);
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &[u8] = b"\xEF\xBB\xBFMSH|^~\\&|A|B|C|D|2020||ADT^A01|1|P|2.5\r\nPID|1||ID1^^^H||DOE^JOHN\r\n\r\nPV1|1|I\n";

    #[test]
    fn unedited_is_byte_identical() {
        let m = Message::parse(M).unwrap();
        let e = m.edit();
        assert!(!e.is_edited());
        assert_eq!(e.encode(), M);
    }

    #[test]
    fn set_and_clear_by_path() {
        let m = Message::parse(M).unwrap();
        let mut e = m.edit();
        e.set("PID-5-2", b"JANE").unwrap();
        e.set("PID-3(2)-4-2", b"X|Y").unwrap();
        e.set("PV1-7", b"new").unwrap();
        e.clear("PID-1").unwrap();
        e.set("MSH-10", b"2").unwrap();
        let out = e.encode();
        let m2 = Message::parse(&out).unwrap();
        assert_eq!(m2.get("PID-5"), Some(&b"DOE^JANE"[..]));
        assert_eq!(m2.get("PID-3(1)"), Some(&b"ID1^^^H"[..]));
        assert_eq!(&*m2.get_decoded("PID-3(2)-4-2").unwrap(), b"X|Y");
        assert_eq!(m2.get("PV1-7"), Some(&b"new"[..]));
        assert_eq!(m2.get("PID-1"), None);
        assert_eq!(m2.header().control_id, b"2");
        // Untouched bytes around the edits stay as they were.
        assert!(out.starts_with(b"\xEF\xBB\xBFMSH|"));
        assert!(out.ends_with(b"\r\n\r\nPV1|1|I|||||new\n"));
    }

    #[test]
    fn segment_operations() {
        let m = Message::parse(M).unwrap();
        let mut e = m.edit();
        e.push_segment(b"ZXY|1|two").unwrap();
        e.rename_segment("PV1", 1, "PV2").unwrap();
        e.insert_segment(1, b"EVN|A01").unwrap();
        e.remove_segment("PID", 1).unwrap();
        let out = e.encode();
        let m2 = Message::parse(&out).unwrap();
        let names: Vec<_> = m2.segments().map(|s| s.name()).collect();
        assert_eq!(names, [&b"MSH"[..], b"EVN", b"PV2", b"ZXY"]);
        assert_eq!(m2.get("ZXY-2"), Some(&b"two"[..]));
    }

    #[test]
    fn refusals() {
        let m = Message::parse(M).unwrap();
        let mut e = m.edit();
        assert_eq!(e.set("MSH-2", b"x"), Err(EditError::Delimiters));
        assert!(matches!(
            e.set("OBX-1", b"x"),
            Err(EditError::NoSuchSegment { .. })
        ));
        assert!(matches!(e.set("bad", b"x"), Err(EditError::Path(_))));
        assert!(e.set_raw("PID-5", b"a|b").is_err());
        assert!(e.push_segment(b"ZX|1").is_err());
        assert!(e.push_segment(b"ZXY|1\rPID|2").is_err());
        assert_eq!(e.remove_segment("MSH", 1), Err(EditError::Header));
        assert_eq!(e.insert_segment(0, b"EVN|1"), Err(EditError::Header));
        assert!(e.rename_segment("PID", 1, "TOOLONG").is_err());
        assert_eq!(e.encode(), M);
    }
}
