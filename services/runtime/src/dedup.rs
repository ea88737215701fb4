//! Duplicate suppression, bounded in time and in size, per process. The ingress remembers the first ACK of a
//! (sending application, sending facility, MSH-10) and replays it to a resend; the egress remembers what it
//! delivered so a redelivery after a crash or rebalance is not sent again. A duplicate that lands on another
//! pod is not caught, which consumers tolerate: delivery is at least once.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Remembers the ACKs of recently accepted messages.
#[derive(Debug)]
pub struct Dedup {
    window: Duration,
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    acks: HashMap<Box<[u8]>, Bytes>,
    order: VecDeque<(Instant, Box<[u8]>)>,
}

/// The key of a message: its sender and control id.
pub fn key(app: &[u8], facility: &[u8], control_id: &[u8]) -> Box<[u8]> {
    let mut k = Vec::with_capacity(app.len() + facility.len() + control_id.len() + 2);
    k.extend_from_slice(app);
    k.push(0);
    k.extend_from_slice(facility);
    k.push(0);
    k.extend_from_slice(control_id);
    k.into_boxed_slice()
}

impl Dedup {
    /// A cache of at most `capacity` ACKs kept for `window` (either 0 turns it off).
    pub fn new(window: Duration, capacity: usize) -> Self {
        Self {
            window,
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// True when duplicates are tracked.
    pub fn enabled(&self) -> bool {
        !self.window.is_zero() && self.capacity > 0
    }

    /// The ACK first sent for `key`, if it was accepted within the window.
    pub fn lookup(&self, key: &[u8], now: Instant) -> Option<Bytes> {
        if !self.enabled() {
            return None;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.expire(now, self.window);
        g.acks.get(key).cloned()
    }

    /// Remembers the ACK of an accepted message.
    pub fn remember(&self, key: Box<[u8]>, ack: Bytes, now: Instant) {
        if !self.enabled() {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.expire(now, self.window);
        while g.acks.len() >= self.capacity {
            match g.order.pop_front() {
                Some((_, k)) => {
                    g.acks.remove(&k);
                }
                None => break,
            }
        }
        if g.acks.insert(key.clone(), ack).is_none() {
            g.order.push_back((now, key));
        }
    }

    /// Number of remembered messages.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .acks
            .len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    fn expire(&mut self, now: Instant, window: Duration) {
        while let Some((t, _)) = self.order.front() {
            if now.duration_since(*t) < window {
                break;
            }
            if let Some((_, k)) = self.order.pop_front() {
                self.acks.remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_within_the_window_and_forgets_after() {
        let d = Dedup::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        let k = key(b"APP", b"FAC", b"1");
        assert!(d.lookup(&k, t0).is_none());
        d.remember(k.clone(), Bytes::from_static(b"ACK1"), t0);
        assert_eq!(
            d.lookup(&k, t0 + Duration::from_secs(9)).unwrap(),
            &b"ACK1"[..]
        );
        assert!(d.lookup(&key(b"APP", b"FAC2", b"1"), t0).is_none());
        assert!(d.lookup(&k, t0 + Duration::from_secs(10)).is_none());
        assert!(d.is_empty());
    }

    #[test]
    fn bounded_in_size() {
        let d = Dedup::new(Duration::from_secs(10), 3);
        let t = Instant::now();
        for i in 0..10u8 {
            d.remember(key(b"A", b"F", &[b'0' + i]), Bytes::new(), t);
        }
        assert_eq!(d.len(), 3);
        assert!(d.lookup(&key(b"A", b"F", b"9"), t).is_some());
        assert!(d.lookup(&key(b"A", b"F", b"0"), t).is_none());
    }

    #[test]
    fn off_when_window_or_capacity_is_zero() {
        let d = Dedup::new(Duration::ZERO, 10);
        let t = Instant::now();
        d.remember(key(b"A", b"F", b"1"), Bytes::new(), t);
        assert!(d.lookup(&key(b"A", b"F", b"1"), t).is_none());
    }
}
