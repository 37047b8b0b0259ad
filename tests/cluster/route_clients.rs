//! Idle and stalled clients against `flotilla route`, over real sockets (issue #35 item
//! 1): connections that send nothing or half a request head cost the proxy nothing
//! real clients need. Past the connection cap a new client closes the idlest; a half
//! head is answered 408 after the header timeout, a silent connection closed after the
//! idle timeout; the proxy's descriptors are measured before, during and after.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use flotilla_testkit::{Group, TempDir, free_port, metric, metrics_page, wait_for};

/// Open descriptors of `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// A GET on a fresh connection: the status line, or why there was none.
fn get(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /hello HTTP/1.1\r\nhost: test\r\n\r\n").unwrap();
    let mut buf = [0u8; 512];
    match s.read(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string(),
        Err(e) => format!("no answer: {e}"),
    }
}

/// A request the byte path hands to hyper's (the echo server answers it 405, and keeps
/// the connection).
const CHUNKED: &[u8] = b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";

fn closed(metrics: &str, reason: &str) -> f64 {
    metric(&metrics_page(metrics), "flotilla_route_client_connections_closed_total", &format!("reason=\"{reason}\""))
        .unwrap_or(0.0)
}

/// `flotilla route --backends BACKEND` on one thread with `extra` flags, once it
/// forwards: its pid, listen address and metrics address.
fn spawn_route(procs: &mut Group, backend: &str, extra: &[&str], dir: &TempDir) -> (u32, String, String) {
    let mut args = vec!["route", "--backends", backend, "--listen", "127.0.0.1:0", "--print-addrs", "--threads", "1"];
    args.extend_from_slice(extra);
    let route = procs.spawn(&args, &dir.join("route.err"));
    let addrs = procs.addrs(route);
    let (listen, metrics) =
        (addrs["listen"].as_str().unwrap().to_string(), addrs["metrics"].as_str().unwrap().to_string());
    wait_for("the proxy forwarding", Duration::from_secs(20), || get(&listen).contains(" 200 ").then_some(()));
    (route, listen, metrics)
}

#[test]
fn idle_and_stalled_clients_cost_the_proxy_nothing_real_clients_need() {
    let dir = TempDir::new("route-clients");
    let mut procs = Group::new();
    let backend = format!("127.0.0.1:{}", free_port());
    procs.spawn(&["echo-server", "--listen", &backend], &dir.join("echo.err"));
    let (route, listen, metrics) = spawn_route(
        &mut procs,
        &backend,
        &[
            "--client-header-timeout",
            "1s",
            "--client-idle-timeout",
            "3s",
            "--max-client-connections",
            "200",
            "--max-client-connections-per-source",
            "200",
        ],
        &dir,
    );
    let (listen, metrics) = (listen.as_str(), metrics.as_str());
    let before = fds(route);
    let rss = || metric(&metrics_page(metrics), "process_resident_memory_bytes", "").unwrap_or(0.0) / 1048576.0;
    let rss_before = rss();

    // 600 connections that send nothing: three times the cap.
    let idle: Vec<TcpStream> = (0..600).map(|_| TcpStream::connect(listen).unwrap()).collect();
    // A real client still gets through (the idlest make room), and the proxy holds no
    // more than its cap.
    wait_for("the proxy past its cap", Duration::from_secs(10), || (closed(metrics, "evicted") >= 400.0).then_some(()));
    let started = Instant::now();
    assert!(get(listen).contains(" 200 "), "a real request among 600 idle connections");
    assert!(started.elapsed() < Duration::from_secs(2), "served at once: {:?}", started.elapsed());
    let during = fds(route);
    let rss_during = rss();
    assert!(during <= before + 200 + 16, "the cap holds the descriptors: {before} before, {during} during");

    // Half a request head: answered 408 once the header timeout passes.
    let mut slow: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(listen).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nhost: te").unwrap();
            s
        })
        .collect();
    let stalled = slow.pop().unwrap();
    let mut answer = String::new();
    stalled.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = (&stalled).read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    wait_for("half heads cut at the header timeout", Duration::from_secs(10), || {
        (closed(metrics, "header_timeout") >= 1.0).then_some(())
    });

    // The general (hyper) path too: a request only it takes (chunked), then half of the
    // next one, is cut at the header timeout; one silent after its request, at the idle
    // timeout.
    let mut general = TcpStream::connect(listen).unwrap();
    general.write_all(CHUNKED).unwrap();
    general.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut first = [0u8; 256];
    let n = general.read(&mut first).unwrap();
    assert!(
        String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 405"),
        "{:?}",
        String::from_utf8_lossy(&first[..n])
    );
    general.write_all(b"GET / HTTP/1.1\r\nhost: t").unwrap();
    let cut = Instant::now();
    let mut rest = Vec::new();
    let _ = general.read_to_end(&mut rest);
    assert!(cut.elapsed() < Duration::from_secs(8), "the general path closes a stalled head: {:?}", cut.elapsed());

    let mut quiet = TcpStream::connect(listen).unwrap();
    quiet.write_all(CHUNKED).unwrap();
    quiet.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let n = quiet.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 405"), "the echo server's answer");
    let since = Instant::now();
    let _ = quiet.read_to_end(&mut rest);
    assert!(
        since.elapsed() < Duration::from_secs(8),
        "the general path closes an idle connection: {:?}",
        since.elapsed()
    );

    let general_path =
        metric(&metrics_page(metrics), "flotilla_route_general_path_connections_total", "reason=\"transfer_encoding\"");
    assert_eq!(general_path, Some(2.0), "both went the general path");

    // Silent connections that were not evicted go at the idle timeout; the proxy's
    // descriptors come back to where they were.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(closed(metrics, "idle_timeout") >= 1.0 && fds(route) <= before + 4) {
        assert!(
            Instant::now() < deadline,
            "idle connections not closed: fds {before} before, {} now; closed idle {}, header {}, evicted {}; held {:?}",
            fds(route),
            closed(metrics, "idle_timeout"),
            closed(metrics, "header_timeout"),
            closed(metrics, "evicted"),
            metric(&metrics_page(metrics), "flotilla_route_client_connections", "")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let page = metrics_page(metrics);
    let count = |reason: &str| closed(metrics, reason);
    eprintln!(
        "fds before {before}, during {during}, after {}; RSS {rss_before:.1} / {rss_during:.1} / {:.1} MiB; closed: evicted {}, header_timeout {}, idle_timeout {}",
        fds(route),
        rss(),
        count("evicted"),
        count("header_timeout"),
        count("idle_timeout")
    );
    assert_eq!(metric(&page, "flotilla_route_client_connections", ""), Some(0.0), "{page}");
    assert!(get(listen).contains(" 200 "));
    drop((idle, slow));
}

