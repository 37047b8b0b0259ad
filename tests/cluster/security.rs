//! Security with real processes on loopback: the HTTP API over HTTPS with a user CA and
//! the CLI reading it; per-peer rate limits, the body cap and missing tokens refused and
//! counted; join tokens rotated and retired under a running shard; gRPC and API tokens
//! rotated under a running control plane and standalone scheduler; a session that tries
//! to heartbeat or report for another node; a shard's gRPC over TLS only for callers with
//! its token.

use std::time::Duration;

use flotilla_testkit::{
    Group, Pki, TempDir, Up, exchange, free_port, http, metric, metrics_page, request, run, signal, stderr, wait_for,
};

use crate::common::{ECHO, running};
use serde_json::Value;

/// Processes a test started and the directory they share (a shard's data dir); the
/// processes are killed before the directory is removed.
struct Sandbox {
    procs: Group,
    dir: TempDir,
}

impl Sandbox {
    fn new(name: &str) -> Sandbox {
        Sandbox { procs: Group::new(), dir: TempDir::new(name) }
    }

    /// Starts `flotilla args` with its stderr in `log` in the directory.
    fn spawn(&mut self, args: &[&str], log: &str) -> u32 {
        self.procs.spawn(args, &self.dir.join(log))
    }

    /// A shard (`aggregator --print-addrs`) on a free port, with `extra` flags: its
    /// addresses and pid.
    fn shard(&mut self, extra: &[&str]) -> Value {
        let d = self.dir.to_str().unwrap().to_string();
        let args = ["aggregator", "--listen", "127.0.0.1:0", "--data", &d, "--metrics", "127.0.0.1:0", "--print-addrs"];
        let pid = self.spawn(&[&args[..], extra].concat(), "shard.err");
        self.procs.addrs(pid)
    }

    /// An agent of node `node` in domain `d` with these join-token flags.
    fn agent(&mut self, shard: &str, node: &str, token: &[&str], ports: &str) -> u32 {
        let (ca, data) = (self.dir.join("tls.crt"), self.dir.join("agents").join(node));
        let mut args = vec!["agent", "--aggregators", shard, "--node-id", node, "--label", "domain=d", "--cores", "1"];
        args.extend_from_slice(&["--memory", "1073741824", "--port-range", ports, "--ca", ca.to_str().unwrap()]);
        args.extend_from_slice(&["--data", data.to_str().unwrap()]);
        args.extend_from_slice(token);
        self.spawn(&args, &format!("{node}.err"))
    }
}

