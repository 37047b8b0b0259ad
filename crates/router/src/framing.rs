//! HTTP/1.1 message framing for the proxy's fast path (`forward.rs`), pure: whether a
//! request can be forwarded as bytes and how long it is, where a response's head ends and
//! how its body ends (length, chunks, end of stream, none). Nothing here allocates per
//! message; the heads are parsed with `httparse` into a stack array of headers.

/// Longest request or response head the fast path reads (hyper's default limit is larger;
/// a bigger request goes there, a bigger response is a 502).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Largest request body the fast path buffers whole (so it can resend it on a fresh
/// connection when a pooled one turns out closed).
pub(crate) const MAX_BODY: usize = 64 * 1024;
const MAX_HEADERS: usize = 64;

/// What the fast path makes of the bytes a client sent so far.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
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

pub(crate) fn parse_request(buf: &[u8]) -> Request {
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
pub(crate) fn decimal(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// How a response's body ends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Body {
    Length(u64),
    Chunked(Chunked),
    /// At the backend's end of stream (no length, not chunked).
    UntilClose,
}

impl Body {
    /// How many leading bytes of `bytes` belong to the body, and whether it ends with them.
    pub(crate) fn take(&mut self, bytes: &[u8]) -> Result<(usize, bool), &'static str> {
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
pub(crate) struct Response {
    /// Bytes of the buffer up to the end of the final head (1xx heads before it included).
    pub(crate) head_end: usize,
    pub(crate) status: u16,
    pub(crate) body: Body,
    /// The backend keeps the connection open after this response.
    pub(crate) keep_alive: bool,
}

/// Parses the response heads at the start of `buf`: 1xx interim heads are skipped over (and
/// forwarded with the final one), the final head decides the framing. `Ok(None)`: read more.
pub(crate) fn parse_response(buf: &[u8], head_request: bool) -> Result<Option<Response>, String> {
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
pub(crate) struct Chunked {
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
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, &'static str> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
