//! The egress started in-process on port 0 against the test broker: it binds, gets ready, serves its gRPC
//! health and drains when told to stop.

use hl7gw_testkit::{self as support, InProcess};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_process_on_port_0() {
    let brokers = tokio::task::spawn_blocking(support::broker).await.unwrap();
    let id = support::unique_topic("inproc");
    let cfg: hl7gw_egress::config::Config = support::config_on_port_0(
        brokers,
        &format!(
            "out_topic_prefix: {id}.out.\ndlq_topic: {id}.dlq\ngroup_prefix: {id}\n\
         destinations: {{lab: {{address: '127.0.0.1:{}'}}}}\n",
            support::free_port()
        ),
    );
    let egress = InProcess::service::<hl7gw_egress::App>(cfg).await;
    assert!(egress.bound.mllp.is_none());
    let metrics = egress.serving().await;
    assert!(
        metrics.contains("hl7gw_egress_connections_active{destination=\"lab\"}"),
        "{metrics}"
    );
    egress.stop(Duration::from_secs(30)).await.unwrap();
}
