//! The IG's data type maps (CX, EI, XPN, XAD, XTN, CWE, DTM, NM, PL, HD, XCN): what every segment map
//! writes its fields with, mostly as `impl Ctx` blocks, one file per data type.

pub(crate) mod cwe;
pub(crate) mod cx;
pub(crate) mod dtm;
pub(crate) mod hd;
pub(crate) mod nm;
pub(crate) mod pl;
pub(crate) mod xad;
pub(crate) mod xcn;
pub(crate) mod xpn;
pub(crate) mod xtn;

use hl7v2::message::Value;

/// The first `N` components of a value, split once ([`Value::component`] splits it again on every call).
fn components<const N: usize>(v: Value<'_>) -> [Option<Value<'_>>; N] {
    first_n(v.components())
}

/// The first `N` items of `parts` (components or subcomponents), the rest `None`.
fn first_n<'v, const N: usize>(parts: impl Iterator<Item = Value<'v>>) -> [Option<Value<'v>>; N] {
    let mut out = [None; N];
    for (slot, c) in out.iter_mut().zip(parts) {
        *slot = Some(c);
    }
    out
}
