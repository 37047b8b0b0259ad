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

    /// Writes a self-signed certificate and key into `dir` (`tls.crt`, `tls.key`), unless
    /// they exist already: for `localhost`, 127.0.0.1 and `hosts` (the address a shard
    /// listens on, so agents on other hosts can verify it there too).
    ///
    /// Both are written before either is put in place ([`flotilla_obs::fsutil`]), so a
    /// full disk leaves neither. A pair an older version left half-written (a file
    /// missing or empty: it wrote the certificate, then the key, not atomically) is
    /// regenerated with a warning: without its key the certificate serves nobody, so
    /// nothing can depend on it. A pair whose files both hold something but do not
    /// parse is refused with the path named: that is not an interrupted start, and
    /// replacing it silently could hide someone's own certificate.
    pub fn ensure_in(dir: &Path, hosts: &[&str]) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        let (cert_blank, key_blank) = (blank(&cert), blank(&key));
        if cert_blank || key_blank {
            if !(cert_blank && key_blank) {
                let (gone, kept) = if key_blank { (&key, &cert) } else { (&cert, &key) };
                tracing::warn!(
                    missing = %gone.display(),
                    replaced = %kept.display(),
                    "the TLS pair is incomplete (an interrupted first start?): generating a new one; \
                     agents given the old tls.crt as their CA need the new one"
                );
            }
            let mut names = vec!["localhost", "127.0.0.1"];
            for h in hosts {
                if !names.contains(h) {
                    names.push(h);
                }
            }
            let (_, cert_pem, key_pem) = Self::self_signed(&names)?;
            flotilla_obs::fsutil::write_atomic_all(&[
                (&key, key_pem.as_bytes(), 0o600),
                (&cert, cert_pem.as_bytes(), 0o644),
            ])?;
        } else {
            Self::load(&cert, &key).with_context(|| {
                format!(
                    "the TLS pair in {} is damaged: remove {} and {} to have a new pair generated \
                     (agents then need the new tls.crt as their --ca)",
                    dir.display(),
                    cert.display(),
                    key.display()
                )
            })?;
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

/// Writes a secret readable by its owner only, atomically (a full disk leaves the old
/// file or none, never an empty one); the error names the path.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    flotilla_obs::fsutil::write_atomic(path, bytes, 0o600)
}

/// Whether `path` is absent or holds only whitespace (what an interrupted write left).
fn blank(path: &Path) -> bool {
    match std::fs::read(path) {
        Ok(b) => b.iter().all(u8::is_ascii_whitespace),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("flotilla-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_half_written_pair_is_regenerated_and_a_damaged_one_refused_with_its_path() {
        let d = fresh("pair");
        let (cert, key) = TlsMaterial::ensure_in(&d, &[]).unwrap();
        let first = std::fs::read(&cert).unwrap();
        TlsMaterial::ensure_in(&d, &[]).unwrap();
        assert_eq!(std::fs::read(&cert).unwrap(), first, "a whole pair is kept");
        // What an older version left on a full disk: the certificate, an empty key.
        std::fs::write(&key, b"").unwrap();
        TlsMaterial::ensure_in(&d, &[]).unwrap();
        assert_ne!(std::fs::read(&cert).unwrap(), first, "a new pair");
        TlsMaterial::load(&cert, &key).unwrap();
        // Both files hold something, but the key is not one: refused, path named.
        std::fs::write(&key, b"not a key\n").unwrap();
        let e = format!("{:#}", TlsMaterial::ensure_in(&d, &[]).unwrap_err());
        assert!(e.contains(&key.display().to_string()) && e.contains("remove"), "{e}");
        assert_eq!(std::fs::read(&key).unwrap(), b"not a key\n", "left as it was");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
