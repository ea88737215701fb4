//! Delivery over HTTP(S) (FHIR servers, web services): the status classes, retries with `Retry-After`, refused
//! credentials bounded, the answer's summary in a dead letter.

use super::ctx::DestCtx;
use super::ctx::Done;
use super::record::Answer;
use super::record::Delivery;
use super::record::Ending;
use super::state::set;
use hl7gw_runtime::proto::v1::Envelope;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

impl DestCtx {
    /// Sends an output to an HTTP(S) destination until its answer settles it: 2xx delivered; 408, 429 and 5xx
    /// retried (waiting at least `Retry-After`, up to `http.max_retry_after`) as `ack_policy.max_retries`
    /// allows, then `gave_up`; refused credentials (401/403, a token endpoint refusing the client) as
    /// `ack_policy.max_auth_retries` allows, then `unauthorized` (replayable once they are fixed); no answer at
    /// all retried as `retry` says (forever by default: the patient's later messages wait behind it); any other
    /// status dead-lettered (`rejected`) with the status and the response body.
    pub(super) async fn deliver_http(
        &self,
        http: &crate::http::HttpClient,
        env: Envelope,
        d: Delivery<'_>,
    ) -> Done {
        let content_type = match env.content_type.as_str() {
            "" => "application/hl7-v2",
            c => c,
        }
        .to_owned();
        let traceparent = hl7gw_runtime::telemetry::trace_context(d.span).0;
        let retry = &self.dest.retry;
        let policy = &self.dest.ack_policy;
        let mut attempt = env.attempts;
        let mut tries = 0u32;
        let mut negative = 0u32;
        // Refused credentials (401/403, a token endpoint's refusal), bounded by `max_auth_retries`.
        let mut refused_auth = 0u32;
        let mut auth_detail = String::new();
        loop {
            attempt += 1;
            tries += 1;
            let started = Instant::now();
            let mut wait = retry.backoff(tries, fastrand::f64());
            let mut last = None;
            let reason: &'static str = match http
                .send(env.raw.clone(), &content_type, &traceparent)
                .await
            {
                Ok(a) => {
                    let status = a.status.as_u16();
                    self.state.answered.store(true, Ordering::Relaxed);
                    self.m.http_answered(status);
                    set(&self.state.last_ack_code, a.status.as_str());
                    if let Ok(mut t) = self.state.last_ack_at.lock() {
                        *t = Some(SystemTime::now());
                    }
                    d.span.record("http.response.status_code", status);
                    d.span.record("hl7.attempts", attempt);
                    match http_verdict(status) {
                        HttpVerdict::Delivered => {
                            let answer = ("", u32::from(status));
                            return self
                                .delivered(&env, d.m, started, attempt, tries, d.key, answer);
                        }
                        HttpVerdict::Refused => {
                            self.m.http_refused(d.span, status);
                            let end = Ending {
                                tries,
                                attempt,
                                reason: "rejected",
                                detail: http_detail(status, &a.content_type, &a.body),
                                answer: Answer::http(a.body, status),
                            };
                            return self.last_attempt(env, d.m, end, d.span, d.stop).await;
                        }
                        HttpVerdict::RetryLater(reason) => {
                            negative += 1;
                            if let Some(after) = a.retry_after {
                                wait = wait.max(after.min(self.dest.http.max_retry_after));
                            }
                            last = Some(Answer::http(a.body, status));
                            reason
                        }
                        HttpVerdict::Unauthorized => {
                            refused_auth += 1;
                            auth_detail = http_detail(status, &a.content_type, &a.body);
                            last = Some(Answer::http(a.body, status));
                            "unauthorized"
                        }
                    }
                }
                Err(e) => {
                    self.state.answered.store(false, Ordering::Relaxed);
                    if !matches!(e, crate::http::HttpError::Connect(_)) {
                        self.m.attempt_failed(d.span, &e);
                    }
                    if let crate::http::HttpError::Refused { status, detail } = &e {
                        refused_auth += 1;
                        auth_detail.clone_from(detail);
                        last = Some(Answer::http(bytes::Bytes::new(), *status));
                    }
                    e.kind()
                }
            };
            set(&self.state.last_error, reason);
            if policy.max_auth_retries > 0 && refused_auth > policy.max_auth_retries {
                self.m.gave_up(d.span, reason, tries);
                let end = Ending {
                    tries,
                    attempt,
                    reason: "unauthorized",
                    detail: format!(
                        "credentials refused {refused_auth} times in {tries} attempts, last: {auth_detail}"
                    ),
                    answer: last.unwrap_or_default(),
                };
                return self.last_attempt(env, d.m, end, d.span, d.stop).await;
            }
            if (retry.max_attempts > 0 && tries >= retry.max_attempts)
                || (policy.max_retries > 0 && negative > policy.max_retries)
            {
                self.m.gave_up(d.span, reason, tries);
                let end = Ending {
                    tries,
                    attempt,
                    reason: "gave_up",
                    detail: format!("{tries} attempts, last: {reason}"),
                    answer: last.unwrap_or_default(),
                };
                return self.last_attempt(env, d.m, end, d.span, d.stop).await;
            }
            if !self
                .pause_before_retry(tries, reason, wait, d.generation, d.head, d.stop)
                .await
            {
                return Done::Abandoned;
            }
        }
    }
}

