//! gRPC `hl7gw.v1.Egress` (destination status, dead letters, replay) and `grpc.health.v1.Health`.
//!
//! Message bodies (patient data) are a permission of their own, [`READ_MESSAGES`], asked on top of the
//! method's when a call wants them. `ListDeadLetters` and `Trace` read Kafka on demand (a consumer and a
//! blocking thread each), so they are bounded ([`MAX_SCANS`], [`MAX_SCANS_PER_CALLER`]) and stop reading
//! when their caller goes away.

use crate::config::Config;
use crate::deadletters::{self, Filter};
use crate::deliver::DestCtx;
use crate::metrics::{DestLabels, EgressMetrics, ScanLabels};
use hl7gw_runtime::grpc::Caller;
use hl7gw_runtime::grpc::READ_MESSAGES;
use hl7gw_runtime::proto::v1::egress_server::{Egress, EgressServer};
use hl7gw_runtime::proto::v1::{
    DestinationStatus, ListDeadLettersRequest, ListDeadLettersResponse, RefusedReplay,
    ReplayRequest, ReplayResponse, StatusRequest, StatusResponse, TraceRequest, TraceResponse,
};
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::consumer::Consumer;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// `ListDeadLetters` and `Trace` calls reading Kafka at once at most per process: each holds a Kafka consumer
/// and a blocking thread for up to its budget (30 s, 20 s). Past it, RESOURCE_EXHAUSTED.
pub const MAX_SCANS: usize = 4;

/// The same per caller (a token, a client certificate, a Kubernetes user; anonymous callers per address), so
/// one caller cannot take every place.
pub const MAX_SCANS_PER_CALLER: usize = 2;

/// The on-demand scans in flight: in total and per caller.
#[derive(Debug, Default)]
struct Scans {
    in_flight: Mutex<(usize, HashMap<String, usize>)>,
}

/// Why a scan was refused: the `limit` label of `admin_scans_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    Process,
    Caller,
}

impl Scans {
    /// A place for one scan of `caller`'s, or which limit is reached.
    fn try_start(self: &Arc<Self>, caller: String, gauge: &Gauge) -> Result<ScanSlot, Full> {
        let mut g = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per_caller) = &mut *g;
        let mine = per_caller.get(&caller).copied().unwrap_or(0);
        if mine >= MAX_SCANS_PER_CALLER {
            return Err(Full::Caller);
        }
        if *total >= MAX_SCANS {
            return Err(Full::Process);
        }
        *total += 1;
        per_caller.insert(caller.clone(), mine + 1);
        gauge.inc();
        Ok(ScanSlot {
            scans: self.clone(),
            caller,
            gauge: gauge.clone(),
        })
    }
}

/// One scan's place, given back when dropped: by the blocking work once it stopped reading, so a cancelled
/// call holds its place until its Kafka reading really ended.
#[derive(Debug)]
struct ScanSlot {
    scans: Arc<Scans>,
    caller: String,
    gauge: Gauge,
}

impl Drop for ScanSlot {
    fn drop(&mut self) {
        let mut g = self
            .scans
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (total, per_caller) = &mut *g;
        *total = total.saturating_sub(1);
        if let Some(n) = per_caller.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_caller.remove(&self.caller);
            }
        }
        self.gauge.dec();
    }
}

/// Who a scan is counted against: the caller, or an anonymous caller's address.
fn scan_owner(caller: &Caller, peer: Option<SocketAddr>) -> String {
    match caller {
        Caller::Anonymous => format!(
            "anonymous@{}",
            peer.map(|p| p.ip().to_string()).unwrap_or_default()
        ),
        c => c.to_string(),
    }
}

