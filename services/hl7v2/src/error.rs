//! Typed parse errors, each with the byte offset where it was found and the HL7 table 0357 code an ACK carries.

use std::fmt;

/// HL7 table 0357 (message error condition codes): what an ERR segment reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// 0: message accepted.
    Accepted,
    /// 100: segment sequence error.
    SegmentSequence,
    /// 101: required field missing.
    RequiredFieldMissing,
    /// 102: data type error.
    DataType,
    /// 103: table value not found.
    TableValueNotFound,
    /// 104: value too long (v2.7+).
    ValueTooLong,
    /// 200: unsupported message type.
    UnsupportedMessageType,
    /// 201: unsupported event code.
    UnsupportedEventCode,
    /// 202: unsupported processing id.
    UnsupportedProcessingId,
    /// 203: unsupported version id.
    UnsupportedVersionId,
    /// 204: unknown key identifier.
    UnknownKeyIdentifier,
    /// 205: duplicate key identifier.
    DuplicateKeyIdentifier,
    /// 206: application record locked.
    ApplicationRecordLocked,
    /// 207: application internal error (also "system unavailable, resend").
    ApplicationInternalError,
}

impl ErrorCode {
    /// The numeric code of table 0357.
    pub const fn code(self) -> u16 {
        match self {
            Self::Accepted => 0,
            Self::SegmentSequence => 100,
            Self::RequiredFieldMissing => 101,
            Self::DataType => 102,
            Self::TableValueNotFound => 103,
            Self::ValueTooLong => 104,
            Self::UnsupportedMessageType => 200,
            Self::UnsupportedEventCode => 201,
            Self::UnsupportedProcessingId => 202,
            Self::UnsupportedVersionId => 203,
            Self::UnknownKeyIdentifier => 204,
            Self::DuplicateKeyIdentifier => 205,
            Self::ApplicationRecordLocked => 206,
            Self::ApplicationInternalError => 207,
        }
    }

    /// The table's text for the code.
    pub const fn text(self) -> &'static str {
        match self {
            Self::Accepted => "Message accepted",
            Self::SegmentSequence => "Segment sequence error",
            Self::RequiredFieldMissing => "Required field missing",
            Self::DataType => "Data type error",
            Self::TableValueNotFound => "Table value not found",
            Self::ValueTooLong => "Value too long",
            Self::UnsupportedMessageType => "Unsupported message type",
            Self::UnsupportedEventCode => "Unsupported event code",
            Self::UnsupportedProcessingId => "Unsupported processing id",
            Self::UnsupportedVersionId => "Unsupported version id",
            Self::UnknownKeyIdentifier => "Unknown key identifier",
            Self::DuplicateKeyIdentifier => "Duplicate key identifier",
            Self::ApplicationRecordLocked => "Application record locked",
            Self::ApplicationInternalError => "Application internal error",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code(), self.text())
    }
}

/// Why a message could not be parsed. Every variant carries the byte offset (into the input given to the parser).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// Nothing but whitespace (or a BOM).
    #[error("empty message")]
    Empty,
    /// The input is larger than the parser's 4 GiB offset range.
    #[error("message of {len} bytes is too large")]
    TooLarge { len: usize },
    /// The first segment is not `MSH`.
    #[error("message does not start with MSH at byte {offset}")]
    MissingMsh { offset: usize },
    /// MSH ends before its field separator.
    #[error("MSH has no field separator at byte {offset}")]
    MissingFieldSeparator { offset: usize },
    /// MSH-2 is not 4 or 5 characters, or holds CR, LF or the field separator.
    #[error("bad encoding characters in MSH-2 at byte {offset}")]
    BadEncodingCharacters { offset: usize },
    /// A segment's fourth character is not the field separator (its name is not three characters).
    #[error(
        "segment at byte {offset} does not have a three-character name followed by the field separator"
    )]
    BadSegmentName { offset: usize },
    /// The message has fewer than 11 field separators (MSH-12 cannot be there).
    #[error("message too short: fewer than 12 MSH fields (at byte {offset})")]
    TooFewFields { offset: usize },
    /// MSH-9 is missing, or has no message type, or no trigger event on a message other than ACK.
    #[error("MSH-9 message type missing or incomplete at byte {offset}")]
    MissingMessageType { offset: usize },
    /// MSH-12 is present but its version id is empty.
    #[error("MSH-12 version id empty at byte {offset}")]
    MissingVersion { offset: usize },
}

impl ParseError {
    /// The byte offset where the problem was found.
    pub fn offset(&self) -> usize {
        match *self {
            Self::Empty => 0,
            Self::TooLarge { .. } => 0,
            Self::MissingMsh { offset }
            | Self::MissingFieldSeparator { offset }
            | Self::BadEncodingCharacters { offset }
            | Self::BadSegmentName { offset }
            | Self::TooFewFields { offset }
            | Self::MissingMessageType { offset }
            | Self::MissingVersion { offset } => offset,
        }
    }

    /// The HL7 table 0357 code an ACK for this error carries.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Empty | Self::MissingMsh { .. } | Self::BadSegmentName { .. } => {
                ErrorCode::SegmentSequence
            }
            Self::TooLarge { .. } => ErrorCode::ApplicationInternalError,
            Self::MissingFieldSeparator { .. }
            | Self::BadEncodingCharacters { .. }
            | Self::TooFewFields { .. } => ErrorCode::RequiredFieldMissing,
            Self::MissingMessageType { .. } => ErrorCode::UnsupportedMessageType,
            Self::MissingVersion { .. } => ErrorCode::UnsupportedVersionId,
        }
    }

    /// A short, bounded label for metrics and logs (never carries message content).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::TooLarge { .. } => "too_large",
            Self::MissingMsh { .. } => "missing_msh",
            Self::MissingFieldSeparator { .. } => "missing_field_separator",
            Self::BadEncodingCharacters { .. } => "bad_encoding_characters",
            Self::BadSegmentName { .. } => "bad_segment_name",
            Self::TooFewFields { .. } => "too_few_fields",
            Self::MissingMessageType { .. } => "missing_message_type",
            Self::MissingVersion { .. } => "missing_version",
        }
    }
}
