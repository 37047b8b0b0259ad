//! The proxy's fast path for plain HTTP/1.1 keep-alive traffic. A request whose head and
//! body fit in the connection's buffer goes to a pooled backend connection byte for byte as
//! the client sent it, and the answer's bytes go back as the backend sent them: only the
//! heads are parsed, to frame the messages. A request then costs two reads and two writes
//! and no allocation, where hyper's server and client rebuild each message twice (the
//! profile in BENCHMARKS.md, issue #19 item 3: malloc and memmove were a third of the
//! proxy's user-space CPU).
//!
//! Anything else (a chunked or large upload, a `Connection`, `Upgrade` or `Expect` header,
//! an absolute-form target, HTTP/1.0, a head that does not parse) hands the connection,
//! with the bytes already read, to the general hyper path for the rest of its life.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use flotilla_core::LockExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::balancer::{Balancer, Outcome};
use crate::catalogue::{self as m, Labels};
use crate::clients::{Admitted, ClientLimits};
use crate::framing::{Body, Request, Response, parse_request, parse_response};

/// A pooled backend connection idle this long is closed rather than reused: backends
/// close theirs after a while, and a request sent into a closing one fails.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_IDLE_PER_ENDPOINT: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 16 * 1024;

/// Idle backend connections of one proxy thread, newest last, by endpoint address.
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<String, VecDeque<(TcpStream, Instant)>>>,
}

impl Pool {
    /// A pooled connection to `addr`. With `verify`, one that the backend closed meanwhile
    /// (it reads as end of stream) is skipped: a request that is not idempotent cannot be
    /// resent after finding that out the hard way.
    fn take(&self, addr: &str, verify: bool) -> Option<TcpStream> {
        let mut idle = self.idle.lock_or_recover();
        let conns = idle.get_mut(addr)?;
        while let Some((conn, since)) = conns.pop_back() {
            if since.elapsed() >= IDLE_TIMEOUT {
                continue;
            }
            if verify && !matches!(conn.try_read(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                continue;
            }
            return Some(conn);
        }
        None
    }

    fn put(&self, addr: &str, conn: TcpStream, balancer: &Balancer) {
        let mut idle = self.idle.lock_or_recover();
        let now = Instant::now();
        if let Some(conns) = idle.get_mut(addr) {
            while conns.front().is_some_and(|(_, since)| now.duration_since(*since) >= IDLE_TIMEOUT) {
                conns.pop_front();
            }
            if conns.len() < MAX_IDLE_PER_ENDPOINT {
                conns.push_back((conn, now));
            }
            return;
        }
        if idle.len() > 2 * balancer.endpoints().len() + 16 {
            // Forget the connections of endpoints that left the table.
            let live = balancer.endpoints();
            idle.retain(|a, _| live.iter().any(|e| &e.addr == a));
        }
        idle.insert(addr.to_string(), VecDeque::from([(conn, now)]));
    }
}

/// Whether the client connection stays open after a request.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    KeepAlive,
    Close,
}

/// One proxy thread's fast path: the balancer, its metrics and its backend connections.
pub(crate) struct Forwarder {
    balancer: Arc<Balancer>,
    timeout: Duration,
    labels: Arc<Labels>,
    limits: ClientLimits,
    pool: Pool,
}

/// A client connection for the general path: the bytes the fast path already read, then
/// the socket.
pub(crate) struct Handover {
    prefix: Bytes,
    stream: TcpStream,
}

impl Forwarder {
    pub(crate) fn new(balancer: Arc<Balancer>, timeout: Duration, labels: Arc<Labels>, limits: ClientLimits) -> Self {
        Forwarder { balancer, timeout, labels, limits, pool: Pool::default() }
    }

