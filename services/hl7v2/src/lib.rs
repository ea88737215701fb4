//! hl7v2: a zero-copy HL7 v2 parser, encoder, ACK builder and MLLP codec.
//!
//! Parsing works on bytes (`&[u8]`), never on `str`: HL7 arrives in Latin-1, UTF-8 and worse, and text is
//! decoded only where a caller asks ([`charset`]). [`Message::parse`] indexes segments and validates the
//! header; fields, repetitions, components and subcomponents are split on access and borrow from the input.

pub mod delims;
pub mod error;
pub mod escape;
pub mod flat;
pub mod header;
pub mod message;
pub mod path;
mod scan;

pub use delims::Delimiters;
pub use error::{ErrorCode, ParseError};
pub use flat::FlatEntry;
pub use header::Header;
pub use message::{Message, Segment, Value};
pub use path::{Path, PathError};
pub mod batch;
pub use batch::{Batch, Split, is_batch};

/// The flat view of a file: a batch (FHS/BHS first) or a single message.
pub fn flat_file(input: &[u8]) -> Result<Vec<FlatEntry<'_>>, FileError> {
    if batch::is_batch(input) {
        Ok(Batch::parse(input)?.flat())
    } else {
        Ok(Message::parse(input)?.flat())
    }
}

/// Why a file (message or batch) could not be flattened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    #[error(transparent)]
    Message(#[from] ParseError),
    #[error(transparent)]
    Batch(#[from] batch::BatchError),
}
pub mod ack;
pub use ack::{AckCode, AckError, AckIds, Outcome, ack_code, hl7_timestamp, read_ack, write_ack};
pub mod edit;
pub use edit::{Edit, EditError};
pub mod mllp;
pub use mllp::{MllpCodec, MllpError};
pub mod charset;
pub use charset::{Charset, CharsetError, TextDecoder};
