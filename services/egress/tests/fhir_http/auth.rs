//! Credentials: mutual TLS and SMART backend services, a rotated bearer token file, refused credentials bounded,
//! hostile token endpoints.

use super::*;

/// A server over HTTPS (the test PKI's server certificate) that gives SMART backend services tokens to
/// `hl7gw-egress` (its key `smart-client`), and wants a client certificate of the test CA when `mutual`.
fn smart_server(pki: &support::Pki, mutual: bool) -> FhirServer {
    let (cert, key, ca) = (
        pki.file("server.pem"),
        pki.file("server.key"),
        pki.file("ca.pem"),
    );
    let client = format!("hl7gw-egress={}", pki.file("smart-client.pub"));
    let mut args = vec!["--tls-cert", &cert, "--tls-key", &key];
    if mutual {
        args.extend(["--client-ca", &ca]);
    }
    args.extend(["--smart-client", &client]);
    FhirServer::start(0, &args)
}

/// HTTPS with mutual TLS and SMART backend services (ES384 assertion, token endpoint discovered from the
/// server's smart-configuration): delivered over HTTP/2; a revoked token costs one 401, a new token and no
/// dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_over_mutual_tls_with_smart_backend_services() {
    let pki = support::pki::pki();
    let server = smart_server(&pki, true);
    let p = fhir_pipeline(&format!(
        "  fhir:\n    url: https://127.0.0.1:{}/fhir\n    response_timeout: 30s\n    retry: {{initial_backoff: 100ms, max_backoff: 1s}}\n\
         \x20   tls: {{ca: {}, cert: {}, key: {}}}\n\
         \x20   http: {{oauth2: {{client_id: hl7gw-egress, private_key: {}, key_id: k1}}}}\n",
        server.port,
        pki.file("ca.pem"),
        pki.file("client.pem"),
        pki.file("client.key"),
        pki.file("smart-client.key"),
    ));
    send_all(&p, &[support::adt("TLS-1", "P-TLS")]).await;
    let auth = wait_authorized(&p, &server, &pki, 1, "not delivered").await;
    assert_eq!(auth["tokensIssued"], 1, "{auth}");
    assert_eq!(auth["lastClientCertificateCn"], "hl7-client", "{auth}");
    let log = &auth["tokenLog"][0];
    assert_eq!(log["alg"], "ES384", "{log}");
    assert_eq!(log["kid"], "k1", "{log}");

    // Every token issued so far is revoked: the next delivery gets a 401, fetches a new one, and goes.
    server.call_tls("POST", "/admin/revoke", &pki).await;
    send_all(&p, &[support::adt("TLS-2", "P-TLS")]).await;
    let auth = wait_authorized(&p, &server, &pki, 2, "not delivered after revocation").await;
    assert_eq!(auth["tokensIssued"], 2, "{auth}");
    assert_eq!(auth["fhirUnauthorizedBy"]["revoked"], 1, "{auth}");
    let requests = server.call_tls("GET", "/admin/requests", &pki).await;
    let posts: Vec<&serde_json::Value> = requests["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["method"] == "POST")
        .collect();
    assert!(
        posts.iter().all(|r| r["protocol"] == "HTTP/2.0"),
        "HTTP/2 by ALPN: {posts:?}"
    );
    let mut egress = p.egress_client().await;
    assert!(dead_letters(&mut egress, "fhir", false).await.is_empty());
}

/// A bearer token from a file: a wrong one is retried (credentials, not the message: no dead letter), and the
/// file's new content is used after the 401 (a rotated secret needs no restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_bearer_token_file_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let expected = dir.path().join("server-token");
    std::fs::write(&expected, "right-token-0123456789\n").unwrap();
    let ours = dir.path().join("egress-token");
    std::fs::write(&ours, "stale-token\n").unwrap();
    let server = FhirServer::start(0, &["--bearer-token-file", expected.to_str().unwrap()]);
    let p = fhir_pipeline(&format!(
        "{}    http: {{bearer_token_file: {}}}\n",
        destination(&server.base()),
        ours.display()
    ));
    send_all(&p, &[support::adt("TOKEN-1", "P-TOKEN")]).await;
    let admin = p.egress.admin.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, m) = support::http_get(admin, "/metrics");
        if m.contains("hl7gw_egress_retries_total{destination=\"fhir\",reason=\"unauthorized\"} ") {
            break;
        }
        assert!(Instant::now() < deadline, "no 401 retry counted\n{m}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(&ours, "right-token-0123456789\n").unwrap();
    wait_delivered(&p, &server, 1, Duration::from_secs(30)).await;
    let mut egress = p.egress_client().await;
    assert!(dead_letters(&mut egress, "fhir", false).await.is_empty());
}

