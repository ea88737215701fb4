//! The PROXY protocol (v1 and v2) in front of MLLP: the sender's address, a missing header refused.

use super::*;

fn proxy_v2_header() -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    h.push(0x11); // AF_INET, STREAM
    h.extend_from_slice(&12u16.to_be_bytes());
    h.extend_from_slice(&[198, 51, 100, 9]); // source
    h.extend_from_slice(&[10, 0, 0, 1]); // destination
    h.extend_from_slice(&41000u16.to_be_bytes());
    h.extend_from_slice(&2575u16.to_be_bytes());
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_v1_and_v2_give_the_senders_address_and_a_missing_header_is_refused() {
    let (ingress, t) = start([("HL7GW_PROXY_PROTOCOL", "true".to_owned())]);

    // v1: header and frame in one write; the ingress must consume the header and nothing after it.
    let mut s = TcpStream::connect(ingress.mllp).await.unwrap();
    let mut bytes = b"PROXY TCP4 203.0.113.7 10.0.0.1 40000 2575\r\n".to_vec();
    bytes.extend(frame(&adt("PROXY1", "P1")));
    s.write_all(&bytes).await.unwrap();
    let mut v1 = Mllp(Framed::new(s, MllpCodec::default()));
    let ack = v1.recv(ACK_WAIT).await.expect("an ACK after a v1 header");
    assert_eq!(msa(&ack), ("AA".to_owned(), "PROXY1".to_owned()));
    // The connection goes on after the header.
    let ack = v1.call(&adt("PROXY1B", "P1")).await.unwrap();
    assert_eq!(msa(&ack), ("AA".to_owned(), "PROXY1B".to_owned()));

    // v2 (binary): the header in its own write, then the frame.
    let mut s = TcpStream::connect(ingress.mllp).await.unwrap();
    s.write_all(&proxy_v2_header()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut v2 = Mllp(Framed::new(s, MllpCodec::default()));
    let ack = v2
        .call(&adt("PROXY2", "P1"))
        .await
        .expect("an ACK after a v2 header");
    assert_eq!(msa(&ack), ("AA".to_owned(), "PROXY2".to_owned()));

    // No header: closed without an answer, counted.
    let (out, closed) = raw_exchange(
        ingress.mllp,
        &frame(&adt("NOPROXY", "P1")),
        Duration::from_secs(10),
    )
    .await;
    assert!(closed, "a connection without a PROXY header is closed");
    assert!(out.is_empty(), "no answer: {out:?}");
    assert_eq!(
        wait_metric(
            &ingress,
            "hl7gw_ingress_connections_refused_total{reason=\"proxy_header\"}",
            1.0,
            Duration::from_secs(5),
        )
        .await,
        1.0
    );

    let records = t.inbound_records(3, Duration::from_secs(30));
    assert_eq!(records.len(), 3, "NOPROXY is not stored");
    let peer = |id: &str| {
        record_of(&records, id)
            .envelope
            .source
            .clone()
            .unwrap()
            .peer
    };
    assert_eq!(peer("PROXY1"), "203.0.113.7:40000");
    assert_eq!(peer("PROXY1B"), "203.0.113.7:40000");
    assert_eq!(peer("PROXY2"), "198.51.100.9:41000");
}
