//! Security with real processes on loopback: the HTTP API over HTTPS with a user CA and
//! the CLI reading it; per-peer rate limits, the body cap and missing tokens refused and
//! counted; join tokens rotated and retired under a running shard; a session that tries
//! to heartbeat or report for another node; a shard's gRPC over TLS only for callers with
//! its token. Run one at a time (.config/nextest.toml).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flotilla");

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flotilla-security-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Processes a test started, each in its own process group; all killed on drop, and the
/// test's directory removed.
struct Procs {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Procs {
    fn new(dir: &Path) -> Procs {
        Procs { children: Vec::new(), dir: dir.to_path_buf() }
    }

    fn spawn(&mut self, args: &[&str], log: &str) -> &mut Child {
        self.spawn_with_env(args, log, &[])
    }

    fn spawn_with_env(&mut self, args: &[&str], log: &str, env: &[(&str, &Path)]) -> &mut Child {
        use std::os::unix::process::CommandExt;
        let child = Command::new(BIN)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(self.dir.join(log)).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        self.children.push(child);
        self.children.last_mut().unwrap()
    }

    /// A shard (`aggregator --print-addrs`) on a free port: its addresses.
    fn shard(&mut self) -> Value {
        use std::io::BufRead;
        let d = self.dir.to_str().unwrap().to_string();
        let args = ["aggregator", "--listen", "127.0.0.1:0", "--data", &d, "--metrics", "127.0.0.1:0", "--print-addrs"];
        let child = self.spawn(&args, "shard.err");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// An agent of node `node` in domain `d` with these join-token flags.
    fn agent(&mut self, shard: &str, node: &str, token: &[&str], ports: &str) -> u32 {
        let (ca, data) = (self.dir.join("tls.crt"), self.dir.join("agents").join(node));
        let mut args = vec!["agent", "--aggregators", shard, "--node-id", node, "--label", "domain=d", "--cores", "1"];
        args.extend_from_slice(&["--memory", "1073741824", "--port-range", ports, "--ca", ca.to_str().unwrap()]);
        args.extend_from_slice(&["--data", data.to_str().unwrap()]);
        args.extend_from_slice(token);
        self.spawn(&args, &format!("{node}.err")).id()
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.children {
            // SAFETY: kill(2) of a process group this test started.
            unsafe {
                libc::kill(-(c.id() as i32), libc::SIGKILL);
            }
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("FLOTILLA_CA")
        .env_remove("FLOTILLA_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Writes `request` to `addr` (`host:port`) and reads until the server closes.
fn exchange(addr: &str, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

/// A raw HTTP/1.1 request: the status, the headers and the JSON body (if any).
fn http(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> (u16, String, Value) {
    let head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}");
    let out = exchange(addr, &format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()));
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (status, head.to_string(), serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The value of the first `name` line whose labels contain `label`, in a Prometheus page.
fn metric(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(['{', ' '])) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn metrics_page(addr: &str) -> String {
    exchange(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
}

/// A CA, and a certificate it signed for 127.0.0.1 with its key, written as PEM into `dir`.
fn user_pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "Flotilla test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("api.crt"), dir.join("api.key"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[test]
fn up_serves_its_api_over_https_with_a_user_certificate_and_the_cli_trusts_its_ca() {
    let dir = temp_dir("https");
    let mut procs = Procs::new(&dir);
    let (ca, cert, key) = user_pki(&dir);
    let data = dir.join("data");
    let d = data.to_str().unwrap();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let args = ["up", "--agents", "0", "--shards", "1", "--listen", "127.0.0.1:0", "--data", d, "--tls-cert", cert];
    procs.spawn(&[&args[..], &["--tls-key", key]].concat(), "up.err");
    let addr =
        wait_for("control.addr", Duration::from_secs(30), || std::fs::read_to_string(data.join("control.addr")).ok());
    assert!(addr.starts_with("https://127.0.0.1:"), "{addr}");
    let ca = ca.to_str().unwrap();

    // Trusting the user CA, by $FLOTILLA_CA or --ca.
    let out = run(&["nodes", "--json"], &[("FLOTILLA_ADDR", &addr), ("FLOTILLA_CA", ca)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), serde_json::json!([]));
    let out = run(&["apps", "--json", "--addr", &addr, "--ca", ca], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Mutating calls carry the API token over HTTPS: this one reaches the handler.
    let out =
        run(&["scale", "echo", "--units", "1"], &[("FLOTILLA_ADDR", &addr), ("FLOTILLA_CA", ca), ("FLOTILLA_DATA", d)]);
    assert!(stderr(&out).contains("404 Not Found: no scheduler runs app \"echo\""), "{}", stderr(&out));
    let out = run(&["node", "cordon", "n1", "--token", "wrong"], &[("FLOTILLA_ADDR", &addr), ("FLOTILLA_CA", ca)]);
    assert!(stderr(&out).contains("401 Unauthorized: the bearer token is wrong"), "{}", stderr(&out));

    // Without the CA the certificate is not trusted, and the error says what to set.
    let out = run(&["nodes"], &[("FLOTILLA_ADDR", &addr)]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--ca or $FLOTILLA_CA") && err.contains("invalid peer certificate"), "{err}");
    // Plain HTTP to the HTTPS port: refused with the URL to use.
    let plain = addr.replace("https://", "http://");
    let out = run(&["nodes"], &[("FLOTILLA_ADDR", &plain)]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("400 Bad Request: this address serves HTTPS: use {addr}")),
        "{}",
        stderr(&out)
    );
    // A CA file that holds no certificate is named.
    let out = run(&["nodes", "--ca", cert.replace("api.crt", "api.key").as_str()], &[("FLOTILLA_ADDR", &addr)]);
    assert!(stderr(&out).contains("holds no PEM certificate"), "{}", stderr(&out));
}

#[test]
fn the_control_api_limits_each_peer_and_counts_every_refusal() {
    let dir = temp_dir("limits");
    let mut procs = Procs::new(&dir);
    std::fs::write(dir.join("api-token"), "secret\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let token_file = dir.join("api-token");
    let args = ["control", "--listen", &addr, "--aggregators", "127.0.0.1:9", "--rate-limit", "3", "--api-token-file"];
    procs.spawn(&[&args[..], &[token_file.to_str().unwrap()]].concat(), "control.err");
    wait_for("the control API", Duration::from_secs(20), || std::net::TcpStream::connect(&addr).ok());

    // A burst of twice the rate, then 429s with a JSON error and Retry-After.
    let answers: Vec<_> = (0..12).map(|_| http(&addr, "GET", "/v1/nodes", "", "")).collect();
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    let limited: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert!((6..=8).contains(&ok) && ok + limited.len() == 12, "{:?}", answers.iter().map(|a| a.0).collect::<Vec<_>>());
    assert_eq!(limited[0].2["error"]["code"], "rate_limited");
    assert!(limited[0].1.to_ascii_lowercase().contains("retry-after: 1"), "{}", limited[0].1);

    // A body declared over 1 MiB is refused before it is sent.
    std::thread::sleep(Duration::from_millis(2100));
    let declared = format!(
        "PUT /v1/apps/echo/spec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nContent-Length: {}\r\n\r\n",
        (1 << 20) + 1
    );
    let out = exchange(&addr, &declared);
    assert!(out.starts_with("HTTP/1.1 413") && out.contains("larger than 1048576 bytes"), "{out}");
    // A mutating call without a valid token, from the CLI and without any.
    let url = format!("http://{addr}");
    let out = run(&["scale", "echo", "--units", "2", "--token", "nope"], &[("FLOTILLA_ADDR", &url)]);
    assert!(stderr(&out).contains("401 Unauthorized: the bearer token is wrong"), "{}", stderr(&out));
    let (status, _, body) = http(&addr, "PUT", "/v1/apps/echo/scale", "", "{\"units\": 2}");
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("unauthorized")));
    // With the token the call passes every check (and no scheduler runs the app here).
    let auth = "Authorization: Bearer secret\r\nContent-Type: application/json\r\n";
    let (status, _, body) = http(&addr, "PUT", "/v1/apps/echo/scale", auth, "{\"units\": 2}");
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("no_such_app")));

    std::thread::sleep(Duration::from_millis(1100));
    let page = metrics_page(&addr);
    let count = |reason: &str| metric(&page, "flotilla_http_requests_rejected_total", &format!("reason=\"{reason}\""));
    assert_eq!(count("rate_limited"), Some(limited.len() as f64), "{page}");
    assert_eq!(count("too_large"), Some(1.0), "{page}");
    assert_eq!(count("unauthenticated"), Some(2.0), "{page}");
}

#[test]
fn a_shard_serves_grpc_over_tls_only_to_callers_with_its_token() {
    use std::io::BufRead;
    let dir = temp_dir("grpc");
    let mut procs = Procs::new(&dir);
    let (ca, cert, key) = user_pki(&dir);
    let d = dir.to_str().unwrap().to_string();
    let (cert, key, ca) = (cert.to_str().unwrap(), key.to_str().unwrap(), ca.to_str().unwrap());
    let args = ["aggregator", "--listen", "127.0.0.1:0", "--data", &d, "--metrics", "127.0.0.1:0", "--print-addrs"];
    let shard = procs.spawn(&[&args[..], &["--grpc-tls-cert", cert, "--grpc-tls-key", key]].concat(), "shard.err");
    let mut line = String::new();
    std::io::BufReader::new(shard.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let shard: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let (addr, metrics) = (shard["addr"].as_str().unwrap(), shard["metrics"].as_str().unwrap());
    std::fs::write(dir.join("wrong-token"), "guess\n").unwrap();
    let no_data = dir.join("no-data");

    // Control planes following the shard: with its token and CA; with a wrong token; with
    // no token at all; with the token but in plain text.
    let grpc_token = format!("{d}/grpc-token");
    let wrong = format!("{d}/wrong-token");
    let callers: [(&str, Vec<&str>); 4] = [
        ("trusted", vec!["--grpc-token-file", &grpc_token, "--grpc-ca", ca]),
        ("forged", vec!["--grpc-token-file", &wrong, "--grpc-ca", ca]),
        ("anonymous", vec!["--grpc-ca", ca]),
        ("plaintext", vec!["--grpc-token-file", &grpc_token]),
    ];
    let mut apis = Vec::new();
    for (name, flags) in &callers {
        let api =
            format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
        let args = ["control", "--listen", &api, "--aggregators", addr];
        procs.spawn_with_env(&[&args[..], flags].concat(), &format!("{name}.err"), &[("FLOTILLA_DATA", &no_data)]);
        apis.push(api);
    }
    for api in &apis {
        wait_for("a control API", Duration::from_secs(20), || std::net::TcpStream::connect(api).ok());
    }
    let connected = |api: &str| {
        let (status, _, shards) = http(api, "GET", "/v1/shards", "", "");
        (status == 200).then(|| shards[0]["connected"].as_bool().unwrap_or(false))
    };
    wait_for("the trusted control plane to follow the shard", Duration::from_secs(20), || {
        connected(&apis[0]).filter(|c| *c)
    });
    wait_for("refusals counted", Duration::from_secs(20), || {
        let page = metrics_page(metrics);
        let count =
            |reason: &str| metric(&page, "flotilla_grpc_requests_rejected_total", &format!("reason=\"{reason}\""));
        (count("forged").is_some() && count("unauthenticated").is_some()).then_some(())
    });
    // They have all tried by now (each follower retries within a second).
    std::thread::sleep(Duration::from_millis(1500));
    for (api, (name, _)) in apis.iter().zip(&callers).skip(1) {
        assert_eq!(connected(api), Some(false), "the {name} control plane must not see the shard's view");
    }
    assert_eq!(connected(&apis[0]), Some(true));

    // Rotated: the "wrong" token is put first in DATA/grpc-token; on SIGHUP the shard takes
    // it, and the control plane holding it follows the view; the old token still works.
    let old = std::fs::read_to_string(&grpc_token).unwrap();
    std::fs::write(&grpc_token, format!("guess\n{old}")).unwrap();
    // SAFETY: kill(2) of the shard process this test started.
    unsafe {
        libc::kill(procs.children[0].id() as i32, libc::SIGHUP);
    }
    wait_for("the rotated token to be accepted", Duration::from_secs(20), || connected(&apis[1]).filter(|c| *c));
    assert_eq!(connected(&apis[0]), Some(true));
    let page = metrics_page(metrics);
    assert_eq!(metric(&page, "flotilla_grpc_tokens", ""), Some(2.0), "{page}");
    assert!(metric(&page, "flotilla_grpc_tokens_reloaded_total", "result=\"changed\"").is_some(), "{page}");
}

#[test]
fn join_tokens_rotate_and_retire_while_the_shard_runs() {
    let dir = temp_dir("tokens");
    let mut procs = Procs::new(&dir);
    let shard = procs.shard();
    let (addr, metrics) = (shard["addr"].as_str().unwrap().to_string(), shard["metrics"].as_str().unwrap().to_string());
    let pid = shard["pid"].as_i64().unwrap() as i32;
    let token_file = dir.join("join-token");
    let file_flag = ["--join-token-file", token_file.to_str().unwrap()];
    let old = std::fs::read_to_string(&token_file).unwrap().trim().to_string();
    let page = || metrics_page(&metrics);
    let accepted = || metric(&page(), "flotilla_registrations_total", "result=\"accepted\"").unwrap_or(0.0);
    let reloads = || metric(&page(), "flotilla_join_tokens_reloaded_total", "result=\"changed\"").unwrap_or(0.0);
    let hup = || unsafe {
        // SAFETY: kill(2) of the shard process this test started.
        libc::kill(pid, libc::SIGHUP);
    };

    procs.agent(&addr, "n1", &file_flag, "32000-32009");
    wait_for("n1 registered", Duration::from_secs(20), || (accepted() == 1.0).then_some(()));

    // Rotate: a new token first, the old one kept; the shard picks it up on SIGHUP.
    let out = run(&["join-token", "rotate", "--data", dir.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let new = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(new.len(), 64);
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), format!("{new}\n{old}\n"));
    hup();
    wait_for("the rotated tokens loaded", Duration::from_secs(10), || (reloads() == 1.0).then_some(()));
    procs.agent(&addr, "n2", &file_flag, "32010-32019");
    procs.agent(&addr, "n3", &["--join-token", &old], "32020-32029");
    wait_for("n2 (new token) and n3 (old token) registered", Duration::from_secs(20), || {
        (accepted() == 3.0).then_some(())
    });

    // Retire: only the newest stays; an agent with the old token is refused and counted.
    let out = run(&["join-token", "retire", "--data", dir.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("retired 1"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), format!("{new}\n"));
    hup();
    wait_for("the retired token dropped", Duration::from_secs(10), || (reloads() == 2.0).then_some(()));
    let refused = procs.agent(&addr, "n4", &["--join-token", &old], "32030-32039");
    let status = wait_for("the agent with the retired token to exit", Duration::from_secs(20), || {
        procs.children.iter_mut().find(|c| c.id() == refused)?.try_wait().ok().flatten()
    });
    assert!(!status.success());
    let err = std::fs::read_to_string(dir.join("n4.err")).unwrap();
    assert!(err.contains("join token is not valid"), "{err}");
    let text = page();
    assert_eq!(metric(&text, "flotilla_registrations_rejected_total", "reason=\"join_token\""), Some(1.0), "{text}");
    assert_eq!(metric(&text, "flotilla_join_tokens", ""), Some(1.0), "{text}");
    // One with the newest token joins; the sessions opened with the old token stay.
    procs.agent(&addr, "n5", &file_flag, "32040-32049");
    wait_for("n5 registered", Duration::from_secs(20), || (accepted() == 4.0).then_some(()));
    wait_for("4 nodes alive", Duration::from_secs(10), || {
        (metric(&page(), "flotilla_nodes", "status=\"alive\"") == Some(4.0)).then_some(())
    });
}

#[tokio::test]
async fn a_session_can_neither_heartbeat_nor_report_for_another_node() {
    use flotilla_agent::client::{ShardConnection, client_endpoint};
    use flotilla_proto::seal::{self, Direction, Header, MAGIC_HEARTBEAT, SessionKey};
    use flotilla_proto::v1;

    let dir = temp_dir("spoof");
    let mut procs = Procs::new(&dir);
    let shard = procs.shard();
    let addr: std::net::SocketAddr = shard["addr"].as_str().unwrap().parse().unwrap();
    let heartbeats: std::net::SocketAddr = shard["heartbeat"].as_str().unwrap().parse().unwrap();
    let metrics = shard["metrics"].as_str().unwrap().to_string();
    let token = std::fs::read_to_string(dir.join("join-token")).unwrap().trim().to_string();
    let endpoint = client_endpoint(&dir.join("tls.crt"), "127.0.0.1:0".parse().unwrap()).unwrap();
    let register = |node: &str| v1::RegisterRequest {
        protocol_version: flotilla_core::PROTOCOL_VERSION,
        join_token: token.clone(),
        node_id: node.into(),
        incarnation: 1,
        labels: [("domain".to_string(), "d".to_string())].into_iter().collect(),
        capacity: Some(v1::Resources { cpu_millis: 1000, memory_bytes: 1 << 30, ..Default::default() }),
        ..Default::default()
    };
    let a = ShardConnection::connect(&endpoint, addr, "127.0.0.1").await.unwrap();
    let b = ShardConnection::connect(&endpoint, addr, "127.0.0.1").await.unwrap();
    let sa = a.register(register("n1")).await.unwrap();
    let sb = b.register(register("n2")).await.unwrap();

    // Reports: n1's session naming n2, and n2's session over n1's connection.
    let report = |node: &str, session_id: u64| {
        let w = v1::WorkloadStatus { app: "echo".into(), unit: "u".into(), member: "m".into(), ..Default::default() };
        let r = v1::ReportWorkloads { node_id: node.into(), session_id, workloads: vec![w] };
        v1::AgentRequest { request: Some(v1::agent_request::Request::Workloads(r)) }
    };
    let err = a.request(report("n2", sa.session_id)).await.unwrap_err().to_string();
    assert!(err.contains("a session reports only for its own node"), "{err}");
    let err = a.request(report("n2", sb.session_id)).await.unwrap_err().to_string();
    assert!(err.contains("this connection holds no session for that node"), "{err}");
    assert!(a.request(report("n1", sa.session_id)).await.is_ok(), "its own report is taken");

    // Heartbeats sealed with n1's key: naming n2 (with n1's or n2's session) is dropped.
    let beat = |s: &v1::Session, session_id: u64, node: &str, seq: u64| {
        let key: SessionKey = s.key.as_slice().try_into().unwrap();
        let h = Header { magic: MAGIC_HEARTBEAT, session_id, seq, incarnation: 1, node_id: node };
        let mut out = Vec::new();
        seal::seal(&key, Direction::ToShard, &h, &[], &mut out).unwrap();
        out
    };
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&beat(&sa, sa.session_id, "n2", 1), heartbeats).await.unwrap();
    sock.send_to(&beat(&sa, sb.session_id, "n2", 2), heartbeats).await.unwrap();
    sock.send_to(&beat(&sa, sa.session_id, "n1", 3), heartbeats).await.unwrap();
    let m = metrics.clone();
    let text = tokio::task::spawn_blocking(move || {
        wait_for("the heartbeats counted", Duration::from_secs(10), || {
            let text = metrics_page(&m);
            (metric(&text, "flotilla_heartbeats_received_total", "shard=\"0\"") == Some(1.0)
                && metric(&text, "flotilla_heartbeats_rejected_total", "reason=\"wrong_node\"") == Some(1.0)
                && metric(&text, "flotilla_heartbeats_rejected_total", "reason=\"forged\"") == Some(1.0))
            .then_some(text)
        })
    })
    .await
    .unwrap();
    assert_eq!(
        metric(&text, "flotilla_control_requests_rejected_total", "reason=\"workloads\""),
        Some(2.0),
        "both reports for n2 are refused and counted: {text}"
    );
}