#[test]
fn up_serves_its_api_over_https_with_a_user_certificate_and_the_cli_trusts_its_ca() {
    let pki_dir = TempDir::new("https-pki");
    let (ca, cert, key) = Pki::new().write_pem(&pki_dir);
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let up = Up::start("https", &["--agents", "0", "--shards", "1", "--tls-cert", cert, "--tls-key", key]);
    let (addr, d) = (up.addr.as_str(), up.data.to_str().unwrap());
    assert!(addr.starts_with("https://127.0.0.1:"), "{addr}");
    let ca = ca.to_str().unwrap();

    // Trusting the user CA, by $FLOTILLA_CA or --ca.
    let out = run(&["nodes", "--json"], &[("FLOTILLA_ADDR", addr), ("FLOTILLA_CA", ca)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), serde_json::json!([]));
    let out = run(&["apps", "--json", "--addr", addr, "--ca", ca], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Mutating calls carry the API token over HTTPS: this one reaches the handler.
    let out =
        run(&["scale", "echo", "--units", "1"], &[("FLOTILLA_ADDR", addr), ("FLOTILLA_CA", ca), ("FLOTILLA_DATA", d)]);
    assert!(stderr(&out).contains("404 Not Found: no scheduler runs app \"echo\""), "{}", stderr(&out));
    let out = run(&["node", "cordon", "n1", "--token", "wrong"], &[("FLOTILLA_ADDR", addr), ("FLOTILLA_CA", ca)]);
    assert!(stderr(&out).contains("401 Unauthorized: the bearer token is wrong"), "{}", stderr(&out));

    // Without the CA the certificate is not trusted, and the error says what to set.
    let out = run(&["nodes"], &[("FLOTILLA_ADDR", addr)]);
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
    let out = run(&["nodes", "--ca", key], &[("FLOTILLA_ADDR", addr)]);
    assert!(stderr(&out).contains("holds no PEM certificate"), "{}", stderr(&out));
}

#[test]
fn the_control_api_limits_each_peer_and_counts_every_refusal() {
    let mut sandbox = Sandbox::new("limits");
    std::fs::write(sandbox.dir.join("api-token"), "secret\n").unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let token_file = sandbox.dir.join("api-token");
    let args = ["control", "--listen", &addr, "--aggregators", "127.0.0.1:9", "--rate-limit", "3", "--api-token-file"];
    sandbox.spawn(&[&args[..], &[token_file.to_str().unwrap()]].concat(), "control.err");
    wait_for("the control API", Duration::from_secs(20), || std::net::TcpStream::connect(&addr).ok());

    // A burst of twice the rate, then 429s with a JSON error and Retry-After.
    let answers: Vec<_> = (0..12).map(|_| request(&addr, "GET", "/v1/nodes", "", "")).collect();
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let limited: Vec<_> = answers.iter().filter(|a| a.status == 429).collect();
    assert!(
        (6..=8).contains(&ok) && ok + limited.len() == 12,
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert_eq!(limited[0].json["error"]["code"], "rate_limited");
    assert!(limited[0].head.to_ascii_lowercase().contains("retry-after: 1"), "{}", limited[0].head);

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
    let r = request(&addr, "PUT", "/v1/apps/echo/scale", "", "{\"units\": 2}");
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (401, Some("unauthorized")));
    // With the token the call passes every check (and no scheduler runs the app here).
    let auth = "Authorization: Bearer secret\r\nContent-Type: application/json\r\n";
    let r = request(&addr, "PUT", "/v1/apps/echo/scale", auth, "{\"units\": 2}");
    assert_eq!((r.status, r.json["error"]["code"].as_str()), (404, Some("no_such_app")));

    std::thread::sleep(Duration::from_millis(1100));
    let page = metrics_page(&addr);
    let count = |reason: &str| metric(&page, "flotilla_http_requests_rejected_total", &format!("reason=\"{reason}\""));
    assert_eq!(count("rate_limited"), Some(limited.len() as f64), "{page}");
    assert_eq!(count("too_large"), Some(1.0), "{page}");
    assert_eq!(count("unauthenticated"), Some(2.0), "{page}");
}

#[test]
fn a_shard_serves_grpc_over_tls_only_to_callers_with_its_token() {
    let mut sandbox = Sandbox::new("grpc");
    let (ca, cert, key) = Pki::new().write_pem(&sandbox.dir);
    let d = sandbox.dir.to_str().unwrap().to_string();
    let (cert, key, ca) = (cert.to_str().unwrap(), key.to_str().unwrap(), ca.to_str().unwrap());
    let shard = sandbox.shard(&["--grpc-tls-cert", cert, "--grpc-tls-key", key]);
    let (addr, metrics) = (shard["addr"].as_str().unwrap(), shard["metrics"].as_str().unwrap());
    let pid = shard["pid"].as_i64().unwrap() as i32;
    std::fs::write(sandbox.dir.join("wrong-token"), "guess\n").unwrap();
    let no_data = sandbox.dir.join("no-data");

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
        let api = format!("127.0.0.1:{}", free_port());
        let args = ["control", "--listen", &api, "--aggregators", addr];
        let log = sandbox.dir.join(format!("{name}.err"));
        let env = [("FLOTILLA_DATA", no_data.to_str().unwrap())];
        sandbox.procs.spawn_with_env(&[&args[..], flags].concat(), &log, &env);
        apis.push(api);
    }
    for api in &apis {
        wait_for("a control API", Duration::from_secs(20), || std::net::TcpStream::connect(api).ok());
    }
    let connected = |api: &str| {
        let r = request(api, "GET", "/v1/shards", "", "");
        (r.status == 200).then(|| r.json[0]["connected"].as_bool().unwrap_or(false))
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
    signal(pid, libc::SIGHUP);
    wait_for("the rotated token to be accepted", Duration::from_secs(20), || connected(&apis[1]).filter(|c| *c));
    assert_eq!(connected(&apis[0]), Some(true));
    let page = metrics_page(metrics);
    assert_eq!(metric(&page, "flotilla_grpc_tokens", ""), Some(2.0), "{page}");
    assert!(metric(&page, "flotilla_grpc_tokens_reloaded_total", "result=\"changed\"").is_some(), "{page}");
}

#[test]
fn join_tokens_rotate_and_retire_while_the_shard_runs() {
    let mut sandbox = Sandbox::new("tokens");
    let shard = sandbox.shard(&[]);
    let (addr, metrics) = (shard["addr"].as_str().unwrap().to_string(), shard["metrics"].as_str().unwrap().to_string());
    let pid = shard["pid"].as_i64().unwrap() as i32;
    let dir = sandbox.dir.to_str().unwrap().to_string();
    let token_file = sandbox.dir.join("join-token");
    let file_flag = ["--join-token-file", token_file.to_str().unwrap()];
    let old = std::fs::read_to_string(&token_file).unwrap().trim().to_string();
    let page = || metrics_page(&metrics);
    let accepted = || metric(&page(), "flotilla_registrations_total", "result=\"accepted\"").unwrap_or(0.0);
    let reloads = || metric(&page(), "flotilla_join_tokens_reloaded_total", "result=\"changed\"").unwrap_or(0.0);
    let hup = || signal(pid, libc::SIGHUP);

    sandbox.agent(&addr, "n1", &file_flag, "32000-32009");
    wait_for("n1 registered", Duration::from_secs(20), || (accepted() == 1.0).then_some(()));

    // Rotate: a new token first, the old one kept; the shard picks it up on SIGHUP.
    let out = run(&["join-token", "rotate", "--data", &dir], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let new = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(new.len(), 64);
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), format!("{new}\n{old}\n"));
    hup();
    wait_for("the rotated tokens loaded", Duration::from_secs(10), || (reloads() == 1.0).then_some(()));
    sandbox.agent(&addr, "n2", &file_flag, "32010-32019");
    sandbox.agent(&addr, "n3", &["--join-token", &old], "32020-32029");
    wait_for("n2 (new token) and n3 (old token) registered", Duration::from_secs(20), || {
        (accepted() == 3.0).then_some(())
    });

    // Retire: only the newest stays; an agent with the old token is refused and counted.
    let out = run(&["join-token", "retire", "--data", &dir], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("retired 1"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), format!("{new}\n"));
    hup();
    wait_for("the retired token dropped", Duration::from_secs(10), || (reloads() == 2.0).then_some(()));
    let refused = sandbox.agent(&addr, "n4", &["--join-token", &old], "32030-32039");
    let status = wait_for("the agent with the retired token to exit", Duration::from_secs(20), || {
        sandbox.procs.try_wait(refused)
    });
    assert!(!status.success());
    let err = std::fs::read_to_string(sandbox.dir.join("n4.err")).unwrap();
    assert!(err.contains("join token is not valid"), "{err}");
    let text = page();
    assert_eq!(metric(&text, "flotilla_registrations_rejected_total", "reason=\"join_token\""), Some(1.0), "{text}");
    assert_eq!(metric(&text, "flotilla_join_tokens", ""), Some(1.0), "{text}");
    // One with the newest token joins; the sessions opened with the old token stay.
    sandbox.agent(&addr, "n5", &file_flag, "32040-32049");
    wait_for("n5 registered", Duration::from_secs(20), || (accepted() == 4.0).then_some(()));
    wait_for("4 nodes alive", Duration::from_secs(10), || {
        (metric(&page(), "flotilla_nodes", "status=\"alive\"") == Some(4.0)).then_some(())
    });
}

