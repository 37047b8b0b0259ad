//! The agent's side of the QUIC control path. Also used by the loadtest, which
//! registers many simulated nodes over one connection.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
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
    // A shard that went silent (its host cut off, its standby serving now) is noticed
    // within the idle timeout; the agent then registers again, moving on to the next
    // address of the shard if this one does not answer (schedulers wait
    // `REJOIN_GRACE_MS` for that).
    transport.keep_alive_interval(Some(QUIC_KEEP_ALIVE));
    transport.max_idle_timeout(Some(QUIC_IDLE_TIMEOUT.try_into()?));
    config.transport_config(Arc::new(transport));
    let mut endpoint = quinn::Endpoint::client(bind)?;
    endpoint.set_default_client_config(config);
    Ok(endpoint)
}

/// How often an idle connection to the shard is pinged.
pub const QUIC_KEEP_ALIVE: Duration = Duration::from_secs(3);
/// How long a connection may hear nothing from the shard before it is given up.
pub const QUIC_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS name to verify a shard address against.
pub fn server_name(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The QUIC close code with which a shard ends a connection whose credentials it
/// refused (a wrong join token, an unsupported protocol version); the shard's
/// `quic::CLOSE_REJECTED`. Shutting down closes with 0.
pub const CLOSE_REJECTED: u64 = 1;

/// The shard's refusal codes (`ErrorReply.code`) that no retry with the same
/// configuration can overcome.
const FATAL_CODES: &[&str] = &["join_token", "protocol_version"];

/// Why a request to a shard failed. Callers decide on the variant and the shard's
/// stable code, never on the message (which is for people).
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The shard answered with a refusal: `code` is its stable name (`join_token`,
    /// `protocol_version`, `node_id`, `invalid`, `wrong_shard`, `stale_incarnation`,
    /// `malformed`, …).
    #[error("shard refused: {message} ({code})")]
    Refused { code: String, message: String },
    /// The shard closed the connection, with its QUIC application close code.
    #[error("shard closed the connection: {reason}")]
    Closed { close_code: u64, reason: String },
    /// The request or its answer did not get through (handshake, stream, timeout).
    #[error("{0}")]
    Transport(String),
    /// An answer the protocol does not allow.
    #[error("{0}")]
    Protocol(String),
}

impl ShardError {
    /// Whether the shard refused this agent for good (its credentials or protocol), so
    /// retrying cannot help; anything else may succeed later.
    pub fn is_fatal(&self) -> bool {
        match self {
            ShardError::Refused { code, .. } => FATAL_CODES.contains(&code.as_str()),
            ShardError::Closed { close_code, .. } => *close_code == CLOSE_REJECTED,
            ShardError::Transport(_) | ShardError::Protocol(_) => false,
        }
    }
}

/// One QUIC connection to one shard.
#[derive(Clone)]
pub struct ShardConnection {
    pub conn: quinn::Connection,
}

impl ShardConnection {
    pub async fn connect(endpoint: &quinn::Endpoint, addr: SocketAddr, name: &str) -> Result<Self, ShardError> {
        let connecting = endpoint
            .connect(addr, server_name(name))
            .map_err(|e| ShardError::Transport(format!("connecting to {addr}: {e}")))?;
        let conn = tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .map_err(|_| ShardError::Transport(format!("QUIC handshake with {addr} timed out")))?
            .map_err(|e| ShardError::Transport(e.to_string()))?;
        Ok(ShardConnection { conn })
    }

    /// Sends one request on its own stream and waits for the answer.
    pub async fn request(&self, req: v1::AgentRequest) -> Result<v1::agent_response::Response, ShardError> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(|e| self.explain(e))?;
        send.write_all(&req.encode_to_vec()).await.map_err(|e| self.explain(e))?;
        send.finish().map_err(|e| ShardError::Transport(format!("finishing request: {e}")))?;
        let bytes = recv.read_to_end(MAX_CONTROL_MESSAGE).await.map_err(|e| self.explain(e))?;
        let resp = v1::AgentResponse::decode(bytes.as_slice())
            .map_err(|e| ShardError::Protocol(format!("decoding the shard's answer: {e}")))?;
        match resp.response {
            Some(v1::agent_response::Response::Error(e)) => {
                Err(ShardError::Refused { code: e.code, message: e.message })
            }
            Some(r) => Ok(r),
            None => Err(ShardError::Protocol("empty answer from the shard".into())),
        }
    }

    /// Prefers the shard's close (a refused credential) over the stream error it caused.
    fn explain(&self, e: impl std::fmt::Display) -> ShardError {
        match self.conn.close_reason() {
            Some(quinn::ConnectionError::ApplicationClosed(c)) => ShardError::Closed {
                close_code: c.error_code.into_inner(),
                reason: String::from_utf8_lossy(&c.reason).into_owned(),
            },
            _ => ShardError::Transport(e.to_string()),
        }
    }

    pub async fn register(&self, req: v1::RegisterRequest) -> Result<v1::Session, ShardError> {
        match self.request(v1::AgentRequest { request: Some(v1::agent_request::Request::Register(req)) }).await? {
            v1::agent_response::Response::Session(s) => Ok(s),
            other => Err(ShardError::Protocol(format!("unexpected answer to register: {other:?}"))),
        }
    }

    pub async fn drain(&self, node_id: &str, session_id: u64) -> Result<v1::DrainAck, ShardError> {
        let req = v1::DrainRequest { node_id: node_id.to_string(), session_id };
        match self.request(v1::AgentRequest { request: Some(v1::agent_request::Request::Drain(req)) }).await? {
            v1::agent_response::Response::Drain(a) => Ok(a),
            other => Err(ShardError::Protocol(format!("unexpected answer to drain: {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refused_credentials_are_fatal() {
        let refused = |code: &str| ShardError::Refused { code: code.into(), message: "whatever it says".into() };
        assert!(refused("join_token").is_fatal());
        assert!(refused("protocol_version").is_fatal());
        for code in ["node_id", "invalid", "wrong_shard", "stale_incarnation", "malformed"] {
            assert!(!refused(code).is_fatal(), "{code}");
        }
        // The message never decides: a retryable code that mentions a join token stays retryable.
        let wordy = ShardError::Refused { code: "invalid".into(), message: "join token protocol version".into() };
        assert!(!wordy.is_fatal());
        let closed = |close_code| ShardError::Closed { close_code, reason: "join token is not valid".into() };
        assert!(closed(CLOSE_REJECTED).is_fatal());
        assert!(!closed(0).is_fatal(), "a shard shutting down is waited for");
        assert!(!ShardError::Transport("join token".into()).is_fatal());
    }
}
