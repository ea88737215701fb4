//! MDM: a document reference with its attachments.

use super::*;

#[test]
fn an_mdm_t02_becomes_a_document_reference_with_its_attachments() {
    let (b, _) = convert_json(MDM_T02, &Options::default());
    let docs = resources(&b, "DocumentReference");
    assert_eq!(docs.len(), 1);
    let doc = docs[0];
    assert_eq!(doc["masterIdentifier"]["value"], "DOC-0001");
    assert_eq!(doc["masterIdentifier"]["system"], "urn:hl7gw:id:CLINIC");
    assert_eq!(doc["identifier"][0]["value"], "discharge-0001.pdf");
    assert_eq!(doc["status"], "current");
    assert_eq!(doc["docStatus"], "final");
    assert_eq!(doc["type"]["coding"][0]["code"], "DS");
    assert_eq!(doc["date"], "2025-03-02T09:30:00+01:00");
    assert_eq!(doc["description"], "Discharge summary (sample)");
    assert_eq!(doc["securityLabel"][0]["coding"][0]["code"], "R");
    assert_eq!(
        resolve(&b, &doc["author"][0])["name"][0]["family"],
        "WRITER"
    );
    assert_eq!(
        resolve(&b, &doc["authenticator"])["name"][0]["family"],
        "CHECKER"
    );
    assert_eq!(resolve(&b, &doc["subject"])["resourceType"], "Patient");
    assert_eq!(
        resolve(&b, &doc["context"]["encounter"][0])["resourceType"],
        "Encounter"
    );
    let content = doc["content"].as_array().expect("content");
    assert_eq!(content.len(), 4);
    // The TX and FT lines, one text attachment.
    assert_eq!(
        content[0]["attachment"]["contentType"],
        "text/plain; charset=utf-8"
    );
    assert_eq!(
        content[0]["attachment"]["data"],
        crate::messages::mdm::base64(
            b"Admitted for observation.\nDischarged home in good condition.\nFollow-up in \ntwo weeks."
        )
    );
    // The NTE after the FT.
    assert_eq!(
        content[1]["attachment"]["data"],
        crate::messages::mdm::base64(b"Dictated, then reviewed")
    );
    // ED: base64 as sent, the type from ED-2/ED-3.
    assert_eq!(content[2]["attachment"]["contentType"], "application/pdf");
    assert_eq!(
        content[2]["attachment"]["data"],
        crate::messages::mdm::base64(b"%PDF-1.4\n% hl7gw sample, no patient data\n%%EOF\n")
    );
    // RP: by url.
    assert_eq!(
        content[3]["attachment"]["url"],
        "https://documents.example/discharge-0001"
    );
    assert_eq!(
        request_url(&b, doc),
        "DocumentReference?identifier=urn:hl7gw:id:CLINIC%7CDOC-0001"
    );
}

#[test]
fn an_mdm_without_content_is_refused() {
    let msg =
        b"MSH|^~\\&|A|B|C|D|20250301||MDM^T02^MDM_T02|1|P|2.5.1\rPID|1||1^^^X^MR\rTXA|1|DS|TX\r";
    let m = hl7v2::Message::parse(msg).expect("parse");
    let err = convert(&m, Charset::Utf8, &Options::default(), &mut Vec::new()).expect_err("no OBX");
    assert!(matches!(err, FhirError::Required(_)), "{err:?}");
}
