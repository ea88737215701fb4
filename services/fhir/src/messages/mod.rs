//! The IG's message maps, one file per message structure: each groups its message's segments, works out the
//! resources' targets, then writes the Bundle through the segment and data type maps (the entries they write
//! alike in `common`).

pub(crate) mod adt;
pub(crate) mod common;
pub(crate) mod mdm;
pub(crate) mod order;
pub(crate) mod siu;
pub(crate) mod vxu;

/// What a message map's `convert(cx, kind, out)` returns: how the Bundle it wrote into `out` came out, or why
/// it wrote none.
pub(crate) type Converted = Result<crate::Outcome, crate::FhirError>;
