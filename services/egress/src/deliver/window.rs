//! The order one partition's deliveries keep (issue 38): records of one key (the patient, the Kafka key) one at
//! a time and in offset order, records of different keys at once; and the committed prefix, the records from the
//! oldest read up to the first not yet finished, whose offsets alone may be stored. Pure bookkeeping (no Kafka,
//! no I/O), so its rules are tested here.

use std::collections::{HashMap, VecDeque};

/// One partition's records from the last stored offset on: `T` is a record not yet started, `D` how a
/// finished one ended.
#[derive(Debug)]
pub struct Window<T, D> {
    /// The sequence number of `slots.front()`.
    base: u64,
    /// Each record's offset and, once finished, its outcome; in read (offset) order.
    slots: VecDeque<(i64, Option<D>)>,
    /// Keys with a record started or ready: the records of that key waiting behind it, in order.
    busy: HashMap<u64, VecDeque<(u64, T)>>,
    /// Records whose key is free, waiting to be started.
    ready: VecDeque<(u64, u64, T)>,
    /// Records in `busy`'s queues.
    waiting: usize,
}

impl<T, D> Default for Window<T, D> {
    fn default() -> Self {
        Self {
            base: 0,
            slots: VecDeque::new(),
            busy: HashMap::new(),
            ready: VecDeque::new(),
            waiting: 0,
        }
    }
}

impl<T, D> Window<T, D> {
    /// Records read and not yet taken off the front.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Records waiting behind an earlier record of their key.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Adds the record at `offset` of `key`: ready at once when no earlier record of its key is unfinished,
    /// else queued behind them. Returns its sequence number.
    pub fn push(&mut self, offset: i64, key: u64, item: T) -> u64 {
        let seq = self.base + self.slots.len() as u64;
        self.slots.push_back((offset, None));
        match self.busy.get_mut(&key) {
            Some(q) => {
                q.push_back((seq, item));
                self.waiting += 1;
            }
            None => {
                self.busy.insert(key, VecDeque::new());
                self.ready.push_back((seq, key, item));
            }
        }
        seq
    }

    /// The next record that may start, if any.
    pub fn peek_ready(&self) -> Option<&T> {
        self.ready.front().map(|(_, _, t)| t)
    }

    /// Takes the next record that may start: its sequence number, key and item. Its key stays busy until
    /// [`Window::finish`].
    pub fn take_ready(&mut self) -> Option<(u64, u64, T)> {
        self.ready.pop_front()
    }

