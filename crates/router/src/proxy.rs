//! `flotilla route`: an HTTP/1.1 reverse proxy over the balancer. Every request goes to
//! the endpoint the balancer picks; its latency and outcome feed the balancer back. Plain
//! keep-alive requests are forwarded as bytes (`forward.rs`); the rest go through hyper.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flotilla_obs::stall::WriteStall;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::balancer::Balancer;
use crate::catalogue::{self as m, Labels};
use crate::clients::{ClientLimits, Clients};
use crate::forward::Forwarder;
use crate::service::{Balance, BoxError, HttpClassify, NoEndpoint};

type Body = BoxBody<Bytes, hyper::Error>;

/// Longest a request may take before it counts as a failure of its endpoint.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The balanced service the proxy forwards through: one pooled HTTP client, a request
/// per endpoint with the URI rewritten to it. Each finished call is counted under `labels`.
pub fn balanced_client(
    balancer: Arc<Balancer>,
    timeout: Duration,
    labels: Arc<Labels>,
) -> impl tower::Service<Request<Incoming>, Response = Response<Incoming>, Error = BoxError, Future: Send>
+ Clone
+ Send
+ 'static {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .build(connector);
    let make = move |addr: &str| {
        // Parsed once per endpoint; each request only swaps it into its URI.
        let (client, authority) = (client.clone(), addr.parse::<Authority>().map_err(|e| format!("{addr:?}: {e}")));
        tower::service_fn(move |mut req: Request<Incoming>| {
            let (client, authority) = (client.clone(), authority.clone());
            async move {
                let authority = authority?;
                let mut parts = std::mem::take(req.uri_mut()).into_parts();
                parts.scheme = Some(Scheme::HTTP);
                parts.authority = Some(authority.clone());
                parts.path_and_query.get_or_insert_with(|| PathAndQuery::from_static("/"));
                *req.uri_mut() = Uri::from_parts(parts)?;
                match tokio::time::timeout(timeout, client.request(req)).await {
                    Ok(r) => r.map_err(|e| Box::new(e) as BoxError),
                    Err(_) => Err(format!("{authority} did not answer within {timeout:?}").into()),
                }
            }
        })
    };
    Balance::new(balancer, make, HttpClassify).with_report(move |r| labels.record(r))
}

fn plain(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(msg)).map_err(|never: Infallible| match never {}).boxed());
    *r.status_mut() = status;
    r
}

/// The accept queue the proxy's socket asks for (the kernel caps it at
/// `net.core.somaxconn`, 4096 on current kernels). The default of 128 overflows when a
/// client opens connections in a burst, and every connection dropped from a full queue
/// waits a whole SYN retransmit (1 s) before it is retried: the p99.9 stall HAProxy does
/// not have, since it asks for its `maxconn`.
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listening socket for the proxy, with [`LISTEN_BACKLOG`] and `SO_REUSEPORT`, so each
/// of [`serve_per_core`]'s threads can have its own on the same port.
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves the proxy on `threads` threads, each with a single-threaded runtime, its own
/// listener on `listener`'s port (the kernel spreads connections over them) and its own
/// connection pool; they share the balancer. A request then lives on one thread from
/// accept to answer: no work stealing, no cross-thread wake-ups, no pool lock contended
/// between cores, which is how HAProxy and nginx spend less CPU per request than a
/// work-stealing runtime does. Returns when any thread ends (it cannot bind, mostly).
pub async fn serve_per_core(
    listener: TcpListener,
    threads: usize,
    balancer: Arc<Balancer>,
    timeout: Duration,
    labels: Arc<Labels>,
    limits: ClientLimits,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let clients = Clients::new(limits);
    let (done_tx, mut done) = tokio::sync::mpsc::channel::<std::io::Result<()>>(threads.max(1));
    let mut first = Some(listener.into_std()?);
    for i in 0..threads.max(1) {
        let listener = match first.take() {
            Some(l) => l,
            None => listen(addr)?.into_std()?,
        };
        let (balancer, labels, done_tx, clients) = (balancer.clone(), labels.clone(), done_tx.clone(), clients.clone());
        std::thread::Builder::new().name(format!("proxy-{i}")).spawn(move || {
            let served = tokio::runtime::Builder::new_current_thread().enable_all().build().and_then(|rt| {
                rt.block_on(async move {
                    serve(TcpListener::from_std(listener)?, balancer, timeout, labels, clients).await;
                    Ok(())
                })
            });
            let _ = done_tx.blocking_send(served);
        })?;
    }
    // Only the threads hold senders now: should every one of them die without a word
    // (a panic), the channel closes and this returns rather than wait for ever.
    drop(done_tx);
    done.recv().await.unwrap_or(Ok(()))
}

