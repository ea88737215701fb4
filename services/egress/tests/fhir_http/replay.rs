//! Replay is whole or refused: re-read from the destination topic or the input, refused when gone, forced ones
//! sent.

use super::*;

/// Stops the egress with SIGTERM (it commits what it settled: no redelivery after its restart).
fn restart_gently(p: &mut Pipeline) {
    if let Some(child) = p.egress.process.as_mut() {
        let code = support::sigterm_and_wait(&mut child.0, "egress", Duration::from_secs(25));
        assert!(code.success(), "egress exited with {code}");
    }
}

/// Issue 36, item 5: replay is whole or refused, and never silent. A dead letter shrunk to fit the record limit
/// (the message dropped) was replayed as an empty body, which a lenient server takes and the ledger called
/// delivered; now the replay re-reads the message from where the egress read it (the destination topic's
/// record the dead letter names), or, when that topic no longer holds it, refuses it saying why and where the
/// original was. A forced replay inside the duplicate window was dropped with a log line only; now it is sent
/// (a replay is a new delivery, its Kafka redeliveries still suppressed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_whole_or_refused_and_a_forced_one_is_sent() {
    let server = FhirServer::start(0, &[]);
    let mut p = fhir_pipeline(&destination(&server.base()));
    // An address of 4 KB makes a Bundle a 2 KB dead letter cannot hold.
    let long = |control_id: &str| {
        String::from_utf8(support::adt(control_id, "P-WHOLE"))
            .unwrap()
            .replace(
                "|F\r",
                &format!("|F|||{} MAIN STREET^^BOSTON^MA^02115\r", "9".repeat(4000)),
            )
            .into_bytes()
    };
    send_all(&p, &[long("WHOLE-0")]).await;
    wait_delivered(&p, &server, 1, Duration::from_secs(60)).await;
    let bundle_bytes = posts(&server)[0].1;
    assert!(bundle_bytes > 4000, "a Bundle of {bundle_bytes} bytes");

    // The egress again, its records limited to 2 KB: a dead letter of a Bundle does not fit whole.
    restart_gently(&mut p);
    p.egress.process = None;
    p.egress
        .env
        .push(("HL7GW_KAFKA__MAX_MESSAGE_BYTES", "2000".into()));
    p.start_egress();
    p.wait_ready(Duration::from_secs(60));
    server.fail_next(400, 2, None);
    send_all(&p, &[long("WHOLE-1"), long("WHOLE-2")]).await;
    let letter = wait_dead_letter(&p, "WHOLE-1", Duration::from_secs(60)).await;
    let second = wait_dead_letter(&p, "WHOLE-2", Duration::from_secs(60)).await;
    let env = letter.envelope.clone().unwrap_or_default();
    let rej = env.rejection.clone().unwrap_or_default();
    assert!(env.raw.is_empty(), "the message was dropped to fit");
    assert!(rej.detail.contains("is not stored"), "{}", rej.detail);

    // The limit is raised again (the replay's own records must fit); the replay sends the whole Bundle, read
    // from the destination topic.
    restart_gently(&mut p);
    p.egress.process = None;
    p.egress
        .env
        .retain(|(k, _)| *k != "HL7GW_KAFKA__MAX_MESSAGE_BYTES");
    p.start_egress();
    p.wait_ready(Duration::from_secs(60));
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), false).await,
        1
    );
    wait_delivered(&p, &server, 2, Duration::from_secs(60)).await;
    let sent = posts(&server);
    assert_eq!(
        sent.last().copied(),
        Some((200, bundle_bytes)),
        "the replay's POST: {sent:?}"
    );

    // Forced again within the duplicate window: sent again (and on the ledger as delivered twice).
    assert_eq!(
        replay_ids(&p, std::slice::from_ref(&letter.id), true).await,
        1
    );
    wait_delivered(&p, &server, 3, Duration::from_secs(30)).await;
    assert_eq!(
        egress_events(&p, "delivered", "WHOLE-1"),
        [(String::new(), 200), (String::new(), 200)]
    );

    // The destination topic no longer holds the second one's message (retention, here deleted): its replay
    // is refused, saying why and where the original was; nothing is sent.
    let rej = second
        .envelope
        .and_then(|e| e.rejection)
        .unwrap_or_default();
    let origin = format!(
        "{}/{}/{}",
        rej.origin_topic, rej.origin_partition, rej.origin_offset
    );
    assert_eq!(rej.origin_topic, p.topic("out.fhir"));
    delete_records(
        &rej.origin_topic,
        rej.origin_partition,
        rej.origin_offset + 1,
    )
    .await;
    let before = posts(&server).len();
    let mut egress = p.egress_client().await;
    let r = egress
        .replay(hl7gw_runtime::proto::v1::ReplayRequest {
            ids: vec![second.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replayed, 0, "{r:?}");
    let [refused] = &r.refused[..] else {
        panic!("one refusal: {r:?}")
    };
    assert_eq!(
        (refused.id.as_str(), refused.origin.as_str()),
        (second.id.as_str(), origin.as_str())
    );
    assert!(
        refused.why.contains("no longer holds it"),
        "{}",
        refused.why
    );
    // The CLI says so, names the place, and exits 1.
    let token = p.dir.path().join("ops.token");
    std::fs::write(&token, hl7gw_testkit::pipeline::OPS_TOKEN).expect("the token file");
    let out = std::process::Command::new(support::bin("hl7gw"))
        .args(["replay", "--to", &p.egress_addr(), "--id", &second.id])
        .arg("--token-file")
        .arg(&token)
        .output()
        .expect("hl7gw replay");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("not replayed {}", second.id))
            && err.contains("no longer holds it")
            && err.contains(&format!("the original was read at {origin}")),
        "{err}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(posts(&server).len(), before, "nothing was sent");
}