    /// Serves `client` until it closes, or until a request the fast path does not take:
    /// then returns the connection and why, for the general path. A request must arrive
    /// whole within the header timeout of its first byte, the next one within the idle
    /// timeout; and the connection closes when `admitted` is evicted.
    pub(crate) async fn serve(&self, mut client: TcpStream, admitted: &Admitted) -> Option<(Handover, &'static str)> {
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let mut answer = BytesMut::with_capacity(READ_CHUNK);
        // When the request being read sent its first byte.
        let mut begun: Option<Instant> = None;
        // One timer for the connection's life, moved to each read's deadline.
        let timer = tokio::time::sleep(self.limits.idle_timeout);
        tokio::pin!(timer);
        loop {
            let (len, idempotent, head) = match parse_request(&buf) {
                Request::Forward { len, idempotent, head } if buf.len() >= len => (len, idempotent, head),
                Request::General(reason) => return Some((Handover { prefix: buf.freeze(), stream: client }, reason)),
                Request::Partial | Request::Forward { .. } => {
                    let deadline = match begun {
                        Some(t) => t + self.limits.header_timeout,
                        None => Instant::now() + self.limits.idle_timeout,
                    };
                    buf.reserve(READ_CHUNK);
                    timer.as_mut().reset(deadline.into());
                    tokio::select! {
                        read = client.read_buf(&mut buf) => match read {
                            Ok(0) | Err(_) => return None,
                            Ok(_) => {
                                begun.get_or_insert_with(Instant::now);
                                continue;
                            }
                        },
                        () = &mut timer => {
                            if begun.is_some() {
                                closed("header_timeout");
                                let bye = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
                                let _ = tokio::time::timeout(Duration::from_secs(1), client.write_all(bye)).await;
                            } else {
                                closed("idle_timeout");
                            }
                            return None;
                        }
                        () = admitted.evicted() => {
                            closed("evicted");
                            return None;
                        }
                    }
                }
            };
            admitted.set_idle(false);
            let flow = self.forward(&mut client, &buf[..len], idempotent, head, &mut answer).await;
            buf.advance(len);
            admitted.set_idle(true);
            // Bytes left are the next request's (pipelined): its clock runs already.
            begun = (!buf.is_empty()).then(Instant::now);
            if flow == Flow::Close {
                return None;
            }
        }
    }

    /// Sends one request to the endpoint the balancer picks and relays its answer.
    async fn forward(
        &self,
        client: &mut TcpStream,
        req: &[u8],
        idempotent: bool,
        head: bool,
        answer: &mut BytesMut,
    ) -> Flow {
        let Some(pick) = self.balancer.pick(Instant::now(), &mut rand::rng()) else {
            metrics::counter!(m::UNROUTABLE.name).increment(1);
            return error_answer(client, "503 Service Unavailable", "no endpoint can take the request", head).await;
        };
        let endpoint = pick.endpoint.clone();
        let started = Instant::now();
        let exchanged =
            tokio::time::timeout(self.timeout, self.exchange(&endpoint.addr, req, idempotent, head, answer)).await;
        let exchanged =
            exchanged.unwrap_or_else(|_| Err(format!("{} did not answer within {:?}", endpoint.addr, self.timeout)));
        let outcome = match &exchanged {
            Ok((_, r)) if r.status < 500 => Outcome::Success,
            _ => Outcome::Failure,
        };
        let probe = pick.probe;
        let finished = self.balancer.finish(pick, outcome, Instant::now());
        self.labels.count(&endpoint.addr, outcome, started.elapsed().as_secs_f64(), probe, finished.ejected_for);
        let (mut upstream, mut response) = match exchanged {
            Ok(x) => x,
            Err(e) => return error_answer(client, "502 Bad Gateway", &format!("upstream: {e}"), head).await,
        };
        match relay(&mut upstream, client, answer, &mut response, self.limits.write_timeout).await {
            Ok(clean) => {
                if clean && response.keep_alive {
                    self.pool.put(&endpoint.addr, upstream, &self.balancer);
                }
                if response.keep_alive { Flow::KeepAlive } else { Flow::Close }
            }
            Err(e) => {
                tracing::debug!(endpoint = %endpoint.addr, error = %e, "relaying a response failed");
                Flow::Close
            }
        }
    }