#[test]
fn grpc_and_api_tokens_rotate_under_a_running_control_plane_and_scheduler_without_a_restart() {
    let up = Up::start("rotation", &["--agents", "2"]);
    wait_for("2 alive nodes", Duration::from_secs(20), || (up.nodes().len() == 2).then_some(()));
    let (_, shards) = http(&up.addr, "GET", "/v1/shards", None, "");
    let addrs: Vec<&str> = shards.as_array().unwrap().iter().map(|s| s["address"].as_str().unwrap()).collect();
    // A standalone scheduler whose tokens are the data dir's (DATA/grpc-token, DATA/api-token).
    let api = format!("127.0.0.1:{}", free_port());
    let store = format!("redb:{}", up.data.join("echo.redb").display());
    let args = ["scheduler", "--app", ECHO, "--aggregators", &addrs.join(","), "--control", &up.addr];
    let mut procs = Group::new();
    let data = up.data.to_str().unwrap();
    let log = up.data.join("scheduler.err");
    let scheduler = procs.spawn_with_env(
        &[&args[..], &["--store", &store, "--listen", &api]].concat(),
        &log,
        &[("FLOTILLA_DATA", data)],
    ) as i32;
    wait_for("2 echo units running", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let hup = || {
        signal(up.pid().unwrap(), libc::SIGHUP);
        signal(scheduler, libc::SIGHUP);
    };
    let reloaded = |addr: &str, family: &str| metric(&metrics_page(addr), family, "result=\"changed\"").unwrap_or(0.0);

    // gRPC: the new token first everywhere, then the old one retired. The scheduler's
    // commits carry the new one from the first reload on, so the shards' refusal of the
    // old one stops nothing.
    let grpc = up.data.join("grpc-token");
    let old = std::fs::read_to_string(&grpc).unwrap().trim().to_string();
    std::fs::write(&grpc, format!("{}\n{old}\n", "n".repeat(64))).unwrap();
    hup();
    wait_for("both processes reloaded the gRPC token", Duration::from_secs(10), || {
        (reloaded(&up.addr, "flotilla_grpc_tokens_reloaded_total") == 1.0
            && reloaded(&api, "flotilla_grpc_tokens_reloaded_total") == 1.0)
            .then_some(())
    });
    std::fs::write(&grpc, format!("{}\n", "n".repeat(64))).unwrap();
    hup();
    wait_for("the old gRPC token retired", Duration::from_secs(10), || {
        (metric(&metrics_page(&up.addr), "flotilla_grpc_tokens", "") == Some(1.0)).then_some(())
    });
    let old_api = up.token();
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&old_api), r#"{"units": 3}"#);
    assert_eq!(status, 200, "{body}");
    wait_for("3 units: commits carry the new gRPC token", Duration::from_secs(30), || {
        (running(&up).len() == 3).then_some(())
    });
    let page = metrics_page(&up.addr);
    assert!(metric(&page, "flotilla_grpc_requests_rejected_total", "").is_none(), "no call was refused:\n{page}");

    // API: the control plane and the scheduler take the new token and refuse the old one.
    let new_api = "a".repeat(64);
    std::fs::write(up.data.join("api-token"), format!("{new_api}\n")).unwrap();
    hup();
    wait_for("both processes reloaded the API token", Duration::from_secs(10), || {
        (reloaded(&up.addr, "flotilla_api_token_reloaded_total") == 1.0
            && reloaded(&api, "flotilla_api_token_reloaded_total") == 1.0)
            .then_some(())
    });
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&old_api), r#"{"units": 2}"#);
    assert_eq!(status, 401, "the old API token is refused");
    let (status, _) = http(&api, "PUT", "/v1/apps/echo/scale", Some(&old_api), r#"{"units": 2}"#);
    assert_eq!(status, 401, "the scheduler refuses the old API token too");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&new_api), r#"{"units": 2}"#);
    assert_eq!(status, 200, "forwarded with the new token: {body}");
    wait_for("back to 2 units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    drop(procs);
}