/// A backend on loopback that answers every request with 1 MiB: a few answers fill any
/// socket buffers between the proxy and a client.
fn big_answers() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let body = vec![b'x'; 1 << 20];
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        head.drain(..end + 4);
                        let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        if conn.write_all(answer.as_bytes()).and_then(|()| conn.write_all(&body)).is_err() {
                            return;
                        }
                    }
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    addr
}

/// A client that pipelines requests and never reads an answer: once the buffers between
/// them are full, the proxy's write waits, and the client is cut at
/// `--client-write-timeout` instead of holding the connection (which is not idle, so no
/// newcomer would evict it) for ever; on the byte path and on hyper's.
#[test]
fn a_client_that_never_reads_its_answers_is_cut() {
    let dir = TempDir::new("route-write-stall");
    let mut procs = Group::new();
    let backend = big_answers();
    let (route, listen, metrics) = spawn_route(&mut procs, &backend, &["--client-write-timeout", "1s"], &dir);
    let (listen, metrics) = (listen.as_str(), metrics.as_str());
    let before = fds(route);

    let mut client = TcpStream::connect(listen).unwrap();
    client.write_all(&b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n".repeat(32)).unwrap();
    let asked = Instant::now();
    wait_for("the stalled client cut", Duration::from_secs(30), || {
        (closed(metrics, "write_stalled") >= 1.0).then_some(())
    });
    assert!(asked.elapsed() < Duration::from_secs(15), "cut soon after its buffers filled: {:?}", asked.elapsed());
    // The proxy's end is gone: reading drains what the buffers held, then ends.
    client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    let _ = client.read_to_end(&mut sink);
    assert!(sink.len() < 32 << 20, "not every answer was sent: {} bytes", sink.len());
    drop(client);

    // The general (hyper) path alike: requests only it takes (chunked).
    let mut general = TcpStream::connect(listen).unwrap();
    general.write_all(&CHUNKED.repeat(32)).unwrap();
    let asked = Instant::now();
    wait_for("the stalled client of the general path cut", Duration::from_secs(30), || {
        (closed(metrics, "write_stalled") >= 2.0).then_some(())
    });
    assert!(asked.elapsed() < Duration::from_secs(15), "{:?}", asked.elapsed());
    general.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sink.clear();
    let _ = general.read_to_end(&mut sink);
    assert!(sink.len() < 32 << 20, "not every answer was sent: {} bytes", sink.len());
    drop(general);
    wait_for("the proxy's descriptors back", Duration::from_secs(10), || (fds(route) <= before).then_some(()));
    assert!(get(listen).contains(" 200 "), "and it still serves");
}