/// What an HTTP status makes of a delivery.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HttpVerdict {
    /// 2xx.
    Delivered,
    /// 408, 429, 5xx: the server cannot take it now (the label says which).
    RetryLater(&'static str),
    /// 401, 403: our credentials, not the message: retried like a receiver that is down.
    Unauthorized,
    /// Any other status (a 4xx, or a redirect, which is not followed): sending it again cannot help.
    Refused,
}

pub(super) fn http_verdict(status: u16) -> HttpVerdict {
    match status {
        200..=299 => HttpVerdict::Delivered,
        408 => HttpVerdict::RetryLater("http_408"),
        429 => HttpVerdict::RetryLater("http_429"),
        500..=599 => HttpVerdict::RetryLater("http_5xx"),
        401 | 403 => HttpVerdict::Unauthorized,
        _ => HttpVerdict::Refused,
    }
}

/// A dead letter's detail for an HTTP refusal: the status and, for a FHIR OperationOutcome, its issues'
/// severities and codes (not their diagnostics, which may quote the message).
pub(super) fn http_detail(status: u16, content_type: &str, body: &[u8]) -> String {
    let mut detail = format!("receiver answered HTTP {status}");
    if !content_type.contains("json") {
        return detail;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return detail;
    };
    if v.get("resourceType").and_then(|t| t.as_str()) != Some("OperationOutcome") {
        return detail;
    }
    let issues = v.get("issue").and_then(|i| i.as_array());
    let n = issues.map_or(0, Vec::len);
    let codes: Vec<String> = issues
        .into_iter()
        .flatten()
        .take(5)
        .map(|i| {
            let field = |k: &str| i.get(k).and_then(|x| x.as_str()).unwrap_or("?").to_owned();
            format!("{}/{}", field("severity"), field("code"))
        })
        .collect();
    detail.push_str(&format!(
        " (OperationOutcome, {n} issue{}: {}{})",
        if n == 1 { "" } else { "s" },
        codes.join(", "),
        if n > 5 { ", ..." } else { "" }
    ));
    detail
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn http_statuses_settle_like_acks() {
        assert_eq!(http_verdict(200), HttpVerdict::Delivered);
        assert_eq!(http_verdict(201), HttpVerdict::Delivered);
        assert_eq!(http_verdict(429), HttpVerdict::RetryLater("http_429"));
        assert_eq!(http_verdict(408), HttpVerdict::RetryLater("http_408"));
        assert_eq!(http_verdict(503), HttpVerdict::RetryLater("http_5xx"));
        assert_eq!(http_verdict(401), HttpVerdict::Unauthorized);
        assert_eq!(http_verdict(403), HttpVerdict::Unauthorized);
        assert_eq!(http_verdict(400), HttpVerdict::Refused);
        assert_eq!(http_verdict(422), HttpVerdict::Refused);
        assert_eq!(http_verdict(302), HttpVerdict::Refused);
    }

    #[test]
    fn an_operation_outcome_is_summarised_without_its_diagnostics() {
        let body = br#"{"resourceType":"OperationOutcome","issue":[{"severity":"error","code":"processing","diagnostics":"Patient Jane Doe: bad birthDate"},{"severity":"warning","code":"invalid"}]}"#;
        let d = http_detail(422, "application/fhir+json;charset=utf-8", body);
        assert_eq!(
            d,
            "receiver answered HTTP 422 (OperationOutcome, 2 issues: error/processing, warning/invalid)"
        );
        assert_eq!(
            http_detail(400, "text/html", b"<html>"),
            "receiver answered HTTP 400"
        );
        assert_eq!(
            http_detail(400, "application/json", b"{"),
            "receiver answered HTTP 400"
        );
    }
}
