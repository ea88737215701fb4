//! Run ids and control ids.
//!
//! Every message a run sends carries a unique MSH-10: `<run-id>-<client>-<seq>` for measured messages and
//! `<run-id>-<client>-W<seq>` for warm-up messages. The run id is 8 base-36 characters of the Unix time in
//! milliseconds (never repeated within a process) followed by 4 random ones, so ids of different runs do not
//! meet (the gateway suppresses duplicates by sender and MSH-10) and sort by start time. A 1 × 10,000 run's
//! ids are at most 19 characters, within HL7 v2.5's 20-character MSH-10.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const BASE36: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// A fresh run id (12 characters, `[0-9A-Z]`).
pub fn new_run_id() -> String {
    // The time part never repeats within a process: a second call in the same millisecond takes the next one.
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let prev = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or(now);
    let millis = now.max(prev + 1);
    let random = fastrand::u64(..);
    let mut id = Vec::with_capacity(12);
    push_base36(&mut id, millis, 8);
    push_base36(&mut id, random, 4);
    String::from_utf8_lossy(&id).into_owned()
}

/// Appends the `width` lowest base-36 digits of `v`, most significant first.
fn push_base36(out: &mut Vec<u8>, mut v: u64, width: usize) {
    let start = out.len();
    out.resize(start + width, b'0');
    for slot in out[start..].iter_mut().rev() {
        *slot = BASE36[(v % 36) as usize];
        v /= 36;
    }
}

/// Appends `v` in decimal, without allocating.
pub fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Appends the control id of message `seq` of `client` in run `run`.
pub fn push_control_id(out: &mut Vec<u8>, run: &[u8], client: u32, seq: u64, warmup: bool) {
    out.extend_from_slice(run);
    out.push(b'-');
    push_u64(out, u64::from(client));
    out.push(b'-');
    if warmup {
        out.push(b'W');
    }
    push_u64(out, seq);
}

/// The control id as a `String` (tests, and callers off the hot path).
pub fn control_id(run: &str, client: u32, seq: u64, warmup: bool) -> String {
    let mut v = Vec::with_capacity(run.len() + 24);
    push_control_id(&mut v, run.as_bytes(), client, seq, warmup);
    String::from_utf8_lossy(&v).into_owned()
}

/// Appends the synthetic patient id (PID-3.1) of message `seq` of `client`: `LOAD<client>-<seq % 20>`, a
/// small set per client so a gateway keyed by patient spreads a run over its partitions.
pub fn push_patient_id(out: &mut Vec<u8>, client: u32, seq: u64) {
    out.extend_from_slice(b"LOAD");
    push_u64(out, u64::from(client));
    out.push(b'-');
    push_u64(out, seq % PATIENTS_PER_CLIENT);
}

/// How many distinct patient ids each client uses.
pub const PATIENTS_PER_CLIENT: u64 = 20;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn decimal_matches_std() {
        for v in [0, 1, 9, 10, 99, 100, 12345, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
    }

    #[test]
    fn control_ids_have_the_documented_shape() {
        assert_eq!(control_id("RUN", 3, 42, false), "RUN-3-42");
        assert_eq!(control_id("RUN", 0, 7, true), "RUN-0-W7");
        let mut out = b"prefix:".to_vec();
        push_control_id(&mut out, b"R", 12, 0, false);
        assert_eq!(out, b"prefix:R-12-0");
    }

    #[test]
    fn control_ids_are_unique_across_clients_sequences_and_phases() {
        let run = new_run_id();
        let mut seen = HashSet::new();
        for client in 0..12 {
            for seq in 0..1_000 {
                for warm in [false, true] {
                    assert!(seen.insert(control_id(&run, client, seq, warm)));
                }
            }
        }
        assert_eq!(seen.len(), 12 * 1_000 * 2);
    }

    #[test]
    fn run_ids_are_short_distinct_and_safe_in_hl7() {
        let ids: HashSet<String> = (0..1_000).map(|_| new_run_id()).collect();
        assert_eq!(ids.len(), 1_000, "run ids repeat");
        for id in &ids {
            assert_eq!(id.len(), 12);
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
            );
        }
        // A 1 x 10,000 run stays within v2.5's 20 characters.
        let run = new_run_id();
        assert!(control_id(&run, 0, 9_999, false).len() <= 20);
    }

    #[test]
    fn patient_ids_cycle_over_a_small_set_per_client() {
        let ids: HashSet<Vec<u8>> = (0..100)
            .map(|seq| {
                let mut v = Vec::new();
                push_patient_id(&mut v, 4, seq);
                v
            })
            .collect();
        assert_eq!(ids.len(), PATIENTS_PER_CLIENT as usize);
        let mut v = Vec::new();
        push_patient_id(&mut v, 4, 21);
        assert_eq!(v, b"LOAD4-1");
    }
}
