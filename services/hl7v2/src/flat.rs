//! The canonical flat view (`SEG(occ)-FIELD(rep)-COMP-SUB` = value), the differential-test format.

use crate::Message;
use crate::escape::unescape_flat;
use crate::message::Segment;
use std::borrow::Cow;
use std::fmt;

/// One non-empty leaf value with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatEntry<'a> {
    pub segment: &'a [u8],
    pub occurrence: usize,
    pub field: usize,
    pub repetition: usize,
    pub component: usize,
    pub subcomponent: usize,
    /// Escape-decoded as the flat format says (formatting sequences kept).
    pub value: Cow<'a, [u8]>,
}

impl FlatEntry<'_> {
    /// The key, e.g. `PID(1)-3(2)-1-1`; segment name bytes map 1:1 to chars (Latin-1).
    pub fn key(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for FlatEntry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &b in self.segment {
            fmt::Write::write_char(f, char::from(b))?;
        }
        write!(
            f,
            "({})-{}({})-{}-{}",
            self.occurrence, self.field, self.repetition, self.component, self.subcomponent
        )
    }
}

/// Flattens segments in order, counting occurrences per name over all of them.
pub(crate) fn flatten<'a>(segments: impl Iterator<Item = Segment<'a>>) -> Vec<FlatEntry<'a>> {
    let mut out = Vec::new();
    let mut seen: Vec<(&'a [u8], usize)> = Vec::new();
    for seg in segments {
        let name = seg.name();
        let occurrence = match seen.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => {
                *c += 1;
                *c
            }
            None => {
                seen.push((name, 1));
                1
            }
        };
        let d = *seg.delimiters();
        let header = seg.is_header();
        for (field, value) in seg.fields() {
            if header && field <= 2 {
                if !value.is_empty() {
                    out.push(FlatEntry {
                        segment: name,
                        occurrence,
                        field,
                        repetition: 1,
                        component: 1,
                        subcomponent: 1,
                        value: Cow::Borrowed(value.raw()),
                    });
                }
                continue;
            }
            if value.is_empty() {
                continue;
            }
            for (r, rep) in value.repetitions().enumerate() {
                for (c, comp) in rep.components().enumerate() {
                    for (s, sub) in comp.subcomponents().enumerate() {
                        if sub.is_empty() {
                            continue;
                        }
                        out.push(FlatEntry {
                            segment: name,
                            occurrence,
                            field,
                            repetition: r + 1,
                            component: c + 1,
                            subcomponent: s + 1,
                            value: unescape_flat(sub.raw(), &d),
                        });
                    }
                }
            }
        }
    }
    out
}

impl<'a> Message<'a> {
    /// The canonical flat view of the message: every non-empty leaf in wire order.
    pub fn flat(&self) -> Vec<FlatEntry<'a>> {
        flatten(self.segments())
    }
}

#[cfg(test)]
mod tests {
    use crate::Message;

    #[test]
    fn the_documented_example() {
        let m = Message::parse(
            b"MSH|^~\\&|A|B|||20200101||ADT^A01|1|P|2.5\rPID|1||X^Y&Z~Q&R^S||A&B|x\\F\\y\rOBX|1\rNTE|1\rOBX|2|TX",
        )
        .unwrap();
        let got: Vec<String> = m
            .flat()
            .iter()
            .map(|e| format!("{}={}", e.key(), String::from_utf8_lossy(&e.value)))
            .collect();
        let want = [
            "MSH(1)-1(1)-1-1=|",
            "MSH(1)-2(1)-1-1=^~\\&",
            "MSH(1)-3(1)-1-1=A",
            "MSH(1)-4(1)-1-1=B",
            "MSH(1)-7(1)-1-1=20200101",
            "MSH(1)-9(1)-1-1=ADT",
            "MSH(1)-9(1)-2-1=A01",
            "MSH(1)-10(1)-1-1=1",
            "MSH(1)-11(1)-1-1=P",
            "MSH(1)-12(1)-1-1=2.5",
            "PID(1)-1(1)-1-1=1",
            "PID(1)-3(1)-1-1=X",
            "PID(1)-3(1)-2-1=Y",
            "PID(1)-3(1)-2-2=Z",
            "PID(1)-3(2)-1-1=Q",
            "PID(1)-3(2)-1-2=R",
            "PID(1)-3(2)-2-1=S",
            "PID(1)-5(1)-1-1=A",
            "PID(1)-5(1)-1-2=B",
            "PID(1)-6(1)-1-1=x|y",
            "OBX(1)-1(1)-1-1=1",
            "NTE(1)-1(1)-1-1=1",
            "OBX(2)-1(1)-1-1=2",
            "OBX(2)-2(1)-1-1=TX",
        ];
        assert_eq!(got, want);
    }
}
