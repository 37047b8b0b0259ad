//! The control API's listener over real sockets on loopback: HTTPS with a user CA
//! (HTTP/1.1 and HTTP/2 by ALPN), plain HTTP sent to it, per-peer rate limits,
//! the body cap, the connection cap and unauthenticated calls, each refusal counted.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_control::{ControlState, HttpOptions, MAX_CONNECTIONS_PER_PEER};
use flotilla_testkit::Pki;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves a control API with no shards and no apps; the API token is `secret`.
async fn start(options: HttpOptions) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    flotilla_obs::metrics_handle();
    let state = Arc::new(ControlState {
        cluster: flotilla_view::ClusterView::new(0),
        shards: vec![],
        api_token: flotilla_core::SharedToken::new(Some("secret".into())),
        tokens: Default::default(),
        journal: Default::default(),
        series: Default::default(),
        apps: Default::default(),
        scheduler_networks: Default::default(),
        http: reqwest::Client::new(),
        dialer: Default::default(),
        policies: Default::default(),
        pools: Default::default(),
        replicas: None,
        artifacts: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(flotilla_control::serve(listener, state, options, async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// A TLS client stream to `addr` that trusts only `ca` and offers `alpn`.
async fn tls_connect(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap()
}

/// One raw HTTP/1.1 exchange on a plain socket from 127.0.0.2 (loopback too, so a
/// peer of its own): the status and what was read before the server closed.
async fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    // The server may answer (and close) before it read everything.
    let _ = s.write_all(request).await;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    let out = String::from_utf8_lossy(&out).to_string();
    (out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0), out)
}

fn metric(text: &str, reason: &str) -> f64 {
    flotilla_testkit::metric(text, "flotilla_http_requests_rejected_total", &format!("reason=\"{reason}\""))
        .unwrap_or(0.0)
}

#[tokio::test]
async fn https_with_a_user_ca_serves_http1_and_h2_and_refuses_plain_http_clearly() {
    let pki = Pki::new();
    let tls = flotilla_control::tls_config(vec![pki.cert_der.clone()], pki.key_der.clone_key()).unwrap();
    let (addr, _stop) = start(HttpOptions { tls: Some(tls), rate_limit: 0, ..Default::default() }).await;

    // HTTP/2, negotiated by ALPN (as gRPC clients do).
    let stream = tls_connect(addr, &pki.ca_der, &[b"h2", b"http/1.1"]).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(format!("https://{addr}/healthz")).body(Empty::<axum::body::Bytes>::new()).unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");

    // HTTP/1.1 over TLS.
    let stream = tls_connect(addr, &pki.ca_der, &[b"http/1.1"]).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/v1/shards").header("host", "x").body(Empty::<axum::body::Bytes>::new()).unwrap();
    let resp = h1.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body, serde_json::json!([]));

    // reqwest (what the CLI uses) with the CA added trusts it; without, it does not.
    let ca = reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap();
    let client = reqwest::Client::builder().add_root_certificate(ca).build().unwrap();
    let r = client.get(format!("https://{addr}/v1/nodes")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let err = reqwest::Client::new().get(format!("https://{addr}/v1/nodes")).send().await.unwrap_err();
    assert!(format!("{:?}", err).contains("UnknownIssuer"), "{err:?}");

    // Plain HTTP to the HTTPS port: an answer that says what to do.
    let (status, out) = raw(addr, b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status, 400, "{out}");
    assert!(out.contains("tls_required") && out.contains(&format!("https://{addr}")), "{out}");

    let text = client.get(format!("https://{addr}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric(&text, "plaintext_on_tls"), 1.0, "{text}");
    assert_eq!(metric(&text, "tls_handshake"), 1.0, "the untrusting client's handshake: {text}");
}

#[tokio::test]
async fn rate_limits_body_caps_and_missing_tokens_are_refused_and_counted() {
    let (addr, _stop) = start(HttpOptions { tls: None, rate_limit: 5, ..Default::default() }).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}");

    // A burst of twice the rate passes, then 429 with a JSON error and Retry-After.
    let mut codes = Vec::new();
    let mut refusal = None;
    for _ in 0..14 {
        let r = client.get(format!("{url}/healthz")).send().await.unwrap();
        codes.push(r.status().as_u16());
        if r.status() == 429 && refusal.is_none() {
            let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            refusal = Some((retry, r.json::<Value>().await.unwrap()));
        }
    }
    let ok = codes.iter().filter(|c| **c == 200).count();
    assert!((10..=11).contains(&ok), "the burst is 10 (one more may refill): {codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 14 - ok, "{codes:?}");
    let (retry, body) = refusal.unwrap();
    assert_eq!(retry, Some(1));
    assert_eq!(body["error"]["code"], "rate_limited");
    assert!(body["error"]["message"].as_str().unwrap().contains("more than 5 requests per second from 127.0.0.1"));

    // Another peer address (127.0.0.2 is loopback too) has its own bucket.
    let other =
        reqwest::Client::builder().local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap()).build().unwrap();
    let r = other.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // A body over 1 MiB: refused from its declared length before it is sent, or once
    // 1 MiB of a chunked one has been read (a caller with the token: without one, no
    // body is read at all).
    let declared = format!(
        "PUT /v1/apps/echo/spec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nContent-Length: {}\r\n\r\n",
        flotilla_control::limits::MAX_BODY_BYTES + 1
    );
    let (status, out) = raw(addr, declared.as_bytes()).await;
    assert_eq!(status, 413, "{out}");
    assert!(out.contains("\"too_large\""), "{out}");
    let mut chunked =
        b"PUT /v1/apps/echo/spec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for _ in 0..17 {
        chunked.extend_from_slice(format!("{:x}\r\n", 64 * 1024).as_bytes());
        chunked.extend(std::iter::repeat_n(b'y', 64 * 1024));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, out) = raw(addr, &chunked).await;
    assert_eq!(status, 413, "{}", &out[..out.len().min(300)]);
    assert!(out.contains("larger than 1048576 bytes"), "{out}");

    // A mutating call without the token, or with a wrong one.
    let r = other.put(format!("{url}/v1/apps/echo/scale")).json(&serde_json::json!({"units": 2})).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("Authorization: Bearer"));
    let r = other.post(format!("{url}/v1/nodes/n1/cordon")).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Within the limits and with the token, the call reaches the handler.
    let r = other
        .put(format!("{url}/v1/apps/echo/scale"))
        .bearer_auth("secret")
        .json(&serde_json::json!({"units": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "no scheduler runs echo here");

    let text = other.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric(&text, "rate_limited"), (14 - ok) as f64, "{text}");
    assert_eq!(metric(&text, "too_large"), 2.0, "{text}");
    // At least: the pool test of this binary makes an unauthenticated call of its own,
    // counted in the same process-wide registry.
    assert!(metric(&text, "unauthenticated") >= 2.0, "{text}");
}

#[tokio::test]
async fn one_peer_holds_a_bounded_number_of_connections() {
    let (addr, _stop) = start(HttpOptions { tls: None, rate_limit: 0, ..Default::default() }).await;
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS_PER_PEER {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(s);
    }
    // One more is closed at once, unanswered.
    let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "the connection past the cap is closed");
    // Closing one makes room again.
    held.pop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = tokio::net::TcpStream::connect(addr).await.unwrap();
    again.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let n = again.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let (_, text) = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert_eq!(metric(&text, "too_many_connections"), 1.0, "{text}");
}

#[tokio::test]
async fn pool_floors_and_reports_are_checked_and_kept() {
    let (addr, _stop) = start(HttpOptions { tls: None, rate_limit: 0, ..Default::default() }).await;
    let addr = addr.to_string();
    let call = |method: &'static str, path: &'static str, token: Option<&'static str>, body: &'static str| {
        let addr = addr.clone();
        tokio::task::spawn_blocking(move || flotilla_testkit::http(&addr, method, path, token, body))
    };
    let floor = r#"{"resource_requests": [{"resources": {"cpu_millis": 4000}, "count": 2}]}"#;
    let (status, _) = call("PUT", "/v1/pools/default/constraints", None, floor).await.unwrap();
    assert_eq!(status, 401, "a floor needs the API token");
    let (status, body) = call(
        "PUT",
        "/v1/pools/default/constraints",
        Some("secret"),
        r#"{"resource_requests": [{"resources": {"cpu_millis": 1}, "count": 1000000}]}"#,
    )
    .await
    .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("count"), "{body}");
    let (status, body) = call("PUT", "/v1/pools/bad name/constraints", Some("secret"), floor).await.unwrap();
    assert!(status == 400 || status == 404, "{status} {body}");
    let (status, _) = call("PUT", "/v1/pools/default/constraints", Some("secret"), floor).await.unwrap();
    assert_eq!(status, 200);
    let (_, got) = call("GET", "/v1/pools/default/constraints", None, "").await.unwrap();
    assert_eq!(got["resource_requests"][0]["count"], 2);

    // An autoscaler's report is answered with the floor and shown.
    let (status, _) = call("POST", "/v1/pools/default/report", Some("secret"), r#"{"no": "instances"}"#).await.unwrap();
    assert_eq!(status, 400);
    let (status, answer) =
        call("POST", "/v1/pools/default/report", Some("secret"), r#"{"instances": [], "provider": "local"}"#)
            .await
            .unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer["constraints"]["resource_requests"][0]["resources"]["cpu_millis"], 4000);
    let (_, pools) = call("GET", "/v1/pools", None, "").await.unwrap();
    assert_eq!(pools[0]["pool"], "default");
    assert_eq!(pools[0]["provider"], "local");
    assert_eq!(pools[0]["stale"], false);
    let (status, body) = call("GET", "/v1/pools/nope", None, "").await.unwrap();
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "no_such_pool");
}

