//! What one sender or connection may take: the rate limit, the in-flight bytes of a connection, the write
//! timeout, `max_connections` (per process and per address), the frame and idle deadlines, and eviction.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_slows_a_fast_sender_without_refusing_it() {
    let (ingress, _) = start([("HL7GW_RATE_LIMIT_PER_CONNECTION", "20".to_owned())]);
    let mut c = Mllp::connect(ingress.mllp).await;
    // Warm the producer up on another connection so the timing below measures the limiter.
    let mut w = Mllp::connect(ingress.mllp).await;
    assert_eq!(ack_code(&w.call(&adt("WARM", "P1")).await.unwrap()), "AA");

    let t = Instant::now();
    for i in 0..30 {
        let ack = c.call(&adt(&format!("RL{i}"), "P1")).await.unwrap();
        assert_eq!(msa(&ack), ("AA".to_owned(), format!("RL{i}")));
    }
    let took = t.elapsed();
    eprintln!("30 messages at 20/s took {took:?}");
    // 29 intervals of 50 ms after the first message.
    assert!(took >= Duration::from_millis(1300), "{took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// The ingress's resident memory in kB.
fn rss_kb(ingress: &Ingress) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", ingress.child.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Issue 9, item 14: a connection holds at most `max_in_flight_bytes_per_connection` of messages waiting for
/// Kafka, not 256 frames of up to 1 MiB each: a sender of large messages during an outage cannot take the
/// pod's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_a_bounded_number_of_bytes_in_flight() {
    let mut env = unreachable_env(None);
    env.retain(|(k, _)| *k != "HL7GW_ACK_TIMEOUT");
    env.push(("HL7GW_ACK_TIMEOUT", "60s".to_owned()));
    env.push((
        "HL7GW_MAX_IN_FLIGHT_BYTES_PER_CONNECTION",
        "4194304".to_owned(),
    ));
    let ingress = Ingress::start_with(&env, &[], false);
    let before = rss_kb(&ingress);
    let s = TcpStream::connect(ingress.mllp).await.unwrap();
    let (_rd, mut wr) = s.into_split();
    let mut big = adt("BIGFLIGHT", "P1");
    big.extend_from_slice(b"NTE|1||");
    big.resize(500_000, b'x');
    big.push(b'\r');
    let framed = frame(&big);
    // Send 200 x 500 kB (100 MB) for up to 8 s; the ingress takes what its bound allows and then stops reading.
    let sender = tokio::spawn(async move {
        for _ in 0..200 {
            if wr.write_all(&framed).await.is_err() {
                break;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(8)).await;
    let grown = rss_kb(&ingress).saturating_sub(before);
    sender.abort();
    assert!(
        grown < 60 * 1024,
        "RSS grew by {grown} kB holding one connection's messages"
    );
}

/// Issue 9, item 14: a sender that never reads its ACKs is cut off after `write_timeout` instead of pinning
/// its messages and the connection forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_that_never_reads_its_acks_is_closed_after_write_timeout() {
    let mut env = unreachable_env(None);
    env.retain(|(k, _)| *k != "HL7GW_ACK_TIMEOUT" && *k != "RUST_LOG");
    env.push(("HL7GW_ACK_TIMEOUT", "60s".to_owned()));
    env.push(("HL7GW_ACK_MODE", "fast".to_owned()));
    env.push(("HL7GW_WRITE_TIMEOUT", "1s".to_owned()));
    env.push(("RUST_LOG", "off".to_owned()));
    let ingress = Ingress::start_with(&env, &[], false);
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = sock.connect(ingress.mllp).await.unwrap();
    let (_rd, mut wr) = s.into_split();
    // Long MSH-5/6 make long ACKs (they are echoed as MSH-3/4), so the socket buffers fill after a few
    // hundred messages.
    let wide = "W".repeat(3000);
    let sender = tokio::spawn(async move {
        for i in 0..20_000 {
            let m = format!(
                "MSH|^~\\&|APP|FAC|{wide}|{wide}|20261123120000||ADT^A01^ADT_A01|NOREAD{i}|P|2.5.1\rPID|1||P1\r"
            );
            if wr.write_all(&frame(m.as_bytes())).await.is_err() {
                break;
            }
        }
    });
    let closed = wait_metric(
        &ingress,
        "hl7gw_ingress_write_timeouts_total",
        1.0,
        Duration::from_secs(30),
    )
    .await;
    sender.abort();
    assert_eq!(closed, 1.0, "the connection was not cut off");
}

/// Issue 10: at `max_connections` a new connection is closed at once and counted
/// (`connections_refused_total{reason="max_connections"}`), not left hanging in the backlog; an idle
/// connection is closed after `idle_timeout` and counted (`idle_closes_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_refusals_and_idle_closes_are_counted() {
    let (ingress, _) = start([
        ("HL7GW_MAX_CONNECTIONS", "2".into()),
        ("HL7GW_IDLE_TIMEOUT", "2s".into()),
        // Refusals at the limit, not eviction (at_the_limit_the_stalest_idle_or_slow_connection_makes_room).
        ("HL7GW_EVICT_AFTER", "0s".into()),
    ]);
    let mut a = Mllp::connect(ingress.mllp).await;
    let _b = Mllp::connect(ingress.mllp).await;
    assert_eq!(ack_code(&a.call(&adt("MAXC-1", "P1")).await.unwrap()), "AA");
    let (_, closed) = raw_exchange(ingress.mllp, &frame(&adt("MAXC-2", "P1")), ACK_WAIT).await;
    assert!(closed, "the third connection is closed, not kept waiting");
    assert_eq!(
        ingress.metric("hl7gw_ingress_connections_refused_total{reason=\"max_connections\"}"),
        1.0
    );
    // Both held connections go idle and are closed; then a new one is served again.
    let idle = wait_metric(&ingress, "hl7gw_ingress_idle_closes_total", 2.0, ACK_WAIT).await;
    assert_eq!(idle, 2.0);
    let mut c = Mllp::connect(ingress.mllp).await;
    assert_eq!(ack_code(&c.call(&adt("MAXC-3", "P1")).await.unwrap()), "AA");
}

/// One slow connection: `first` then a byte every 400 ms (inside a frame when `first` opens one, between frames
/// otherwise) until the ingress closes it or `limit` passes; true when the ingress closed it.
async fn trickle(addr: SocketAddr, first: &'static [u8], limit: Duration) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return true;
    };
    let end = Instant::now() + limit;
    let mut next: &[u8] = first;
    while Instant::now() < end {
        if s.write_all(next).await.is_err() {
            return true;
        }
        next = if first == b"\x0b" { b"X" } else { b"\n" };
        let mut b = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(400), s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            _ => {}
        }
    }
    false
}