/// Runs `work` on a blocking thread with a token that is cancelled when the returned future is dropped (the
/// caller went away: tonic drops a call's future when its stream is reset), holding `slot` until `work`
/// returned.
async fn blocking<T: Send + 'static>(
    slot: Option<ScanSlot>,
    work: impl FnOnce(&CancellationToken) -> T + Send + 'static,
) -> Result<T, Status> {
    let cancel = CancellationToken::new();
    let _cancel_on_drop = cancel.clone().drop_guard();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        work(&cancel)
    })
    .await
    .map_err(|_| Status::internal("the Kafka reader failed"))
}

/// The audit line of a call whose caller went away before its answer (its future dropped), unless
/// [`Unfinished::done`] was called: every admin call is on the record, cancelled ones too.
struct Unfinished<'a> {
    caller: &'a Caller,
    peer: Option<SocketAddr>,
    method: &'static str,
    what: &'a str,
    done: bool,
}

impl Unfinished<'_> {
    fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if !self.done {
            hl7gw_runtime::grpc::audit(
                &self.caller.to_string(),
                self.peer,
                self.method,
                self.what,
                "cancelled: the caller went away",
            );
        }
    }
}

/// The Egress service.
pub struct EgressService {
    pub cfg: Arc<Config>,
    /// Who may call what: every method here is an admin method (nobody unless `grpc.allow` says).
    pub auth: hl7gw_runtime::grpc::Auth,
    pub dests: Vec<Arc<DestCtx>>,
    pub producer: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
    pub metrics: EgressMetrics,
    /// `ListDeadLetters` and `Trace` calls reading Kafka now.
    scans: Arc<Scans>,
}

impl std::fmt::Debug for EgressService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressService").finish_non_exhaustive()
    }
}

/// What an admin call asks for, for its audit line: destination, stage, ids and time range (no content).
fn describe(
    destination: &str,
    stage: &str,
    ids: &[String],
    since: Option<&prost_types::Timestamp>,
    until: Option<&prost_types::Timestamp>,
) -> String {
    use hl7gw_runtime::grpc::clip;
    let mut w = format!(
        "destination={:?} stage={:?}",
        clip(destination),
        clip(stage)
    );
    // The ids a caller sends are logged before it is authorised: bounded, in number and each in length.
    let first: Vec<_> = ids.iter().take(20).map(|id| clip(id)).collect();
    match ids.len() {
        0 => {}
        n if n <= 20 => w.push_str(&format!(" ids={}", first.join(","))),
        n => w.push_str(&format!(" ids={n} (first {})", first.join(","))),
    }
    if let Some(t) = millis(since) {
        w.push_str(&format!(" since_ms={t}"));
    }
    if let Some(t) = millis(until) {
        w.push_str(&format!(" until_ms={t}"));
    }
    w
}

fn millis(t: Option<&prost_types::Timestamp>) -> Option<i64> {
    t.map(|t| {
        t.seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(t.nanos) / 1_000_000)
    })
}

impl EgressService {
    /// The Egress gRPC server over the destinations, gzip and zstd both ways. Every method is an admin
    /// method: nobody may call it unless `grpc.allow` says.
    pub fn server(
        cfg: Arc<Config>,
        dests: Vec<Arc<DestCtx>>,
        producer: Arc<hl7gw_runtime::kafka::producer::ProducerSlot>,
        metrics: EgressMetrics,
    ) -> EgressServer<Self> {
        let service = Self {
            auth: hl7gw_runtime::grpc::Auth::new(&cfg.grpc, &[]),
            cfg,
            dests,
            producer,
            metrics,
            scans: Arc::default(),
        };
        hl7gw_runtime::compressed!(EgressServer::new(service))
    }

    /// Replay's listing of the DLQ (not counted in the scans' limits: Replay is an operator's, and writes).
    async fn list(&self, filter: Filter) -> Result<deadletters::Page, Status> {
        self.list_in(filter, None).await
    }

