//! Duplicate suppression, bounded in time, in entries and in bytes, per process. The ingress remembers the
//! first ACK of a (sending application, sending facility, MSH-10) together with a digest of the message, and
//! replays it only to a resend of the same bytes: a reused control id with other content is a new message.
//! The egress remembers which outputs (envelope id, route) it delivered, so a redelivery after a crash or a
//! rebalance is not sent again. Keys and digests are keyed SipHash values (random keys per process), so an
//! entry's size does not depend on the message and crafted collisions are out of a sender's reach. A
//! duplicate that lands on another pod is not caught, which consumers tolerate: delivery is at least once.
//! A resend that arrives while its first copy still waits for Kafka waits for that copy's answer
//! ([`Dedup::claim`]), so it is published once and answered with the same ACK.

use bytes::Bytes;
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What one remembered message costs besides its ACK bytes: the map entry, the expiry queue slot and the
/// allocator's share (measured order of magnitude, not exact).
pub const ENTRY_OVERHEAD_BYTES: usize = 96;

/// A message's identity in the window (a keyed hash of its identifying fields).
pub type Key = u64;

/// The answer of [`Dedup::lookup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Not remembered (or duplicates are off).
    New,
    /// The same key with the same content: a resend; its first ACK.
    Resend(Bytes),
    /// The same key with other content: a reused control id, a new message.
    Reused,
}

/// What a resend waiting on its first copy learns: `None` while the copy is in flight, then `Some(ACK)` when
/// it was accepted and remembered, or `Some(None)` when it was not (NAK, timeout, connection gone).
pub type FirstCopy = Option<Option<Bytes>>;

/// The answer of [`Dedup::claim`].
#[derive(Debug)]
pub enum Claimed {
    /// Neither remembered nor in flight: publish it, holding the claim until its answer is known.
    New(Claim),
    /// The same key with other content (remembered or in flight): a reused control id, a new message.
    Reused(Claim),
    /// A resend of a remembered message: its first ACK.
    Resend(Bytes),
    /// A resend of a message still in flight: wait for its first copy's outcome.
    InFlight(watch::Receiver<FirstCopy>),
}

/// A message being published, registered so a resend of it waits instead of publishing again. Dropped
/// without [`Claim::accepted`], its waiters learn the first copy failed.
#[derive(Debug)]
pub struct Claim {
    pending: Arc<Mutex<HashMap<Key, InFlight>>>,
    key: Key,
    token: u64,
    tx: watch::Sender<FirstCopy>,
}

#[derive(Debug)]
struct InFlight {
    digest: u64,
    token: u64,
    rx: watch::Receiver<FirstCopy>,
}

impl Claim {
    /// The message was accepted and remembered with `ack` (call after [`Dedup::remember`]): waiting resends
    /// answer with it.
    pub fn accepted(&self, ack: Bytes) {
        self.tx.send_replace(Some(Some(ack)));
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.get(&self.key).is_some_and(|e| e.token == self.token) {
            p.remove(&self.key);
        }
        drop(p);
        self.tx.send_if_modified(|v| {
            let unset = v.is_none();
            if unset {
                *v = Some(None);
            }
            unset
        });
    }
}

/// Remembers recently accepted messages, and the ones in flight.
#[derive(Debug)]
pub struct Dedup {
    window: Duration,
    capacity: usize,
    max_bytes: usize,
    keys: RandomState,
    digests: RandomState,
    inner: Mutex<Inner>,
    pending: Arc<Mutex<HashMap<Key, InFlight>>>,
    tokens: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    digest: u64,
    ack: Bytes,
    /// The number of its live slot in the expiry queue.
    slot: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    /// Expiry queue: (remembered at, key, slot number). A key remembered again leaves a stale slot behind,
    /// dropped when it comes up or when the queue is compacted.
    order: VecDeque<(Instant, Key, u64)>,
    next_slot: u64,
    bytes: usize,
}

