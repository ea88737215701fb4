//! The delimiters a message declares in MSH-1 and MSH-2.

/// Field, component, repetition, escape and subcomponent separators, and the optional v2.7 truncation character.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delimiters {
    pub field: u8,
    pub component: u8,
    pub repetition: u8,
    pub escape: u8,
    pub subcomponent: u8,
    pub truncation: Option<u8>,
}

impl Default for Delimiters {
    fn default() -> Self {
        Self {
            field: b'|',
            component: b'^',
            repetition: b'~',
            escape: b'\\',
            subcomponent: b'&',
            truncation: None,
        }
    }
}

impl Delimiters {
    /// Reads the field separator and MSH-2 (4 or 5 characters, distinct, none of them CR or LF).
    pub fn from_msh(field: u8, encoding: &[u8]) -> Option<Self> {
        if !(encoding.len() == 4 || encoding.len() == 5) {
            return None;
        }
        let mut all = [0u8; 6];
        all[0] = field;
        all[1..=encoding.len()].copy_from_slice(encoding);
        let all = &all[..=encoding.len()];
        let bad = all
            .iter()
            .enumerate()
            .any(|(i, b)| *b == b'\r' || *b == b'\n' || all[i + 1..].contains(b));
        if bad {
            return None;
        }
        Some(Self {
            field,
            component: encoding[0],
            repetition: encoding[1],
            escape: encoding[2],
            subcomponent: encoding[3],
            truncation: encoding.get(4).copied(),
        })
    }

    /// Writes MSH-1 and MSH-2 as they would appear after `MSH`.
    pub fn write_msh12(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[
            self.field,
            self.component,
            self.repetition,
            self.escape,
            self.subcomponent,
        ]);
        if let Some(t) = self.truncation {
            out.push(t);
        }
    }

    /// True when `b` is one of the delimiters (or the truncation character).
    #[inline]
    pub fn is_delimiter(&self, b: u8) -> bool {
        b == self.field
            || b == self.component
            || b == self.repetition
            || b == self.escape
            || b == self.subcomponent
            || Some(b) == self.truncation
    }
}
