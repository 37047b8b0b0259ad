//! The API's listener: plain HTTP, or HTTPS with the user's certificate (ALPN `h2` and
//! `http/1.1`, so gRPC `WatchRoutes` keeps sharing the port). Each connection's peer
//! address goes into its requests for the rate limit ([`crate::limits`]); a peer may hold
//! a bounded number of connections, and an HTTP/2 connection a bounded number of streams.

use flotilla_core::LockExt;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::limits::rejected;
use crate::{ApiError, ControlError};
use flotilla_obs::stall::WriteStall;

/// How the API is served.
#[derive(Clone)]
pub struct HttpOptions {
    /// HTTPS with this configuration; plain HTTP without.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Requests per second one peer may make (bursts of twice that); 0: no limit.
    pub rate_limit: u32,
    /// `Host` names answered beyond addresses and private names.
    pub allowed_hosts: crate::hosts::AllowedHosts,
    /// How long a write may wait for its client to read ([`flotilla_obs::stall`]).
    pub write_stall: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            tls: None,
            rate_limit: 0,
            allowed_hosts: Default::default(),
            write_stall: flotilla_obs::stall::WRITE_STALL,
        }
    }
}

impl HttpOptions {
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
}

/// A TLS server configuration for the API from a certificate chain and its key.
pub fn tls_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the TLS certificate and key do not make a valid pair")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Connections one peer address may hold open at once.
pub const MAX_CONNECTIONS_PER_PEER: u32 = 256;
/// Concurrent streams on one HTTP/2 connection (route watchers hold one each).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 128;
/// Time a client has to finish its TLS handshake, or to send a request's headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head (line and headers) a connection buffers: a client sending
/// headers slowly holds at most this much until the header timeout cuts it. Over it,
/// hyper answers 431 (counted `header_too_large`); targets over the API's own limit
/// ([`crate::limits::MAX_URI_BYTES`]) and under this get its JSON 414.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long open connections may finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Open connections by peer address.
#[derive(Default)]
struct PeerConnections(Mutex<HashMap<IpAddr, u32>>);

/// One admitted connection; gives its place back when dropped.
struct PeerSlot {
    peers: Arc<PeerConnections>,
    ip: IpAddr,
}

impl PeerConnections {
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let mut m = self.0.lock_or_recover();
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot { peers: self.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.peers.0.lock_or_recover();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Counts a connection cut because its client read nothing for the stall time.
fn write_stalled() {
    rejected("write_stalled");
}

/// Serves `app` on `listener` until `shutdown` resolves; then open calls get a short
/// grace (route watchers hold their streams open forever) and the function returns.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    write_stall: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let local = listener.local_addr()?;
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HANDSHAKE_TIMEOUT).max_buf_size(MAX_HEAD_BYTES);
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    let builder = Arc::new(builder);
    let peers = Arc::new(PeerConnections::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, most likely: let connections close.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(slot) = peers.admit(peer.ip()) else {
            rejected("too_many_connections");
            tracing::debug!(%peer, "refused a connection: too many from this peer");
            continue;
        };
        let (app, builder, tls, stop) = (app.clone(), builder.clone(), tls.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let _slot = slot;
            connection(tcp, peer, local, tls, app, &builder, stop, write_stall).await;
        });
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(true);
    if tokio::time::timeout(SHUTDOWN_GRACE, stop_tx.closed()).await.is_err() {
        tracing::info!("closing the connections still open after the shutdown grace");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments, reason = "one connection's whole context, passed once")]
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    builder: &Builder<TokioExecutor>,
    stop: watch::Receiver<bool>,
    write_stall: Duration,
) {
    let _ = tcp.set_nodelay(true);
    let Some(acceptor) = tls else {
        // hyper's header timeout starts once it knows the protocol: a client that sends
        // nothing at all is cut here.
        let mut first = [0u8; 1];
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
            Ok(Ok(1)) => return http(WriteStall::new(tcp, write_stall, write_stalled), peer, app, builder, stop).await,
            Ok(_) => return,
            Err(_) => {
                rejected("header_timeout");
                tracing::debug!(%peer, "no request within the header timeout");
                return;
            }
        }
    };
    // A TLS connection starts with a handshake record (0x16); anything else is most
    // likely plain HTTP sent to the HTTPS port, and gets an answer that says so.
    let mut first = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] != 0x16 => return refuse_plaintext(tcp, local).await,
        Ok(Ok(1)) => {}
        _ => return,
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => http(WriteStall::new(stream, write_stall, write_stalled), peer, app, builder, stop).await,
        Ok(Err(e)) => {
            rejected("tls_handshake");
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
        }
        Err(_) => {
            rejected("tls_handshake");
            tracing::debug!(%peer, "TLS handshake timed out");
        }
    }
}

/// Serves HTTP/1.1 or HTTP/2 (by the connection's preface) until the connection ends,
/// or shuts it down gracefully when told to stop.
async fn http<I>(
    io: I,
    peer: SocketAddr,
    app: Router,
    builder: &Builder<TokioExecutor>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let requests = Arc::new(AtomicU64::new(0));
    let seen = requests.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        seen.fetch_add(1, Ordering::Relaxed);
        req.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(req)
    });
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                if let Some(reason) = refusal(&*e, requests.load(Ordering::Relaxed)) {
                    rejected(reason);
                }
                tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
            }
        }
        _ = stop.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// The refusal a connection's error stands for, if hyper refused the client itself (it
/// answers a malformed request 400, an over-long target 414, over-large headers 431,
/// before any route sees them), or cut it for sending its headers too slowly. A
/// keep-alive connection that served requests and then idled past the header timeout
/// is no refusal.
fn refusal(e: &(dyn std::error::Error + 'static), requests: u64) -> Option<&'static str> {
    let e = e.downcast_ref::<hyper::Error>()?;
    if e.is_timeout() {
        return (requests == 0).then_some("header_timeout");
    }
    if e.is_parse_too_large() {
        // hyper tells an over-long target from over-large headers only in its message.
        return Some(if e.to_string().contains("URI") { "uri_too_long" } else { "header_too_large" });
    }
    e.is_parse().then_some("bad_request")
}

/// Answers a plain HTTP request on the HTTPS port with a JSON error naming the right URL.
async fn refuse_plaintext(mut tcp: TcpStream, local: SocketAddr) {
    rejected("plaintext_on_tls");
    let mut buf = vec![0u8; 16 * 1024];
    // Read the request first: closing with unread data would reset the connection
    // before the client reads the answer.
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.read(&mut buf)).await;
    let refusal = ApiError::from(&ControlError::TlsRequired { url: format!("https://{local}") });
    let body = refusal.body().to_string();
    let status = refusal.status();
    let resp = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    if tcp.write_all(resp.as_bytes()).await.is_ok() && tcp.shutdown().await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
        })
        .await;
    }
}
