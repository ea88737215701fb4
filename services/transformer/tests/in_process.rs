//! The transformer started in-process on port 0 against the test broker: it binds, loads its routes, gets
//! ready (topics created, transactions initialised) and drains when told to stop.

use hl7gw_testkit as support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_in_process_on_port_0() {
    let brokers = support::broker_async().await;
    let (_dir, routes) = support::temp_file(
        "routes.yaml",
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {name: adt}\n\
         spec:\n  match: {messageTypes: ['ADT^A01']}\n  destinations: [lab]\n",
    );
    let id = support::unique_topic("inproc");
    let cfg: hl7gw_transformer::config::Config = support::config_on_port_0(
        brokers,
        &format!(
            "inbound_topic: {id}.in\ndlq_topic: {id}.dlq\nout_topic_prefix: {id}.out.\ngroup_id: {id}\n\
         transactional_id: {id}\nroutes: {{file: {}}}\n",
            routes.display()
        ),
    );
    support::worker_serves::<hl7gw_transformer::App>(cfg, "hl7gw_transformer_routes_active 1")
        .await;
}
