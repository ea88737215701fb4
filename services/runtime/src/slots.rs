//! Connection slots for a listener (the MLLP listener and every gRPC listener): at most `max` connections
//! open, at most `per_address` of them from one client address, and at a limit a new connection takes the slot
//! of one that is doing nothing for anyone: first the oldest that never completed a frame or call (a scanner,
//! an idle or a slowloris client, a handshake that does not finish: a real client sends as soon as it
//! connects), then the one that completed nothing for longest, past `evict_after`, with nothing unanswered,
//! then one whose answers have not been read for `evict_after`. At the per-address bound the victim is one of
//! that address's own connections, so one address flooding the listener costs only itself. Idle, slow and
//! never-reading clients cannot keep others out, even when they reconnect as fast as they are closed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// New connections that may wait at once for a slot (of a connection being closed for them, or, where the
/// listener waits when full, of any); beyond, a new connection at the limit is refused.
const MAX_WAITING: usize = 64;

/// How long a new connection waits for a slot.
const EVICTION_WAIT: Duration = Duration::from_secs(5);

/// The listener's slots and the progress of every open connection.
#[derive(Debug)]
pub struct Slots {
    free: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Arc<Progress>>>,
    base: Instant,
    limits: SlotLimits,
    waiting: AtomicUsize,
}

/// How many connections a listener holds and when it closes one for another.
#[derive(Debug, Clone, Copy)]
pub struct SlotLimits {
    /// Connections open at once.
    pub max: usize,
    /// Connections open at once from one client address (0: no bound).
    pub per_address: usize,
    /// How long a connection must have done nothing before it is closed for a new one (0: never evict; the
    /// oldest never-proven connection is always a candidate while this is not 0).
    pub evict_after: Duration,
    /// At `max` with nothing to evict, a new connection waits (bounded) for a slot instead of being refused.
    pub wait_when_full: bool,
}

/// What a connection did lately, as the eviction sees it.
#[derive(Debug)]
pub struct Progress {
    /// Milliseconds from the listener's start to the connection's last complete frame or call (or its
    /// opening).
    last_frame_ms: AtomicU64,
    /// Milliseconds from the listener's start to its opening.
    opened_ms: u64,
    /// It completed a frame (or opened a call).
    proven: AtomicBool,
    /// 1 + milliseconds from the listener's start to when the write of its answers blocked (0: not blocked).
    write_blocked_ms: AtomicU64,
    /// Messages read (calls opened) and not yet answered (ended).
    unanswered: AtomicUsize,
    /// The client's address, once known (at the accept, or from a PROXY protocol header).
    addr: OnceLock<IpAddr>,
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

    /// A call was opened (gRPC): the connection is proven and busy until [`Progress::call_ended`].
    pub fn call_started(&self) {
        self.frame();
        self.read();
    }

    /// A call ended: idle from now on unless another is open.
    pub fn call_ended(&self) {
        self.answered();
        self.last_frame_ms
            .store(ms_since(self.base), Ordering::Relaxed);
    }

    /// How good a victim it is at `now` (lower first), or `None` when it is doing something for someone.
    /// `young_too`: one that never proved itself goes whatever its age (at the listener's limit); else only
    /// once older than `min_age` (at an address's bound: its newest connections are not churned for its next).
    fn eviction_rank(&self, now: u64, min_age: u64, young_too: bool) -> Option<(u8, u64)> {
        if self.evicted.is_cancelled() {
            return None;
        }
        let unanswered = self.unanswered.load(Ordering::Relaxed);
        if !self.proven.load(Ordering::Relaxed)
            && unanswered == 0
            && (young_too || now.saturating_sub(self.opened_ms) >= min_age)
        {
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

    /// Counts toward its address's bound: open, not being closed.
    fn live_from(&self, ip: IpAddr) -> bool {
        self.addr.get() == Some(&ip) && !self.evicted.is_cancelled()
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

impl Slot {
    /// The client's address learnt after the accept (a PROXY protocol header): at the address's bound one of
    /// its stale connections is closed for this one, or this one is refused.
    pub fn bind_address(&self, ip: IpAddr) -> Result<(), Refusal> {
        let open = lock(&self.slots.open);
        self.slots.room_for(&open, ip)?;
        let _ = self.progress.addr.set(ip);
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.slots.open).remove(&self.id);
    }
}

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is held by a connection that made progress lately or waits for answers.
    MaxConnections,
    /// Its address holds its bound of connections, each busy or recent.
    PerAddress,
}

impl Refusal {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::PerAddress => "max_connections_per_address",
        }
    }
}

