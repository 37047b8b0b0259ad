//! Agent-to-agent transfers over QUIC. Every agent listens (unless it sits behind NAT,
//! then it only dials), and either side of an authenticated connection may ask the other
//! for manifests and pieces: a node that can only dial out still serves the peers it
//! dialled.
//!
//! TLS here only encrypts: the certificate is a throwaway, and a peer is believed for
//! its [`Hello`], an HMAC with the cluster's key over this session's TLS exporter. A
//! man in the middle has two sessions with two exporters, so neither side's proof
//! verifies on the other.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use flotilla_core::LockExt;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::sync::Semaphore;

use crate::auth::{PeerKeys, Side};
use crate::catalogue as m;
use crate::digest::Digest;
use crate::throttle::Throttle;
use crate::wire::{ALPN, Hello, MAX_BODY, Request, Status};

/// The QUIC close code for a peer that did not prove it holds the cluster's key.
pub const CLOSE_REFUSED: u32 = 2;
const EXPORTER_LABEL: &[u8] = b"EXPORTER-flotilla-p2p";
/// A peer that says nothing for this long is dropped.
const IDLE: Duration = Duration::from_secs(20);
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// What this node can hand out: its cache and the pieces of what it is fetching.
pub trait Holdings: Send + Sync + 'static {
    fn manifest(&self, d: &Digest) -> Option<Vec<u8>>;
    /// Blocking (a disk read); called off the async threads.
    fn piece(&self, d: &Digest, i: u32) -> Option<Vec<u8>>;
}

pub struct Limits {
    pub upload: Throttle,
    pub download: Throttle,
    /// Pieces sent at once, at most; more requests are answered `Busy`.
    pub uploads: Semaphore,
}

/// This node's end of the swarm: its endpoint and its connections to peers, by node.
pub struct Peers {
    endpoint: quinn::Endpoint,
    node: String,
    keys: Mutex<PeerKeys>,
    /// Each with the id of the key its peer proved it holds.
    conns: Mutex<HashMap<String, (quinn::Connection, [u8; 8])>>,
    holdings: Arc<dyn Holdings>,
    limits: Arc<Limits>,
    /// Where peers reach this node; `None` behind NAT.
    listen: Option<SocketAddr>,
    /// HAVEs from peers: (node, artifact, piece).
    haves: tokio::sync::broadcast::Sender<(String, Digest, u32)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer does not hold it")]
    Missing,
    #[error("peer is busy")]
    Busy,
    #[error("{0}")]
    Transport(String),
}

