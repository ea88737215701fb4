//! What the ingress answers: MLLP release 2 commit blocks, enhanced acknowledgement mode (MSH-15/16,
//! `accept_ack`, `application_ack`), pipelined frames, fast ACK mode, a frame missing its final CR.

use super::*;
use std::collections::HashSet;

/// Writes one frame and reads exactly four bytes back.
async fn read4(s: &mut TcpStream, payload: &[u8]) -> [u8; 4] {
    s.write_all(&frame(payload)).await.unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(ACK_WAIT, s.read_exact(&mut got))
        .await
        .expect("a commit block in time")
        .expect("four bytes");
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mllp2_commit_acks_are_exactly_four_bytes() {
    let (ingress, t) = start([("HL7GW_MLLP2_COMMIT_ACKS", "true".to_owned())]);

    let mut s = TcpStream::connect(ingress.mllp).await.unwrap();
    assert_eq!(
        read4(&mut s, &adt("COMMIT1", "P1")).await,
        [0x0B, 0x06, 0x1C, 0x0D],
        "commit ACK for a good message"
    );
    assert_eq!(
        read4(&mut s, &adt_enhanced("COMMIT2", "3.0", "", "")).await,
        [0x0B, 0x15, 0x1C, 0x0D],
        "commit NAK for an unsupported version"
    );
    assert_eq!(
        read4(&mut s, b"PID|1||NOMSH").await,
        [0x0B, 0x15, 0x1C, 0x0D],
        "commit NAK for a message without MSH"
    );
    assert_eq!(
        read4(&mut s, &adt("COMMIT3", "P1")).await,
        [0x0B, 0x06, 0x1C, 0x0D],
        "commit ACK again"
    );
    // Nothing else follows the commit blocks (no HL7 ACK behind them).
    let mut extra = [0u8; 64];
    match tokio::time::timeout(Duration::from_millis(700), s.read(&mut extra)).await {
        Err(_) => {}
        Ok(r) => panic!("unexpected bytes after the commit blocks: {r:?} {extra:?}"),
    }
    let records = t.inbound_records(2, Duration::from_secs(30));
    assert_eq!(records.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enhanced_mode_follows_msh15() {
    let (ingress, t) = start([]);
    let mut c = Mllp::connect(ingress.mllp).await;
    let quiet = Duration::from_millis(1500);

    // AL: a commit accept.
    let ack = c.call(&adt_enhanced("ENH-AL", "2.5.1", "AL", "AL")).await;
    assert_eq!(msa(&ack.unwrap()), ("CA".to_owned(), "ENH-AL".to_owned()));

    // NE (application ACK AL): no accept ACK at all; the next message on the connection gets its own.
    c.send(&adt_enhanced("ENH-NE", "2.5.1", "NE", "AL")).await;
    match next_frame(&mut c.0, quiet).await {
        Next::Silent => {}
        other => panic!("MSH-15=NE got {other:?}"),
    }
    let ack = c.call(&adt("ENH-AFTER-NE", "P1")).await.unwrap();
    assert_eq!(msa(&ack), ("AA".to_owned(), "ENH-AFTER-NE".to_owned()));

    // ER: nothing for a good message, CR for a bad one (and it is the bad one's answer).
    c.send(&adt_enhanced("ENH-ER-OK", "2.5.1", "ER", "AL"))
        .await;
    match next_frame(&mut c.0, quiet).await {
        Next::Silent => {}
        other => panic!("MSH-15=ER on a good message got {other:?}"),
    }
    let ack = c
        .call(&adt_enhanced("ENH-ER-BAD", "3.0", "ER", "AL"))
        .await
        .unwrap();
    assert_eq!(msa(&ack), ("CR".to_owned(), "ENH-ER-BAD".to_owned()));
    assert_eq!(err3(&ack).as_deref(), Some("203"));

    // SU: CA for a good message, nothing for a bad one.
    let ack = c
        .call(&adt_enhanced("ENH-SU-OK", "2.5.1", "SU", "AL"))
        .await
        .unwrap();
    assert_eq!(msa(&ack), ("CA".to_owned(), "ENH-SU-OK".to_owned()));
    c.send(&adt_enhanced("ENH-SU-BAD", "3.0", "SU", "AL")).await;
    match next_frame(&mut c.0, quiet).await {
        Next::Silent => {}
        other => panic!("MSH-15=SU on a bad message got {other:?}"),
    }
    let ack = c.call(&adt("ENH-LAST", "P1")).await.unwrap();
    assert_eq!(msa(&ack), ("AA".to_owned(), "ENH-LAST".to_owned()));

    // Unanswered is not unstored: the good messages without an ACK are in the topic too.
    let records = t.inbound_records(6, Duration::from_secs(30));
    let ids: HashSet<String> = records
        .iter()
        .map(|r| r.envelope.header.as_ref().unwrap().control_id.clone())
        .collect();
    let want: HashSet<String> = [
        "ENH-AL",
        "ENH-NE",
        "ENH-AFTER-NE",
        "ENH-ER-OK",
        "ENH-SU-OK",
        "ENH-LAST",
    ]
    .map(String::from)
    .into();
    assert_eq!(ids, want);
    assert_eq!(records.len(), 6);
}

/// README: "A resent message (same MSH-3, MSH-4, MSH-10) within `duplicate_window` gets its first ACK again
/// and is not published twice". A message whose MSH-15 asks for no accept ACK is a resend all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enhanced_mode_resend_without_an_ack_is_published_once() {
    let (ingress, t) = start([]);
    let mut c = Mllp::connect(ingress.mllp).await;
    for _ in 0..2 {
        c.send(&adt_enhanced("ENH-NE-DUP", "2.5.1", "NE", "AL"))
            .await;
        match next_frame(&mut c.0, Duration::from_millis(1500)).await {
            Next::Silent => {}
            other => panic!("MSH-15=NE got {other:?}"),
        }
    }
    let ack = c.call(&adt("ENH-DUP-END", "P1")).await.unwrap();
    assert_eq!(msa(&ack), ("AA".to_owned(), "ENH-DUP-END".to_owned()));
    let records = t.inbound_records(2, Duration::from_secs(30));
    let copies = records
        .iter()
        .filter(|r| r.envelope.header.as_ref().unwrap().control_id == "ENH-NE-DUP")
        .count();
    assert_eq!(
        copies, 1,
        "the resent NE message was published {copies} times"
    );
}

/// Issue 26, item 3: `accept_ack: always` answers CA whatever MSH-15 says (what HAPI's client waits for);
/// original mode is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_ack_always_answers_ne() {
    let (ingress, _t) = start([("HL7GW_ACCEPT_ACK", "always".to_owned())]);
    let mut c = Mllp::connect(ingress.mllp).await;
    let ack = c.call(&adt_enhanced("ALW-NE", "2.5.1", "NE", "NE")).await;
    assert_eq!(msa(&ack.unwrap()), ("CA".to_owned(), "ALW-NE".to_owned()));
    // SU asks for nothing on a refusal: `always` sends the CR all the same.
    let ack = c.call(&adt_enhanced("ALW-SU-BAD", "3.0", "SU", "")).await;
    let ack = ack.unwrap();
    assert_eq!(msa(&ack), ("CR".to_owned(), "ALW-SU-BAD".to_owned()));
    assert_eq!(err3(&ack).as_deref(), Some("203"));
    let ack = c.call(&adt("ALW-ORIG", "P1")).await.unwrap();
    assert_eq!(msa(&ack), ("AA".to_owned(), "ALW-ORIG".to_owned()));
    assert!(matches!(
        next_frame(&mut c.0, Duration::from_millis(800)).await,
        Next::Silent
    ));
}

/// Issue 26, item 3: `application_ack: on_store`: once Kafka stored the message the gateway answers as the
/// application, per MSH-16, after the accept ACK (per MSH-15): AA with its own MSH-10, MSA-2 the message's,
/// MSH-15/16 empty; AR with the ERR for a refused message; a resend gets both again; original mode and an
/// empty or NE MSH-16 get no second message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_ack_on_store_follows_msh16() {
    let (ingress, t) = start([("HL7GW_APPLICATION_ACK", "on_store".to_owned())]);
    let mut c = Mllp::connect(ingress.mllp).await;
    let quiet = Duration::from_millis(1000);
    let frame_or = |n: Next| match n {
        Next::Frame(f) => f,
        other => panic!("expected a message, got {other:?}"),
    };

    // AL/AL: CA, then AA. A resend (same bytes) gets the same two answers and is not published again.
    for _ in 0..2 {
        let ca = c
            .call(&adt_enhanced("APP-AL", "2.5.1", "AL", "AL"))
            .await
            .unwrap();
        assert_eq!(msa(&ca), ("CA".to_owned(), "APP-AL".to_owned()));
        let aa = frame_or(next_frame(&mut c.0, ACK_WAIT).await);
        assert_eq!(msa(&aa), ("AA".to_owned(), "APP-AL".to_owned()));
        assert_eq!(field(&aa, "MSH-9").as_deref(), Some("ACK^A01^ACK"));
        let (id_ca, id_aa) = (field(&ca, "MSH-10"), field(&aa, "MSH-10"));
        assert!(id_aa.is_some() && id_aa != id_ca, "{id_ca:?} {id_aa:?}");
        assert!(field(&aa, "MSH-15").unwrap_or_default().is_empty());
        assert!(field(&aa, "MSH-16").unwrap_or_default().is_empty());
        assert_eq!(field(&aa, "MSH-5").as_deref(), Some("TESTAPP"));
    }

    // NE/AL: no accept ACK, the application ACK alone.
    c.send(&adt_enhanced("APP-NE", "2.5.1", "NE", "AL")).await;
    let aa = frame_or(next_frame(&mut c.0, ACK_WAIT).await);
    assert_eq!(msa(&aa), ("AA".to_owned(), "APP-NE".to_owned()));
    assert!(matches!(next_frame(&mut c.0, quiet).await, Next::Silent));

    // AL/NE and AL/empty: the accept ACK only; AL/ER on a stored message: the accept ACK only.
    for (id, f16) in [
        ("APP-AL-NE", "NE"),
        ("APP-AL-EMPTY", ""),
        ("APP-AL-ER", "ER"),
    ] {
        let ca = c.call(&adt_enhanced(id, "2.5.1", "AL", f16)).await.unwrap();
        assert_eq!(msa(&ca), ("CA".to_owned(), id.to_owned()));
        assert!(
            matches!(next_frame(&mut c.0, quiet).await, Next::Silent),
            "MSH-16={f16:?}"
        );
    }

    // A refused message with MSH-16 ER: CR, then AR carrying the same ERR.
    let cr = c
        .call(&adt_enhanced("APP-BAD", "3.0", "AL", "ER"))
        .await
        .unwrap();
    assert_eq!(msa(&cr), ("CR".to_owned(), "APP-BAD".to_owned()));
    let ar = frame_or(next_frame(&mut c.0, ACK_WAIT).await);
    assert_eq!(msa(&ar), ("AR".to_owned(), "APP-BAD".to_owned()));
    assert_eq!(err3(&ar).as_deref(), Some("203"));

    // Original mode: the one AA, as without the setting.
    let aa = c.call(&adt("APP-ORIG", "P1")).await.unwrap();
    assert_eq!(msa(&aa), ("AA".to_owned(), "APP-ORIG".to_owned()));
    assert!(matches!(next_frame(&mut c.0, quiet).await, Next::Silent));

    let records = t.inbound_records(6, Duration::from_secs(30));
    let ids: Vec<String> = records
        .iter()
        .map(|r| r.envelope.header.as_ref().unwrap().control_id.clone())
        .collect();
    assert_eq!(ids.iter().filter(|i| *i == "APP-AL").count(), 1, "{ids:?}");
    assert_eq!(records.len(), 6, "{ids:?}");
    assert!(ingress.metric("hl7gw_ingress_application_acks_total{code=\"AA\"}") >= 3.0);
    assert!(ingress.metric("hl7gw_ingress_application_acks_total{code=\"AR\"}") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_frames_are_answered_in_order() {
    let (ingress, t) = start([]);
    let ids: Vec<String> = (0..200).map(|i| format!("PIPE{i}")).collect();
    let mut bytes = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        bytes.extend(frame(&adt(id, &format!("P{}", i % 7))));
    }
    let s = TcpStream::connect(ingress.mllp).await.unwrap();
    s.set_nodelay(true).unwrap();
    let (rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(&bytes).await.unwrap();
        wr
    });
    let mut acks = tokio_util::codec::FramedRead::new(rd, MllpCodec::default());
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.len() < ids.len() {
        let f = tokio::time::timeout_at(deadline, acks.next())
            .await
            .expect("200 ACKs in time")
            .expect("the connection stays open")
            .unwrap();
        got.push(msa(&f));
    }
    let _wr = writer.await.unwrap();
    for (i, (code, id)) in got.iter().enumerate() {
        assert_eq!(code, "AA", "{id}");
        assert_eq!(id, &ids[i], "ACK {i} answers the {i}th frame");
    }
    let records = t.inbound_records(200, Duration::from_secs(60));
    assert_eq!(records.len(), 200);
    // Per connection, the envelopes' sequence follows the order sent.
    for r in &records {
        let id = &r.envelope.header.as_ref().unwrap().control_id;
        let i: u64 = id.trim_start_matches("PIPE").parse().unwrap();
        assert_eq!(r.envelope.sequence, i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_mode_acks_and_stores_every_message() {
    let (ingress, t) = start([("HL7GW_ACK_MODE", "fast".to_owned())]);
    let mut c = Mllp::connect(ingress.mllp).await;
    for i in 0..100 {
        let ack = c
            .call(&adt(&format!("FAST{i}"), &format!("P{}", i % 3)))
            .await
            .unwrap();
        assert_eq!(msa(&ack), ("AA".to_owned(), format!("FAST{i}")));
    }
    let records = t.inbound_records(100, Duration::from_secs(60));
    assert_eq!(records.len(), 100);
    let ids: HashSet<String> = records
        .iter()
        .map(|r| r.envelope.header.as_ref().unwrap().control_id.clone())
        .collect();
    assert_eq!(ids, (0..100).map(|i| format!("FAST{i}")).collect());
    assert_eq!(
        ingress.metric("hl7gw_ingress_acks_total{code=\"AA\"}"),
        100.0
    );
    // Every publish behind an ACK completed.
    assert_eq!(
        wait_metric(
            &ingress,
            "hl7gw_ingress_publish_duration_seconds_count",
            100.0,
            Duration::from_secs(10),
        )
        .await,
        100.0
    );
}

/// Issue 9, item 1: in fast mode a message's ACK is remembered for duplicate detection only once Kafka stored
/// it; a resend that arrives before (or after a failed publish) is published again instead of being answered
/// from memory for a message Kafka never took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_mode_does_not_remember_an_ack_before_its_publish_succeeded() {
    let mut env = unreachable_env(None);
    env.push(("HL7GW_ACK_MODE", "fast".to_owned()));
    let ingress = Ingress::start_with(&env, &[], false);
    let mut c = Mllp::connect(ingress.mllp).await;
    let first = c.call(&adt("FASTLOST1", "P1")).await.unwrap();
    assert_eq!(msa(&first), ("AA".to_owned(), "FASTLOST1".to_owned()));
    let again = c.call(&adt("FASTLOST1", "P1")).await.unwrap();
    assert_eq!(msa(&again), ("AA".to_owned(), "FASTLOST1".to_owned()));
    assert_eq!(
        ingress.metric("hl7gw_ingress_messages_total{message_type=\"ADT\",outcome=\"duplicate\"}"),
        0.0,
        "a resend was answered from memory although its first copy was never stored"
    );
    assert_eq!(
        ingress.metric("hl7gw_ingress_messages_total{message_type=\"ADT\",outcome=\"accepted\"}"),
        2.0
    );
}

/// Issue 10: a frame whose end block is not followed by CR is refused with AE (ERR 207) for its control id, and
/// its payload goes to the DLQ (reason `missing_cr`) like the other rejects, not only a framing counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_missing_its_final_cr_is_answered_and_dead_lettered() {
    let (ingress, t) = start([]);
    let mut bytes = vec![0x0b];
    bytes.extend_from_slice(&adt("NOCR-1", "P1"));
    bytes.extend_from_slice(&[0x1c, b'X']);
    let (out, _) = raw_exchange(ingress.mllp, &bytes, Duration::from_secs(3)).await;
    let frames = frames_in(&out);
    assert_eq!(frames.len(), 1, "one answer");
    let (code, control_id) = msa(&frames[0]);
    assert_eq!((code.as_str(), control_id.as_str()), ("AE", "NOCR-1"));
    let records = t.dlq_records(1, Duration::from_secs(30));
    assert_eq!(records.len(), 1);
    let rej = records[0].envelope.rejection.clone().unwrap();
    assert_eq!(rej.reason, "missing_cr");
    assert_eq!(&records[0].envelope.raw[..], &adt("NOCR-1", "P1")[..]);
}
