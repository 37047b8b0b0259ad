//! Raw HTTP/1.1 over a plain socket: tests see exactly what the server sent, headers
//! and refusals included, with no client library deciding anything for them.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::Value;

/// Writes `request` to `addr` (`host:port`, or `http://host:port`) and reads until the
/// server closes or 10 s pass.
pub fn exchange(addr: &str, request: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

/// An answer: its status, its head (status line and headers) and its JSON body (`Null`
/// if none).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub json: Value,
}

/// A request with exactly these `headers` (each ending in `\r\n`) besides Host,
/// Connection and Content-Length.
pub fn request(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> Response {
    let head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}");
    let out = exchange(addr, &format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()));
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    Response { status, head: head.to_string(), json: serde_json::from_str(body).unwrap_or(Value::Null) }
}

/// A JSON API call, with the bearer `token` if given: the status and the JSON body.
pub fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, Value) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let r = request(addr, method, path, &format!("Content-Type: application/json\r\n{auth}"), body);
    (r.status, r.json)
}

/// GET `path`, allowing `timeout` for the answer: the whole answer; `None` for any
/// failure, so it can be polled while a server starts or stops.
fn get(addr: &str, path: &str, timeout: Duration) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr.trim_start_matches("http://")).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The body of GET `path` if it answered 200.
pub fn get_text(addr: &str, path: &str) -> Option<String> {
    let out = get(addr, path, Duration::from_secs(5))?;
    out.starts_with("HTTP/1.1 200").then(|| out.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

/// What an echo workload at `addr` says it is (unit, node, role, pid), if it answers.
pub fn who(addr: &str) -> Option<Value> {
    serde_json::from_str(get(addr, "/who", Duration::from_secs(2))?.split("\r\n\r\n").nth(1)?).ok()
}

/// The Prometheus page at `addr` (empty if it did not answer).
pub fn metrics_page(addr: &str) -> String {
    get_text(addr, "/metrics").unwrap_or_default()
}

/// The value of the first sample of `name` (the whole name) whose labels contain `label`,
/// in a Prometheus page.
pub fn metric(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(['{', ' '])) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A server on loopback that answers its first `n` connections with `200` and `json`
/// (each closed after the answer), then stops listening: a standalone scheduler that
/// passes the control plane's registration check and is gone afterwards.
pub fn answer_then_vanish(json: &str, n: usize) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    );
    std::thread::spawn(move || {
        for _ in 0..n {
            let Ok((mut s, _)) = listener.accept() else { return };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => head.extend_from_slice(&buf[..k]),
                }
            }
            let _ = s.write_all(answer.as_bytes());
        }
    });
    format!("http://{addr}")
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn a_metric_is_found_by_its_whole_name_and_a_label() {
        let page = "# TYPE x_total counter\nx_total_other 9\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3.5\ny 1\n";
        assert_eq!(metric(page, "x_total", "a=\"2\""), Some(3.5));
        assert_eq!(metric(page, "x_total", ""), Some(2.0));
        assert_eq!(metric(page, "y", ""), Some(1.0));
        assert_eq!(metric(page, "x", ""), None);
    }
}
