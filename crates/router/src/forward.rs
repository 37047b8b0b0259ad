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

/// Longest request or response head the fast path reads (hyper's default limit is larger;
/// a bigger request goes there, a bigger response is a 502).
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body the fast path buffers whole (so it can resend it on a fresh
/// connection when a pooled one turns out closed).
const MAX_BODY: usize = 64 * 1024;
const MAX_HEADERS: usize = 64;
/// A pooled backend connection idle this long is closed rather than reused: backends
/// close theirs after a while, and a request sent into a closing one fails.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_IDLE_PER_ENDPOINT: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 16 * 1024;

/// What the fast path makes of the bytes a client sent so far.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    /// The head is not complete yet.
    Partial,
    /// Forward the first `len` bytes (head and body) once they are all buffered.
    Forward {
        len: usize,
        /// The method is idempotent (RFC 9110 §9.2.2): it may be sent again when a pooled
        /// connection turns out closed before any answer.
        idempotent: bool,
        head: bool,
    },
    /// Not for the fast path; the reason labels `flotilla_route_general_path_connections_total`.
    General(&'static str),
}

fn parse_request(buf: &[u8]) -> Request {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Request::General("large_head"),
        Ok(httparse::Status::Partial) => return Request::Partial,
        Err(_) => return Request::General("unparsed"),
    };
    if req.version != Some(1) {
        return Request::General("http_1_0");
    }
    let method = req.method.unwrap_or_default();
    if method == "CONNECT" || !req.path.is_some_and(|p| p.starts_with('/')) {
        return Request::General("target_form");
    }
    let mut body = None;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            match (body, decimal(h.value)) {
                (None, Some(n)) => body = Some(n),
                _ => return Request::General("content_length"),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Request::General("transfer_encoding");
        } else if name.eq_ignore_ascii_case("connection") {
            if !h.value.trim_ascii().eq_ignore_ascii_case(b"keep-alive") {
                return Request::General("connection");
            }
        } else if name.eq_ignore_ascii_case("upgrade") || name.eq_ignore_ascii_case("expect") {
            return Request::General("upgrade_or_expect");
        }
    }
    let body = body.unwrap_or(0);
    if body > MAX_BODY as u64 {
        return Request::General("large_body");
    }
    Request::Forward {
        len: head_len + body as usize,
        idempotent: matches!(method, "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "TRACE"),
        head: method == "HEAD",
    }
}