    /// Lists the DLQ on a blocking thread holding `slot`, stopping when the call is dropped.
    async fn list_in(
        &self,
        filter: Filter,
        slot: Option<ScanSlot>,
    ) -> Result<deadletters::Page, Status> {
        let cfg = self.cfg.clone();
        blocking(slot, move |cancel| deadletters::list(&cfg, &filter, cancel))
            .await?
            .map_err(|e| match e {
                deadletters::DeadLetterError::Cursor(m) => Status::invalid_argument(m),
                e => Status::unavailable(e.to_string()),
            })
    }
}

impl EgressService {
    /// A place for an on-demand scan of `caller`'s (`method`: its metric label), or RESOURCE_EXHAUSTED
    /// (counted) when the process or the caller has as many as it may.
    fn start_scan(
        &self,
        method: &'static str,
        caller: &Caller,
        peer: Option<SocketAddr>,
    ) -> Result<ScanSlot, Status> {
        self.scans
            .try_start(scan_owner(caller, peer), &self.metrics.admin_scans_in_flight)
            .map_err(|full| {
                let (limit, text) = match full {
                    Full::Process => (
                        "process",
                        format!("this egress pod runs {MAX_SCANS} dead-letter listings and traces already"),
                    ),
                    Full::Caller => (
                        "caller",
                        format!("you run {MAX_SCANS_PER_CALLER} dead-letter listings and traces already"),
                    ),
                };
                self.metrics
                    .admin_scans_refused
                    .get_or_create(&ScanLabels { method, limit })
                    .inc();
                Status::resource_exhausted(format!("{text}; retry when one finished"))
            })
    }
}

/// The cursor a caller sent, parsed (empty: none).
fn cursor(s: &str) -> Result<Option<deadletters::Cursor>, Status> {
    if s.is_empty() {
        return Ok(None);
    }
    deadletters::parse_cursor(s)
        .map(Some)
        .map_err(Status::invalid_argument)
}

