use std::path::{Path, PathBuf};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A user's PKI, as an operator would bring one: a CA, and a certificate it signed for
/// 127.0.0.1 with its key; PEM for the binaries' flags, DER for rustls in the test.
pub struct Pki {
    pub ca_pem: String,
    pub ca_der: CertificateDer<'static>,
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_pem: String,
    pub key_der: PrivateKeyDer<'static>,
}

impl Pki {
    pub fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "Flotilla test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert =
            CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
        Pki {
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key_pem: key.serialize_pem(),
            key_der: PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        }
    }

    /// Writes `ca.pem`, `api.crt` and `api.key` into `dir`; their paths, in that order.
    pub fn write_pem(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let paths = (dir.join("ca.pem"), dir.join("api.crt"), dir.join("api.key"));
        std::fs::write(&paths.0, &self.ca_pem).unwrap();
        std::fs::write(&paths.1, &self.cert_pem).unwrap();
        std::fs::write(&paths.2, &self.key_pem).unwrap();
        paths
    }
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}
