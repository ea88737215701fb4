//! The live set of routes, indexed by message type and trigger, evaluated in their order.

use super::types::Route;
use std::collections::HashMap;
use std::sync::Arc;

/// The live set of compiled routes, in evaluation order, indexed by message type and trigger so a message is
/// matched only against the routes that can take it: the cost per message does not grow with the number of
/// routes for other types.
#[derive(Debug, Default)]
pub struct Routes {
    pub routes: Vec<Arc<Route>>,
    /// The files the routes read (code maps) as they were when compiled (`source::files_fingerprint`).
    pub files: u64,
    /// Positions in `routes` (ascending) by literal message type, then by literal trigger.
    pub(super) by_type: HashMap<String, TypeIndex>,
    /// Routes any message may match: no `messageTypes`, or a type pattern with a wildcard.
    pub(super) any_type: Vec<u32>,
}

#[derive(Debug, Default)]
pub(super) struct TypeIndex {
    /// No trigger, or a trigger pattern with a wildcard.
    pub(super) any_trigger: Vec<u32>,
    pub(super) by_trigger: HashMap<String, Vec<u32>>,
}

impl Routes {
    /// Builds a set from compiled routes, sorted by priority then name.
    pub fn new(mut routes: Vec<Arc<Route>>) -> Self {
        routes.sort_by(|a, b| a.priority.cmp(&b.priority).then(a.name.cmp(&b.name)));
        let mut by_type: HashMap<String, TypeIndex> = HashMap::new();
        let mut any_type = Vec::new();
        for (i, r) in routes.iter().enumerate() {
            let i = i as u32;
            let types = &r.matcher.types;
            if types.is_empty() || types.iter().any(|(ty, _)| !ty.is_literal()) {
                any_type.push(i);
                continue;
            }
            for (ty, tr) in types {
                let t = by_type.entry(ty.pattern.clone()).or_default();
                let list = match tr {
                    Some(tr) if tr.is_literal() => {
                        t.by_trigger.entry(tr.pattern.clone()).or_default()
                    }
                    _ => &mut t.any_trigger,
                };
                // A route listing the same type twice is indexed once.
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        Self {
            routes,
            files: 0,
            by_type,
            any_type,
        }
    }

    /// The routes that may take a message of this type and trigger, in evaluation order (each still checked
    /// with [`Route::matches`]).
    pub fn candidates<'a>(
        &'a self,
        message_type: &str,
        trigger: &str,
    ) -> impl Iterator<Item = &'a Arc<Route>> + 'a {
        let t = self.by_type.get(message_type);
        let any_trigger = t.map_or(&[][..], |t| &t.any_trigger[..]);
        let by_trigger = t
            .and_then(|t| t.by_trigger.get(trigger))
            .map_or(&[][..], |v| &v[..]);
        Merge([&self.any_type[..], any_trigger, by_trigger]).map(|i| &self.routes[i as usize])
    }
}

/// The ascending union of sorted position lists, each position once.
pub(super) struct Merge<'a>([&'a [u32]; 3]);

impl Iterator for Merge<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let next = self.0.iter().filter_map(|l| l.first().copied()).min()?;
        for l in &mut self.0 {
            if l.first() == Some(&next) {
                *l = &l[1..];
            }
        }
        Some(next)
    }
}
