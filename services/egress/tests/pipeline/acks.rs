//! The receiver's answers: matched by MSA-2, and the ACK policy of HL7 table 0008.

use super::*;

/// Answers every message twice, an accept ACK (CE for control ids ending in `-3`, else CA) then an application
/// ACK (AA).
async fn two_ack_receiver(port: u16) -> tokio::task::JoinHandle<()> {
    scripted_receiver(port, |m| {
        let cid = control_id(m);
        let accept = if cid.ends_with("-3") { "CE" } else { "CA" };
        vec![format!("{accept}|{cid}"), format!("AA|{cid}")]
    })
    .await
}

/// Issue 9, item 4: the egress matches MSA-2 to the control id it sent. A receiver that sends an accept ACK
/// and then an application ACK must not shift every answer by one: the message the receiver refused (CE) is
/// dead-lettered, and no other is.
#[test]
fn answers_are_matched_by_msa2_not_by_arrival() {
    common::run_alone(|mut p| async move {
        let _receiver = two_ack_receiver(p.receiver_port).await;
        p.start_services();
        let mut c = p.mllp_client().await;
        let ids: Vec<String> = (1..=6).map(|i| format!("TWOACK-{i}")).collect();
        for id in &ids {
            // One patient: one partition, one connection, in order.
            let ack = c.call(&adt_from("ADMIT", id, "MRN7")).await.unwrap();
            assert_eq!(support::ack_code(&ack), "AA");
        }
        let mut egress = p.egress_client().await;
        wait_settled(&mut egress, 6, String::new).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let dead: Vec<String> = dead_letters(&mut egress)
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            dead,
            ["TWOACK-3"],
            "only the refused message is a dead letter"
        );
        let s = common::egress_status(&mut egress).await;
        assert_eq!(s.destinations[0].delivered, 5);
    });
}

/// A receiver that answers by control id, as real receivers do: `POL-1` has a content error (AE 102), `POL-2`
/// is refused twice with AR 207 ("resend later") before it is taken, a message whose MSH-15 is `NE` gets no
/// answer at all (a compliant enhanced-mode receiver), and the rest get AA. Every message that reaches it is
/// recorded in arrival order as (control id, MSH-15).
async fn policy_receiver(port: u16) -> std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    scripted_receiver(port, move |m| {
        let get = |p: &str| String::from_utf8_lossy(m.get(p).unwrap_or_default()).into_owned();
        let (cid, msh15) = (get("MSH-10"), get("MSH-15"));
        let tries = {
            let mut l = log.lock().unwrap();
            l.push((cid.clone(), msh15.clone()));
            l.iter().filter(|(c, _)| *c == cid).count()
        };
        let msa = match (cid.as_str(), msh15.as_str()) {
            (_, "NE") => return vec![],
            ("POL-1", _) => "AE|POL-1\rERR|||102^Data type error^HL70357|E".to_owned(),
            ("POL-2", _) if tries <= 2 => {
                "AR|POL-2\rERR|||207^Application internal error^HL70357|E".to_owned()
            }
            _ => format!("AA|{cid}"),
        };
        vec![msa]
    })
    .await;
    seen
}

/// Issue 9, item 10: the egress follows HL7 table 0008. A content error (AE) goes to the DLQ at once instead
/// of blocking the partition forever; a rejection with ERR 207 ("resend later") is retried, so the patient's
/// later messages do not overtake it; and a message whose MSH-15 asks for no accept ACK is sent with MSH-15
/// `AL`, so a compliant receiver answers instead of the egress resending it forever.
#[test]
fn the_ack_policy_follows_hl7_table_0008_and_msh15_asks_for_an_answer() {
    common::run_alone(|mut p| async move {
        let seen = policy_receiver(p.receiver_port).await;
        p.start_services();
        let mut c = p.mllp_client().await;
        for (cid, msh15) in [("POL-1", ""), ("POL-2", ""), ("POL-3", "NE"), ("POL-4", "")] {
            let m = format!(
                "MSH|^~\\&|ADMIT|FAC|HL7GW|HL7GW|20261123120000||ADT^A01^ADT_A01|{cid}|P|2.5.1|||{msh15}|\r\
                 EVN|A01|20261123120000\rPID|1||MRN9^^^FAC^MR||DOE^JANE||19700101|F\r"
            );
            if msh15 == "NE" {
                // The ingress, too, sends no accept ACK for NE.
                c.send(m.as_bytes()).await;
            } else {
                let ack = c.call(m.as_bytes()).await.unwrap();
                assert_eq!(support::ack_code(&ack), "AA");
            }
        }
        let mut egress = p.egress_client().await;
        wait_settled(&mut egress, 4, || {
            format!("the receiver saw {:?}", seen.lock().unwrap())
        })
        .await;
        let dead = dead_letters(&mut egress).await;
        assert_eq!(dead, [("POL-1".to_owned(), "AE".to_owned())]);
        let seen = seen.lock().unwrap().clone();
        let order: Vec<&str> = seen.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(
            order,
            ["POL-1", "POL-2", "POL-2", "POL-2", "POL-3", "POL-4"],
            "AE once, AR 207 retried in place, then the rest in order"
        );
        assert_eq!(seen[4].1, "AL", "MSH-15 NE went out as AL");
    });
}