/// Issue 24, item 1 (MLLP slowloris): a byte now and then must not hold a connection slot. `frame_timeout` is
/// a deadline for a whole frame and `idle_timeout` one since the last complete frame, so more trickling
/// connections than `max_connections` (half inside a frame, half sending bytes between frames) are all closed
/// after their deadlines, and a normal sender gets its ACK right after. Before: every slot stayed held while
/// the trickle went on, and the normal sender was refused to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_connections_cannot_hold_every_slot() {
    let (ingress, _) = start([
        ("HL7GW_MAX_CONNECTIONS", "6".into()),
        ("HL7GW_FRAME_TIMEOUT", "2s".into()),
        ("HL7GW_IDLE_TIMEOUT", "2s".into()),
        // The deadlines alone (eviction would also let the sender in).
        ("HL7GW_EVICT_AFTER", "0s".into()),
    ]);
    let addr = ingress.mllp;
    let mut slow = Vec::new();
    for i in 0..8 {
        let first: &'static [u8] = if i % 2 == 0 { b"\x0b" } else { b"\n" };
        slow.push(tokio::spawn(trickle(addr, first, Duration::from_secs(12))));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let mut code = None;
    while code.is_none() && started.elapsed() < Duration::from_secs(8) {
        if let Ok(s) = TcpStream::connect(addr).await {
            let mut c = Framed::new(s, MllpCodec::default());
            if c.send(&adt("SLOW-1", "P1")[..]).await.is_ok()
                && let Next::Frame(ack) = next_frame(&mut c, Duration::from_secs(1)).await
            {
                code = Some(ack_code(&ack));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        code.as_deref(),
        Some("AA"),
        "a normal sender got no ACK in {:?} while slow connections held the slots",
        started.elapsed()
    );
    for t in slow {
        assert!(t.await.unwrap(), "a slow connection was left open");
    }
    // Of the 8, the 6 that got a slot are closed by a deadline (the others were refused at once).
    let frame_timeouts =
        ingress.metric("hl7gw_ingress_framing_errors_total{reason=\"frame_timeout\"}");
    let idle = ingress.metric("hl7gw_ingress_idle_closes_total");
    assert!(
        frame_timeouts >= 2.0 && idle >= 2.0 && frame_timeouts + idle >= 6.0,
        "closes counted: {frame_timeouts} frame timeouts, {idle} idle"
    );
}

/// Issue 24 (idle and slow clients cost only themselves): with every slot held by connections that completed
/// no frame for longer than `evict_after` (idle ones, and ones trickling into a frame whose deadline is far
/// off), a new sender takes the slot of the stalest and gets its ACK; a connection waiting for an answer is
/// never chosen. Before: refused for as long as the holders stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_the_stalest_idle_or_slow_connection_makes_room() {
    let (ingress, _) = start([
        ("HL7GW_MAX_CONNECTIONS", "4".into()),
        ("HL7GW_FRAME_TIMEOUT", "60s".into()),
        ("HL7GW_IDLE_TIMEOUT", "60s".into()),
        ("HL7GW_EVICT_AFTER", "1s".into()),
    ]);
    let addr = ingress.mllp;
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(trickle(addr, b"\x0b", Duration::from_secs(20))))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut senders = Vec::new();
    for i in 1..=2 {
        let started = Instant::now();
        let mut c = Mllp::connect(addr).await;
        let ack = c.call(&adt(&format!("ROOM-{i}"), "P1")).await;
        assert_eq!(
            ack.as_deref().map(ack_code).as_deref(),
            Some("AA"),
            "sender {i}: no ACK after {:?}",
            started.elapsed()
        );
        senders.push(c);
    }
    assert!(ingress.metric("hl7gw_ingress_connections_evicted_total") >= 2.0);
    for t in slow {
        t.abort();
    }
}