impl Peers {
    /// Binds `bind` (a listening node) or an ephemeral port that only dials (`listen` false).
    pub fn start(
        node: String,
        keys: PeerKeys,
        bind: SocketAddr,
        listen: bool,
        holdings: Arc<dyn Holdings>,
        limits: Limits,
    ) -> anyhow::Result<Arc<Peers>> {
        let endpoint = if listen {
            quinn::Endpoint::server(server_config()?, bind).with_context(|| format!("binding the peer port {bind}"))?
        } else {
            quinn::Endpoint::client(SocketAddr::new(bind.ip(), 0)).context("binding a port to dial peers from")?
        };
        let mut endpoint = endpoint;
        endpoint.set_default_client_config(client_config()?);
        let addr = endpoint.local_addr()?;
        let peers = Arc::new(Peers {
            endpoint,
            node,
            keys: Mutex::new(keys),
            conns: Mutex::new(HashMap::new()),
            holdings,
            limits: Arc::new(limits),
            listen: listen.then_some(addr),
            haves: tokio::sync::broadcast::channel(1024).0,
        });
        if listen {
            tokio::spawn(peers.clone().accept_loop());
        }
        Ok(peers)
    }

    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen
    }

    /// Takes the keys of the join tokens accepted now, and closes the connections of
    /// peers that proved a key no longer among them: a retired token admits nobody.
    pub fn set_keys(&self, keys: PeerKeys) {
        let mut conns = self.conns.lock_or_recover();
        conns.retain(|node, (conn, key)| {
            let kept = keys.holds(key);
            if !kept {
                tracing::info!(peer = %node, "closing a peer connection made with a retired join token");
                conn.close(CLOSE_REFUSED.into(), b"its join token was retired");
            }
            kept
        });
        *self.keys.lock_or_recover() = keys;
    }

    pub fn keys(&self) -> PeerKeys {
        self.keys.lock_or_recover().clone()
    }

    async fn accept_loop(self: Arc<Self>) {
        while let Some(incoming) = self.endpoint.accept().await {
            let me = self.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                match me.authenticate(&conn, Side::Listener).await {
                    Ok((node, key)) => {
                        me.adopt(node, key, conn);
                    }
                    Err(why) => {
                        tracing::warn!(peer = %conn.remote_address(), %why, "refused a peer");
                        conn.close(CLOSE_REFUSED.into(), b"not a member of this cluster");
                    }
                }
            });
        }
    }

    /// Exchanges hellos: the dialer speaks first, on the connection's first stream.
    /// Returns the peer's node and the id of the key it proved.
    async fn authenticate(&self, conn: &quinn::Connection, side: Side) -> anyhow::Result<(String, [u8; 8])> {
        let mut exporter = [0u8; 32];
        conn.export_keying_material(&mut exporter, EXPORTER_LABEL, b"")
            .map_err(|_| anyhow!("no TLS exporter on this connection"))?;
        let keys = self.keys();
        let mine = keys.hello(side, &exporter, &self.node).ok_or_else(|| anyhow!("this node has no cluster key"))?;
        let theirs_side = match side {
            Side::Dialer => Side::Listener,
            Side::Listener => Side::Dialer,
        };
        let exchange = async {
            let (mut send, mut recv) = match side {
                Side::Dialer => conn.open_bi().await?,
                Side::Listener => conn.accept_bi().await?,
            };
            if side == Side::Dialer {
                send.write_all(&mine.encode()).await?;
                send.finish()?;
            }
            let theirs = recv.read_to_end(Hello::MAX_LEN).await.map_err(|e| anyhow!("reading the hello: {e}"))?;
            let hello = match Hello::decode(&theirs) {
                Ok(h) => h,
                Err(e) => {
                    metrics::counter!(m::PEERS_REFUSED.name, "reason" => "no_hello").increment(1);
                    bail!("a malformed hello: {e}");
                }
            };
            if !keys.verify(theirs_side, &exporter, &hello) {
                metrics::counter!(m::PEERS_REFUSED.name, "reason" => "bad_proof").increment(1);
                bail!("{} did not prove it holds the cluster's key", hello.node);
            }
            if side == Side::Listener {
                send.write_all(&mine.encode()).await?;
                send.finish()?;
            }
            anyhow::Ok((hello.node, hello.key_id))
        };
        tokio::time::timeout(HELLO_WAIT, exchange).await.map_err(|_| anyhow!("no hello within {HELLO_WAIT:?}"))?
    }

    /// HAVEs peers send from now on.
    pub fn haves(&self) -> tokio::sync::broadcast::Receiver<(String, Digest, u32)> {
        self.haves.subscribe()
    }

    /// Tells every connected peer this node now holds piece `i` of `d` (a datagram:
    /// one lost costs only the wait for the tracker's next answer).
    pub fn broadcast_have(&self, d: Digest, i: u32) {
        let frame = bytes::Bytes::copy_from_slice(&Request::Have(d, i).encode());
        for (c, _) in self.conns.lock_or_recover().values() {
            let _ = c.send_datagram(frame.clone());
        }
    }

    /// Keeps an authenticated connection and answers what the peer asks on it; false
    /// (and closed) if the key it proved was retired meanwhile.
    fn adopt(self: &Arc<Self>, node: String, key: [u8; 8], conn: quinn::Connection) -> bool {
        {
            // Checked again under the lock `set_keys` holds (conns, then keys): a key
            // retired while this connection's hello was being checked does not slip in.
            let mut conns = self.conns.lock_or_recover();
            if !self.keys.lock_or_recover().holds(&key) {
                conn.close(CLOSE_REFUSED.into(), b"its join token was retired");
                return false;
            }
            conns.insert(node.clone(), (conn.clone(), key));
        }
        let (c, haves, from) = (conn.clone(), self.haves.clone(), node.clone());
        tokio::spawn(async move {
            while let Ok(frame) = c.read_datagram().await {
                if let Ok(Request::Have(d, i)) = Request::decode(&frame) {
                    let _ = haves.send((from.clone(), d, i));
                }
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok((send, recv)) = conn.accept_bi().await {
                tokio::spawn(serve(me.holdings.clone(), me.limits.clone(), send, recv));
            }
            let mut conns = me.conns.lock_or_recover();
            if conns.get(&node).is_some_and(|(c, _)| c.stable_id() == conn.stable_id()) {
                conns.remove(&node);
            }
        });
        true
    }

    /// A connection to `node`: the one there is (either direction), else dialled at `addr`.
    pub async fn connection(self: &Arc<Self>, node: &str, addr: Option<&str>) -> Result<quinn::Connection, PeerError> {
        if let Some((c, _)) = self.conns.lock_or_recover().get(node).filter(|(c, _)| c.close_reason().is_none()) {
            return Ok(c.clone());
        }
        let addr = addr.ok_or_else(|| PeerError::Transport(format!("{node} takes no connections (NAT)")))?;
        let sa: SocketAddr = tokio::net::lookup_host(addr)
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| PeerError::Transport(format!("{node}'s address {addr} does not resolve")))?;
        let t = |e: String| PeerError::Transport(format!("{node} at {addr}: {e}"));
        let conn = self.endpoint.connect(sa, "peer").map_err(|e| t(e.to_string()))?;
        let conn = tokio::time::timeout(HELLO_WAIT, conn)
            .await
            .map_err(|_| t("no answer".into()))?
            .map_err(|e| t(e.to_string()))?;
        let (who, key) = self.authenticate(&conn, Side::Dialer).await.map_err(|e| t(format!("{e:#}")))?;
        if who != node {
            conn.close(CLOSE_REFUSED.into(), b"wrong node");
            return Err(t(format!("answered as {who}")));
        }
        if !self.adopt(who, key, conn.clone()) {
            return Err(t("its join token was retired".into()));
        }
        Ok(conn)
    }

    /// Asks `conn` for `req`; the answer counts against this node's download limit.
    pub async fn request(&self, conn: &quinn::Connection, req: Request, max: u32) -> Result<Vec<u8>, PeerError> {
        let t = |e: String| PeerError::Transport(e);
        let go = async {
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| t(e.to_string()))?;
            send.write_all(&req.encode()).await.map_err(|e| t(e.to_string()))?;
            let _ = send.finish();
            let mut head = [0u8; Status::LEN];
            recv.read_exact(&mut head).await.map_err(|e| t(e.to_string()))?;
            match Status::decode(&head).map_err(|e| t(e.to_string()))? {
                Status::Missing => Err(PeerError::Missing),
                Status::Busy => Err(PeerError::Busy),
                Status::Ok(n) if n > max => Err(t(format!("an answer of {n} bytes, at most {max} expected"))),
                Status::Ok(n) => {
                    self.limits.download.take(u64::from(n)).await;
                    let mut body = vec![0u8; n as usize];
                    recv.read_exact(&mut body).await.map_err(|e| t(e.to_string()))?;
                    Ok(body)
                }
            }
        };
        tokio::time::timeout(IDLE, go).await.map_err(|_| t(format!("no answer within {IDLE:?}")))?
    }

    pub fn close(&self) {
        self.endpoint.close(0u32.into(), b"bye");
    }
}