#[tokio::test]
async fn a_session_can_neither_heartbeat_nor_report_for_another_node() {
    use flotilla_agent::client::{ShardConnection, client_endpoint};
    use flotilla_proto::seal::{self, Format, Header, MAGIC_HEARTBEAT, SessionKey};
    use flotilla_proto::v1;
    use flotilla_testkit::shard::registration;

    let mut sandbox = Sandbox::new("spoof");
    let shard = sandbox.shard(&[]);
    let addr: std::net::SocketAddr = shard["addr"].as_str().unwrap().parse().unwrap();
    let heartbeats: std::net::SocketAddr = shard["heartbeat"].as_str().unwrap().parse().unwrap();
    let metrics = shard["metrics"].as_str().unwrap().to_string();
    let token = std::fs::read_to_string(sandbox.dir.join("join-token")).unwrap().trim().to_string();
    let endpoint = client_endpoint(&sandbox.dir.join("tls.crt"), "127.0.0.1:0".parse().unwrap()).unwrap();
    let a = ShardConnection::connect(&endpoint, addr, "127.0.0.1").await.unwrap();
    let b = ShardConnection::connect(&endpoint, addr, "127.0.0.1").await.unwrap();
    let sa = a.register(registration("n1", &token, "d", 1000)).await.unwrap();
    let sb = b.register(registration("n2", &token, "d", 1000)).await.unwrap();

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
        let h = Header { magic: MAGIC_HEARTBEAT, format: Format::Mac, session_id, seq, incarnation: 1, node_id: node };
        let mut out = Vec::new();
        seal::seal(&key, &h, &[], &mut out).unwrap();
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

/// A spec's secret-looking env values are shown only to a reader with the API token, and
/// the redacted copy cannot be applied back over them.
#[test]
fn spec_env_secrets_are_hidden_from_readers_without_the_token() {
    let dir = TempDir::new("spec-secrets-file");
    let spec = std::fs::read_to_string(ECHO).unwrap().replacen(
        "[unit.head]\n",
        "[unit.head]\nenv = { DB_PASSWORD = \"hunter2\", LOG_LEVEL = \"info\" }\n",
        1,
    );
    let path = dir.join("echo.toml");
    std::fs::write(&path, &spec).unwrap();
    let up = Up::start("spec-secrets", &["--agents", "0", "--shards", "1", "--app", path.to_str().unwrap()]);
    let read = |auth: &str| {
        let out = exchange(
            &up.addr,
            &format!("GET /v1/apps/echo/spec HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n"),
        );
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
    };
    let anonymous = read("");
    assert!(!anonymous.contains("hunter2"), "{anonymous}");
    assert!(
        anonymous.contains("DB_PASSWORD = \"<redacted") && anonymous.contains("LOG_LEVEL = \"info\""),
        "{anonymous}"
    );
    let with_token = read(&format!("Authorization: Bearer {}\r\n", up.token()));
    assert!(with_token.contains("DB_PASSWORD = \"hunter2\""), "{with_token}");
    // Applying what an anonymous reader saw would overwrite the secret: refused.
    let r = request(
        &up.addr,
        "PUT",
        "/v1/apps/echo/spec",
        &format!("Authorization: Bearer {}\r\nContent-Type: text/plain\r\n", up.token()),
        &anonymous,
    );
    assert_eq!(r.status, 422, "{:?}", r.json);
    assert!(
        r.json["error"]["message"].as_str().unwrap_or_default().contains("put the real value back"),
        "{:?}",
        r.json
    );
    assert!(read(&format!("Authorization: Bearer {}\r\n", up.token())).contains("hunter2"));
}