/// Issue 36, item 3: never-reading senders from one address (127.0.0.2: each sends messages and reads no ACK,
/// reconnecting when closed) take at most `max_connections_per_address` slots, so a normal sender from another
/// address gets its ACK; the flood's extra connections are refused and counted. Before: they held every slot
/// and the normal sender was refused (0 of 13 in the issue's run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_reading_senders_from_one_address_leave_room_for_the_others() {
    let (ingress, _) = start([
        ("HL7GW_MAX_CONNECTIONS", "12".into()),
        ("HL7GW_MAX_CONNECTIONS_PER_ADDRESS", "4".into()),
    ]);
    let addr = ingress.mllp;
    let flooder = std::net::IpAddr::from([127, 0, 0, 2]);
    let stop = tokio_util::sync::CancellationToken::new();
    let flood: Vec<_> = (0..30)
        .map(|i| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.is_cancelled() {
                    let Ok(mut c) = Mllp::connect_from(flooder, addr).await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    // Messages, never an ACK read; held until the listener closes it or the test ends.
                    for _ in 0..3 {
                        n += 1;
                        if c.0
                            .send(&adt(&format!("FLOOD-{i}-{n}"), "P1")[..])
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = async { while let Some(Ok(_)) = c.0.next().await {} } => {}
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 1..=3 {
        let started = Instant::now();
        let mut c = Mllp::connect(addr).await;
        let ack = c.call(&adt(&format!("OTHER-{i}"), "P1")).await;
        assert_eq!(
            ack.as_deref().map(ack_code).as_deref(),
            Some("AA"),
            "the normal sender {i}: no ACK after {:?}",
            started.elapsed()
        );
    }
    let refused = ingress
        .metric("hl7gw_ingress_connections_refused_total{reason=\"max_connections_per_address\"}");
    assert!(refused >= 1.0, "per-address refusals counted: {refused}");
    stop.cancel();
    for t in flood {
        let _ = t.await;
    }
}

/// Issue 36, item 3: TLS handshakes that never finish are evictable like connections that never sent a frame:
/// at `max_connections` a new sender closes the oldest of them at once. Before: the handshakes held their slots
/// until their 10 s timeout, and the sender waited 5 s for an evicted slot and was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_tls_handshakes_are_evicted_for_a_new_sender() {
    let pki = pki();
    let mut env = pki.env(false);
    env.push(("HL7GW_MAX_CONNECTIONS", "3".into()));
    env.push(("HL7GW_EVICT_AFTER", "1s".into()));
    let (ingress, _) = start(env);
    // Three connections that send nothing: each sits in the server's TLS handshake.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        stalled.push(TcpStream::connect(ingress.mllp).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut conn = tls_connect(ingress.mllp, client_config(&pki, None))
        .await
        .expect("TLS handshake");
    let ack = call_on(&mut conn, &adt("HANDSHAKE-1", "P1"))
        .await
        .expect("an ACK over TLS");
    assert_eq!(msa(&ack).0, "AA");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "served after {:?}: the stalled handshakes were not evicted",
        started.elapsed()
    );
    assert!(ingress.metric("hl7gw_ingress_connections_evicted_total") >= 1.0);
    drop(stalled);
}
