//! The ingress's live view of its senders: each open connection (MLLP connection or gRPC `SendStream`) and each
//! sending application/facility, with its messages, negative answers by code and last message time. Served by
//! the admin method `Ingest/Senders` (`hl7gw senders`); senders named in the config also get metrics.
//!
//! A sender is the first component (HD-1, the namespace id) of MSH-3 and MSH-4 as received, without unescaping:
//! `LAB^1.2.3^ISO` and `LAB` are the same sender `LAB`. Both are cut to the standard's HD length. Messages whose
//! MSH cannot be read at all (framing errors, no MSH) count on their connection only.
//!
//! Bounded: at most `max_senders` (MSH-3, MSH-4) pairs are tracked. At the bound a new pair takes the place of
//! the pair whose last message is oldest (its counts move to `other`; counted in
//! `hl7gw_ingress_senders_evicted_total`), so made-up pairs cannot fill the view for good and a real new sender
//! still gets its entry; senders named in the config are never evicted (they have their own metrics and their
//! silence is what an alert looks for). Only when every entry is named do messages of further pairs count in
//! `other` and in `hl7gw_ingress_senders_untracked_messages_total`. A connection's entry goes when it closes. Named senders' metrics are made once at start, so their labels come from the config
//! only. One uncontended lock per answered message.

use crate::config::{Config, NamedSender};
use crate::metrics::{IngressMetrics, SenderCodeLabels, SenderLabels, TimestampGauge};
use crate::origin::hd1;
use hl7gw_runtime::proto::v1 as pb;
use hl7v2::Header;
use hl7v2::ack::AckCode;
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// The negative codes counted, in the order of [`Counts::naks`].
const NAK_CODES: [AckCode; 4] = [AckCode::AE, AckCode::AR, AckCode::CE, AckCode::CR];

/// Messages, negative answers and the last message time of a sender or a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub messages: u64,
    /// By code: AE, AR, CE, CR.
    pub naks: [u64; 4],
    pub last: Option<SystemTime>,
}

impl Counts {
    fn add(&mut self, nak: Option<usize>, at: SystemTime) {
        self.messages += 1;
        if let Some(i) = nak {
            self.naks[i] += 1;
        }
        self.last = Some(at);
    }

    fn to_proto(self) -> pb::SenderCounts {
        pb::SenderCounts {
            messages: self.messages,
            naks: NAK_CODES
                .iter()
                .zip(self.naks)
                .filter(|(_, n)| *n > 0)
                .map(|(c, n)| (c.as_str().to_owned(), n))
                .collect(),
            last_message_at: self.last.map(prost_types::Timestamp::from),
        }
    }
}

/// The index of a negative code in [`Counts::naks`].
fn nak_index(code: Option<AckCode>) -> Option<usize> {
    code.and_then(|c| NAK_CODES.iter().position(|n| *n == c))
}

/// A sender named in the config, with its metrics made at start.
#[derive(Debug)]
struct Named {
    app: Box<[u8]>,
    /// None: any facility.
    fac: Option<Box<[u8]>>,
    messages: Counter,
    naks: [Counter; 4],
    last: TimestampGauge,
}

/// One (MSH-3, MSH-4) pair.
#[derive(Debug)]
struct Entry {
    counts: Counts,
    named: Option<usize>,
    first_seen: SystemTime,
    last_peer: Arc<str>,
    last_listener: Arc<str>,
}

/// One open connection or stream.
#[derive(Debug)]
struct Conn {
    connection_id: String,
    listener: Arc<str>,
    protocol: &'static str,
    peer: Arc<str>,
    tls_client: String,
    connected: SystemTime,
    counts: Counts,
    app: Box<[u8]>,
    fac: Box<[u8]>,
}

/// MSH-4 -> entry, for one MSH-3.
type ByFacility = HashMap<Box<[u8]>, Entry>;

#[derive(Debug, Default)]
struct State {
    /// MSH-3 -> MSH-4 -> entry (two levels: a lookup borrows both keys, nothing is allocated per message).
    by_app: HashMap<Box<[u8]>, ByFacility>,
    tracked: usize,
    other: Counts,
    conns: HashMap<u64, Conn>,
}