    /// The record `seq` of `key` ended with `done`; the next record of its key, if any, becomes ready.
    pub fn finish(&mut self, seq: u64, key: u64, done: D) {
        if let Some(slot) = seq
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.slots.get_mut(i))
        {
            slot.1 = Some(done);
        }
        if let Some(q) = self.busy.get_mut(&key) {
            match q.pop_front() {
                Some((s, item)) => {
                    self.waiting -= 1;
                    self.ready.push_back((s, key, item));
                }
                None => {
                    self.busy.remove(&key);
                }
            }
        }
    }

    /// The oldest record's offset and outcome, when it has finished.
    pub fn front_mut(&mut self) -> Option<(i64, &mut D)> {
        let (offset, done) = self.slots.front_mut()?;
        done.as_mut().map(|d| (*offset, d))
    }

    /// Takes the oldest record off when it has finished: its offset and outcome.
    pub fn pop_front(&mut self) -> Option<(i64, D)> {
        if !matches!(self.slots.front(), Some((_, Some(_)))) {
            return None;
        }
        let (offset, done) = self.slots.pop_front()?;
        self.base += 1;
        done.map(|d| (offset, d))
    }

    /// Drops every record not started (ready or waiting); the started ones keep their keys until they finish.
    /// Their slots stay unfinished: nothing from the first of them on is taken off the front.
    pub fn drop_unstarted(&mut self) -> Vec<T> {
        let mut dropped = Vec::with_capacity(self.ready.len() + self.waiting);
        for (_, key, item) in self.ready.drain(..) {
            dropped.push(item);
            if let Some(q) = self.busy.remove(&key) {
                dropped.extend(q.into_iter().map(|(_, t)| t));
            }
        }
        for q in self.busy.values_mut() {
            dropped.extend(q.drain(..).map(|(_, t)| t));
        }
        self.waiting = 0;
        dropped
    }

    /// Forgets every slot (after [`Window::drop_unstarted`] and once nothing started is still running): the
    /// outcomes not taken off the front, in order.
    pub fn reset(&mut self) -> Vec<D> {
        self.base += self.slots.len() as u64;
        self.busy.clear();
        self.ready.clear();
        self.waiting = 0;
        self.slots.drain(..).filter_map(|(_, d)| d).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Records of one key start one at a time in offset order; another key's start beside them; only the
    /// finished prefix comes off the front.
    #[test]
    fn one_key_in_order_other_keys_beside_it_and_only_the_finished_prefix_commits() {
        let mut w: Window<&str, &str> = Window::default();
        let a1 = w.push(10, 1, "a1");
        let b1 = w.push(11, 2, "b1");
        let a2 = w.push(12, 1, "a2");
        let c1 = w.push(13, 3, "c1");
        assert_eq!(w.waiting(), 1);
        let started: Vec<_> = std::iter::from_fn(|| w.take_ready()).collect();
        assert_eq!(started, vec![(a1, 1, "a1"), (b1, 2, "b1"), (c1, 3, "c1")]);
        // c1 and b1 finish first: nothing commits while a1 (offset 10) is unfinished.
        w.finish(c1, 3, "ok");
        w.finish(b1, 2, "ok");
        assert!(w.pop_front().is_none());
        assert!(w.take_ready().is_none(), "a2 waits for a1");
        w.finish(a1, 1, "ok");
        assert_eq!(w.take_ready(), Some((a2, 1, "a2")));
        assert_eq!(w.waiting(), 0);
        assert_eq!(w.pop_front(), Some((10, "ok")));
        assert_eq!(w.pop_front(), Some((11, "ok")));
        assert!(w.pop_front().is_none(), "a2 at 12 still running");
        w.finish(a2, 1, "ok");
        assert_eq!(w.pop_front(), Some((12, "ok")));
        assert_eq!(w.pop_front(), Some((13, "ok")));
        assert!(w.is_empty());
        // The key is free again: its next record is ready at once.
        w.push(14, 1, "a3");
        assert_eq!(w.peek_ready(), Some(&"a3"));
    }

    /// A rebalance: the unstarted records are dropped, the running ones keep their keys until they end, and a
    /// reset forgets the rest (an abandoned record never lets a later offset commit before it).
    #[test]
    fn dropping_the_unstarted_keeps_running_keys_busy_until_they_finish() {
        let mut w: Window<&str, &str> = Window::default();
        let a1 = w.push(0, 1, "a1");
        w.push(1, 1, "a2");
        w.push(2, 2, "b1");
        let (s, k, _) = w.take_ready().unwrap();
        assert_eq!((s, k), (a1, 1));
        let mut dropped = w.drop_unstarted();
        dropped.sort_unstable();
        assert_eq!(dropped, vec!["a2", "b1"]);
        assert_eq!(w.waiting(), 0);
        // a1 still runs: a record of its key read now waits for it.
        let a3 = w.push(3, 1, "a3");
        assert!(w.take_ready().is_none());
        w.finish(a1, 1, "abandoned");
        assert_eq!(w.take_ready().map(|r| r.0), Some(a3));
        assert_eq!(w.pop_front(), Some((0, "abandoned")));
        assert!(w.pop_front().is_none(), "a2 (offset 1) never finished");
        w.finish(a3, 1, "ok");
        assert_eq!(w.reset(), vec!["ok"]);
        assert!(w.is_empty());
        let next = w.push(7, 1, "a4");
        assert_eq!(w.take_ready().map(|r| r.0), Some(next));
        w.finish(next, 1, "ok");
        assert_eq!(w.pop_front(), Some((7, "ok")));
    }
}
