//! gRPC `hl7gw.v1.Egress` (destination status, dead letters, replay) and `grpc.health.v1.Health`.

use crate::config::Config;
use crate::deadletters::{self, Filter};
use crate::deliver::DestCtx;
use crate::metrics::{DestLabels, EgressMetrics};
use hl7gw_runtime::proto::v1::egress_server::{Egress, EgressServer};
use hl7gw_runtime::proto::v1::{
    DestinationStatus, ListDeadLettersRequest, ListDeadLettersResponse, ReplayRequest,
    ReplayResponse, StatusRequest, StatusResponse, TraceRequest, TraceResponse,
};
use rdkafka::consumer::Consumer;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tonic::{Request, Response, Status};

/// The Egress service.
pub struct EgressService {
    pub cfg: Arc<Config>,
    /// Who may call what: every method here is an admin method (nobody unless `grpc.allow` says).
    pub auth: hl7gw_runtime::grpc::Auth,
    pub dests: Vec<Arc<DestCtx>>,
    pub producer: Arc<hl7gw_runtime::producer::ProducerSlot>,
    pub metrics: EgressMetrics,
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
        producer: Arc<hl7gw_runtime::producer::ProducerSlot>,
        metrics: EgressMetrics,
    ) -> EgressServer<Self> {
        let service = Self {
            auth: hl7gw_runtime::grpc::Auth::new(&cfg.grpc, &[]),
            cfg,
            dests,
            producer,
            metrics,
        };
        hl7gw_runtime::compressed!(EgressServer::new(service))
    }

    async fn list(&self, filter: Filter) -> Result<deadletters::Page, Status> {
        let cfg = self.cfg.clone();
        tokio::task::spawn_blocking(move || deadletters::list(&cfg, &filter))
            .await
            .map_err(|_| Status::internal("DLQ reader failed"))?
            .map_err(|e| match e {
                deadletters::DeadLetterError::Cursor(m) => Status::invalid_argument(m),
                e => Status::unavailable(e.to_string()),
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
        let peer = hl7gw_runtime::grpc::peer(&req);
        let result: Result<Response<ListDeadLettersResponse>, Status> = async move {
            let r = req.into_inner();
            let found = self
                .list(Filter {
                    destination: r.destination,
                    stage: r.stage,
                    replay_only: false,
                    ids: Vec::new(),
                    since_ms: millis(r.since.as_ref()),
                    until_ms: millis(r.until.as_ref()),
                    limit: r.limit as usize,
                    reason: r.reason,
                    cursor: cursor(&r.cursor)?,
                })
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
        hl7gw_runtime::grpc::audit_result(&caller, peer, "ListDeadLetters", &what, &result, |r| {
            format!("{} dead letters", r.dead_letters.len())
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
            let letters: Vec<_> = chosen.iter().map(|(dl, _)| dl.clone()).collect();
            if r.dry_run {
                return Ok(Response::new(ReplayResponse {
                    replayed: letters.len() as u32,
                    ids: letters.iter().map(|l| l.id.clone()).collect(),
                    truncated,
                    next_cursor,
                    skipped,
                    letters,
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
            tracing::info!(replayed = ids.len(), skipped, "dead letters replayed");
            Ok(Response::new(ReplayResponse {
                replayed: ids.len() as u32,
                ids: ids.into_iter().map(|(id, _)| id).collect(),
                truncated,
                next_cursor,
                skipped,
                letters,
            }))
        }
        .await;
        hl7gw_runtime::grpc::audit_result(&caller, peer, "Replay", &what, &result, |r| {
            format!(
                "{} replayed, {} skipped as replayed before: {}",
                r.replayed,
                r.skipped,
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
        let result: Result<Response<TraceResponse>, Status> = async move {
            let r = req.into_inner();
            let q = crate::trace::Query::from_request(&r).map_err(Status::invalid_argument)?;
            let cfg = self.cfg.clone();
            tokio::task::spawn_blocking(move || crate::trace::find(&cfg, &q))
                .await
                .map_err(|_| Status::internal("trace reader failed"))?
                .map(Response::new)
                .map_err(|e| Status::unavailable(e.to_string()))
        }
        .await;
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
    #[test]
    fn audit_descriptions_are_bounded_whatever_the_caller_sends() {
        let big = "x".repeat(4 << 20);
        let ids = vec!["i".repeat(64 << 10); 50];
        let what = super::describe(&big, &big, &ids, None, None);
        assert!(what.len() < 8 * 1024, "{} bytes", what.len());
        assert!(what.contains("ids=50 (first "), "{}", &what[..200]);
    }
}
