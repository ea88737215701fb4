//! The TLS certificates a process presents, and when each stops being valid:
//! `hl7gw_tls_certificate_not_after_timestamp_seconds{use, destination}` (unix seconds), in every registry
//! [`crate::metrics::registry`] makes, so one alert (the chart's HL7GWCertificateExpiry) covers every service.
//!
//! `use` names the configured certificate, never its subject: `mllp-server` (the ingress's MLLP listener),
//! `grpc-server` (every service's gRPC listener), `kafka-client` (the Kafka client certificate, mutual TLS),
//! `grpc-client` (the transformer's plugin calls), `mllp-client` (an egress destination's, with `destination`:
//! configured names, so the labels stay bounded). Each load of a certificate records it again, replacing what
//! the previous load of that use recorded: the services read their certificates at start, and a Kafka client
//! made again (a recreated producer) reads its certificate file again, so the gauge is what the process
//! presents now. CA files are not recorded (they are what the process trusts, not what it presents).

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::path::Path;
use std::sync::LazyLock;

/// A certificate's labels: `use`, and `destination` for an egress destination's.
pub type CertLabels = Vec<(&'static str, String)>;

/// The process's certificates: one family, shared by every registry of the process.
static LOADED: LazyLock<Family<CertLabels, Gauge>> = LazyLock::new(Family::default);

crate::metric_set! {
    /// The certificates [`record`] noted; [`crate::metrics::registry`] registers them in every registry.
    pub struct TlsMetrics under "tls" {
        pub certificate_not_after as "certificate_not_after_timestamp": Family<CertLabels, Gauge> =
            "When each TLS certificate (chain) the process loaded to present stops being valid (its earliest notAfter, unix seconds), by use",
            unit Seconds, new LOADED.clone();
    }
}

/// Records the earliest notAfter of the certificate chain in `path`, loaded for `use_` (for an egress
/// destination's, with its name), and returns it. A file that cannot be read or parsed is logged and left out:
/// the caller has just loaded it, or the client that reads it (librdkafka) reports the error itself.
pub fn record(use_: &'static str, destination: Option<&str>, path: &Path) -> Option<i64> {
    match hl7gw_tls::file_not_after(path) {
        Ok(not_after) => {
            let mut labels = vec![("use", use_.to_owned())];
            if let Some(d) = destination {
                labels.push(("destination", d.to_owned()));
            }
            LOADED.get_or_create(&labels).set(not_after);
            Some(not_after)
        }
        Err(e) => {
            tracing::warn!(cert_use = use_, destination, error = %e, "certificate expiry not recorded");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, date_time_ymd};

    fn cert(
        name: &str,
        not_after: (i32, u8, u8),
        issuer: Option<&Issuer<'_, KeyPair>>,
    ) -> (String, CertificateParams, KeyPair) {
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.not_before = date_time_ymd(2024, 1, 1);
        params.not_after = date_time_ymd(not_after.0, not_after.1, not_after.2);
        if issuer.is_none() {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        let key = KeyPair::generate().unwrap();
        let pem = match issuer {
            Some(i) => params.signed_by(&key, i).unwrap().pem(),
            None => params.self_signed(&key).unwrap().pem(),
        };
        (pem, params, key)
    }

    /// The sample of `use_` (and `destination`) in a registry's scrape.
    fn sample(text: &str, labels: &str) -> Option<i64> {
        let prefix = format!("hl7gw_tls_certificate_not_after_timestamp_seconds{{{labels}}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().unwrap())
    }

    /// Issue 26, item 6: each certificate's notAfter is a gauge of every service's registry, labelled by its
    /// use (and destination), never its subject; a chain counts from its earliest notAfter; a reload replaces
    /// the value.
    #[test]
    fn the_gauge_holds_each_certificates_not_after() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_pem, ca_params, ca_key) = cert("test CA", (2030, 3, 1), None);
        let issuer = Issuer::new(ca_params, ca_key);
        let (leaf_pem, ..) = cert("leaf.example", (2031, 5, 17), Some(&issuer));
        let (renewed_pem, ..) = cert("leaf.example", (2032, 5, 17), Some(&issuer));
        let leaf = dir.path().join("leaf.pem");
        let chain = dir.path().join("chain.pem");
        std::fs::write(&leaf, &leaf_pem).unwrap();
        std::fs::write(&chain, format!("{leaf_pem}{ca_pem}")).unwrap();

        // 2031-05-17T00:00:00Z, 2030-03-01T00:00:00Z, 2032-05-17T00:00:00Z
        let (leaf_end, ca_end, renewed_end) = (1_936_742_400, 1_898_553_600, 1_968_364_800);
        assert_eq!(record("test-server", None, &leaf), Some(leaf_end));
        assert_eq!(
            record("test-client", Some("lab"), &chain),
            Some(ca_end),
            "a chain is valid until its first certificate expires"
        );
        let registry = crate::metrics::registry();
        let text = crate::metrics::render(&registry);
        assert!(
            text.contains("# TYPE hl7gw_tls_certificate_not_after_timestamp_seconds gauge"),
            "{text}"
        );
        assert_eq!(sample(&text, r#"use="test-server""#), Some(leaf_end));
        assert_eq!(
            sample(&text, r#"use="test-client",destination="lab""#),
            Some(ca_end)
        );
        assert!(!text.contains("leaf.example"), "no subject in the labels");

        // Renewed and loaded again: the new notAfter, in a registry made before too.
        std::fs::write(&leaf, &renewed_pem).unwrap();
        assert_eq!(record("test-server", None, &leaf), Some(renewed_end));
        let text = crate::metrics::render(&registry);
        assert_eq!(sample(&text, r#"use="test-server""#), Some(renewed_end));

        // A file that is not a certificate is left out.
        std::fs::write(dir.path().join("bad.pem"), "not a certificate").unwrap();
        assert_eq!(record("test-bad", None, &dir.path().join("bad.pem")), None);
        assert_eq!(
            sample(&crate::metrics::render(&registry), r#"use="test-bad""#),
            None
        );
    }
}
