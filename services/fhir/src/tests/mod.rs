//! The converter's unit tests, one file per message family (and the Bundle's options, and identity); here the
//! sample messages and the helpers that read a Bundle's JSON.

mod adt;
mod bundle;
mod identity;
mod mdm;
mod order;
mod siu;
mod vxu;

use super::*;
use serde_json::Value as Json;

/// An entry's request as one condition: `Type?identifier=...` for a conditional update (PUT) or a
/// create-if-absent (POST with `ifNoneExist`), `Type/id` for an update by id.
fn condition(e: &Json) -> String {
    let r = &e["request"];
    let url = r["url"].as_str().unwrap_or_default();
    match r["ifNoneExist"].as_str() {
        Some(q) => {
            assert_eq!(r["method"], "POST", "{r}");
            format!("{url}?{q}")
        }
        None => url.to_owned(),
    }
}

const ADT_A01: &[u8] = b"MSH|^~\\&|EPIC|MAIN^2.16.840.1.113883.19.1^ISO|LAB|LABFAC|20240102030405+0100||ADT^A01^ADT_A01|MSG00001|P|2.5.1\r\
EVN|A01|20240102030405+0100||ADM\r\
PID|1||12345^^^HOSP^MR~999-99-9999^^^SSA^SS||DOE^JANE^Q^^DR||19800214|F|||1 MAIN ST^APT 2^SPRINGFIELD^IL^62701^USA^H||^PRN^PH^^1^217^5551234|^WPN^PH^^1^217^5559876|ENG|M\r\
NK1|1|DOE^JOHN|SPO^Spouse^HL70063|1 MAIN ST^^SPRINGFIELD^IL^62701|^PRN^PH^^1^217^5551234\r\
PV1|1|I|W3^301^A^MAIN||||1234^SMITH^ANNA^^^DR^^^HOSP|||MED||||7|||1234^SMITH^ANNA^^^DR^^^HOSP||V100^^^HOSP^VN|||||||||||||||||||||||||20240102030000+0100\r\
OBX|1|NM|29463-7^Body weight^LN||72.5|kg^kilogram^UCUM|||||F|||20240102030000+0100\r\
AL1|1|DA|70618^Penicillin^RXNORM|SV|Hives~Rash|20100101\r\
DG1|1||I10^Essential hypertension^I10||20240101\r\
IN1|1|PLAN1^Gold plan|INS1^^^PAYERS|ACME INSURANCE|||||||||20240101|20241231\r\
ZPI|1|custom|value\r";

fn convert_json(msg: &[u8], opts: &Options) -> (Json, Outcome) {
    let m = hl7v2::Message::parse(msg).expect("parse");
    let mut out = Vec::new();
    let outcome = convert(&m, Charset::Utf8, opts, &mut out).expect("convert");
    let json: Json = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));
    (json, outcome)
}

fn resources<'j>(b: &'j Json, ty: &str) -> Vec<&'j Json> {
    b["entry"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| &e["resource"])
        .filter(|r| r["resourceType"] == ty)
        .collect()
}

const ORU_R01: &[u8] = b"MSH|^~\\&|LAB|MAIN^2.16.840.1.113883.19.2^ISO|EHR|HOSP|20240103101500+0100||ORU^R01^ORU_R01|LAB0001|P|2.5.1\r\
PID|1||12345^^^HOSP^MR||DOE^JANE||19800214|F\r\
PV1|1|O|CLINIC^101||||1234^SMITH^ANNA^^^DR^^^HOSP||||||||||||V200^^^HOSP^VN\r\
ORC|RE|PL1^EHR|FL1^LAB||CM||||20240103080000+0100|||1234^SMITH^ANNA^^^DR^^^HOSP\r\
OBR|1|PL1^EHR|FL1^LAB|24331-1^Lipid panel^LN|||20240103073000+0100|||||||||1234^SMITH^ANNA^^^DR^^^HOSP||||||20240103101000+0100||CH|F\r\
OBX|1|NM|2093-3^Cholesterol^LN||195|mg/dL^mg/dL^UCUM|<200|N|||F|||20240103090000+0100\r\
OBX|2|SN|2571-8^Triglyceride^LN||>^400|mg/dL^mg/dL^UCUM||H|||F\r\
NTE|1||Sample lipemic\r\
SPM|1|SP1&EHR^SPF1&LAB||SER^Serum^HL70487|||||||||||||20240103073000+0100|20240103080000+0100\r\
OBR|2|PL2^EHR|FL2^LAB|600-7^Bacteria identified in Blood by Culture^LN|||20240103073000+0100|||||||||||||||20240103101000+0100||MB|P\r\
OBX|1|CWE|600-7^Bacteria identified^LN|1|3092008^Staphylococcus aureus^SCT||||||P\r\
OBX|2|TX|18769-0^Antimicrobial susceptibility^LN|1|Line one~Line two||||||P\r\
ZLB|1|custom\r";

fn entries(b: &Json) -> &Vec<Json> {
    b["entry"].as_array().expect("entries")
}

/// The entry a `urn:uuid:` reference points at.
fn resolve<'j>(b: &'j Json, reference: &Json) -> &'j Json {
    let r = reference["reference"].as_str().expect("reference");
    let e = entries(b)
        .iter()
        .find(|e| e["fullUrl"] == r)
        .unwrap_or_else(|| panic!("{r} is not in the Bundle"));
    &e["resource"]
}

const VXU_V04: &[u8] = include_bytes!("../../tests/data/vxu_v04.hl7");

const MDM_T02: &[u8] = include_bytes!("../../tests/data/mdm_t02.hl7");

const SIU_S12: &[u8] = include_bytes!("../../tests/data/siu_s12.hl7");

/// The transaction request of the entry holding `resource`.
fn request_url<'j>(b: &'j Json, resource: &Json) -> &'j Json {
    &entries(b)
        .iter()
        .find(|e| e["resource"] == *resource)
        .expect("entry")["request"]["url"]
}

/// An ADT^A04 from `facility` (MSH-4) for a patient whose PID-3 is `pid3`.
fn a04(facility: &str, pid3: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|REG|{facility}|HL7GW|HL7GW|20260201080000||ADT^A04^ADT_A01|C1|P|2.5.1\rPID|1||{pid3}||DOE^JANE||19700101|F\rPV1|1|O\r"
    )
    .into_bytes()
}