/// DNS rebinding: a page whose name now points here sends its own name as `Host`.
#[tokio::test]
async fn a_host_name_nobody_allowed_reads_nothing_without_the_token() {
    let allowed_hosts = flotilla_control::hosts::AllowedHosts::new(["flotilla.example.com"]).unwrap();
    let (addr, _stop) = start(HttpOptions { allowed_hosts, ..Default::default() }).await;
    let get =
        |host: &str, auth: &str| format!("GET /v1/nodes HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    let (status, out) = raw(addr, get("rebind.attacker.example:7700", "").as_bytes()).await;
    assert_eq!(status, 400, "{out}");
    assert!(out.contains("host_not_allowed") && out.contains("--allowed-host"), "{out}");
    // The same request by address, by a private or allowed name, or with the token.
    for host in [addr.to_string(), "localhost".into(), "flotilla.example.com:443".into()] {
        let (status, out) = raw(addr, get(&host, "").as_bytes()).await;
        assert_eq!(status, 200, "{host}: {out}");
    }
    let (status, out) = raw(addr, get("rebind.attacker.example", "Authorization: Bearer secret\r\n").as_bytes()).await;
    assert_eq!(status, 200, "{out}");
    let (status, _) = raw(addr, get("rebind.attacker.example", "Authorization: Bearer wrong\r\n").as_bytes()).await;
    assert_eq!(status, 400);
    let (_, text) = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await;
    assert!(metric(&text, "host_not_allowed") >= 2.0, "{text}");
}

/// Issue #35 item 4: each request a peer has forwarded to a standalone scheduler costs
/// that scheduler a request, so a peer gets a quarter of its rate for them.
#[tokio::test]
async fn forwarded_requests_are_limited_per_peer() {
    let (addr, _stop) = start(HttpOptions { rate_limit: 8, ..Default::default() }).await;
    let ghost = flotilla_testkit::answer_then_vanish(r#"[{"app": "ghost", "scheduler": {"instance": "a"}}]"#, 1);
    let body = format!(r#"{{"app": "ghost", "url": "{ghost}"}}"#);
    let register = format!(
        "POST /v1/schedulers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, out) = raw(addr, register.as_bytes()).await;
    assert_eq!(status, 204, "{out}");
    // 2 a second in bursts of 4: the scheduler is gone, so each forward that is allowed
    // answers 502; the fifth in a row is refused before it is sent.
    let get = b"GET /v1/apps/ghost/units HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(raw(addr, get).await.0);
    }
    assert_eq!(statuses, [502, 502, 502, 502, 429]);
    // Requests that forward nothing are not charged.
    assert_eq!(raw(addr, b"GET /v1/nodes HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.0, 200);
    let (_, text) = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert!(metric(&text, "forward_rate_limited") >= 1.0, "{text}");
}
