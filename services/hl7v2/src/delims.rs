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
    /// Reads the field separator and MSH-2 (4 or 5 characters, none of them CR, LF or the field separator).
    /// Encoding characters may repeat, as real senders write (`^~\\&`, `^^^^`) and the reference parser
    /// accepts: splitting goes field, repetition, component, subcomponent, so a character that also names
    /// an earlier level is taken by that level (`^^^^` reads every `^` as a repetition separator).
    pub fn from_msh(field: u8, encoding: &[u8]) -> Option<Self> {
        if !(encoding.len() == 4 || encoding.len() == 5) {
            return None;
        }
        if field == b'\r' || field == b'\n' {
            return None;
        }
        if encoding
            .iter()
            .any(|b| *b == b'\r' || *b == b'\n' || *b == field)
        {
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