impl Dedup {
    /// A cache of at most `capacity` entries and `max_bytes` bytes, each kept for `window` (any 0 turns it
    /// off).
    pub fn new(window: Duration, capacity: usize, max_bytes: usize) -> Self {
        Self {
            window,
            capacity,
            max_bytes,
            keys: RandomState::new(),
            digests: RandomState::new(),
            inner: Mutex::new(Inner::default()),
            pending: Arc::new(Mutex::new(HashMap::new())),
            tokens: AtomicU64::new(0),
        }
    }

    /// True when duplicates are tracked.
    pub fn enabled(&self) -> bool {
        !self.window.is_zero() && self.capacity > 0 && self.max_bytes > ENTRY_OVERHEAD_BYTES
    }

    /// The key of a message from its identifying parts (each length-prefixed, so `("ab", "c")` and
    /// `("a", "bc")` differ).
    pub fn key(&self, parts: &[&[u8]]) -> Key {
        let mut h = self.keys.build_hasher();
        for p in parts {
            h.write_usize(p.len());
            h.write(p);
        }
        h.finish()
    }

    /// The digest of a message's bytes.
    pub fn digest(&self, payload: &[u8]) -> u64 {
        let mut h = self.digests.build_hasher();
        h.write(payload);
        h.finish()
    }