    /// Writes `req` to a backend connection and reads the answer's head into `answer`. A
    /// pooled connection the backend closed before answering is replaced once, when the
    /// request may be sent again.
    async fn exchange(
        &self,
        addr: &str,
        req: &[u8],
        idempotent: bool,
        head: bool,
        answer: &mut BytesMut,
    ) -> Result<(TcpStream, Response), String> {
        let mut pooled = self.pool.take(addr, !idempotent);
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => connect(addr).await?,
            };
            answer.clear();
            let sent = conn.write_all(req).await;
            let result = match &sent {
                Ok(()) => read_response_head(&mut conn, answer, head).await,
                Err(e) => Err(format!("sending to {addr}: {e}")),
            };
            match result {
                Ok(r) => return Ok((conn, r)),
                // Nothing came back on a connection that sat in the pool: the backend
                // closed it. Safe to send again when no byte of an answer arrived and the
                // request is idempotent, or it never left.
                Err(_) if reused && answer.is_empty() && (idempotent || sent.is_err()) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

async fn connect(addr: &str) -> Result<TcpStream, String> {
    let conn = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(format!("connecting to {addr}: {e}")),
        Err(_) => return Err(format!("connecting to {addr}: no answer within {CONNECT_TIMEOUT:?}")),
    };
    let _ = conn.set_nodelay(true);
    Ok(conn)
}

async fn read_response_head(conn: &mut TcpStream, answer: &mut BytesMut, head: bool) -> Result<Response, String> {
    loop {
        answer.reserve(READ_CHUNK);
        match conn.read_buf(answer).await {
            Ok(0) => return Err("the backend closed the connection before answering".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
        if let Some(r) = parse_response(answer, head)? {
            return Ok(r);
        }
    }
}

/// Writes the response in `answer` (its head and the body's first bytes) to the client and
/// relays the rest of the body. `Ok(true)`: the backend sent exactly this response, so its
/// connection may serve another.
async fn relay(
    upstream: &mut TcpStream,
    client: &mut TcpStream,
    answer: &mut BytesMut,
    r: &mut Response,
    write_timeout: Duration,
) -> io::Result<bool> {
    let bad = |e: &'static str| io::Error::new(io::ErrorKind::InvalidData, e);
    let (k, mut done) = r.body.take(&answer[r.head_end..]).map_err(bad)?;
    let mut clean = r.head_end + k == answer.len();
    write_within(client, &answer[..r.head_end + k], write_timeout).await?;
    while !done {
        answer.clear();
        answer.reserve(READ_CHUNK);
        if upstream.read_buf(answer).await? == 0 {
            return match r.body {
                Body::UntilClose => Ok(false),
                _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the backend closed the connection mid-body")),
            };
        }
        let (k, d) = r.body.take(answer).map_err(bad)?;
        (done, clean) = (d, k == answer.len());
        write_within(client, &answer[..k], write_timeout).await?;
    }
    Ok(clean)
}

/// Writes `bytes` to the client, which must take them within `limit` (an answer's
/// pieces are at most [`READ_CHUNK`] past its head, so a client reading at all keeps up).
async fn write_within(client: &mut TcpStream, bytes: &[u8], limit: Duration) -> io::Result<()> {
    match tokio::time::timeout(limit, client.write_all(bytes)).await {
        Ok(r) => r,
        Err(_) => {
            closed("write_stalled");
            Err(io::Error::new(io::ErrorKind::TimedOut, "the client read nothing of the answer"))
        }
    }
}

/// Counts a client connection the proxy closed itself.
pub(crate) fn closed(reason: &'static str) {
    metrics::counter!(m::CLIENTS_CLOSED.name, "reason" => reason).increment(1);
}

/// Answers a request the proxy could not forward, in plain text.
async fn error_answer(client: &mut TcpStream, status: &str, msg: &str, head: bool) -> Flow {
    let body = format!("{msg}\n");
    let mut text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    if !head {
        text += &body;
    }
    match client.write_all(text.as_bytes()).await {
        Ok(()) => Flow::KeepAlive,
        Err(_) => Flow::Close,
    }
}

impl AsyncRead for Handover {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Handover {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing::{MAX_BODY, decimal};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    /// A backend speaking raw HTTP/1.1 with answers scripted by path, counting the
    /// connections it accepted.
    async fn backend() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = Arc::new(AtomicUsize::new(0));
        let accepted = conns.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = BytesMut::new();
                    loop {
                        let (path, method, head_len, body_len) = loop {
                            let mut h = [httparse::EMPTY_HEADER; 32];
                            let mut req = httparse::Request::new(&mut h);
                            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                                let len = req.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length"));
                                let len = len.and_then(|h| decimal(h.value)).unwrap_or(0) as usize;
                                break (req.path.unwrap().to_string(), req.method.unwrap().to_string(), n, len);
                            }
                            if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                                return;
                            }
                        };
                        while buf.len() < head_len + body_len {
                            if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                                return;
                            }
                        }
                        let body = buf.split_to(head_len + body_len).split_off(head_len);
                        let answer = |parts: &[&[u8]]| parts.concat();
                        let out = match path.as_str() {
                            "/echo" => {
                                answer(&[format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes(), &body])
                            }
                            "/chunked" => {
                                for part in [&b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r"[..], b"\nhello\r\n6\r\n wor", b"ld\r\n0\r\n\r\n"] {
                                    s.write_all(part).await.unwrap();
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                                continue;
                            }
                            "/early" => answer(&[b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly"]),
                            "/head" if method == "HEAD" => answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"]),
                            "/fail" => answer(&[b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nfail"]),
                            "/close" => {
                                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end").await;
                                return;
                            }
                            "/hang-up" => {
                                // Answers, then closes the connection as an idle timeout would.
                                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                                return;
                            }
                            _ => answer(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]),
                        };
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, conns)
    }

    async fn proxy(endpoints: &[std::net::SocketAddr]) -> (std::net::SocketAddr, Arc<Balancer>) {
        let balancer = Arc::new(Balancer::new(crate::Config::default()));
        let routes: Vec<(String, f64)> = endpoints.iter().map(|a| (a.to_string(), 1.0)).collect();
        balancer.update(&routes, Instant::now());
        let listener = crate::proxy::listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let clients = crate::clients::Clients::new(ClientLimits::default());
        tokio::spawn(crate::proxy::serve(
            listener,
            balancer.clone(),
            Duration::from_secs(5),
            Labels::new("test"),
            clients,
        ));
        (addr, balancer)
    }

    /// A client on one connection that reads whole responses.
    struct Client {
        stream: TcpStream,
        buf: BytesMut,
    }

    impl Client {
        async fn connect(addr: std::net::SocketAddr) -> Client {
            Client { stream: TcpStream::connect(addr).await.unwrap(), buf: BytesMut::new() }
        }

        async fn send(&mut self, bytes: &[u8]) {
            self.stream.write_all(bytes).await.unwrap();
        }

        /// The next response: its status and its raw body.
        async fn response(&mut self, head: bool) -> (u16, Vec<u8>) {
            let mut r = loop {
                if let Some(r) = parse_response(&self.buf, head).unwrap() {
                    break r;
                }
                assert!(self.stream.read_buf(&mut self.buf).await.unwrap() > 0, "the proxy closed mid-head");
            };
            self.buf.advance(r.head_end);
            let mut body = Vec::new();
            loop {
                let (k, done) = r.body.take(&self.buf).unwrap();
                body.extend_from_slice(&self.buf.split_to(k));
                if done {
                    return (r.status, body);
                }
                if self.stream.read_buf(&mut self.buf).await.unwrap() == 0 {
                    assert_eq!(r.body, Body::UntilClose, "the proxy closed mid-body");
                    return (r.status, body);
                }
            }
        }

        async fn request(&mut self, req: &str) -> (u16, String) {
            self.send(req.as_bytes()).await;
            let (status, body) = self.response(req.starts_with("HEAD")).await;
            (status, String::from_utf8(body).unwrap())
        }

        async fn closed(&mut self) -> bool {
            matches!(self.stream.read_buf(&mut self.buf).await, Ok(0) | Err(_))
        }
    }

    #[tokio::test]
    async fn keep_alive_requests_share_a_backend_connection_and_arrive_intact() {
        let (backend, conns) = backend().await;
        let (addr, balancer) = proxy(&[backend]).await;
        let mut c = Client::connect(addr).await;
        assert_eq!(c.request("GET / HTTP/1.1\r\nhost: a\r\n\r\n").await, (200, "ok".into()));
        let payload = "x".repeat(20_000);
        let post = format!("POST /echo HTTP/1.1\r\ncontent-length: {}\r\n\r\n{payload}", payload.len());
        // Sent in two writes, split inside the body.
        c.send(&post.as_bytes()[..post.len() / 2]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.send(&post.as_bytes()[post.len() / 2..]).await;
        let (status, body) = c.response(false).await;
        assert_eq!((status, body.len()), (200, payload.len()));
        assert_eq!(c.request("HEAD /head HTTP/1.1\r\n\r\n").await, (200, String::new()));
        assert_eq!(
            c.request("GET /chunked HTTP/1.1\r\n\r\n").await,
            (200, "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".into())
        );
        assert_eq!(c.request("GET /early HTTP/1.1\r\n\r\n").await, (200, "early".into()));
        assert_eq!(c.request("GET /fail HTTP/1.1\r\n\r\n").await, (500, "fail".into()));
        // Two requests in one write: both answered, in order.
        c.send(b"POST /echo HTTP/1.1\r\ncontent-length: 3\r\n\r\noneGET / HTTP/1.1\r\n\r\n").await;
        assert_eq!(c.response(false).await, (200, b"one".to_vec()));
        assert_eq!(c.response(false).await, (200, b"ok".to_vec()));
        assert_eq!(conns.load(Ordering::SeqCst), 1, "one backend connection served every request");
        assert!(balancer.endpoints().iter().all(|e| e.in_flight() == 0), "every call finished");
    }

    #[tokio::test]
    async fn a_backend_connection_closed_while_pooled_is_replaced() {
        let (backend, conns) = backend().await;
        let (addr, _) = proxy(&[backend]).await;
        let mut c = Client::connect(addr).await;
        for (i, req) in
            ["GET / HTTP/1.1\r\n\r\n", "POST /echo HTTP/1.1\r\ncontent-length: 2\r\n\r\nok"].iter().enumerate()
        {
            assert_eq!(c.request("GET /hang-up HTTP/1.1\r\n\r\n").await, (200, "ok".into()));
            if i == 1 {
                // Let the backend's FIN arrive: a POST checks the connection before it is sent.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(c.request(req).await, (200, "ok".into()), "{req}");
        }
        assert_eq!(conns.load(Ordering::SeqCst), 3, "each hang-up costs one new connection");
        // A response that ends at the backend's close ends the client's connection too.
        assert_eq!(c.request("GET /close HTTP/1.1\r\n\r\n").await, (200, "until the end".into()));
        assert!(c.closed().await);
    }

    #[tokio::test]
    async fn requests_the_fast_path_does_not_take_go_through_hyper() {
        let (backend, _) = backend().await;
        let (addr, _) = proxy(&[backend]).await;
        let mut c = Client::connect(addr).await;
        assert_eq!(c.request("GET / HTTP/1.1\r\n\r\n").await, (200, "ok".into()));
        // Too large to buffer: hyper streams it, on the same client connection.
        let payload = "y".repeat(MAX_BODY + 1);
        let (status, body) = c
            .request(&format!("POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: {}\r\n\r\n{payload}", payload.len()))
            .await;
        assert_eq!((status, body.len()), (200, payload.len()));
        assert_eq!(c.request("GET /early HTTP/1.1\r\nhost: a\r\n\r\n").await, (200, "early".into()));
        let mut c = Client::connect(addr).await;
        assert_eq!(c.request("GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").await, (200, "ok".into()));
        assert!(c.closed().await, "hyper honours connection: close");
        let mut c = Client::connect(addr).await;
        assert_eq!(c.request("GET / HTTP/1.0\r\n\r\n").await, (200, "ok".into()));
    }

    #[tokio::test]
    async fn an_unreachable_backend_is_a_502_and_no_endpoint_a_503() {
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let (addr, balancer) = proxy(&[gone]).await;
        let mut c = Client::connect(addr).await;
        let (status, body) = c.request("GET / HTTP/1.1\r\n\r\n").await;
        assert_eq!(status, 502);
        assert!(body.starts_with(&format!("upstream: connecting to {gone}")), "{body}");
        assert_eq!(c.request("HEAD / HTTP/1.1\r\n\r\n").await.0, 502, "the connection stays open, HEAD without a body");
        balancer.update(&[], Instant::now());
        assert_eq!(c.request("GET / HTTP/1.1\r\n\r\n").await, (503, "no endpoint can take the request\n".into()));
        assert!(balancer.endpoints().is_empty());
    }
}