/// How a new connection got its slot.
#[derive(Debug)]
pub enum Taken {
    /// A free slot.
    Free(Slot),
    /// Wait for a slot with [`Slots::wait`] (another connection is being closed for it, or the listener waits
    /// when full).
    Wait,
    /// No slot for it: close it.
    Refused(Refusal),
}

impl Slots {
    pub fn new(limits: SlotLimits) -> Arc<Self> {
        Arc::new(Self {
            free: Arc::new(Semaphore::new(limits.max.max(1))),
            open: Mutex::new(HashMap::new()),
            base: Instant::now(),
            limits,
            waiting: AtomicUsize::new(0),
        })
    }

    /// A free slot for connection `id` from `addr` (`None`: learnt later, see [`Slot::bind_address`]) at once,
    /// or else the eviction of the stalest connection (without waiting: the accept loop goes on).
    pub fn take(self: &Arc<Self>, id: u64, addr: Option<IpAddr>) -> Taken {
        let mut evicting = false;
        if let Some(ip) = addr {
            let open = lock(&self.open);
            match self.room_for(&open, ip) {
                Ok(e) => evicting = e,
                Err(r) => return Taken::Refused(r),
            }
        }
        if let Ok(p) = self.free.clone().try_acquire_owned() {
            return Taken::Free(self.slot(id, addr, p));
        }
        if self.waiting.load(Ordering::Relaxed) >= MAX_WAITING {
            return Taken::Refused(Refusal::MaxConnections);
        }
        if !evicting {
            let open = lock(&self.open);
            match self.victim(open.values(), true) {
                Some(v) => v.evicted.cancel(),
                None if self.limits.wait_when_full => {}
                None => return Taken::Refused(Refusal::MaxConnections),
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Taken::Wait
    }

    /// After [`Taken::Wait`]: a slot once one is free, or `None` after a bounded wait.
    pub async fn wait(self: &Arc<Self>, id: u64, addr: Option<IpAddr>) -> Option<Slot> {
        let got = tokio::time::timeout(EVICTION_WAIT, self.free.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        match got {
            Ok(Ok(p)) => Some(self.slot(id, addr, p)),
            _ => None,
        }
    }

    /// Whether `ip` may open one more connection: under its bound (`Ok(false)`), or at it with one of its own
    /// stale connections now being closed (`Ok(true)`).
    fn room_for(&self, open: &HashMap<u64, Arc<Progress>>, ip: IpAddr) -> Result<bool, Refusal> {
        let bound = self.limits.per_address;
        if bound == 0 || open.values().filter(|p| p.live_from(ip)).count() < bound {
            return Ok(false);
        }
        match self.victim(open.values().filter(|p| p.live_from(ip)), false) {
            Some(v) => {
                v.evicted.cancel();
                Ok(true)
            }
            None => Err(Refusal::PerAddress),
        }
    }

    /// The stalest of `candidates` doing nothing for anyone, if eviction is on (`young_too`: see
    /// [`Progress::eviction_rank`]).
    fn victim<'a>(
        &self,
        candidates: impl Iterator<Item = &'a Arc<Progress>>,
        young_too: bool,
    ) -> Option<&'a Arc<Progress>> {
        if self.limits.evict_after.is_zero() {
            return None;
        }
        let now = ms_since(self.base);
        let min_age = self.limits.evict_after.as_millis() as u64;
        candidates
            .filter_map(|p| Some((p.eviction_rank(now, min_age, young_too)?, p)))
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, p)| p)
    }

    fn slot(self: &Arc<Self>, id: u64, addr: Option<IpAddr>, permit: OwnedSemaphorePermit) -> Slot {
        let opened_ms = ms_since(self.base);
        let progress = Arc::new(Progress {
            last_frame_ms: AtomicU64::new(opened_ms),
            opened_ms,
            proven: AtomicBool::new(false),
            write_blocked_ms: AtomicU64::new(0),
            unanswered: AtomicUsize::new(0),
            addr: OnceLock::new(),
            evicted: CancellationToken::new(),
            base: self.base,
        });
        if let Some(ip) = addr {
            let _ = progress.addr.set(ip);
        }
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

    fn limits(max: usize, per_address: usize, evict_after: Duration) -> SlotLimits {
        SlotLimits {
            max,
            per_address,
            evict_after,
            wait_when_full: false,
        }
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    /// At the limit, a connection that never completed a frame goes first (the oldest), then the stalest
    /// idle one; one with a message waiting for its answer and one that just completed a frame are kept, until
    /// its answers go unread for `evict_after`.
    #[tokio::test]
    async fn the_stalest_idle_connection_makes_room() {
        let slots = Slots::new(limits(3, 0, Duration::from_millis(50)));
        let take = |id| match slots.take(id, ip(1)) {
            Taken::Free(s) => s,
            _ => panic!("free"),
        };
        let (a, b, c) = (take(1), take(2), take(3));
        for s in [&a, &b, &c] {
            s.progress.frame();
        }
        a.progress.read();
        assert!(
            matches!(
                slots.take(4, ip(1)),
                Taken::Refused(Refusal::MaxConnections)
            ),
            "nobody is stale yet"
        );
        let d = {
            drop(c);
            take(4)
        };
        assert!(matches!(slots.take(5, ip(1)), Taken::Wait));
        assert!(
            d.progress.evicted.is_cancelled(),
            "the one without a frame goes first"
        );
        drop(d);
        let e = slots.wait(5, ip(1)).await.expect("the evicted one's slot");
        e.progress.frame();
        e.progress.read();
        tokio::time::sleep(Duration::from_millis(80)).await;
        b.progress.frame();
        // a and e wait for answers, b just completed a frame: nobody.
        assert!(matches!(slots.take(6, ip(1)), Taken::Refused(_)));
        a.progress.writing();
        tokio::time::sleep(Duration::from_millis(80)).await;
        b.progress.frame();
        // a's answers have not been read for longer than evict_after.
        assert!(matches!(slots.take(6, ip(1)), Taken::Wait));
        assert!(a.progress.evicted.is_cancelled());
    }

    #[test]
    fn evict_after_zero_refuses() {
        let slots = Slots::new(limits(1, 0, Duration::ZERO));
        let _a = slots.take(1, None);
        assert!(matches!(slots.take(2, None), Taken::Refused(_)));
    }

    /// Issue 36, item 3: one address at its bound of busy connections is refused, others still get slots;
    /// at the bound one of its own stale connections (never the other addresses', never its young ones)
    /// makes room.
    #[tokio::test]
    async fn one_address_is_held_to_its_bound_and_evicts_only_its_own() {
        let slots = Slots::new(limits(10, 3, Duration::from_millis(50)));
        let mut flood = Vec::new();
        for id in 0..3 {
            let Taken::Free(s) = slots.take(id, ip(2)) else {
                panic!("free")
            };
            s.progress.frame();
            s.progress.read();
            flood.push(s);
        }
        assert!(matches!(
            slots.take(10, ip(2)),
            Taken::Refused(Refusal::PerAddress)
        ));
        let Taken::Free(other) = slots.take(11, ip(1)) else {
            panic!("another address gets a slot")
        };
        // A handshake that never finishes from the flooding address is its own victim at the bound.
        flood[0].progress.answered();
        drop(flood.remove(0));
        let Taken::Free(stalled) = slots.take(12, ip(2)) else {
            panic!("free")
        };
        assert!(
            matches!(slots.take(13, ip(2)), Taken::Refused(Refusal::PerAddress)),
            "a young connection is not churned for the next"
        );
        for s in &flood {
            s.progress.frame();
        }
        tokio::time::sleep(Duration::from_millis(80)).await;
        for s in &flood {
            s.progress.frame();
        }
        assert!(matches!(slots.take(13, ip(2)), Taken::Free(_)));
        assert!(stalled.progress.evicted.is_cancelled());
        assert!(!other.progress.evicted.is_cancelled());
    }

    /// A PROXY protocol address learnt after the accept counts toward its bound.
    #[test]
    fn an_address_bound_after_the_accept_counts() {
        let slots = Slots::new(limits(10, 1, Duration::ZERO));
        let Taken::Free(a) = slots.take(1, None) else {
            panic!("free")
        };
        let Taken::Free(b) = slots.take(2, None) else {
            panic!("free")
        };
        assert_eq!(a.bind_address(IpAddr::from([10, 0, 0, 1])), Ok(()));
        assert_eq!(
            b.bind_address(IpAddr::from([10, 0, 0, 1])),
            Err(Refusal::PerAddress)
        );
        assert_eq!(b.bind_address(IpAddr::from([10, 0, 0, 2])), Ok(()));
    }

    /// A listener that waits when full hands a freed slot to a waiting connection.
    #[tokio::test]
    async fn a_waiting_listener_hands_on_a_freed_slot() {
        let slots = Slots::new(SlotLimits {
            wait_when_full: true,
            ..limits(1, 0, Duration::from_secs(3600))
        });
        let Taken::Free(a) = slots.take(1, None) else {
            panic!("free")
        };
        a.progress.call_started();
        assert!(matches!(slots.take(2, None), Taken::Wait));
        let waiter = tokio::spawn({
            let slots = slots.clone();
            async move { slots.wait(2, None).await.is_some() }
        });
        drop(a);
        assert!(waiter.await.expect("joined"));
    }
}
