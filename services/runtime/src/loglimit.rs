//! Log lines that a client can cause (refused connections, failed handshakes, framing errors) are rate-limited
//! per reason: at most [`LINES_PER_WINDOW`] of each reason per [`WINDOW`], the rest counted in
//! `hl7gw_log_lines_suppressed_total{reason}`, so a flood of bad connections cannot fill the log store.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Lines of one reason written per window.
pub const LINES_PER_WINDOW: u32 = 20;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);

crate::label_sets! {
    /// `reason`: what the suppressed lines were about (a fixed name from the code).
    pub struct LogReasonLabels { pub reason: &'static str }
}

crate::metric_set! {
    /// Lines the rate limit held back.
    pub struct LogMetrics under "log" {
        pub lines_suppressed: prometheus_client::metrics::family::Family<
            LogReasonLabels,
            prometheus_client::metrics::counter::Counter,
        > = "Log lines not written because their reason passed its rate limit (20 a minute per reason), by reason";
    }
}

/// The process's limiter.
static LIMITER: LazyLock<Limiter> = LazyLock::new(Limiter::default);

#[derive(Debug, Default)]
struct Limiter {
    windows: Mutex<HashMap<&'static str, (Instant, u32)>>,
    metrics: Mutex<Option<LogMetrics>>,
}

impl Limiter {
    fn allow(&self, reason: &'static str, now: Instant) -> bool {
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let (start, n) = w.entry(reason).or_insert((now, 0));
        if now.duration_since(*start) >= WINDOW {
            (*start, *n) = (now, 0);
        }
        *n += 1;
        if *n <= LINES_PER_WINDOW {
            return true;
        }
        drop(w);
        if let Some(m) = &*self.metrics.lock().unwrap_or_else(|p| p.into_inner()) {
            m.lines_suppressed
                .get_or_create(&LogReasonLabels { reason })
                .inc();
        }
        false
    }
}

/// Registers the suppressed-lines counter in a process's registry (each service does, once).
pub fn register(r: &mut crate::metrics::Registry) {
    let m = LogMetrics::register(r);
    *LIMITER.metrics.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
}

/// Runs `line` (a `tracing` macro) unless `reason` passed its rate limit; only when `enabled` (the line's level
/// is on), so lines that would not be written are not counted.
pub fn emit(enabled: bool, reason: &'static str, line: impl FnOnce()) {
    if enabled && LIMITER.allow(reason, Instant::now()) {
        line();
    }
}

/// A rate-limited `tracing::warn!` line: `warn!(reason, <tracing::warn! arguments>)`.
#[macro_export]
macro_rules! limited_warn {
    ($reason:expr, $($arg:tt)+) => {
        $crate::loglimit::emit(tracing::enabled!(tracing::Level::WARN), $reason, || tracing::warn!($($arg)+))
    };
}

/// A rate-limited `tracing::info!` line.
#[macro_export]
macro_rules! limited_info {
    ($reason:expr, $($arg:tt)+) => {
        $crate::loglimit::emit(tracing::enabled!(tracing::Level::INFO), $reason, || tracing::info!($($arg)+))
    };
}

/// A rate-limited `tracing::debug!` line.
#[macro_export]
macro_rules! limited_debug {
    ($reason:expr, $($arg:tt)+) => {
        $crate::loglimit::emit(tracing::enabled!(tracing::Level::DEBUG), $reason, || tracing::debug!($($arg)+))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36, item 8: the 21st line of a reason within a minute is held back and counted; another reason
    /// and the next window are not affected.
    #[test]
    fn lines_past_the_rate_are_counted_not_written() {
        let l = Limiter::default();
        let mut r = crate::metrics::registry();
        let m = LogMetrics::register(&mut r);
        *l.metrics.lock().unwrap_or_else(|p| p.into_inner()) = Some(m.clone());
        let t0 = Instant::now();
        let written = (0..1000).filter(|_| l.allow("tls_handshake", t0)).count();
        assert_eq!(written, LINES_PER_WINDOW as usize);
        assert!(l.allow("proxy_header", t0));
        assert_eq!(
            m.lines_suppressed
                .get_or_create(&LogReasonLabels {
                    reason: "tls_handshake"
                })
                .get(),
            1000 - u64::from(LINES_PER_WINDOW)
        );
        assert!(l.allow("tls_handshake", t0 + WINDOW));
    }
}
