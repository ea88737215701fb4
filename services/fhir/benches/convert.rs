//! `toFhir`'s cost: one message into a FHIR R4 Bundle (JSON), the output buffer reused as the transformer
//! does. Prints the allocations per conversion once (a counting allocator around the system one).
//!
//! On a busy machine, count instructions instead of timing (exact, whatever the load; SHA-256 counts more
//! than on hardware with SHA extensions, which valgrind does not emulate):
//!
//!   HL7GW_FHIR_BENCH_ONLY=adt_a01 valgrind --tool=callgrind target/release/deps/convert-<hash> --bench nothing
//!
//!   cargo bench -p hl7gw-fhir --bench convert

use criterion::{Criterion, criterion_group, criterion_main};
use hl7gw_fhir::{BundleType, Options, convert};
use hl7v2::{Charset, Message};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts allocations (the bench is one thread).
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; only a counter is added.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The messages measured: (name, bytes).
fn messages() -> Vec<(&'static str, &'static [u8])> {
    vec![
        ("adt_a01", include_bytes!("../tests/data/adt_a01.hl7")),
        ("oru_r01", include_bytes!("../tests/data/oru_r01.hl7")),
        ("oru_r01_20obx", ORU_20_OBX.get_or_init(oru_20_obx)),
    ]
}

static ORU_20_OBX: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// An ORU_R01 with one order and 20 numeric OBX (the issue's "typical" lab result).
fn oru_20_obx() -> Vec<u8> {
    let mut m = b"MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240102030405+0100||ORU^R01^ORU_R01|C20|P|2.5.1\r\
PID|1||12345^^^HOSP^MR||DOE^JANE||19800214|F\r\
PV1|1|O|LAB^^^HOSP||||1234^SMITH^ANNA\r\
ORC|RE|P1^EHR|F1^LAB\r\
OBR|1|P1^EHR|F1^LAB|24323-8^Comprehensive metabolic panel^LN|||20240102020000+0100|||||||||1234^SMITH^ANNA||||||20240102030000+0100|||F\r"
        .to_vec();
    for i in 1..=20 {
        m.extend_from_slice(
            format!("OBX|{i}|NM|{}-{}^Analyte {i}^LN||{}.{}|mmol/L^mmol/L^UCUM|3.5-5.0|N|||F|||20240102020000+0100\r", 2000 + i, i % 10, i, i % 7)
                .as_bytes(),
        );
    }
    m
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("to_fhir");
    // HL7GW_FHIR_BENCH_ONLY=<name>: only the messages whose name contains it (to count one message's
    // instructions with valgrind on a busy machine, where times are not to be trusted).
    let only = std::env::var("HL7GW_FHIR_BENCH_ONLY").unwrap_or_default();
    for (name, bytes) in messages()
        .into_iter()
        .filter(|(n, _)| n.contains(only.as_str()))
    {
        for (kind, bundle_type) in [
            ("transaction", BundleType::Transaction),
            ("message", BundleType::Message),
        ] {
            let opts = Options {
                bundle_type,
                received_at: Some("2026-11-27T10:00:00Z".into()),
                ..Options::default()
            };
            let mut out = Vec::with_capacity(64 * 1024);
            // Parse included: the transformer parses each message before its steps.
            let once = |out: &mut Vec<u8>| {
                out.clear();
                let msg = Message::parse(bytes).expect("parse");
                convert(&msg, Charset::Utf8, &opts, out).expect("convert")
            };
            once(&mut out);
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            once(&mut out);
            let allocs = ALLOCATIONS.load(Ordering::Relaxed) - before;
            println!(
                "to_fhir/{name}/{kind}: {} bytes in, {} bytes of Bundle out, {allocs} allocations",
                bytes.len(),
                out.len()
            );
            group.bench_function(format!("{name}/{kind}"), |b| {
                b.iter(|| black_box(once(&mut out)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
