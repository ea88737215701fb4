//! Measures what serving librdkafka's delivery reports on the tokio side would save (issue 12): CLIENTS
//! sequential producers (one record in flight each, acks=all, idempotent, linger 0, the ingress's producer
//! settings) for SECONDS, then msg/s and CPU µs per message of this process and of the broker.
//!
//! `future`: rdkafka's `FutureProducer`, as the services use it: the broker thread hands each delivery report
//! to rdkafka's polling thread, which completes the future and wakes a tokio worker.
//! `tokio`: a `BaseProducer` polled by a tokio task that librdkafka wakes when its main queue becomes non-empty
//! (`rd_kafka_queue_cb_event_enable`), so the reports are served on a tokio worker, a batch per wake-up.
//! This example is the measurement behind `hl7gw_runtime::delivery`, which does the same for the services
//! (their producer since issue 12); it is kept to compare the two with a bare producer and no HL7 work.
//!
//! `cargo run --release -p hl7gw-runtime --example delivery_reports -- BROKERS TOPIC future|tokio CLIENTS SECONDS
//! BROKER_PID`
#![allow(unsafe_code)]

use hl7gw_runtime::kafka::{KafkaSettings, producer_config};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::bindings as rd;
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{
    BaseProducer, BaseRecord, FutureProducer, FutureRecord, Producer, ProducerContext,
};
use std::ffi::c_void;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot};

/// Completes each record's oneshot from the delivery report.
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<bool>>;

    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let _ = tx.send(result.is_ok());
    }
}

/// Called by a librdkafka thread when the main queue goes from empty to non-empty.
unsafe extern "C" fn wake(_rk: *mut rd::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Notify` leaked in `main` for the life of the process.
    let notify = unsafe { &*(opaque as *const Notify) };
    notify.notify_one();
}

fn cpu_seconds_of(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let [_, brokers, topic, mode, clients, secs, broker_pid] = &a[..] else {
        return Err("usage: BROKERS TOPIC future|tokio CLIENTS SECONDS BROKER_PID".into());
    };
    let clients: u64 = clients.parse()?;
    let secs: f64 = secs.parse()?;
    let cfg = producer_config(
        "delivery-reports",
        &KafkaSettings {
            brokers: brokers.clone(),
            ..KafkaSettings::default()
        },
        Duration::from_secs(30),
    )?;
    let admin: AdminClient<DefaultClientContext> = cfg.create()?;
    let _ = admin
        .create_topics(
            &[NewTopic::new(topic, 12, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?;
    let payload = vec![b'x'; 1000];
    let done = Arc::new(AtomicU64::new(0));
    type Sent = Pin<Box<dyn Future<Output = bool> + Send>>;
    let run = |send: Arc<dyn Fn(u64, u64) -> Sent + Send + Sync>| {
        let mut tasks = Vec::new();
        for c in 0..clients {
            let send = send.clone();
            let done = done.clone();
            tasks.push(tokio::spawn(async move {
                let until = Instant::now() + Duration::from_secs_f64(secs);
                let mut seq = 0;
                while Instant::now() < until {
                    if send(c, seq).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    seq += 1;
                }
            }));
        }
        tasks
    };
    let key = |c: u64, seq: u64| format!("patient-{c}-{}", seq % 97);
    let (cpu0, b0, t0) = (
        cpu_seconds_of("self"),
        cpu_seconds_of(broker_pid),
        Instant::now(),
    );
    let tasks = match mode.as_str() {
        "future" => {
            let p: FutureProducer = cfg.create()?;
            let (topic, payload) = (topic.clone(), payload.clone());
            run(Arc::new(move |c, seq| -> Sent {
                let k = key(c, seq);
                let r = FutureRecord::to(&topic).key(&k).payload(&payload);
                match p.send_result(r) {
                    Ok(d) => Box::pin(async move { matches!(d.await, Ok(Ok(_))) }),
                    Err(_) => Box::pin(async { false }),
                }
            }))
        }
        "tokio" => {
            let p: Arc<BaseProducer<Reports>> = Arc::new(cfg.create_with_context(Reports)?);
            let notify: &'static Notify = Box::leak(Box::new(Notify::new()));
            // SAFETY: the queue handle is valid for the producer's life; the callback's opaque is 'static.
            let queue = unsafe { rd::rd_kafka_queue_get_main(p.client().native_ptr()) };
            unsafe {
                rd::rd_kafka_queue_cb_event_enable(
                    queue,
                    Some(wake),
                    notify as *const Notify as *mut c_void,
                )
            };
            let poller = p.clone();
            let queue_addr = queue as usize;
            tokio::spawn(async move {
                loop {
                    notify.notified().await;
                    // Drain: the callback fires again only after the queue was empty.
                    // SAFETY: the queue outlives this task (the process ends with it).
                    while unsafe { rd::rd_kafka_queue_length(queue_addr as *mut _) } > 0 {
                        poller.poll(Duration::ZERO);
                    }
                }
            });
            let (topic, payload) = (topic.clone(), payload.clone());
            run(Arc::new(move |c, seq| -> Sent {
                let (tx, rx) = oneshot::channel();
                let k = key(c, seq);
                let r = BaseRecord::with_opaque_to(&topic, Box::new(tx))
                    .key(&k)
                    .payload(&payload);
                let _ = p.send(r);
                Box::pin(async move { rx.await.unwrap_or(false) })
            }))
        }
        other => return Err(format!("mode is future or tokio, not {other}").into()),
    };
    for t in tasks {
        t.await?;
    }
    let n = done.load(Ordering::Relaxed).max(1) as f64;
    let (cpu1, b1, el) = (
        cpu_seconds_of("self"),
        cpu_seconds_of(broker_pid),
        t0.elapsed().as_secs_f64(),
    );
    println!(
        "{mode} clients={clients}: {:.0} msg/s, CPU µs/msg: process {:.1}, broker {:.1}",
        n / el,
        (cpu1 - cpu0) * 1e6 / n,
        (b1 - b0) * 1e6 / n
    );
    Ok(())
}