/// The server's `/admin/auth` once it authorized `n` FHIR requests; panics after 60 s saying `what`.
async fn wait_authorized(
    p: &Pipeline,
    server: &FhirServer,
    pki: &support::Pki,
    n: u64,
    what: &str,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut auth = server.call_tls("GET", "/admin/auth", pki).await;
    while auth["fhirAuthorized"].as_u64() < Some(n) {
        assert!(
            Instant::now() < deadline,
            "{what}: {auth}\n{}",
            p.metrics_summary()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        auth = server.call_tls("GET", "/admin/auth", pki).await;
    }
    auth
}

/// Issue 36, item 4: a 403 (a scope the server refuses) was retried for ever and never counted toward a bound:
/// the partition was wedged behind it with no dead letter. Now 401/403 count toward
/// `ack_policy.max_auth_retries` (10 by default), then the output is a dead letter `unauthorized` with the
/// status, and its replay (once the credentials are fixed) is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_bounded_then_a_replayable_dead_letter() {
    let server = FhirServer::start(0, &[]);
    let p = fhir_pipeline(&destination(&server.base()));

    server.fail_next(403, 1000, None);
    assert_eq!(
        send_all(&p, &[support::adt("SCOPE-1", "P-SCOPE")])
            .await
            .len(),
        1
    );
    let letter = wait_dead_letter(&p, "SCOPE-1", Duration::from_secs(60)).await;
    assert_eq!(letter.reason, "unauthorized");
    assert_eq!(letter.http_status, 403);
    assert_eq!(letter.attempts, 11, "1 + max_auth_retries (10)");
    let posts = server
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST")
        .count();
    assert_eq!(posts, 11);

    // The scope is granted: the replay is delivered.
    server.fail_next(403, 0, None);
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_delivered(&p, &server, 1, Duration::from_secs(60)).await;
    assert_eq!(
        egress_events(&p, "dead_lettered", "SCOPE-1"),
        [("unauthorized".to_owned(), 403)]
    );
}

/// A stand-in for a pod's sidecar (an admin port on loopback): counts the connections it gets.
async fn sidecar() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the sidecar");
    let port = listener.local_addr().expect("its address").port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    (port, hits)
}

/// Issue 36, item 4, the token endpoint: SMART discovery naming a plain-http endpoint on the pod's loopback (a
/// request forgery to its sidecars) is refused, never connected to, and counted like a refusal (a dead letter
/// `unauthorized`, replayed once the server is fixed); a token answer with an `expires_in` of 2^64-1 seconds
/// is clamped (it panicked the worker: `Instant + keep` overflowed, and the egress stopped); a token endpoint
/// that refuses the client counts toward the same bound (it was retried for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_token_endpoints_are_refused_bounded_and_clamped() {
    let pki = support::pki::pki();
    let server = smart_server(&pki, false);
    let (sidecar_port, sidecar_hits) = sidecar().await;
    let hostile = format!("/admin/smart?tokenEndpoint=http://127.0.0.1:{sidecar_port}/token");
    server.call_tls("POST", &hostile, &pki).await;
    let p = fhir_pipeline(&format!(
        "  fhir:\n    url: https://127.0.0.1:{}/fhir\n    response_timeout: 30s\n    retry: {{initial_backoff: 100ms, max_backoff: 500ms}}\n\
         \x20   ack_policy: {{max_retries: 3}}\n\
         \x20   tls: {{ca: {}}}\n\
         \x20   http: {{oauth2: {{client_id: hl7gw-egress, private_key: {}, key_id: k1}}}}\n",
        server.port,
        pki.file("ca.pem"),
        pki.file("smart-client.key"),
    ));

    // The discovered endpoint is on loopback over plain http: refused, never reached.
    send_all(&p, &[support::adt("SSRF-1", "P-SMART")]).await;
    let letter = wait_dead_letter(&p, "SSRF-1", Duration::from_secs(60)).await;
    assert_eq!(letter.reason, "unauthorized");
    assert_eq!(
        sidecar_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the egress connected to the discovered loopback endpoint"
    );
    let detail = letter
        .envelope
        .as_ref()
        .and_then(|e| e.rejection.as_ref())
        .map(|r| r.detail.clone())
        .unwrap_or_default();
    assert!(detail.contains("token endpoint"), "{detail}");

    // The server is fixed, and answers tokens that (it says) never expire: the replay is delivered.
    server
        .call_tls(
            "POST",
            "/admin/smart?tokenEndpoint=&expiresIn=18446744073709551615",
            &pki,
        )
        .await;
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_authorized(&p, &server, &pki, 1, "not delivered after the fix").await;
    // The egress is still up (the clamp), and delivers the next one with the token it has.
    send_all(&p, &[support::adt("SMART-2", "P-SMART")]).await;
    let auth = wait_authorized(&p, &server, &pki, 2, "the egress stopped delivering").await;
    assert_eq!(auth["tokensIssued"], 1, "{auth}");

    // The token endpoint refuses the client (every token revoked, every new one refused): bounded, then a
    // dead letter with the token endpoint's status.
    server.call_tls("POST", "/admin/revoke", &pki).await;
    server
        .call_tls("POST", "/admin/token-fail?status=400&count=1000", &pki)
        .await;
    send_all(&p, &[support::adt("REFUSED-1", "P-SMART")]).await;
    let letter = wait_dead_letter(&p, "REFUSED-1", Duration::from_secs(60)).await;
    assert_eq!(letter.reason, "unauthorized");
    assert_eq!(letter.http_status, 400);
    assert_eq!(letter.attempts, 11, "1 + max_auth_retries (10)");
    server
        .call_tls("POST", "/admin/token-fail?status=400&count=0", &pki)
        .await;
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_authorized(&p, &server, &pki, 3, "the replay was not delivered").await;
}
