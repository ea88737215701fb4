//! TLS and mutual TLS on the MLLP listener: plain TCP refused, a client certificate of the client CA required,
//! the envelope naming the client.

use super::*;

/// A TLS attempt that must not produce an ACK: Ok(()) when the handshake failed or the connection closed
/// (or stayed silent) without one.
async fn tls_refused(addr: SocketAddr, config: Arc<rustls::ClientConfig>, control_id: &str) {
    let Ok(mut conn) = tls_connect(addr, config).await else {
        return; // the handshake failed: refused
    };
    // TLS 1.3: the client finishes before the server has checked its certificate; the refusal arrives
    // as an alert on the first read.
    let _ = conn.send(&adt(control_id, "P1")[..]).await;
    match next_frame(&mut conn, Duration::from_secs(5)).await {
        Next::Frame(f) => panic!(
            "a refused client got an answer: {:?}",
            String::from_utf8_lossy(&f)
        ),
        Next::Closed | Next::Silent => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_accepts_mllp_over_tls_and_refuses_plain_tcp() {
    let pki = pki();
    let (ingress, t) = start(pki.env(false));

    let mut conn = tls_connect(ingress.mllp, client_config(&pki, None))
        .await
        .expect("TLS handshake");
    let ack = call_on(&mut conn, &adt("TLS1", "P1"))
        .await
        .expect("an ACK over TLS");
    assert_eq!(msa(&ack), ("AA".to_owned(), "TLS1".to_owned()));
    // A second message on the same TLS connection.
    let ack = call_on(&mut conn, &adt("TLS2", "P1")).await.unwrap();
    assert_eq!(msa(&ack), ("AA".to_owned(), "TLS2".to_owned()));

    // Plain MLLP to the TLS port: no ACK, the connection is closed, the refusal is counted.
    let (out, closed) = raw_exchange(
        ingress.mllp,
        &frame(&adt("PLAIN1", "P1")),
        Duration::from_secs(10),
    )
    .await;
    assert!(closed, "the plain connection is closed");
    assert!(frames_in(&out).is_empty(), "no MLLP answer: {out:?}");
    let refused = wait_metric(
        &ingress,
        "hl7gw_ingress_connections_refused_total{reason=\"tls_handshake\"}",
        1.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(refused, 1.0);

    let records = t.inbound_records(2, Duration::from_secs(30));
    assert_eq!(records.len(), 2, "only the TLS messages are stored");
    let src = record_of(&records, "TLS1").envelope.source.clone().unwrap();
    assert_eq!(src.protocol, "mllp");
    assert!(src.peer.starts_with("127.0.0.1:"), "{}", src.peer);
    assert!(
        src.tls_client.is_empty(),
        "no client certificate: {:?}",
        src.tls_client
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate_from_the_client_ca() {
    let pki = pki();
    let (ingress, t) = start(pki.env(true));
    let refused_series = "hl7gw_ingress_connections_refused_total{reason=\"tls_handshake\"}";

    let mut conn = tls_connect(
        ingress.mllp,
        client_config(&pki, Some(("client.pem", "client.key"))),
    )
    .await
    .expect("mutual TLS handshake");
    let ack = call_on(&mut conn, &adt("MTLS1", "P1"))
        .await
        .expect("an ACK over mutual TLS");
    assert_eq!(msa(&ack), ("AA".to_owned(), "MTLS1".to_owned()));
    assert_eq!(ingress.metric(refused_series), 0.0);

    // No client certificate: refused.
    tls_refused(ingress.mllp, client_config(&pki, None), "NOCERT1").await;
    assert_eq!(
        wait_metric(&ingress, refused_series, 1.0, Duration::from_secs(5)).await,
        1.0
    );
    // A certificate from another CA: refused as well.
    tls_refused(
        ingress.mllp,
        client_config(&pki, Some(("intruder.pem", "intruder.key"))),
        "INTRUDER1",
    )
    .await;
    assert_eq!(
        wait_metric(&ingress, refused_series, 2.0, Duration::from_secs(5)).await,
        2.0
    );

    let records = t.inbound_records(1, Duration::from_secs(30));
    assert_eq!(records.len(), 1, "only the authenticated message is stored");
    let src = record_of(&records, "MTLS1")
        .envelope
        .source
        .clone()
        .unwrap();
    assert!(
        !src.tls_client.is_empty(),
        "the envelope names the TLS client"
    );
}

/// proto/hl7gw/v1/envelope.proto: `tls_client` is the "TLS client certificate subject, when mutual TLS
/// identified the sender", so a consumer can tell which client sent a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_envelope_names_the_client_certificate_subject() {
    let pki = pki();
    let (ingress, t) = start(pki.env(true));
    let mut conn = tls_connect(
        ingress.mllp,
        client_config(&pki, Some(("client.pem", "client.key"))),
    )
    .await
    .expect("mutual TLS handshake");
    let ack = call_on(&mut conn, &adt("SUBJ1", "P1")).await.unwrap();
    assert_eq!(msa(&ack).0, "AA");
    let records = t.inbound_records(1, Duration::from_secs(30));
    let src = record_of(&records, "SUBJ1")
        .envelope
        .source
        .clone()
        .unwrap();
    assert!(
        src.tls_client.contains("hl7-client"),
        "tls_client should carry the certificate subject (CN=hl7-client), got {:?}",
        src.tls_client
    );
}
