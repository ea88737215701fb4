//! MLLP connection slots: at most `max_connections` open, and at the limit a new connection takes the slot of
//! the one that has completed no frame for longest (idle, or trickling bytes into a frame that never ends) when
//! that is longer than `evict_after` and nothing of it waits for an answer. Idle and slow clients then cost only
//! themselves: a real sender gets in, and a sender whose connection was closed while idle simply reconnects.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
            .filter(|p| {
                !p.evicted.is_cancelled()
                    && p.unanswered.load(Ordering::Relaxed) == 0
                    && now.saturating_sub(p.last_frame_ms.load(Ordering::Relaxed)) >= min_age
            })
            .min_by_key(|p| p.last_frame_ms.load(Ordering::Relaxed));
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
        let progress = Arc::new(Progress {
            last_frame_ms: AtomicU64::new(ms_since(self.base)),
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

    /// At the limit, the connection with no frame for longest and nothing unanswered is chosen; a busy one
    /// (a message waiting for its answer) and a recent one are not.
    #[tokio::test]
    async fn the_stalest_idle_connection_makes_room() {
        let slots = Slots::new(3, Duration::from_millis(50));
        let Taken::Free(a) = slots.take(1) else {
            panic!("free")
        };
        let Taken::Free(b) = slots.take(2) else {
            panic!("free")
        };
        let Taken::Free(c) = slots.take(3) else {
            panic!("free")
        };
        assert!(
            matches!(slots.take(4), Taken::Refused),
            "nobody is stale yet"
        );
        tokio::time::sleep(Duration::from_millis(80)).await;
        a.progress.read();
        b.progress.frame();
        // a waits for an answer, b just completed a frame: c is the one.
        assert!(matches!(slots.take(4), Taken::Evicting));
        assert!(c.progress.evicted.is_cancelled());
        assert!(!a.progress.evicted.is_cancelled() && !b.progress.evicted.is_cancelled());
        drop(c);
        assert!(slots.wait(4).await.is_some());
        a.progress.answered();
        drop(b);
    }

    #[test]
    fn evict_after_zero_refuses() {
        let slots = Slots::new(1, Duration::ZERO);
        let _a = slots.take(1);
        assert!(matches!(slots.take(2), Taken::Refused));
    }
}
