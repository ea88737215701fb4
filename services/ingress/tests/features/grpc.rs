//! gRPC `Ingest`: a cancelled or unary send and the in-flight budget, the listener's connection limit, and its
//! mutual TLS policy following the MLLP listener's.

use super::*;

/// Issue 9: a gRPC `Send` whose caller gives up (deadline, cancel) while the message waits for Kafka must not
/// leave the in-flight gauge raised forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_grpc_send_does_not_stay_in_flight() {
    use hl7gw_runtime::proto::v1::SendRequest;
    use hl7gw_runtime::proto::v1::ingest_client::IngestClient;
    let mut env = unreachable_env(None);
    env.retain(|(k, _)| *k != "HL7GW_ACK_TIMEOUT");
    env.push(("HL7GW_ACK_TIMEOUT", "30s".to_owned()));
    let ingress = Ingress::start_with(&env, &[], false);
    let mut client = IngestClient::connect(format!("http://{}", ingress.grpc))
        .await
        .unwrap();
    let mut req = tonic::Request::new(SendRequest {
        message: adt("CANCEL1", "P1").into(),
    });
    req.set_timeout(Duration::from_millis(300));
    let r = client.send(req).await;
    assert!(
        r.is_err(),
        "no answer within 300 ms while Kafka is away: {r:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = ingress.metric("hl7gw_ingress_in_flight");
        if n == 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "in_flight stays at {n} after the caller gave up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 9, item 14: the gRPC listener serves at most `grpc_max_connections` connections; the next one waits
/// in the accept backlog until one closes (hyper alone would take any number).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_connections_beyond_the_limit_wait_for_a_free_slot() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let mut env = unreachable_env(None);
    env.push(("HL7GW_GRPC_MAX_CONNECTIONS", "2".to_owned()));
    let ingress = Ingress::start_with(&env, &[], false);
    let url = format!("http://{}", ingress.grpc);
    let check = |mut c: HealthClient<tonic::transport::Channel>| async move {
        c.check(HealthCheckRequest::default()).await.map(|_| c)
    };
    let connect = |url: String| async move {
        HealthClient::new(
            tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap(),
        )
    };
    let first = check(connect(url.clone()).await).await.unwrap();
    let _second = check(connect(url.clone()).await).await.unwrap();
    let third = tokio::spawn(async move {
        let c = HealthClient::new(
            tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect_lazy(),
        );
        check(c).await.is_ok()
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served beyond the limit of 2"
    );
    drop(first);
    let served = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("the third connection was served once a slot freed")
        .unwrap();
    assert!(served);
}

/// Issue 11: when the MLLP listener requires client certificates, gRPC Ingest is no open side door: an
/// anonymous caller is refused (and counted), one with a certificate of the CA sends, over a TLS gRPC listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_ingest_follows_the_mllp_listeners_mutual_tls_policy() {
    use hl7gw_runtime::proto::v1::SendRequest;
    use hl7gw_runtime::proto::v1::ingest_client::IngestClient;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let (_, _, mut env) = topics_env(broker());
    let pki = pki();
    env.extend(pki.env(true));
    env.extend([
        ("HL7GW_GRPC__TLS__CERT", pki.file("server.pem")),
        ("HL7GW_GRPC__TLS__KEY", pki.file("server.key")),
        ("HL7GW_GRPC__TLS__CLIENT_CA", pki.file("ca.pem")),
    ]);
    let ingress = Ingress::start(&env);
    let ca = Certificate::from_pem(std::fs::read(pki.path("ca.pem")).unwrap());
    let tls = ClientTlsConfig::new()
        .ca_certificate(ca)
        .domain_name("localhost");
    let connect = |tls: ClientTlsConfig| {
        let url = format!("https://{}", ingress.grpc);
        async move {
            IngestClient::new(
                Endpoint::from_shared(url)
                    .unwrap()
                    .tls_config(tls)
                    .unwrap()
                    .connect()
                    .await
                    .unwrap(),
            )
        }
    };
    let send = |id: &str| SendRequest {
        message: adt(id, "P1").into(),
    };
    let refused = connect(tls.clone()).await.send(send("GRPC-ANON")).await;
    assert_eq!(
        refused.map(|_| ()).unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    assert_eq!(
        ingress.metric("hl7gw_ingress_connections_refused_total{reason=\"grpc_unauthenticated\"}"),
        1.0
    );
    let identity = Identity::from_pem(
        std::fs::read(pki.path("client.pem")).unwrap(),
        std::fs::read(pki.path("client.key")).unwrap(),
    );
    let ok = connect(tls.identity(identity))
        .await
        .send(send("GRPC-CERT"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.ack_code, "AA");
}

/// Issue 36, item 6: a unary `Ingest/Send` holds its bytes in the process's in-flight budget until answered,
/// as a stream's and an MLLP connection's messages do (`hl7gw_ingress_in_flight_bytes`). Before: unary calls
/// held any amount outside the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_send_draws_on_the_in_flight_budget() {
    use hl7gw_runtime::proto::v1::SendRequest;
    use hl7gw_runtime::proto::v1::ingest_client::IngestClient;
    let mut env = unreachable_env(None);
    env.push(("HL7GW_ACK_TIMEOUT", "4s".to_owned()));
    let ingress = Ingress::start_with(&env, &[], false);
    let url = format!("http://{}", ingress.grpc);
    let message = adt("UNARY-BUDGET", "P1");
    let len = message.len();
    let call = tokio::spawn(async move {
        let channel = tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        IngestClient::new(channel)
            .send(SendRequest {
                message: message.into(),
            })
            .await
    });
    // Kafka never confirms: the call waits for its ack_timeout, holding its bytes meanwhile (watched for as long
    // as the call lasts: the ingress may still be starting when the call is made).
    let mut held = 0.0;
    while !call.is_finished() && held < len as f64 {
        held = ingress.metric("hl7gw_ingress_in_flight_bytes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = tokio::time::timeout(Duration::from_secs(15), call).await;
    assert!(
        held >= len as f64,
        "in-flight bytes while the call waits: {held} ({answer:?})"
    );
    assert_eq!(
        ingress.metric("hl7gw_ingress_in_flight_bytes"),
        0.0,
        "released once answered"
    );
}
