//! The ingress started in-process on port 0 against the test broker: it binds, gets ready, answers AA once
//! Kafka holds a message, and drains when told to stop.

use hl7gw_testkit::{self as support, InProcess, Mllp};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_process_on_port_0() {
    let brokers = support::broker_async().await;
    let cfg: hl7gw_ingress::config::Config = support::config_on_port_0(
        brokers,
        &format!(
            "mllp_addr: 127.0.0.1:0\ninbound_topic: {}\ndlq_topic: {}\n",
            support::unique_topic("inproc.in"),
            support::unique_topic("inproc.dlq"),
        ),
    );
    let ingress = InProcess::service::<hl7gw_ingress::App>(cfg).await;
    ingress.serving().await;
    let mllp = ingress.bound.mllp.expect("the ingress bound MLLP");
    let mut c = Mllp::connect(mllp).await;
    let ack = c
        .call(&support::adt("INPROC-1", "P1"))
        .await
        .expect("an ACK");
    assert_eq!(support::ack_code(&ack), "AA");
    drop(c);
    ingress.stop(Duration::from_secs(30)).await.unwrap();
}