/// The sender view of one ingress process.
#[derive(Debug)]
pub struct Senders {
    max: usize,
    named: Vec<Named>,
    /// Names of `named`, in the same order.
    names: Vec<String>,
    state: Mutex<State>,
    next_id: AtomicU64,
    metrics: IngressMetrics,
}

/// Where a message came from, for [`Senders::record`]: a listed connection (its entry goes when this is
/// dropped) or a unary call (no entry).
#[derive(Debug)]
pub struct SenderConn {
    senders: Arc<Senders>,
    /// 0: not listed (a unary call).
    id: u64,
    peer: Arc<str>,
    listener: Arc<str>,
}

impl Drop for SenderConn {
    fn drop(&mut self) {
        if self.id != 0 {
            self.senders.lock().conns.remove(&self.id);
        }
    }
}

impl Senders {
    /// The view for `cfg` (`senders`, `max_senders`); the named senders' metrics are made now, their last
    /// message time set to now (the process start), so a sender silent since the start still looks silent.
    pub fn new(cfg: &Config, metrics: IngressMetrics) -> Self {
        let now = unix_seconds(SystemTime::now());
        let named = cfg
            .senders
            .iter()
            .map(|s: &NamedSender| {
                let label = || SenderLabels {
                    sender: s.name.clone(),
                };
                let last = metrics
                    .sender_last_message_timestamp
                    .get_or_create(&label())
                    .clone();
                last.set(now);
                Named {
                    app: s.sending_application.as_bytes().into(),
                    fac: s.sending_facility.as_ref().map(|f| f.as_bytes().into()),
                    messages: metrics.sender_messages.get_or_create(&label()).clone(),
                    naks: NAK_CODES.map(|c| {
                        metrics
                            .sender_naks
                            .get_or_create(&SenderCodeLabels {
                                sender: s.name.clone(),
                                code: c.as_str(),
                            })
                            .clone()
                    }),
                    last,
                }
            })
            .collect();
        Self {
            max: cfg.max_senders,
            named,
            names: cfg.senders.iter().map(|s| s.name.clone()).collect(),
            state: Mutex::default(),
            next_id: AtomicU64::new(1),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists a connection (or gRPC stream) until the returned handle is dropped.
    pub fn connect(self: &Arc<Self>, origin: &crate::origin::Origin) -> SenderConn {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let peer = origin.peer.clone();
        self.lock().conns.insert(
            id,
            Conn {
                connection_id: origin.connection_id.clone(),
                listener: origin.listener.clone(),
                protocol: origin.protocol,
                peer: peer.clone(),
                tls_client: origin.tls_client.clone(),
                connected: SystemTime::now(),
                counts: Counts::default(),
                app: Box::default(),
                fac: Box::default(),
            },
        );
        SenderConn {
            senders: self.clone(),
            id,
            peer,
            listener: origin.listener.clone(),
        }
    }

    /// A handle for a unary call: its messages count for their sender, no connection is listed.
    pub fn unlisted(self: &Arc<Self>, origin: &crate::origin::Origin) -> SenderConn {
        SenderConn {
            senders: self.clone(),
            id: 0,
            peer: origin.peer.clone(),
            listener: origin.listener.clone(),
        }
    }

    /// The named sender (application, facility) is, an exact facility before "any".
    fn match_named(&self, app: &[u8], fac: &[u8]) -> Option<usize> {
        let exact = self
            .named
            .iter()
            .position(|n| &*n.app == app && n.fac.as_deref() == Some(fac));
        exact.or_else(|| {
            self.named
                .iter()
                .position(|n| &*n.app == app && n.fac.is_none())
        })
    }

    /// Counts one answered message of `h`'s sender on `conn`; `code` is its answer (None: none, the
    /// connection was closed instead).
    pub fn record(&self, conn: &SenderConn, h: &Header<'_>, code: Option<AckCode>, at: SystemTime) {
        let c = h.delimiters.component;
        let (app, fac) = (hd1(h.sending_application, c), hd1(h.sending_facility, c));
        let nak = nak_index(code);
        let named;
        {
            let mut st = self.lock();
            let st = &mut *st;
            if conn.id != 0
                && let Some(k) = st.conns.get_mut(&conn.id)
            {
                k.counts.add(nak, at);
                if *k.app != *app {
                    k.app = app.into();
                }
                if *k.fac != *fac {
                    k.fac = fac.into();
                }
            }
            if app.is_empty() && fac.is_empty() {
                return;
            }
            let at_bound = st.tracked >= self.max;
            if let Some(e) = st.by_app.get_mut(app).and_then(|m| m.get_mut(fac)) {
                e.counts.add(nak, at);
                if *e.last_peer != *conn.peer {
                    e.last_peer = conn.peer.clone();
                }
                if *e.last_listener != *conn.listener {
                    e.last_listener = conn.listener.clone();
                }
                named = e.named;
            } else if !at_bound || self.evict_least_recent(st) {
                named = self.match_named(app, fac);
                let mut counts = Counts::default();
                counts.add(nak, at);
                st.by_app.entry(app.into()).or_default().insert(
                    fac.into(),
                    Entry {
                        counts,
                        named,
                        first_seen: at,
                        last_peer: conn.peer.clone(),
                        last_listener: conn.listener.clone(),
                    },
                );
                st.tracked += 1;
                self.metrics.senders_tracked.set(st.tracked as i64);
            } else {
                st.other.add(nak, at);
                self.metrics.senders_untracked_messages.inc();
                named = self.match_named(app, fac);
            }
        }
        if let Some(n) = named.and_then(|i| self.named.get(i)) {
            n.messages.inc();
            if let Some(i) = nak {
                n.naks[i].inc();
            }
            n.last.set(unix_seconds(at));
        }
    }

    /// Removes the unnamed pair whose last message is oldest, its counts added to `other`; false when every
    /// tracked pair is named (or none is tracked). A scan of the view: it runs only for a new pair at the bound.
    fn evict_least_recent(&self, st: &mut State) -> bool {
        let oldest = st
            .by_app
            .iter()
            .flat_map(|(app, m)| m.iter().map(move |(fac, e)| (app, fac, e)))
            .filter(|(_, _, e)| e.named.is_none())
            .min_by_key(|(_, _, e)| e.counts.last)
            .map(|(app, fac, _)| (app.clone(), fac.clone()));
        let Some((app, fac)) = oldest else {
            return false;
        };
        let Some(m) = st.by_app.get_mut(&app) else {
            return false;
        };
        if let Some(e) = m.remove(&fac) {
            st.other.messages += e.counts.messages;
            for (o, n) in st.other.naks.iter_mut().zip(e.counts.naks) {
                *o += n;
            }
            st.other.last = st.other.last.max(e.counts.last);
        }
        if m.is_empty() {
            st.by_app.remove(&app);
        }
        st.tracked = st.tracked.saturating_sub(1);
        self.metrics.senders_evicted.inc();
        true
    }

    /// The view now, senders by application and facility, connections by when they opened; only the
    /// senders (and connections last sending) for `sending_application` when it is not empty.
    pub fn snapshot(&self, sending_application: &str) -> pb::SendersResponse {
        let st = self.lock();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let wanted =
            |app: &[u8]| sending_application.is_empty() || app == sending_application.as_bytes();
        let mut open: HashMap<(&[u8], &[u8]), u32> = HashMap::new();
        for k in st.conns.values() {
            *open.entry((&k.app, &k.fac)).or_default() += 1;
        }
        let mut senders = Vec::new();
        for (app, facs) in &st.by_app {
            if !wanted(app) {
                continue;
            }
            for (fac, e) in facs {
                senders.push(pb::Sender {
                    sending_application: text(app),
                    sending_facility: text(fac),
                    name: e
                        .named
                        .and_then(|i| self.names.get(i))
                        .cloned()
                        .unwrap_or_default(),
                    counts: Some(e.counts.to_proto()),
                    first_seen_at: Some(e.first_seen.into()),
                    last_peer: e.last_peer.to_string(),
                    last_listener: e.last_listener.to_string(),
                    open_connections: open.get(&(&**app, &**fac)).copied().unwrap_or(0),
                });
            }
        }
        senders.sort_by(|a, b| {
            (&a.sending_application, &a.sending_facility)
                .cmp(&(&b.sending_application, &b.sending_facility))
        });
        let mut conns: Vec<&Conn> = st.conns.values().filter(|k| wanted(&k.app)).collect();
        conns.sort_by_key(|k| k.connected);
        pb::SendersResponse {
            pod: hl7gw_runtime::pod_name(),
            senders,
            connections: conns
                .into_iter()
                .map(|k| pb::SenderConnection {
                    connection_id: k.connection_id.clone(),
                    listener: k.listener.to_string(),
                    protocol: k.protocol.to_owned(),
                    peer: k.peer.to_string(),
                    tls_client: k.tls_client.clone(),
                    connected_at: Some(k.connected.into()),
                    counts: Some(k.counts.to_proto()),
                    sending_application: text(&k.app),
                    sending_facility: text(&k.fac),
                })
                .collect(),
            other: Some(st.other.to_proto()),
            tracked: st.tracked as u32,
            max_senders: self.max as u32,
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::origin::Origin;

    fn origin(peer: &str) -> Origin {
        Origin {
            listener: "mllp".into(),
            protocol: "mllp",
            peer: peer.into(),
            connection_id: format!("c-{peer}"),
            tls_client: String::new(),
        }
    }

    fn msg(app: &str, fac: &str) -> Vec<u8> {
        format!("MSH|^~\\&|{app}|{fac}|GW|HOSP|20260101||ADT^A01|C1|P|2.5\r").into_bytes()
    }

    fn view(cfg: Config) -> (Arc<Senders>, prometheus_client::registry::Registry) {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = IngressMetrics::register(&mut registry);
        (Arc::new(Senders::new(&cfg, metrics)), registry)
    }

    fn record(s: &Senders, conn: &SenderConn, bytes: &[u8], code: Option<AckCode>) {
        s.record(conn, &Header::salvage(bytes), code, SystemTime::now());
    }

    /// Issue 26, item 3 and issue 36, item 6: however many (MSH-3, MSH-4) pairs senders make up, the view holds
    /// `max_senders`, the least recent making room for a new one (their counts in `other`, evictions counted),
    /// so a real sender arriving after a flood of made-up pairs is listed; a named sender is never evicted.
    #[test]
    fn distinct_senders_are_capped() {
        let cfg = Config {
            max_senders: 10,
            senders: vec![NamedSender {
                name: "named".into(),
                sending_application: "NAMED".into(),
                sending_facility: None,
            }],
            ..Config::default()
        };
        let (s, _r) = view(cfg);
        let conn = s.connect(&origin("10.0.0.1:1000"));
        let t0 = SystemTime::now();
        let at = |i: u64| t0 + std::time::Duration::from_secs(i);
        let record_at =
            |bytes: &[u8], code, i| s.record(&conn, &Header::salvage(bytes), code, at(i));
        record_at(&msg("NAMED", "FAC"), Some(AckCode::AA), 0);
        for i in 0..500 {
            record_at(&msg(&format!("APP{i}"), "FAC"), Some(AckCode::AA), i + 1);
        }
        record_at(&msg("REAL", "FAC"), Some(AckCode::AE), 1000);
        let v = s.snapshot("");
        assert_eq!(v.tracked, 10);
        assert_eq!(v.max_senders, 10);
        assert_eq!(v.senders.len(), 10);
        let listed = |app: &str| v.senders.iter().any(|x| x.sending_application == app);
        assert!(listed("REAL"), "a new sender after the flood is listed");
        assert!(listed("NAMED"), "a named sender is never evicted");
        assert!(listed("APP499") && !listed("APP3"), "the least recent went");
        // 492 made-up pairs evicted (501 pairs + REAL into 10 entries, one of them named), their messages in
        // `other`.
        assert_eq!(s.metrics.senders_evicted.get(), 492);
        assert_eq!(v.other.as_ref().map(|o| o.messages), Some(492));
        assert_eq!(s.metrics.senders_untracked_messages.get(), 0);
        assert_eq!(s.metrics.senders_tracked.get(), 10);
        let real = v
            .senders
            .iter()
            .find(|x| x.sending_application == "REAL")
            .and_then(|x| x.counts.clone())
            .unwrap_or_default();
        assert_eq!(real.naks.get("AE"), Some(&1));
        // The connection counts everything it carried, tracked or not.
        assert_eq!(v.connections.len(), 1);
        assert_eq!(
            v.connections[0].counts.as_ref().map(|c| c.messages),
            Some(502)
        );
    }

    /// Values are cut to the HD-1 component and its standard length, so one long MSH-3 cannot make an entry
    /// large; a connection's entry goes when its handle drops; an unlisted call lists no connection.
    #[test]
    fn entries_are_small_and_connections_go_when_closed() {
        let (s, _r) = view(Config::default());
        let conn = s.connect(&origin("10.0.0.1:1000"));
        let long = "X".repeat(100_000);
        record(
            &s,
            &conn,
            &msg(&format!("{long}^1.2.3^ISO"), "FAC^9.9^ISO"),
            None,
        );
        record(&s, &conn, &msg("LAB^1.2.3^ISO", "FAC"), Some(AckCode::CR));
        let v = s.snapshot("");
        assert_eq!(v.senders.len(), 2);
        assert!(
            v.senders
                .iter()
                .all(|x| x.sending_application.len() <= hl7v2::ack::MAX_HD)
        );
        let lab = v
            .senders
            .iter()
            .find(|x| x.sending_application == "LAB")
            .expect("LAB, its first component");
        assert_eq!(lab.sending_facility, "FAC");
        assert_eq!(lab.open_connections, 1);
        assert_eq!(v.connections[0].sending_application, "LAB");
        drop(conn);
        let unary = s.unlisted(&origin("10.0.0.2:2000"));
        record(&s, &unary, &msg("LAB", "FAC"), Some(AckCode::AA));
        let v = s.snapshot("LAB");
        assert!(v.connections.is_empty());
        assert_eq!(v.senders.len(), 1);
        assert_eq!(v.senders[0].last_peer, "10.0.0.2:2000");
        assert_eq!(v.senders[0].open_connections, 0);
    }

    /// Named senders get metrics: messages, NAKs by code, last message time (the start time before any
    /// message); an exact facility wins over "any facility"; unnamed senders move no named series.
    #[test]
    fn named_senders_have_metrics() {
        let cfg = Config {
            senders: vec![
                NamedSender {
                    name: "lab".into(),
                    sending_application: "LAB".into(),
                    sending_facility: None,
                },
                NamedSender {
                    name: "lab-north".into(),
                    sending_application: "LAB".into(),
                    sending_facility: Some("NORTH".into()),
                },
            ],
            ..Config::default()
        };
        let (s, registry) = view(cfg);
        let start = unix_seconds(SystemTime::now());
        let text = hl7gw_runtime::metrics::render(&registry);
        assert!(
            text.contains("ingress_sender_last_message_timestamp_seconds{sender=\"lab\"}"),
            "{text}"
        );
        let conn = s.connect(&origin("10.0.0.1:1000"));
        record(&s, &conn, &msg("LAB", "SOUTH"), Some(AckCode::AA));
        record(&s, &conn, &msg("LAB", "SOUTH"), Some(AckCode::AR));
        record(&s, &conn, &msg("LAB^x^ISO", "NORTH"), Some(AckCode::CE));
        record(&s, &conn, &msg("RAD", "NORTH"), Some(AckCode::AE));
        let get = |name: &str| {
            s.metrics
                .sender_messages
                .get_or_create(&SenderLabels {
                    sender: name.into(),
                })
                .get()
        };
        assert_eq!(get("lab"), 2);
        assert_eq!(get("lab-north"), 1);
        let nak = |name: &str, code: &'static str| {
            s.metrics
                .sender_naks
                .get_or_create(&SenderCodeLabels {
                    sender: name.into(),
                    code,
                })
                .get()
        };
        assert_eq!(nak("lab", "AR"), 1);
        assert_eq!(nak("lab", "AE"), 0);
        assert_eq!(nak("lab-north", "CE"), 1);
        let last = s
            .metrics
            .sender_last_message_timestamp
            .get_or_create(&SenderLabels {
                sender: "lab".into(),
            })
            .get();
        assert!(last >= start, "{last} < {start}");
        let v = s.snapshot("");
        let names: Vec<_> = v.senders.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["lab-north", "lab", ""]);
    }
}
