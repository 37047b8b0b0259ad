//! TLS material for the shard's QUIC endpoint: loaded from PEM files, or generated
//! (self-signed, for 127.0.0.1 and localhost) by `flotilla up`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN for the agent <-> shard protocol.
pub const ALPN: &[u8] = b"flotilla/1";

pub struct TlsMaterial {
    pub certs: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl TlsMaterial {
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Self> {
        let certs = rustls_pemfile::certs(&mut std::io::BufReader::new(
            std::fs::File::open(cert).with_context(|| format!("opening {}", cert.display()))?,
        ))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing certificates in {}", cert.display()))?;
        if certs.is_empty() {
            return Err(anyhow!("{} holds no certificate", cert.display()));
        }
        let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
            std::fs::File::open(key).with_context(|| format!("opening {}", key.display()))?,
        ))
        .with_context(|| format!("parsing {}", key.display()))?
        .ok_or_else(|| anyhow!("{} holds no private key", key.display()))?;
        Ok(TlsMaterial { certs, key })
    }

    /// A fresh self-signed certificate for `names`.
    pub fn self_signed(names: &[&str]) -> anyhow::Result<(Self, String, String)> {
        let ck = rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        let cert_pem = ck.cert.pem();
        let key_pem = ck.key_pair.serialize_pem();
        let key = PrivateKeyDer::try_from(ck.key_pair.serialize_der()).map_err(|e| anyhow!("{e}"))?;
        Ok((TlsMaterial { certs: vec![ck.cert.der().clone()], key }, cert_pem, key_pem))
    }

    /// Writes a self-signed certificate and key for loopback use into `dir`
    /// (`tls.crt`, `tls.key`), unless they exist already.
    pub fn ensure_in(dir: &Path) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        if !cert.exists() || !key.exists() {
            let (_, cert_pem, key_pem) = Self::self_signed(&["localhost", "127.0.0.1"])?;
            std::fs::write(&cert, cert_pem).with_context(|| format!("writing {}", cert.display()))?;
            write_private(&key, key_pem.as_bytes()).with_context(|| format!("writing {}", key.display()))?;
        }
        Ok((cert, key))
    }

    pub fn quic_server_config(self) -> anyhow::Result<quinn::ServerConfig> {
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_no_client_auth()
            .with_single_cert(self.certs, self.key)?;
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        let mut transport = quinn::TransportConfig::default();
        transport.max_concurrent_bidi_streams(256u32.into());
        transport.max_concurrent_uni_streams(16u32.into());
        transport.max_idle_timeout(Some(std::time::Duration::from_secs(30).try_into()?));
        config.transport_config(Arc::new(transport));
        Ok(config)
    }
}

/// Writes a secret readable by its owner only.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(bytes)
}
