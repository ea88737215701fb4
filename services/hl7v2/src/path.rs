//! Terser paths: `PID-5-1`, `OBX(3)-5`, `PID-3(2)-4-1` (a `.` may stand for `-`).

use std::fmt;
use std::str::FromStr;

/// A parsed terser path. Occurrence and repetition default to 1; component and subcomponent are optional
/// (absent means "the whole element at the level above").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Path {
    name: [u8; 8],
    name_len: u8,
    /// Segment occurrence in wire order, 1-based.
    pub occurrence: usize,
    /// Field number in HL7 numbering (MSH-1 is the field separator).
    pub field: usize,
    /// Field repetition, 1-based.
    pub repetition: usize,
    /// Component, 1-based.
    pub component: Option<usize>,
    /// Subcomponent, 1-based.
    pub subcomponent: Option<usize>,
}

/// Why a terser path string is not a path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid terser path {path:?}: {reason}")]
pub struct PathError {
    path: String,
    reason: &'static str,
}

impl Path {
    /// Parses a terser path.
    pub fn parse(s: &str) -> Result<Self, PathError> {
        let err = |reason| PathError {
            path: s.to_owned(),
            reason,
        };
        let b = s.as_bytes();
        let name_len = b
            .iter()
            .position(|&c| !c.is_ascii_alphanumeric())
            .unwrap_or(b.len());
        if !(2..=8).contains(&name_len) {
            return Err(err("segment name must be 2 to 8 letters or digits"));
        }
        let mut name = [0u8; 8];
        name[..name_len].copy_from_slice(&b[..name_len]);
        let mut rest = &b[name_len..];
        let occurrence = take_index(&mut rest).map_err(err)?.unwrap_or(1);
        let mut numbers = [None::<(usize, usize)>; 3];
        for slot in numbers.iter_mut() {
            match rest.first() {
                None => break,
                Some(b'-' | b'.') => rest = &rest[1..],
                Some(_) => return Err(err("expected '-' between parts")),
            }
            let n = take_number(&mut rest).ok_or_else(|| err("expected a number"))?;
            let rep = take_index(&mut rest).map_err(err)?.unwrap_or(1);
            *slot = Some((n, rep));
        }
        if !rest.is_empty() {
            return Err(err("too many parts"));
        }
        let (field, repetition) = numbers[0].ok_or_else(|| err("missing field number"))?;
        if numbers[1].is_some_and(|(_, r)| r != 1) || numbers[2].is_some_and(|(_, r)| r != 1) {
            return Err(err("only segments and fields repeat"));
        }
        Ok(Self {
            name,
            name_len: name_len as u8,
            occurrence,
            field,
            repetition,
            component: numbers[1].map(|(n, _)| n),
            subcomponent: numbers[2].map(|(n, _)| n),
        })
    }

    /// The segment name.
    pub fn segment(&self) -> &[u8] {
        &self.name[..self.name_len as usize]
    }
}

impl FromStr for Path {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.segment()))?;
        if self.occurrence != 1 {
            write!(f, "({})", self.occurrence)?;
        }
        write!(f, "-{}", self.field)?;
        if self.repetition != 1 {
            write!(f, "({})", self.repetition)?;
        }
        if let Some(c) = self.component {
            write!(f, "-{c}")?;
        }
        if let Some(s) = self.subcomponent {
            write!(f, "-{s}")?;
        }
        Ok(())
    }
}

fn take_number(rest: &mut &[u8]) -> Option<usize> {
    let len = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    if len == 0 || len > 6 {
        return None;
    }
    let n = rest[..len]
        .iter()
        .fold(0usize, |acc, c| acc * 10 + usize::from(c - b'0'));
    *rest = &rest[len..];
    (n >= 1).then_some(n)
}

fn take_index(rest: &mut &[u8]) -> Result<Option<usize>, &'static str> {
    if rest.first() != Some(&b'(') {
        return Ok(None);
    }
    *rest = &rest[1..];
    let n = take_number(rest).ok_or("expected a number of 1 or more in parentheses")?;
    if rest.first() != Some(&b')') {
        return Err("expected ')'");
    }
    *rest = &rest[1..];
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let p = Path::parse("PID-3(2)-4-1").unwrap();
        assert_eq!(p.segment(), b"PID");
        assert_eq!((p.occurrence, p.field, p.repetition), (1, 3, 2));
        assert_eq!((p.component, p.subcomponent), (Some(4), Some(1)));
        let p = Path::parse("OBX(3)-5").unwrap();
        assert_eq!((p.occurrence, p.field, p.component), (3, 5, None));
        assert_eq!(
            Path::parse("PID.5.1").unwrap(),
            Path::parse("PID-5-1").unwrap()
        );
        assert_eq!(Path::parse("ZPI-1").unwrap().segment(), b"ZPI");
        assert_eq!(
            Path::parse("OBX(3)-5(2)-1-2").unwrap().to_string(),
            "OBX(3)-5(2)-1-2"
        );
    }

    #[test]
    fn rejects_malformed_paths() {
        for bad in [
            "",
            "P",
            "PID",
            "PID-",
            "PID-0",
            "PID-x",
            "PID(0)-1",
            "PID(1-1",
            "PID-1-2-3-4",
            "PID-1-2(2)",
            "PID 1",
        ] {
            assert!(Path::parse(bad).is_err(), "{bad}");
        }
    }
}