/// Serves the proxy on `listener` until the task is dropped or aborted. Each connection
/// starts on the byte-forwarding fast path (`forward.rs`); one that sends a request it does
/// not take continues on hyper, through the same balancer. `clients` admits (and bounds)
/// the connections of every thread.
pub async fn serve(
    listener: TcpListener,
    balancer: Arc<Balancer>,
    timeout: Duration,
    labels: Arc<Labels>,
    clients: Arc<Clients>,
) {
    let limits = clients.limits();
    let forwarder = Arc::new(Forwarder::new(balancer.clone(), timeout, labels.clone(), limits));
    let svc = balanced_client(balancer, timeout, labels);
    let mut accept_errors = AcceptErrors::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                accept_errors.failed(&e, &clients).await;
                continue;
            }
        };
        // An evicted connection counts itself as it closes.
        let admitted = match clients.admit(peer.ip()) {
            Ok((a, _evicted)) => a,
            Err(refused) => {
                metrics::counter!(m::CLIENTS_REFUSED.name, "reason" => refused.as_str()).increment(1);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (svc, forwarder) = (svc.clone(), forwarder.clone());
        tokio::spawn(async move {
            let Some((stream, reason)) = forwarder.serve(stream, &admitted).await else { return };
            metrics::counter!(m::GENERAL_PATH.name, "reason" => reason).increment(1);
            let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
                let svc = svc.clone();
                async move {
                    let resp = match svc.oneshot(req).await {
                        Ok(r) => r.map(|b| b.boxed()),
                        Err(e) if e.is::<NoEndpoint>() => {
                            metrics::counter!(m::UNROUTABLE.name).increment(1);
                            plain(StatusCode::SERVICE_UNAVAILABLE, "no endpoint can take the request\n".into())
                        }
                        Err(e) => plain(StatusCode::BAD_GATEWAY, format!("upstream: {e}\n")),
                    };
                    Ok::<_, Infallible>(resp)
                }
            });
            // hyper's own header timeout bounds each request head (and the wait for the
            // next one); an eviction drops the connection.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(WriteStall::new(stream, limits.write_timeout, write_stalled)), handler);
            admitted.set_idle(false);
            tokio::select! {
                served = conn => if let Err(e) = served {
                    if e.is_timeout() {
                        crate::forward::closed("header_timeout");
                    }
                    tracing::debug!(error = %e, "proxy connection ended");
                },
                () = admitted.evicted() => crate::forward::closed("evicted"),
            }
        });
    }
}

/// What the accept loop does when an accept fails: out of file descriptors, it closes
/// the idlest client connection and pauses (the kernel's queue holds the newcomers
/// meanwhile) rather than spin; either way one log line per 10 s says how many failed.
#[derive(Default)]
struct AcceptErrors {
    since_log: u64,
    logged: Option<std::time::Instant>,
}

impl AcceptErrors {
    async fn failed(&mut self, e: &std::io::Error, clients: &Clients) {
        let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        metrics::counter!(m::ACCEPT_ERRORS.name, "kind" => if out_of_fds { "fds" } else { "other" }).increment(1);
        self.since_log += 1;
        if self.logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(error = %e, failed = self.since_log, "accepting client connections failed");
            (self.since_log, self.logged) = (0, Some(std::time::Instant::now()));
        }
        if out_of_fds {
            clients.shed_idlest();
        }
        tokio::time::sleep(Duration::from_millis(if out_of_fds { 100 } else { 10 })).await;
    }
}

/// Counts a client cut because it read nothing of an answer for the write timeout.
fn write_stalled() {
    crate::forward::closed("write_stalled");
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;

    /// A backend answering `ok` to everything, on a free port.
    async fn backend() -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn every_thread_of_the_proxy_serves_on_the_one_port() {
        let balancer = Arc::new(Balancer::new(crate::Config::default()));
        balancer.update(&[(backend().await.to_string(), 1.0)], std::time::Instant::now());
        let listener = listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let labels = Labels::new("test");
        tokio::spawn(serve_per_core(
            listener,
            3,
            balancer.clone(),
            Duration::from_secs(5),
            labels,
            ClientLimits::default(),
        ));
        // A fresh connection per request: the kernel spreads them over the threads' listeners.
        let client: Client<HttpConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(HttpConnector::new());
        for i in 0..60 {
            let uri: http::Uri = format!("http://{addr}/r/{i}?q=1").parse().unwrap();
            let resp = client.get(uri).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "request {i}");
            assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
        assert!(balancer.endpoints().iter().all(|e| e.in_flight() == 0), "every call finished");
    }
}
