//! Reading an ACK: the class (MSA-1) and whether it answers the message sent (MSA-2).

use hl7v2::Message;
use hl7v2::ack::AckCode;

/// What an ACK said, as counted: one of the six codes, or `invalid` (not HL7, no MSA, unknown MSA-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckClass {
    Code(AckCode),
    Invalid,
}

/// Number of classes (index space of [`AckClass::index`]).
pub const CLASSES: usize = 7;

/// Class names, by index.
pub const CLASS_NAMES: [&str; CLASSES] = ["AA", "AE", "AR", "CA", "CE", "CR", "invalid"];

impl AckClass {
    /// A dense index, for counters.
    pub fn index(self) -> usize {
        match self {
            Self::Code(c) => c.index(),
            Self::Invalid => AckCode::ALL.len(),
        }
    }

    /// True for AA and CA: the receiver took responsibility for the message.
    pub fn is_accept(self) -> bool {
        matches!(self, Self::Code(AckCode::AA | AckCode::CA))
    }
}

/// The verdict on one ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckCheck {
    pub class: AckClass,
    /// MSA-2 equals the control id sent.
    pub id_matches: bool,
}

impl AckCheck {
    /// AA/CA for exactly the message sent: the only case recorded as acknowledged.
    pub fn accepted(self) -> bool {
        self.class.is_accept() && self.id_matches
    }
}

/// Classifies `frame` (an MLLP payload) as the answer to the message with control id `sent`.
pub fn check(frame: &[u8], sent: &[u8]) -> AckCheck {
    let Ok(m) = Message::parse(frame) else {
        return AckCheck {
            class: AckClass::Invalid,
            id_matches: false,
        };
    };
    let class = m
        .get("MSA-1")
        .and_then(AckCode::parse)
        .map_or(AckClass::Invalid, AckClass::Code);
    let id_matches = m.get("MSA-2") == Some(sent);
    AckCheck { class, id_matches }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(msa: &str) -> Vec<u8> {
        format!("MSH|^~\\&|GW|GW|LOAD|LOAD|20260101000000||ACK^A01^ACK|A1|P|2.5\r{msa}\r")
            .into_bytes()
    }

    #[test]
    fn classifies_every_code() {
        for (i, code) in ["AA", "AE", "AR", "CA", "CE", "CR"].iter().enumerate() {
            let c = check(&ack(&format!("MSA|{code}|ID1")), b"ID1");
            assert_eq!(c.class.index(), i);
            assert_eq!(CLASS_NAMES[i], *code);
            assert!(c.id_matches);
            assert_eq!(c.accepted(), *code == "AA" || *code == "CA");
        }
    }

    #[test]
    fn invalid_acks() {
        for frame in [
            b"garbage".to_vec(),
            ack("MSA|XX|ID1"),
            ack("MSA||ID1"),
            ack("ERR|1"),
            Vec::new(),
        ] {
            let c = check(&frame, b"ID1");
            assert_eq!(
                c.class,
                AckClass::Invalid,
                "{:?}",
                String::from_utf8_lossy(&frame)
            );
            assert!(!c.accepted());
        }
    }

    #[test]
    fn mismatched_control_id_is_not_accepted() {
        let c = check(&ack("MSA|AA|OTHER"), b"ID1");
        assert!(c.class.is_accept());
        assert!(!c.id_matches);
        assert!(!c.accepted());
        let c = check(&ack("MSA|AA"), b"ID1");
        assert!(!c.accepted());
    }
}
