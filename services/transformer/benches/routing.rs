//! The transformer's route dispatch with 1, 10, 100 and 1,000 routes: one ADT^A01 message, one route that takes
//! it, the others for other message types. `indexed` is what the worker does (candidates by type and trigger,
//! then `matches`); `scan` checks every route, as the worker did before the index; `route_one` is the whole
//! per-message work (decode, parse, match, transform, output records). Run: `make bench-routing`.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures_util::FutureExt;
use hl7gw_runtime::envelope;
use hl7gw_runtime::proto::v1::{Envelope, TransformRequest};
use hl7gw_transformer::config::Config;
use hl7gw_transformer::engine::{Plugin, PluginCaller, Route, Routes};
use hl7gw_transformer::metrics::TransformerMetrics;
use hl7gw_transformer::route::HL7RouteSpec;
use hl7gw_transformer::worker::route_one;
use hl7v2::{Charset, Message};
use std::hint::black_box;
use std::sync::Arc;

const ADT: &[u8] = b"MSH|^~\\&|EPIC|GOOD HOSP|LAB|X|20260101120000||ADT^A01^ADT_A01|C1|P|2.5\rEVN|A01|20260101120000\rPID|1||12345^^^MRN||DOE^JANE||19800101|F\rPV1|1|I|W^1^1\r";

struct NoPlugins;
impl PluginCaller for NoPlugins {
    async fn call(&self, _: &Plugin, _: TransformRequest) -> Result<(Vec<u8>, String), String> {
        Err("no plugins in this bench".into())
    }
}

/// `n` routes: `r0000` takes ADT^A01 and masks PID-5; the others take `Z<i>^A01`.
fn routes(n: usize) -> Routes {
    let list = (0..n)
        .map(|i| {
            let yaml = if i == 0 {
                "{match: {messageTypes: ['ADT^A01']}, transforms: [{mask: {path: PID-5}}], destinations: [lab]}".to_owned()
            } else {
                format!("{{match: {{messageTypes: ['Z{i:03}^A01']}}, destinations: [d{i}]}}")
            };
            let spec: HL7RouteSpec = serde_saphyr::from_str(&yaml).expect("route yaml");
            Arc::new(Route::compile(&format!("r{i:04}"), &spec).expect("route compiles"))
        })
        .collect();
    Routes::new(list)
}

fn bench(c: &mut Criterion) {
    let msg = Message::parse(ADT).expect("fixture parses");
    let env = Envelope {
        id: "e1".into(),
        raw: ADT.to_vec().into(),
        charset: "UNICODE UTF-8".into(),
        key: "GOOD HOSP|12345".into(),
        header: Some(envelope::header(msg.header(), Charset::Utf8)),
        ..Envelope::default()
    };
    let mut payload = Vec::new();
    envelope::encode_into(&env, &mut payload);
    let cfg = Config::default();
    let (_reg, metrics) = TransformerMetrics::registered();
    let h = env.header.clone().unwrap_or_default();
    let mut g = c.benchmark_group("routing");
    for n in [1usize, 10, 100, 1000] {
        let rs = routes(n);
        g.bench_with_input(BenchmarkId::new("indexed", n), &rs, |b, rs| {
            b.iter(|| {
                rs.candidates(&h.message_type, &h.trigger_event)
                    .filter(|r| r.matches(&env, &msg, Charset::Utf8).is_ok())
                    .count()
            })
        });
        g.bench_with_input(BenchmarkId::new("scan", n), &rs, |b, rs| {
            b.iter(|| {
                rs.routes
                    .iter()
                    .filter(|r| r.matches(&env, &msg, Charset::Utf8).is_ok())
                    .count()
            })
        });
        g.bench_with_input(BenchmarkId::new("route_one", n), &rs, |b, rs| {
            b.iter(|| {
                route_one(&cfg, rs, black_box(&payload), &NoPlugins, &metrics)
                    .now_or_never()
                    .map(|r| r.records.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
