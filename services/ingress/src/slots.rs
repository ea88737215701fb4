//! MLLP connection slots: at most `max_connections` open, and at the limit a new connection takes the slot of
//! one that is doing nothing for anyone: first the oldest that never completed a frame (a scanner, an idle or a
//! slowloris client: a real sender sends its message as soon as it connects), then the one that completed no
//! frame for longest, past `evict_after`, with nothing unanswered, then one whose answers have not been read for
//! `evict_after`. Idle, slow and never-reading clients then cost only themselves, even when they reconnect as
//! fast as they are closed: a real sender gets in and, once it sends, keeps its slot; a sender whose connection
//! was closed while idle simply reconnects.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// New connections that may wait at once for the slot of a connection being closed for them; beyond, a new
/// connection at the limit is refused.
const MAX_WAITING: usize = 64;

/// How long a new connection waits for the slot of the connection it evicted.
const EVICTION_WAIT: Duration = Duration::from_secs(5);

/// The listener's slots and the progress of every open connection.
#[derive(Debug)]
pub struct Slots {
    free: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Arc<Progress>>>,
    base: Instant,
    evict_after: Duration,
    waiting: AtomicUsize,
}

/// What a connection did lately, as the eviction sees it.
#[derive(Debug)]
pub struct Progress {
    /// Milliseconds from the listener's start to the connection's last complete frame (or its opening).
    last_frame_ms: AtomicU64,
    /// Milliseconds from the listener's start to its opening.
    opened_ms: u64,
    /// It completed a frame.
    proven: AtomicBool,
    /// 1 + milliseconds from the listener's start to when the write of its answers blocked (0: not blocked).
    write_blocked_ms: AtomicU64,
    /// Messages read and not yet answered.
    unanswered: AtomicUsize,
    /// Cancelled when the connection is to close for a new one.
    pub evicted: CancellationToken,
    base: Instant,
}

impl Progress {
    /// A complete frame was read.
    pub fn frame(&self) {
        self.last_frame_ms
            .store(ms_since(self.base), Ordering::Relaxed);
        self.proven.store(true, Ordering::Relaxed);
    }

    /// Answers are being written (the write may block on a peer that does not read).
    pub fn writing(&self) {
        self.write_blocked_ms
            .store(ms_since(self.base) + 1, Ordering::Relaxed);
    }

    /// The write finished.
    pub fn written(&self) {
        self.write_blocked_ms.store(0, Ordering::Relaxed);
    }

    /// How good a victim it is at `now` (lower first), or `None` when it is doing something for someone.
    fn eviction_rank(&self, now: u64, min_age: u64) -> Option<(u8, u64)> {
        if self.evicted.is_cancelled() {
            return None;
        }
        let unanswered = self.unanswered.load(Ordering::Relaxed);
        if !self.proven.load(Ordering::Relaxed) && unanswered == 0 {
            return Some((0, self.opened_ms));
        }
        let last = self.last_frame_ms.load(Ordering::Relaxed);
        if unanswered == 0 && now.saturating_sub(last) >= min_age {
            return Some((1, last));
        }
        let blocked = self.write_blocked_ms.load(Ordering::Relaxed);
        if blocked != 0 && now.saturating_sub(blocked - 1) >= min_age {
            return Some((2, blocked));
        }
        None
    }

    /// A message was read; its answer is due.
    pub fn read(&self) {
        self.unanswered.fetch_add(1, Ordering::Relaxed);
    }

    /// A message was answered (or dropped unanswered).
    pub fn answered(&self) {
        self.unanswered.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    id: u64,
    slots: Arc<Slots>,
    pub progress: Arc<Progress>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.slots.open).remove(&self.id);
    }
}

/// How a new connection got its slot.
#[derive(Debug)]
pub enum Taken {
    /// A free slot.
    Free(Slot),
    /// Another connection is being closed for it: wait for its slot with [`Slots::wait`].
    Evicting,
    /// Every slot is held by a connection that made progress lately or waits for answers.
    Refused,
}

