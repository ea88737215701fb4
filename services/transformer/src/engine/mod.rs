//! Compiled routes: matching a message against `HL7Route`s and running their transform steps.
//!
//! A route is compiled once (paths parsed, regexes built, rules checked) so that a bad route is refused when it
//! is loaded, with a reason, instead of failing message by message.
//!
//! The files: `types` (a compiled route and its parts), `compile` (compiling and matching), `glob`, `steps`
//! (running the transform steps), `json` (the canonical JSON), `index` (the live set of routes).

mod compile;
mod glob;
mod index;
mod json;
mod steps;
mod types;

pub use compile::fhir_options;
pub use index::Routes;
pub use json::to_json;
pub use types::*;

#[cfg(test)]
mod tests;