    /// Whether `key` was accepted within the window, and with the same content (`digest`).
    pub fn lookup(&self, key: Key, digest: u64, now: Instant) -> Seen {
        if !self.enabled() {
            return Seen::New;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.expire(now, self.window);
        match g.entries.get(&key) {
            None => Seen::New,
            Some(e) if e.digest == digest => Seen::Resend(e.ack.clone()),
            Some(_) => Seen::Reused,
        }
    }

    /// Looks `key` up among the remembered and the in-flight messages, and registers it as in flight unless
    /// it is a resend. The in-flight lock is held across the lookup, and a finished copy is remembered before
    /// its claim is released, so a resend always finds its first copy in one place or the other.
    pub fn claim(&self, key: Key, digest: u64, now: Instant) -> Claimed {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut reused = match self.lookup(key, digest, now) {
            Seen::Resend(ack) => return Claimed::Resend(ack),
            Seen::Reused => true,
            Seen::New => false,
        };
        if let Some(e) = p.get(&key) {
            if e.digest == digest {
                return Claimed::InFlight(e.rx.clone());
            }
            reused = true;
        }
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        p.insert(key, InFlight { digest, token, rx });
        drop(p);
        let c = Claim {
            pending: self.pending.clone(),
            key,
            token,
            tx,
        };
        if reused {
            Claimed::Reused(c)
        } else {
            Claimed::New(c)
        }
    }

    /// Remembers an accepted message (replacing what its key held) and its ACK.
    pub fn remember(&self, key: Key, digest: u64, ack: Bytes, now: Instant) {
        if !self.enabled() {
            return;
        }
        let cost = ENTRY_OVERHEAD_BYTES + ack.len();
        if cost > self.max_bytes {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.expire(now, self.window);
        if let Some(old) = g.entries.remove(&key) {
            g.bytes -= ENTRY_OVERHEAD_BYTES + old.ack.len();
        }
        while g.entries.len() >= self.capacity || g.bytes + cost > self.max_bytes {
            if !g.evict_oldest() {
                break;
            }
        }
        g.bytes += cost;
        let slot = g.next_slot;
        g.next_slot += 1;
        g.entries.insert(key, Entry { digest, ack, slot });
        g.order.push_back((now, key, slot));
        // Stale slots of keys remembered again (a sender resending one message in a loop) would otherwise grow
        // the queue without bound while the entries stay few.
        if g.order.len() > 2 * g.entries.len() + 64 {
            g.compact();
        }
    }

    /// Number of remembered messages.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .len()
    }

    /// Bytes held by the remembered messages (their ACKs and the per-entry overhead).
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Drops the oldest queue slot and, if it is still the live one of its key, the entry. False when empty.
    fn evict_oldest(&mut self) -> bool {
        let Some((_, k, slot)) = self.order.pop_front() else {
            return false;
        };
        // A key remembered again has a newer slot further back; this stale one leaves its entry alone.
        if self.entries.get(&k).is_some_and(|e| e.slot == slot)
            && let Some(e) = self.entries.remove(&k)
        {
            self.bytes -= ENTRY_OVERHEAD_BYTES + e.ack.len();
        }
        true
    }

    /// Drops every stale slot: one slot per entry is left.
    fn compact(&mut self) {
        let entries = &self.entries;
        self.order
            .retain(|(_, k, slot)| entries.get(k).is_some_and(|e| e.slot == *slot));
    }

    fn expire(&mut self, now: Instant, window: Duration) {
        while let Some((t, _, _)) = self.order.front() {
            if now.duration_since(*t) < window {
                break;
            }
            self.evict_oldest();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(d: &Dedup, app: &[u8], facility: &[u8], id: &[u8]) -> Key {
        d.key(&[app, facility, id])
    }

    /// A 10 s window of at most 100 entries and 1 MiB, and the time it starts at.
    fn window() -> (Dedup, Instant) {
        (
            Dedup::new(Duration::from_secs(10), 100, 1 << 20),
            Instant::now(),
        )
    }

    #[test]
    fn replays_a_resend_within_the_window_and_forgets_after() {
        let (d, t0) = window();
        let k = key(&d, b"APP", b"FAC", b"1");
        let digest = d.digest(b"MSH|1");
        assert_eq!(d.lookup(k, digest, t0), Seen::New);
        d.remember(k, digest, Bytes::from_static(b"ACK1"), t0);
        assert_eq!(
            d.lookup(k, digest, t0 + Duration::from_secs(9)),
            Seen::Resend(Bytes::from_static(b"ACK1"))
        );
        assert_eq!(
            d.lookup(key(&d, b"APP", b"FAC2", b"1"), digest, t0),
            Seen::New
        );
        assert_eq!(d.lookup(k, digest, t0 + Duration::from_secs(10)), Seen::New);
        assert!(d.is_empty());
        assert_eq!(d.bytes(), 0);
    }

    #[test]
    fn the_same_key_with_other_content_is_a_reused_control_id() {
        let (d, t) = window();
        let k = key(&d, b"APP", b"FAC", b"REUSED-1");
        d.remember(k, d.digest(b"PID|MRN111"), Bytes::from_static(b"ACK1"), t);
        assert_eq!(d.lookup(k, d.digest(b"PID|MRN222"), t), Seen::Reused);
        // The second message replaces the first; its own resend is recognised, the first's is new again.
        d.remember(k, d.digest(b"PID|MRN222"), Bytes::from_static(b"ACK2"), t);
        assert_eq!(
            d.lookup(k, d.digest(b"PID|MRN222"), t),
            Seen::Resend(Bytes::from_static(b"ACK2"))
        );
        assert_eq!(d.len(), 1);
        assert_eq!(d.bytes(), ENTRY_OVERHEAD_BYTES + 4);
    }

    /// Issue 10: a resend that arrives while the first copy is in flight waits for it, then gets its ACK;
    /// when the first copy fails, the waiter learns it and the next resend is new.
    #[test]
    fn a_resend_of_a_message_in_flight_waits_for_its_first_copy() {
        let (d, t) = window();
        let k = key(&d, b"APP", b"FAC", b"1");
        let digest = d.digest(b"MSH|1");
        let Claimed::New(first) = d.claim(k, digest, t) else {
            panic!("new")
        };
        let Claimed::InFlight(mut waiter) = d.claim(k, digest, t) else {
            panic!("in flight")
        };
        assert!(matches!(
            d.claim(k, d.digest(b"other"), t),
            Claimed::Reused(_)
        ));
        assert_eq!(*waiter.borrow_and_update(), None);
        d.remember(k, digest, Bytes::from_static(b"ACK1"), t);
        first.accepted(Bytes::from_static(b"ACK1"));
        drop(first);
        assert_eq!(
            *waiter.borrow_and_update(),
            Some(Some(Bytes::from_static(b"ACK1")))
        );
        assert!(matches!(d.claim(k, digest, t), Claimed::Resend(_)));

        let k2 = key(&d, b"APP", b"FAC", b"2");
        let Claimed::New(first) = d.claim(k2, digest, t) else {
            panic!("new")
        };
        let Claimed::InFlight(mut waiter) = d.claim(k2, digest, t) else {
            panic!("in flight")
        };
        drop(first);
        assert_eq!(*waiter.borrow_and_update(), Some(None));
        assert!(matches!(d.claim(k2, digest, t), Claimed::New(_)));
    }

    #[test]
    fn parts_are_length_prefixed() {
        let (d, _) = window();
        assert_ne!(d.key(&[b"ab", b"c"]), d.key(&[b"a", b"bc"]));
    }

    #[test]
    fn bounded_in_entries() {
        let d = Dedup::new(Duration::from_secs(10), 3, 1 << 20);
        let t = Instant::now();
        for i in 0..10u8 {
            d.remember(key(&d, b"A", b"F", &[b'0' + i]), 0, Bytes::new(), t);
        }
        assert_eq!(d.len(), 3);
        assert!(matches!(
            d.lookup(key(&d, b"A", b"F", b"9"), 0, t),
            Seen::Resend(_)
        ));
        assert_eq!(d.lookup(key(&d, b"A", b"F", b"0"), 0, t), Seen::New);
    }

    /// Issue 9, item 13: large ACKs (long MSH fields echoed back) cannot grow the cache past its byte bound.
    #[test]
    fn bounded_in_bytes() {
        let max = 64 * 1024;
        let d = Dedup::new(Duration::from_secs(10), 1_000_000, max);
        let t = Instant::now();
        let ack = Bytes::from(vec![b'A'; 4000]);
        for i in 0..1000u32 {
            d.remember(d.key(&[&i.to_be_bytes()]), 0, ack.clone(), t);
            assert!(d.bytes() <= max, "{} bytes after {i}", d.bytes());
        }
        assert_eq!(d.len(), max / (4000 + ENTRY_OVERHEAD_BYTES));
        // The newest is kept, the oldest went first.
        assert!(matches!(
            d.lookup(d.key(&[&999u32.to_be_bytes()]), 0, t),
            Seen::Resend(_)
        ));
        assert_eq!(d.lookup(d.key(&[&0u32.to_be_bytes()]), 0, t), Seen::New);
        // An ACK larger than the whole budget is not remembered at all.
        d.remember(1, 0, Bytes::from(vec![0; max]), t);
        assert_eq!(d.lookup(1, 0, t), Seen::New);
    }

    /// Issue 24, item 8: a key remembered again and again leaves one live slot in the expiry queue, not one per
    /// resend (10 million resends of one message held ~240 MB of queue while `len()` said 1).
    #[test]
    fn remembering_one_key_again_keeps_the_expiry_queue_bounded() {
        let d = Dedup::new(Duration::from_secs(3600), 100, 1 << 20);
        let t = Instant::now();
        let k = key(&d, b"A", b"F", b"1");
        for i in 0..100_000u32 {
            d.remember(k, 0, Bytes::new(), t + Duration::from_micros(u64::from(i)));
        }
        assert_eq!(d.len(), 1);
        let slots = d.inner.lock().map(|g| g.order.len()).unwrap_or(usize::MAX);
        assert!(slots <= 2 * 100, "{slots} expiry slots for 1 entry");
        // The live slot survived the compactions: the key is still remembered until its own window ends.
        assert!(matches!(
            d.lookup(k, 0, t + Duration::from_secs(1)),
            Seen::Resend(_)
        ));
    }

    #[test]
    fn off_when_window_or_capacity_is_zero() {
        let d = Dedup::new(Duration::ZERO, 10, 1 << 20);
        let t = Instant::now();
        d.remember(1, 0, Bytes::new(), t);
        assert_eq!(d.lookup(1, 0, t), Seen::New);
        let d = Dedup::new(Duration::from_secs(1), 0, 1 << 20);
        d.remember(1, 0, Bytes::new(), t);
        assert_eq!(d.lookup(1, 0, t), Seen::New);
    }
}