impl Slots {
    /// `max` slots; `evict_after` 0 never evicts.
    pub fn new(max: usize, evict_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            free: Arc::new(Semaphore::new(max)),
            open: Mutex::new(HashMap::new()),
            base: Instant::now(),
            evict_after,
            waiting: AtomicUsize::new(0),
        })
    }

    /// A free slot for connection `id` at once, or else the eviction of the stalest connection (without
    /// waiting: the accept loop goes on).
    pub fn take(self: &Arc<Self>, id: u64) -> Taken {
        if let Ok(p) = self.free.clone().try_acquire_owned() {
            return Taken::Free(self.slot(id, p));
        }
        if self.evict_after.is_zero() || self.waiting.load(Ordering::Relaxed) >= MAX_WAITING {
            return Taken::Refused;
        }
        let now = ms_since(self.base);
        let min_age = self.evict_after.as_millis() as u64;
        let open = lock(&self.open);
        let victim = open
            .values()
            .filter_map(|p| Some((p.eviction_rank(now, min_age)?, p)))
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, p)| p);
        match victim {
            Some(v) => {
                v.evicted.cancel();
                self.waiting.fetch_add(1, Ordering::Relaxed);
                Taken::Evicting
            }
            None => Taken::Refused,
        }
    }

    /// After [`Taken::Evicting`]: the slot once the evicted connection has closed, or `None` after a bounded
    /// wait.
    pub async fn wait(self: &Arc<Self>, id: u64) -> Option<Slot> {
        let got = tokio::time::timeout(EVICTION_WAIT, self.free.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        match got {
            Ok(Ok(p)) => Some(self.slot(id, p)),
            _ => None,
        }
    }

    fn slot(self: &Arc<Self>, id: u64, permit: OwnedSemaphorePermit) -> Slot {
        let opened_ms = ms_since(self.base);
        let progress = Arc::new(Progress {
            last_frame_ms: AtomicU64::new(opened_ms),
            opened_ms,
            proven: AtomicBool::new(false),
            write_blocked_ms: AtomicU64::new(0),
            unanswered: AtomicUsize::new(0),
            evicted: CancellationToken::new(),
            base: self.base,
        });
        lock(&self.open).insert(id, progress.clone());
        Slot {
            _permit: permit,
            id,
            slots: self.clone(),
            progress,
        }
    }
}

fn ms_since(base: Instant) -> u64 {
    base.elapsed().as_millis() as u64
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the limit, a connection that never completed a frame goes first (the oldest), then the stalest
    /// idle one; one with a message waiting for its answer and one that just completed a frame are kept, until
    /// its answers go unread for `evict_after`.
    #[tokio::test]
    async fn the_stalest_idle_connection_makes_room() {
        let slots = Slots::new(3, Duration::from_millis(50));
        let take = |id| match slots.take(id) {
            Taken::Free(s) => s,
            _ => panic!("free"),
        };
        let (a, b, c) = (take(1), take(2), take(3));
        for s in [&a, &b, &c] {
            s.progress.frame();
        }
        a.progress.read();
        assert!(
            matches!(slots.take(4), Taken::Refused),
            "nobody is stale yet"
        );
        let d = {
            drop(c);
            take(4)
        };
        assert!(matches!(slots.take(5), Taken::Evicting));
        assert!(
            d.progress.evicted.is_cancelled(),
            "the one without a frame goes first"
        );
        drop(d);
        let e = slots.wait(5).await.expect("the evicted one's slot");
        e.progress.frame();
        e.progress.read();
        tokio::time::sleep(Duration::from_millis(80)).await;
        b.progress.frame();
        // a and e wait for answers, b just completed a frame: nobody.
        assert!(matches!(slots.take(6), Taken::Refused));
        a.progress.writing();
        tokio::time::sleep(Duration::from_millis(80)).await;
        b.progress.frame();
        // a's answers have not been read for longer than evict_after.
        assert!(matches!(slots.take(6), Taken::Evicting));
        assert!(a.progress.evicted.is_cancelled());
    }

    #[test]
    fn evict_after_zero_refuses() {
        let slots = Slots::new(1, Duration::ZERO);
        let _a = slots.take(1);
        assert!(matches!(slots.take(2), Taken::Refused));
    }
}