/// A `Content-Length` value: digits only, no sign, no list.
fn decimal(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// How a response's body ends.
#[derive(Debug, PartialEq, Eq)]
enum Body {
    Length(u64),
    Chunked(Chunked),
    /// At the backend's end of stream (no length, not chunked).
    UntilClose,
}

impl Body {
    /// How many leading bytes of `bytes` belong to the body, and whether it ends with them.
    fn take(&mut self, bytes: &[u8]) -> Result<(usize, bool), &'static str> {
        match self {
            Body::Length(n) => {
                let k = (*n).min(bytes.len() as u64);
                *n -= k;
                Ok((k as usize, *n == 0))
            }
            Body::Chunked(c) => Ok(c.feed(bytes)?.map_or((bytes.len(), false), |end| (end, true))),
            Body::UntilClose => Ok((bytes.len(), false)),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Response {
    /// Bytes of the buffer up to the end of the final head (1xx heads before it included).
    head_end: usize,
    status: u16,
    body: Body,
    /// The backend keeps the connection open after this response.
    keep_alive: bool,
}

/// Parses the response heads at the start of `buf`: 1xx interim heads are skipped over (and
/// forwarded with the final one), the final head decides the framing. `Ok(None)`: read more.
fn parse_response(buf: &[u8], head_request: bool) -> Result<Option<Response>, String> {
    let mut start = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let len = match resp.parse(&buf[start..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(format!("response head over {MAX_HEAD} bytes"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(format!("malformed response head: {e}")),
        };
        let status = resp.code.unwrap_or_default();
        if status == 101 {
            return Err("101 Switching Protocols to a request that asked for no upgrade".into());
        }
        if (100..200).contains(&status) {
            start += len;
            continue;
        }
        let mut keep_alive = resp.version == Some(1);
        let (mut length, mut chunked, mut encoded) = (None, false, false);
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                match (length, decimal(h.value)) {
                    (None, Some(n)) => length = Some(n),
                    (Some(a), Some(b)) if a == b => {}
                    _ => return Err("bad or conflicting content-length in the response".into()),
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                encoded = true;
                chunked = h
                    .value
                    .rsplit(|b| *b == b',')
                    .next()
                    .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if h.name.eq_ignore_ascii_case("connection")
                && h.value.split(|b| *b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
            {
                keep_alive = false;
            }
        }
        let body = if head_request || status == 204 || status == 304 {
            Body::Length(0)
        } else if encoded && chunked {
            Body::Chunked(Chunked::default())
        } else if let (false, Some(n)) = (encoded, length) {
            Body::Length(n)
        } else {
            keep_alive = false;
            Body::UntilClose
        };
        return Ok(Some(Response { head_end: start + len, status, body, keep_alive }));
    }
}

/// Finds where a chunked body ends, fed its bytes as they arrive (RFC 9112 §7.1): the
/// proxy only needs the end, to know when the backend connection is free again.
#[derive(Debug, Default, PartialEq, Eq)]
struct Chunked {
    state: ChunkState,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum ChunkState {
    /// In a chunk-size line, with the size so far and how many digits it had.
    #[default]
    Start,
    Size(u64, u8),
    /// After the size: an extension, up to the line's end.
    Ext(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    /// In the trailer section; `true` at the start of a line (an empty line ends it).
    Trailer(bool),
    TrailerLf(bool),
}

impl Chunked {
    /// `Some(n)`: the body ends after the first `n` bytes of `bytes`.
    fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, &'static str> {
        use ChunkState::*;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            self.state = match self.state {
                Data(n) => {
                    let k = n.min((bytes.len() - i) as u64);
                    i += k as usize;
                    self.state = if n == k { DataCr } else { Data(n - k) };
                    continue;
                }
                Start | Size(..) => {
                    let (n, digits) = if let Size(n, d) = self.state { (n, d) } else { (0, 0) };
                    match (b as char).to_digit(16) {
                        Some(_) if digits >= 15 => return Err("chunk size over 15 hex digits"),
                        Some(d) => Size(n * 16 + u64::from(d), digits + 1),
                        None if digits == 0 => return Err("chunk size line without a size"),
                        None => match b {
                            b';' | b' ' | b'\t' => Ext(n),
                            b'\r' => SizeLf(n),
                            b'\n' => Self::after_size(n),
                            _ => return Err("bad byte in a chunk size"),
                        },
                    }
                }
                Ext(n) => match b {
                    b'\r' => SizeLf(n),
                    b'\n' => Self::after_size(n),
                    _ => Ext(n),
                },
                SizeLf(n) if b == b'\n' => Self::after_size(n),
                DataCr if b == b'\r' => DataLf,
                DataCr | DataLf if b == b'\n' => Start,
                Trailer(line_start) | TrailerLf(line_start) if b == b'\n' => {
                    if line_start {
                        return Ok(Some(i + 1));
                    }
                    Trailer(true)
                }
                Trailer(line_start) if b == b'\r' => TrailerLf(line_start),
                Trailer(_) => Trailer(false),
                SizeLf(_) | DataCr | DataLf | TrailerLf(_) => return Err("a chunk line not ended by CRLF"),
            };
            i += 1;
        }
        Ok(None)
    }

    fn after_size(n: u64) -> ChunkState {
        if n == 0 { ChunkState::Trailer(true) } else { ChunkState::Data(n) }
    }
}

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
    pool: Pool,
}

/// A client connection for the general path: the bytes the fast path already read, then
/// the socket.
pub(crate) struct Handover {
    prefix: Bytes,
    stream: TcpStream,
}

impl Forwarder {
    pub(crate) fn new(balancer: Arc<Balancer>, timeout: Duration, labels: Arc<Labels>) -> Self {
        Forwarder { balancer, timeout, labels, pool: Pool::default() }
    }

    /// Serves `client` until it closes, or until a request the fast path does not take:
    /// then returns the connection and why, for the general path.
    pub(crate) async fn serve(&self, mut client: TcpStream) -> Option<(Handover, &'static str)> {
        let mut buf = BytesMut::with_capacity(8 * 1024);
        let mut answer = BytesMut::with_capacity(READ_CHUNK);
        loop {
            let (len, idempotent, head) = match parse_request(&buf) {
                Request::Forward { len, idempotent, head } if buf.len() >= len => (len, idempotent, head),
                Request::General(reason) => return Some((Handover { prefix: buf.freeze(), stream: client }, reason)),
                Request::Partial | Request::Forward { .. } => {
                    buf.reserve(READ_CHUNK);
                    match client.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => return None,
                        Ok(_) => continue,
                    }
                }
            };
            let flow = self.forward(&mut client, &buf[..len], idempotent, head, &mut answer).await;
            buf.advance(len);
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
        match relay(&mut upstream, client, answer, &mut response).await {
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
) -> io::Result<bool> {
    let bad = |e: &'static str| io::Error::new(io::ErrorKind::InvalidData, e);
    let (k, mut done) = r.body.take(&answer[r.head_end..]).map_err(bad)?;
    let mut clean = r.head_end + k == answer.len();
    client.write_all(&answer[..r.head_end + k]).await?;
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
        client.write_all(&answer[..k]).await?;
    }
    Ok(clean)
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    #[test]
    fn request_heads_are_forwarded_whole_or_handed_to_the_general_path() {
        let get = b"GET /a?b=1 HTTP/1.1\r\nhost: x\r\n\r\n";
        assert_eq!(parse_request(get), Request::Forward { len: get.len(), idempotent: true, head: false });
        assert_eq!(parse_request(&get[..get.len() - 1]), Request::Partial);
        let post = b"POST / HTTP/1.1\r\ncontent-length: 5\r\nconnection: Keep-Alive\r\n\r\nhel";
        assert_eq!(parse_request(post), Request::Forward { len: post.len() + 2, idempotent: false, head: false });
        let head = b"HEAD / HTTP/1.1\r\n\r\n";
        assert_eq!(parse_request(head), Request::Forward { len: head.len(), idempotent: true, head: true });
        for (req, reason) in [
            (&b"GET / HTTP/1.0\r\n\r\n"[..], "http_1_0"),
            (b"GET http://x/ HTTP/1.1\r\n\r\n", "target_form"),
            (b"CONNECT x:1 HTTP/1.1\r\n\r\n", "target_form"),
            (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", "transfer_encoding"),
            (b"GET / HTTP/1.1\r\nconnection: close\r\n\r\n", "connection"),
            (b"GET / HTTP/1.1\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n", "connection"),
            (b"GET / HTTP/1.1\r\nupgrade: h2c\r\n\r\n", "upgrade_or_expect"),
            (b"PUT / HTTP/1.1\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n", "upgrade_or_expect"),
            (b"POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n", "content_length"),
            (b"POST / HTTP/1.1\r\ncontent-length: -3\r\n\r\n", "content_length"),
            (b"POST / HTTP/1.1\r\ncontent-length: 70000\r\n\r\n", "large_body"),
            (b"GET / HTTP/1.1\r\nbad header\r\n\r\n", "unparsed"),
        ] {
            assert_eq!(parse_request(req), Request::General(reason), "{}", String::from_utf8_lossy(req));
        }
        let mut big = b"GET / HTTP/1.1\r\nx: ".to_vec();
        big.resize(MAX_HEAD + 10, b'a');
        assert_eq!(parse_request(&big), Request::General("large_head"));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("h{i}: v\r\n")).collect();
        assert_eq!(parse_request(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()), Request::General("unparsed"));
    }

    #[test]
    fn response_heads_decide_how_the_body_ends() {
        let parse = |s: &str, head| parse_response(s.as_bytes(), head);
        let r = parse("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false).unwrap().unwrap();
        assert_eq!((r.status, r.head_end, r.keep_alive), (200, 38, true));
        assert_eq!(r.body, Body::Length(2));
        assert_eq!(parse("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n", false), Ok(None));
        let r = parse("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", true).unwrap().unwrap();
        assert_eq!(r.body, Body::Length(0), "no body answers a HEAD request");
        for s in ["HTTP/1.1 204 No Content\r\n\r\n", "HTTP/1.1 304 Not Modified\r\ncontent-length: 7\r\n\r\n"] {
            assert_eq!(parse(s, false).unwrap().unwrap().body, Body::Length(0), "{s}");
        }
        let r = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n", false);
        assert_eq!(r.unwrap().unwrap().body, Body::Chunked(Chunked::default()), "chunked wins over a length");
        let r =
            parse("HTTP/1.1 200 OK\r\nconnection: foo, close\r\ncontent-length: 0\r\n\r\n", false).unwrap().unwrap();
        assert!(!r.keep_alive);
        let r = parse("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", false).unwrap().unwrap();
        assert!(!r.keep_alive, "HTTP/1.0 closes");
        let r = parse("HTTP/1.1 200 OK\r\n\r\nto the end", false).unwrap().unwrap();
        assert_eq!((r.body, r.keep_alive), (Body::UntilClose, false));
        let r = parse("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", false).unwrap().unwrap();
        assert_eq!((r.body, r.keep_alive), (Body::UntilClose, false));
        let early = "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let r = parse(early, false).unwrap().unwrap();
        assert_eq!((r.status, r.head_end), (200, early.len() - 2), "an interim head is forwarded with the final one");
        assert_eq!(parse("HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 2", false), Ok(None));
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(parse(bad, false).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_chunked_body_ends_where_it_ends_however_it_is_split() {
        let body = b"5\r\nhello\r\n6;name=value\r\n world\r\nA\n0123456789\n0\r\nTrailer: t\r\n\r\n";
        for split in 0..=body.len() {
            let mut c = Chunked::default();
            let first = c.feed(&body[..split]).unwrap();
            let end = match first {
                Some(end) => end,
                None => split + c.feed(&body[split..]).unwrap().expect("the body ends"),
            };
            assert_eq!(end, body.len(), "split at {split}");
        }
        // Bytes after the end (the next response) are not the body's.
        let mut c = Chunked::default();
        assert_eq!(c.feed(b"0\r\n\r\nHTTP/1.1 200 OK"), Ok(Some(5)));
        for bad in [&b"\r\n"[..], b"x\r\n", b"1\r\nab", b"1\r\na\r\r", b"1234567890abcdef0\r\n", b"0\r\n\rx"] {
            assert!(Chunked::default().feed(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

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
        tokio::spawn(crate::proxy::serve(listener, balancer.clone(), Duration::from_secs(5), Labels::new("test")));
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
