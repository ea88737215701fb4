//! The egress started in-process on port 0 against the test broker: it binds, gets ready, serves its gRPC
//! health and drains when told to stop.

use hl7gw_testkit as support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_process_on_port_0() {
    let brokers = support::broker_async().await;
    let id = support::unique_topic("inproc");
    let cfg: hl7gw_egress::config::Config = support::config_on_port_0(
        brokers,
        &format!(
            "out_topic_prefix: {id}.out.\ndlq_topic: {id}.dlq\ngroup_prefix: {id}\n\
         destinations: {{lab: {{address: '127.0.0.1:{}'}}}}\n",
            support::free_port()
        ),
    );
    let series = "hl7gw_egress_connections_active{destination=\"lab\"}";
    support::worker_serves::<hl7gw_egress::App>(cfg, series).await;
}