/// Answers one request on its stream.
async fn serve(
    holdings: Arc<dyn Holdings>,
    limits: Arc<Limits>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let mut buf = [0u8; Request::LEN];
    let req = match recv.read_exact(&mut buf).await.ok().map(|()| Request::decode(&buf)) {
        Some(Ok(r)) => r,
        _ => {
            metrics::counter!(m::REQUESTS.name, "answer" => "malformed").increment(1);
            let _ = send.reset(1u32.into());
            return;
        }
    };
    let Ok(_slot) = limits.uploads.try_acquire() else {
        metrics::counter!(m::REQUESTS.name, "answer" => "busy").increment(1);
        let _ = send.write_all(&Status::Busy.encode()).await;
        let _ = send.finish();
        return;
    };
    let body = match req {
        Request::Have(..) => None,
        Request::Manifest(d) => holdings.manifest(&d),
        Request::Piece(d, i) => {
            let h = holdings.clone();
            tokio::task::spawn_blocking(move || h.piece(&d, i)).await.ok().flatten()
        }
    };
    let Some(body) = body.filter(|b| b.len() <= MAX_BODY as usize) else {
        metrics::counter!(m::REQUESTS.name, "answer" => "missing").increment(1);
        let _ = send.write_all(&Status::Missing.encode()).await;
        let _ = send.finish();
        return;
    };
    let len = body.len() as u64;
    limits.upload.take(len).await;
    let sent = async {
        send.write_all(&Status::Ok(len as u32).encode()).await?;
        // Handed over whole, not copied into the stream's buffer.
        send.write_chunk(body.into()).await?;
        send.finish()?;
        anyhow::Ok(())
    };
    if sent.await.is_ok() {
        metrics::counter!(m::REQUESTS.name, "answer" => "ok").increment(1);
        metrics::counter!(m::SERVED_BYTES.name).increment(len);
    }
}

fn transport() -> anyhow::Result<Arc<quinn::TransportConfig>> {
    let mut t = quinn::TransportConfig::default();
    // No keep-alive: a connection nobody uses closes after IDLE, so one dialled twice
    // (two tasks at once) or replaced in the map costs nothing for long.
    t.max_idle_timeout(Some(IDLE.try_into()?));
    t.max_concurrent_bidi_streams(64u32.into());
    Ok(Arc::new(t))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config() -> anyhow::Result<quinn::ServerConfig> {
    let ck = rcgen::generate_simple_self_signed(vec!["peer".to_string()])?;
    let key = PrivateKeyDer::try_from(ck.key_pair.serialize_der()).map_err(|e| anyhow!("{e}"))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut config =
        quinn::ServerConfig::with_crypto(Arc::new(quinn::crypto::rustls::QuicServerConfig::try_from(tls)?));
    config.transport_config(transport()?);
    Ok(config)
}

fn client_config() -> anyhow::Result<quinn::ClientConfig> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut config = quinn::ClientConfig::new(Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(tls)?));
    config.transport_config(transport()?);
    Ok(config)
}

/// Takes any certificate but still checks the handshake's signatures: who the peer is
/// comes from its [`Hello`], not from a CA.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
