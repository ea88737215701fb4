//! Fuzz `Message::parse` and everything reachable from a parsed message: no input may panic, and an
//! unedited message must re-encode byte-identical.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = hl7v2::Message::parse(data) {
        let _ = m.flat();
        for p in ["MSH-9-1", "PID-3(2)-4-1", "OBX(2)-5", "MSH-2", "PID-5-1-1"] {
            let _ = m.get_decoded(p);
        }
        assert_eq!(m.edit().encode(), data);
        let mut e = m.edit();
        if e.set("PID-5(2)-1-2", data).is_ok() {
            let out = e.encode();
            let _ = hl7v2::Message::parse(&out);
        }
        let mut ack = Vec::new();
        hl7v2::write_ack(&mut ack, m.header(), hl7v2::AckCode::AA, None, &hl7v2::AckIds {
            control_id: b"1",
            timestamp: b"20260101000000",
        });
        assert!(hl7v2::Message::parse(&ack).is_ok());
    }
    let _ = hl7v2::Batch::parse(data);
    let _ = hl7v2::Header::salvage(data);
});
