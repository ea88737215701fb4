//! TLS material generated at test time: a CA, a server certificate for localhost/127.0.0.1, a client
//! certificate from the same CA, a client certificate from another CA, and a SMART client's key pair.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::PathBuf;

/// A CA and certificates in a temporary folder (see [`pki`]).
pub struct Pki {
    pub dir: tempfile::TempDir,
}

impl Pki {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// [`Pki::path`] as a string, for command lines.
    pub fn file(&self, name: &str) -> String {
        self.path(name)
            .to_str()
            .expect("UTF-8 temp path")
            .to_owned()
    }

    /// The ingress's TLS settings as `HL7GW_TLS__*` variables (with `client_ca`: mutual TLS).
    pub fn env(&self, client_ca: bool) -> Vec<(&'static str, String)> {
        let s = |n: &str| self.path(n).to_str().unwrap().to_owned();
        let mut env = vec![
            ("HL7GW_TLS__CERT", s("server.pem")),
            ("HL7GW_TLS__KEY", s("server.key")),
        ];
        if client_ca {
            env.push(("HL7GW_TLS__CLIENT_CA", s("ca.pem")));
        }
        env
    }
}

fn ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A CA, a server certificate for 127.0.0.1/localhost, a client certificate from the same CA, and a client
/// certificate from another CA.
pub fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| std::fs::write(dir.path().join(name), pem).unwrap();
    let (ca_cert, issuer) = ca("hl7gw features test CA");
    write("ca.pem", &ca_cert.pem());
    let (cert, key) = leaf(
        &issuer,
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    write("server.pem", &cert);
    write("server.key", &key);
    let (cert, key) = leaf(
        &issuer,
        &["hl7-client"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    write("client.pem", &cert);
    write("client.key", &key);
    let (other_ca, other) = ca("some other CA");
    write("other-ca.pem", &other_ca.pem());
    let (cert, key) = leaf(&other, &["intruder"], ExtendedKeyUsagePurpose::ClientAuth);
    write("intruder.pem", &cert);
    write("intruder.key", &key);
    // A SMART backend services client's key pair (EC P-384: ES384 assertions): PKCS#8 and SPKI.
    let smart = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    write("smart-client.key", &smart.serialize_pem());
    write("smart-client.pub", &smart.public_key_pem());
    Pki { dir }
}