/// Deletes the records of `topic`'s `partition` before `offset` (as retention would).
async fn delete_records(topic: &str, partition: i32, offset: i64) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", support::broker())
        .create()
        .expect("an admin client");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .expect("a partition");
    let done = admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("records deleted");
    for e in done.elements() {
        assert!(e.error().is_ok(), "delete records: {:?}", e.error());
    }
}

/// Stops the transformer with SIGTERM (its transaction committed: no batch read again after its restart).
fn stop_transformer(p: &mut Pipeline) {
    if let Some(child) = p.transformer.process.as_mut() {
        let code = support::sigterm_and_wait(&mut child.0, "transformer", Duration::from_secs(25));
        assert!(code.success(), "transformer exited with {code}");
    }
    p.transformer.process = None;
}

/// Issue 36, item 5: a `toFhir` output over the record limit was dead-lettered without its content and was
/// not replayable. Its dead letter now names its input (inbound topic, partition, offset), and `replay`
/// re-reads that input and routes it again (once the limit is raised), while the inbound topic holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_large_output_is_replayed_from_its_input() {
    let server = FhirServer::start(0, &[]);
    let mut p = fhir_pipeline(&destination(&server.base()));
    send_all(&p, &[support::adt("BIG-0", "P-BIG")]).await;
    wait_delivered(&p, &server, 1, Duration::from_secs(60)).await;

    // The transformer's records limited to 2 KB: a Bundle with a 4 KB address is over it.
    stop_transformer(&mut p);
    p.transformer
        .env
        .push(("HL7GW_KAFKA__MAX_MESSAGE_BYTES", "2000".into()));
    p.start_transformer();
    p.wait_ready(Duration::from_secs(60));
    let big = String::from_utf8(support::adt("BIG-1", "P-BIG"))
        .unwrap()
        .replace(
            "|F\r",
            &format!("|F|||{} MAIN STREET^^BOSTON^MA^02115\r", "9".repeat(4000)),
        )
        .into_bytes();
    send_all(&p, &[big]).await;
    let mut egress = p.egress_client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let letter = loop {
        let page = egress
            .list_dead_letters(hl7gw_runtime::proto::v1::ListDeadLettersRequest {
                stage: "transformer".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if let Some(d) = page
            .dead_letters
            .into_iter()
            .find(|d| d.control_id == "BIG-1")
        {
            break d;
        }
        assert!(
            Instant::now() < deadline,
            "no transformer dead letter for BIG-1"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(letter.reason, "too_large");

    // The limit raised again: the replay re-reads the input and the route delivers it.
    stop_transformer(&mut p);
    p.transformer
        .env
        .retain(|(k, _)| *k != "HL7GW_KAFKA__MAX_MESSAGE_BYTES");
    p.start_transformer();
    p.wait_ready(Duration::from_secs(60));
    let replayed = egress
        .replay(hl7gw_runtime::proto::v1::ReplayRequest {
            ids: vec![letter.id.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.replayed, 1, "{replayed:?}");
    wait_delivered(&p, &server, 2, Duration::from_secs(60)).await;
    let (status, bundle) = server.call(
        "GET",
        "/fhir/Patient?identifier=urn:hl7gw:id:TESTFAC%7CP-BIG",
    );
    assert_eq!(status, 200, "{bundle}");
    let line = bundle["entry"][0]["resource"]["address"][0]["line"][0]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        line.len() > 4000,
        "the replayed message's address: {bundle}"
    );
}