#[tonic::async_trait]
impl Egress for EgressService {
    async fn status(
        &self,
        req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let what = format!(
            "destination={:?}",
            hl7gw_runtime::grpc::clip(&req.get_ref().destination)
        );
        let caller = self.auth.admin(&req, "Status", &what).await?;
        let peer = hl7gw_runtime::grpc::peer(&req);
        let result: Result<Response<StatusResponse>, Status> = async move {
            let want = req.into_inner().destination;
            let mut out = StatusResponse::default();
            for d in &self.dests {
                if !want.is_empty() && d.name != want {
                    continue;
                }
                let s = &d.state;
                let connected = self
                    .metrics
                    .per_destination
                    .connections_active
                    .get_or_create(&DestLabels {
                        destination: d.name.clone(),
                    })
                    .get();
                let (address, connected) = match &d.dest.url {
                    Some(url) => (url.clone(), s.answered.load(Ordering::Relaxed)),
                    None => (d.dest.address.clone(), connected > 0),
                };
                out.destinations.push(DestinationStatus {
                    name: d.name.clone(),
                    address,
                    connected,
                    lag: s.lag.load(Ordering::Relaxed),
                    last_ack_code: s
                        .last_ack_code
                        .lock()
                        .map(|g| g.clone())
                        .unwrap_or_default(),
                    last_ack_at: s
                        .last_ack_at
                        .lock()
                        .ok()
                        .and_then(|g| *g)
                        .map(prost_types::Timestamp::from),
                    retrying: s.retrying.load(Ordering::Relaxed) > 0,
                    last_error: s.last_error.lock().map(|g| g.clone()).unwrap_or_default(),
                    delivered: s.delivered.load(Ordering::Relaxed),
                    dead_lettered: s.dead_lettered.load(Ordering::Relaxed),
                    partitions: d.consumer.context().partitions(),
                    oldest_undelivered_age_seconds: s.oldest_undelivered_age().as_secs_f64(),
                    retrying_since: s.retrying_since().map(prost_types::Timestamp::from),
                    dead_lettered_by_reason: s
                        .dead_lettered_by_reason
                        .lock()
                        .map(|m| m.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
                        .unwrap_or_default(),
                });
            }
            if !want.is_empty() && out.destinations.is_empty() {
                return Err(Status::not_found(format!(
                    "no destination {:?}",
                    hl7gw_runtime::grpc::clip(&want)
                )));
            }
            Ok(Response::new(out))
        }
        .await;
        hl7gw_runtime::grpc::audit_result(&caller, peer, "Status", &what, &result, |r| {
            format!("{} destinations", r.destinations.len())
        });
        result
    }

    async fn list_dead_letters(
        &self,
        req: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        let what = format!(
            "{} reason={:?} cursor={:?} limit={} include_envelope={}",
            describe(
                &req.get_ref().destination,
                &req.get_ref().stage,
                &[],
                req.get_ref().since.as_ref(),
                req.get_ref().until.as_ref()
            ),
            hl7gw_runtime::grpc::clip(&req.get_ref().reason),
            hl7gw_runtime::grpc::clip(&req.get_ref().cursor),
            req.get_ref().limit,
            req.get_ref().include_envelope
        );
        let caller = self.auth.admin(&req, "ListDeadLetters", &what).await?;
        if req.get_ref().include_envelope {
            // Message bodies are patient data: a permission of their own (audited as such when refused).
            self.auth
                .admin(&req, READ_MESSAGES, &what)
                .await
                .map_err(|s| match s.code() {
                    tonic::Code::PermissionDenied => Status::permission_denied(format!(
                        "{}: message bodies need {READ_MESSAGES}; list without include_envelope \
                         (--with-message) for ids and codes",
                        s.message()
                    )),
                    _ => s,
                })?;
        }
        let peer = hl7gw_runtime::grpc::peer(&req);
        let unfinished = Unfinished {
            caller: &caller,
            peer,
            method: "ListDeadLetters",
            what: &what,
            done: false,
        };
        let result: Result<Response<ListDeadLettersResponse>, Status> = async {
            let slot = self.start_scan("ListDeadLetters", &caller, peer)?;
            let r = req.into_inner();
            let found = self
                .list_in(
                    Filter {
                        destination: r.destination,
                        stage: r.stage,
                        replay_only: false,
                        ids: Vec::new(),
                        since_ms: millis(r.since.as_ref()),
                        until_ms: millis(r.until.as_ref()),
                        limit: r.limit as usize,
                        reason: r.reason,
                        cursor: cursor(&r.cursor)?,
                    },
                    Some(slot),
                )
                .await?;
            let truncated = found.truncated;
            let next_cursor = found.next_cursor;
            let dead_letters = found
                .letters
                .into_iter()
                .map(|(mut dl, env)| {
                    if r.include_envelope {
                        dl.envelope = Some(env);
                    }
                    dl
                })
                .collect();
            Ok(Response::new(ListDeadLettersResponse {
                dead_letters,
                truncated,
                next_cursor,
            }))
        }
        .await;
        unfinished.done();
        hl7gw_runtime::grpc::audit_result(&caller, peer, "ListDeadLetters", &what, &result, |r| {
            let with = r
                .dead_letters
                .iter()
                .filter(|d| d.envelope.is_some())
                .count();
            if with > 0 {
                format!(
                    "{} dead letters, {with} with their messages",
                    r.dead_letters.len()
                )
            } else {
                format!("{} dead letters", r.dead_letters.len())
            }
        });
        result
    }

    async fn replay(
        &self,
        req: Request<ReplayRequest>,
    ) -> Result<Response<ReplayResponse>, Status> {
        let what = format!(
            "{} reason={:?} cursor={:?} dry_run={} force={}",
            describe(
                &req.get_ref().destination,
                &req.get_ref().stage,
                &req.get_ref().ids,
                req.get_ref().since.as_ref(),
                req.get_ref().until.as_ref(),
            ),
            hl7gw_runtime::grpc::clip(&req.get_ref().reason),
            hl7gw_runtime::grpc::clip(&req.get_ref().cursor),
            req.get_ref().dry_run,
            req.get_ref().force,
        );
        let caller = self.auth.admin(&req, "Replay", &what).await?;
        let peer = hl7gw_runtime::grpc::peer(&req);
        let by = caller.to_string();
        let result: Result<Response<ReplayResponse>, Status> = async move {
            let r = req.into_inner();
            if r.ids.is_empty() && r.destination.is_empty() && r.stage.is_empty() {
                return Err(Status::invalid_argument(
                    "name ids, or a destination or stage (with an optional time range)",
                ));
            }
            let found = self
                .list(Filter {
                    destination: r.destination,
                    stage: r.stage,
                    replay_only: true,
                    ids: r.ids,
                    since_ms: millis(r.since.as_ref()),
                    until_ms: millis(r.until.as_ref()),
                    limit: deadletters::MAX_PAGE,
                    reason: r.reason,
                    cursor: cursor(&r.cursor)?,
                })
                .await?;
            let truncated = found.truncated;
            let next_cursor = found.next_cursor;
            // Letters replayed before (a marker follows them in the DLQ) go again only when forced.
            let (again, fresh): (Vec<_>, Vec<_>) = found
                .letters
                .into_iter()
                .partition(|(dl, _)| !dl.replayed_by.is_empty());
            let skipped = if r.force { 0 } else { again.len() as u32 };
            let chosen: Vec<_> = if r.force {
                again.into_iter().chain(fresh).collect()
            } else {
                fresh
            };
            // Never sent without its message: re-read from its origin, or refused (with why and where).
            let (chosen, refused) = deadletters::whole(&self.cfg, chosen)
                .await
                .map_err(Status::internal)?;
            let refused: Vec<_> = refused
                .into_iter()
                .map(|f| RefusedReplay {
                    id: f.id,
                    control_id: f.control_id,
                    why: f.why,
                    origin: f.origin,
                })
                .collect();
            let letters: Vec<_> = chosen.iter().map(|(dl, _)| dl.clone()).collect();
            if r.dry_run {
                return Ok(Response::new(ReplayResponse {
                    replayed: letters.len() as u32,
                    ids: letters.iter().map(|l| l.id.clone()).collect(),
                    truncated,
                    next_cursor,
                    skipped,
                    letters,
                    refused,
                }));
            }
            let ids = deadletters::replay(&self.cfg, &by, chosen)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            for (_, dest) in &ids {
                self.metrics
                    .replayed
                    .get_or_create(&DestLabels {
                        destination: dest.clone(),
                    })
                    .inc();
            }
            tracing::info!(
                replayed = ids.len(),
                skipped,
                refused = refused.len(),
                "dead letters replayed"
            );
            Ok(Response::new(ReplayResponse {
                replayed: ids.len() as u32,
                ids: ids.into_iter().map(|(id, _)| id).collect(),
                truncated,
                next_cursor,
                skipped,
                letters,
                refused,
            }))
        }
        .await;
        hl7gw_runtime::grpc::audit_result(&caller, peer, "Replay", &what, &result, |r| {
            format!(
                "{} replayed, {} skipped as replayed before, {} refused (not whole): {}",
                r.replayed,
                r.skipped,
                r.refused.len(),
                r.ids.join(",")
            )
        });
        result
    }

    async fn trace(&self, req: Request<TraceRequest>) -> Result<Response<TraceResponse>, Status> {
        let r = req.get_ref();
        let what = format!(
            "envelope_id={:?} control_id={:?} sending_application={:?} sending_facility={:?} since_ms={:?} until_ms={:?} limit={}",
            hl7gw_runtime::grpc::clip(&r.envelope_id),
            hl7gw_runtime::grpc::clip(&r.control_id),
            hl7gw_runtime::grpc::clip(&r.sending_application),
            hl7gw_runtime::grpc::clip(&r.sending_facility),
            millis(r.since.as_ref()),
            millis(r.until.as_ref()),
            r.limit,
        );
        let caller = self.auth.admin(&req, "Trace", &what).await?;
        let peer = hl7gw_runtime::grpc::peer(&req);
        let unfinished = Unfinished {
            caller: &caller,
            peer,
            method: "Trace",
            what: &what,
            done: false,
        };
        let result: Result<Response<TraceResponse>, Status> = async {
            let r = req.into_inner();
            let q = crate::trace::Query::from_request(&r).map_err(Status::invalid_argument)?;
            let slot = self.start_scan("Trace", &caller, peer)?;
            let cfg = self.cfg.clone();
            blocking(Some(slot), move |cancel| {
                crate::trace::find(&cfg, &q, cancel)
            })
            .await?
            .map(Response::new)
            .map_err(|e| Status::unavailable(e.to_string()))
        }
        .await;
        unfinished.done();
        hl7gw_runtime::grpc::audit_result(&caller, peer, "Trace", &what, &result, |r| {
            format!(
                "{} messages, {} records read{}",
                r.messages.len(),
                r.records_scanned,
                if r.truncated { ", truncated" } else { "" }
            )
        });
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_are_bounded_per_caller_and_per_process() {
        let scans = Arc::new(Scans::default());
        let gauge = Gauge::default();
        let mut held = Vec::new();
        for n in 0..MAX_SCANS {
            let caller = format!("token:c{}", n / MAX_SCANS_PER_CALLER);
            held.push(scans.try_start(caller, &gauge).expect("a place"));
        }
        let full = |caller: &str| scans.try_start(caller.to_owned(), &gauge).err();
        assert_eq!(full("token:c0"), Some(Full::Caller));
        assert_eq!(full("token:other"), Some(Full::Process));
        assert_eq!(gauge.get(), MAX_SCANS as i64);
        held.swap_remove(0);
        assert_eq!(gauge.get(), MAX_SCANS as i64 - 1);
        assert!(scans.try_start("token:other".into(), &gauge).is_ok());
        held.clear();
        assert_eq!(gauge.get(), 0);
        let g = scans.in_flight.lock().expect("scans");
        assert_eq!(
            (g.0, g.1.len()),
            (0, 0),
            "callers without scans are forgotten"
        );
        drop(g);
        // Anonymous callers are counted per address.
        let peer = |ip: [u8; 4]| Some(SocketAddr::from((ip, 1000)));
        assert_ne!(
            scan_owner(&Caller::Anonymous, peer([10, 0, 0, 1])),
            scan_owner(&Caller::Anonymous, peer([10, 0, 0, 2]))
        );
    }

    #[tokio::test]
    async fn a_dropped_call_cancels_its_blocking_work_and_gives_its_place_back() {
        let scans = Arc::new(Scans::default());
        let gauge = Gauge::default();
        let slot = scans.try_start("token:a".into(), &gauge).expect("a place");
        let (tx, rx) = std::sync::mpsc::channel();
        let call = blocking(Some(slot), move |cancel| {
            while !cancel.is_cancelled() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            tx.send(()).ok();
        });
        // The caller gives up: the call's future is dropped.
        let cut = tokio::time::timeout(std::time::Duration::from_millis(100), call).await;
        assert!(cut.is_err());
        tokio::task::spawn_blocking(move || rx.recv_timeout(std::time::Duration::from_secs(5)))
            .await
            .expect("join")
            .expect("the blocking work stopped");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while gauge.get() != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the place was not given back"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn audit_descriptions_are_bounded_whatever_the_caller_sends() {
        let big = "x".repeat(4 << 20);
        let ids = vec!["i".repeat(64 << 10); 50];
        let what = describe(&big, &big, &ids, None, None);
        assert!(what.len() < 8 * 1024, "{} bytes", what.len());
        assert!(what.contains("ids=50 (first "), "{}", &what[..200]);
    }
}
