//! How a process opens its gRPC channels to shards: over the network, or over another
//! transport (the deterministic simulation runs the real clients over simulated TCP).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

/// A byte stream a transport hands out.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

pub type BoxIo = Box<dyn Io>;
type Connecting = Pin<Box<dyn Future<Output = std::io::Result<BoxIo>> + Send>>;
/// Opens a stream to `host:port`.
pub type Transport = Arc<dyn Fn(String) -> Connecting + Send + Sync>;

/// A channel whose every call carries the dialer's bearer token (if it has one).
pub type GrpcChannel = InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer <token>` to every request: the token at the time of the
/// request, so a reload ([`Dialer::set_token`]) reaches channels already open.
#[derive(Clone, Default)]
pub struct Bearer(Arc<ArcSwapOption<MetadataValue<Ascii>>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &*self.0.load() {
            request.metadata_mut().insert("authorization", MetadataValue::clone(v));
        }
        Ok(request)
    }
}

#[derive(Clone, Default)]
pub struct Dialer {
    transport: Option<Transport>,
    bearer: Bearer,
    /// PEM of the CA that signs the shards' gRPC certificates: channels use TLS.
    ca_pem: Option<Arc<Vec<u8>>>,
    /// The runtime the channels' connections run on (the caller's when `None`); see
    /// [`Dialer::on_io_thread`].
    io: Option<tokio::runtime::Handle>,
}

/// Spawns a channel's connection and buffer tasks on a given runtime.
#[derive(Clone)]
struct OnRuntime(tokio::runtime::Handle);

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for OnRuntime {
    fn execute(&self, fut: F) {
        self.0.spawn(fut);
    }
}

/// The process's I/O thread: a current-thread runtime that only runs channel connections.
fn io_thread() -> Option<tokio::runtime::Handle> {
    static IO: std::sync::OnceLock<Option<tokio::runtime::Handle>> = std::sync::OnceLock::new();
    IO.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("flotilla-io".into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))
            .ok()?;
        Some(handle)
    })
    .clone()
}

#[derive(Debug, thiserror::Error)]
#[error("a bearer token must be printable ASCII")]
pub struct BadToken;

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.transport.is_some() { "Dialer(custom transport)" } else { "Dialer(network)" })
    }
}

/// `http://host:port` for a bare `host:port`; URLs pass through.
pub fn endpoint_url(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

impl Dialer {
    /// Channels over the network (TCP).
    pub fn network() -> Self {
        Dialer::default()
    }

    /// Channels over `transport`.
    pub fn with_transport(transport: Transport) -> Self {
        Dialer { transport: Some(transport), ..Dialer::default() }
    }

    /// Every call carries `authorization: Bearer <token>`. Dialers cloned before this
    /// keep their own token.
    pub fn with_token(mut self, token: &str) -> Result<Self, BadToken> {
        self.bearer = Bearer::default();
        self.set_token(token)?;
        Ok(self)
    }

    /// Replaces the token of this dialer, of its clones made since [`Dialer::with_token`],
    /// and of every channel they opened: the next call carries the new one.
    pub fn set_token(&self, token: &str) -> Result<(), BadToken> {
        let value: MetadataValue<Ascii> = format!("Bearer {token}").parse().map_err(|_| BadToken)?;
        self.bearer.0.store(Some(Arc::new(value)));
        Ok(())
    }

    /// Channels speak TLS (`https://` for bare `host:port` addresses), trusting `ca_pem`.
    pub fn with_ca(mut self, ca_pem: Vec<u8>) -> Self {
        self.ca_pem = Some(Arc::new(ca_pem));
        self
    }

    /// Channels run their connections (HTTP/2 framing, reads and writes) on the process's
    /// I/O thread instead of the caller's runtime.
    ///
    /// Why: in a scheduler process the app schedulers' passes keep every worker of the
    /// runtime busy for milliseconds at a time, and a connection task queued behind them
    /// delivers a shard's answer that much later. With sixteen apps in one process that
    /// queueing was most of a commit's median time (about 50 ms, against 11–17 ms on
    /// the I/O thread; BENCHMARKS.md). Falls back to the caller's runtime if the thread cannot
    /// start.
    pub fn on_io_thread(mut self) -> Self {
        self.io = io_thread();
        self
    }

    /// Connects to `addr` (`host:port` or a URL). `timeout` bounds every call on the
    /// channel when given.
    pub async fn connect(&self, addr: &str, timeout: Option<Duration>) -> Result<GrpcChannel, tonic::transport::Error> {
        let channel = match self.io.clone() {
            // Connected there too: a socket belongs to the runtime it was opened on.
            Some(io) => {
                let (dialer, owned) = (self.clone(), addr.to_string());
                match io.spawn(async move { dialer.channel(&owned, timeout).await }).await {
                    Ok(r) => r?,
                    // The connect panicked there: connect here, with the connection here.
                    Err(_) => Dialer { io: None, ..self.clone() }.channel(addr, timeout).await?,
                }
            }
            None => self.channel(addr, timeout).await?,
        };
        Ok(InterceptedService::new(channel, self.bearer.clone()))
    }

    async fn channel(&self, addr: &str, timeout: Option<Duration>) -> Result<Channel, tonic::transport::Error> {
        let url = match &self.ca_pem {
            Some(_) if !addr.contains("://") => format!("https://{addr}"),
            _ => endpoint_url(addr),
        };
        // HTTP/2 pings find a connection that a partition left silent (no reset ever
        // comes), so calls fail fast and the channel reconnects.
        let mut endpoint = Endpoint::from_shared(url)?
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        if let Some(t) = timeout {
            endpoint = endpoint.timeout(t);
        }
        if let Some(io) = &self.io {
            endpoint = endpoint.executor(OnRuntime(io.clone()));
        }
        if let Some(ca) = &self.ca_pem {
            let tls = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca.as_slice()));
            endpoint = endpoint.tls_config(tls)?;
        }
        let Some(transport) = self.transport.clone() else { return endpoint.connect().await };
        let connector = tower::service_fn(move |uri: Uri| {
            let transport = transport.clone();
            async move {
                let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
                transport(authority).await.map(TokioIo::new)
            }
        });
        endpoint.connect_with_connector(connector).await
    }
}
