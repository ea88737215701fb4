//! A consumer error that stops all reading (the topic missing, not authorised), held for readiness: librdkafka
//! may report it once only, so it holds until a record is read or the assignment changes.

use std::sync::Mutex;

/// The last such error and the rebalance generation it came in ([`super::Assignment::generation`]).
#[derive(Debug, Default)]
pub struct Unreadable(Mutex<Option<(u64, String)>>);

impl Unreadable {
    /// Records `why`, reported while the consumer's generation was `generation`.
    pub fn set(&self, generation: u64, why: String) {
        if let Ok(mut u) = self.0.lock() {
            *u = Some((generation, why));
        }
    }

    /// A record was read: the topic is readable.
    pub fn clear(&self) {
        if let Ok(mut u) = self.0.lock() {
            *u = None;
        }
    }

    /// The error, if it came in `generation` (the consumer's now): a later assignment may read again.
    pub fn reason(&self, generation: u64) -> Option<String> {
        let u = self.0.lock().ok()?;
        match u.as_ref() {
            Some((g, why)) if *g == generation => Some(why.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_holds_for_its_generation_until_a_record_is_read() {
        let u = Unreadable::default();
        assert_eq!(u.reason(1), None);
        u.set(1, "Broker: Topic authorization failed".into());
        assert_eq!(
            u.reason(1).as_deref(),
            Some("Broker: Topic authorization failed")
        );
        assert_eq!(u.reason(2), None, "a new assignment may read");
        u.clear();
        assert_eq!(u.reason(1), None);
    }
}
