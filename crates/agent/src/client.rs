//! The agent's side of the QUIC control path. Also used by the loadtest, which
//! registers many simulated nodes over one connection.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use flotilla_proto::{MAX_CONTROL_MESSAGE, v1};
use prost::Message;

/// ALPN for the agent <-> shard protocol (must match the shard's).
pub const ALPN: &[u8] = b"flotilla/1";

/// A QUIC client endpoint that trusts the certificates in a PEM file.
pub fn client_endpoint(ca_pem: &Path, bind: SocketAddr) -> anyhow::Result<quinn::Endpoint> {
    let mut roots = rustls::RootCertStore::empty();
    let file = std::fs::File::open(ca_pem).with_context(|| format!("opening CA file {}", ca_pem.display()))?;
    for cert in rustls_pemfile::certs(&mut std::io::BufReader::new(file)) {
        roots.add(cert.with_context(|| format!("parsing {}", ca_pem.display()))?)?;
    }
    if roots.is_empty() {
        bail!("{} holds no certificate", ca_pem.display());
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut config = quinn::ClientConfig::new(Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(tls)?));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_secs(5)));
    transport.max_idle_timeout(Some(Duration::from_secs(20).try_into()?));
    config.transport_config(Arc::new(transport));
    let mut endpoint = quinn::Endpoint::client(bind)?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// The TLS name to verify a shard address against.
pub fn server_name(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// One QUIC connection to one shard.
#[derive(Clone)]
pub struct ShardConnection {
    pub conn: quinn::Connection,
}

impl ShardConnection {
    pub async fn connect(endpoint: &quinn::Endpoint, addr: SocketAddr, name: &str) -> anyhow::Result<Self> {
        let connecting = endpoint.connect(addr, server_name(name))?;
        let conn = tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .map_err(|_| anyhow!("QUIC handshake with {addr} timed out"))??;
        Ok(ShardConnection { conn })
    }

    /// Sends one request on its own stream and waits for the answer.
    pub async fn request(&self, req: v1::AgentRequest) -> anyhow::Result<v1::agent_response::Response> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(|e| self.explain(e.into()))?;
        send.write_all(&req.encode_to_vec()).await.map_err(|e| self.explain(e.into()))?;
        send.finish().map_err(|e| anyhow!("finishing request: {e}"))?;
        let bytes = recv.read_to_end(MAX_CONTROL_MESSAGE).await.map_err(|e| self.explain(e.into()))?;
        let resp = v1::AgentResponse::decode(bytes.as_slice()).context("decoding the shard's answer")?;
        match resp.response {
            Some(v1::agent_response::Response::Error(e)) => bail!("shard refused: {} ({})", e.message, e.code),
            Some(r) => Ok(r),
            None => bail!("empty answer from the shard"),
        }
    }

    /// Prefers the shard's close reason (a refused credential) over a stream error.
    fn explain(&self, e: anyhow::Error) -> anyhow::Error {
        match self.conn.close_reason() {
            Some(quinn::ConnectionError::ApplicationClosed(c)) => {
                anyhow!("shard closed the connection: {}", String::from_utf8_lossy(&c.reason))
            }
            _ => e,
        }
    }

    pub async fn register(&self, req: v1::RegisterRequest) -> anyhow::Result<v1::Session> {
        match self.request(v1::AgentRequest { request: Some(v1::agent_request::Request::Register(req)) }).await? {
            v1::agent_response::Response::Session(s) => Ok(s),
            other => bail!("unexpected answer to register: {other:?}"),
        }
    }

    pub async fn drain(&self, node_id: &str, session_id: u64) -> anyhow::Result<v1::DrainAck> {
        let req = v1::DrainRequest { node_id: node_id.to_string(), session_id };
        match self.request(v1::AgentRequest { request: Some(v1::agent_request::Request::Drain(req)) }).await? {
            v1::agent_response::Response::Drain(a) => Ok(a),
            other => bail!("unexpected answer to drain: {other:?}"),
        }
    }
}
