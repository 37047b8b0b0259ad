//! The `flotilla` CLI against a real cluster: node STATUS and allocation columns, `--wait`
//! on scale, apply and drain, `--json` on the actions, `status`, addresses without a
//! scheme, the missing-token error, completions, duration flags, and logs without
//! colour (or as JSON) in the files `up` writes.

use std::time::Duration;

use flotilla_testkit::{Group, TempDir, Up, flotilla, run, run_ok, stderr, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

const LONG: &str = "ip-10-0-12-34.us-west-2.compute.internal";

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: not JSON: {out}"))
}

/// The echo spec with `from` replaced by `to`, written to `dir/name`.
fn spec_variant(dir: &TempDir, name: &str, edits: &[(&str, &str)]) -> String {
    let mut text = std::fs::read_to_string(ECHO).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{from:?} is in the echo spec");
        text = text.replace(from, to);
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn nodes_show_cordons_drains_allocation_and_long_names_in_aligned_columns() {
    let up = Up::start("cli-nodes", &["--agents", "2", "--shards", "1", "--app", ECHO]);
    wait_for("2 running echo units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let status = json(&run_ok(up.cli().args(["status", "--json"])));
    let shard = status["shards"][0]["address"].as_str().unwrap().to_string();

    // An agent with a cloud-style long node id, started by hand with the duration flags
    // and one deprecated `-ms` spelling.
    let (ca, token) = (up.data.join("tls.crt"), up.data.join("join-token"));
    let agent_dir = up.data.join("long-agent");
    let mut procs = Group::new();
    procs.spawn(
        &[
            "agent",
            "--aggregators",
            &shard,
            "--node-id",
            LONG,
            "--label",
            "domain=domain-c",
            "--cores",
            "2",
            "--memory",
            "4294967296",
            "--join-token-file",
            token.to_str().unwrap(),
            "--ca",
            ca.to_str().unwrap(),
            "--data",
            agent_dir.to_str().unwrap(),
            "--port-range",
            "21000-21049",
            "--heartbeat-interval",
            "500ms",
            "--stop-grace",
            "2s",
            "--usage-interval-ms",
            "2000",
        ],
        &up.data.join("long-agent.err"),
    );
    wait_for("the long-named node alive", Duration::from_secs(20), || {
        (up.node(LONG)?["status"] == "alive").then_some(())
    });
    let log = std::fs::read_to_string(up.data.join("long-agent.err")).unwrap();
    assert!(log.contains("--usage-interval-ms is deprecated") && log.contains("--usage-interval"), "{log}");

    // Cordon node-1, drain node-2 and wait: the echo units move to the long-named node.
    let answer = json(&run_ok(up.cli().args(["node", "cordon", "node-1", "--json"])));
    assert_eq!((answer["node_id"].as_str(), answer["cordoned"].as_bool()), (Some("node-1"), Some(true)));
    let out = up.cli().args(["node", "drain", "node-2", "--wait", "--timeout", "60s"]).output().unwrap();
    let (stdout, progress) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "drain --wait failed: {stdout}\n{progress}");
    assert!(stdout.contains("node-2: drained, no member runs there"), "{stdout}");
    assert!(progress.lines().any(|l| l.starts_with("node-2: ") && l.contains("member(s) left")), "{progress}");
    let n2 = up.node("node-2").unwrap();
    assert_eq!((n2["workloads"].as_u64(), n2["allocated"]["cpu_millis"].as_u64()), (Some(0), Some(0)), "{n2}");
    wait_for("both units running again", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));

    let table = run_ok(up.cli().arg("nodes"));
    let lines: Vec<&str> = table.lines().collect();
    let header = lines[0];
    let row = |id: &str| *lines.iter().find(|l| l.starts_with(&format!("{id} "))).unwrap_or_else(|| panic!("{table}"));
    let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(cols(row("node-1"))[1], "alive,cordoned", "{table}");
    assert_eq!(cols(row("node-2"))[1], "alive,draining", "{table}");
    assert_eq!(cols(row(LONG))[1], "alive", "{table}");
    // Allocation: node-2 has nothing left, the long-named node runs the units moved there.
    assert!(cols(row("node-2"))[5].starts_with("0m/"), "{table}");
    let long_cpu = cols(row(LONG))[5].clone();
    assert!(long_cpu.ends_with("m/2000m") && !long_cpu.starts_with("0m/"), "{table}");
    assert_eq!(cols(header)[7], "MEMBERS");
    // Every left-aligned column starts where its header does, on every row, however
    // long the node name before it.
    let rows = &lines[1..lines.len() - 1];
    for name in ["STATUS", "DOMAIN", "PRIO"] {
        let at = header.find(name).unwrap();
        for l in rows {
            let b = l.as_bytes();
            assert!(b[at - 1] == b' ' && b[at] != b' ', "{name} misaligned in {l:?}\n{table}");
        }
    }
    // Right-aligned columns end where their headers end.
    let end = header.find("HEALTH").unwrap() + "HEALTH".len();
    assert!(rows.iter().all(|l| l.len() == end), "{table}");

    let out = json(&run_ok(up.cli().args(["node", "uncordon", "node-2", "--json"])));
    assert_eq!(out["drain_requested"], false);

    // TAB completes node and app names from the cluster (issue #34 item 6).
    let offered = complete(&mut up.cli(), &["node", "drain", ""]);
    for n in ["node-1", "node-2", LONG] {
        assert!(offered.iter().any(|o| o == n), "node drain offers {n}: {offered:?}");
    }
    assert_eq!(complete(&mut up.cli(), &["node", "cordon", "ip-10"]), vec![LONG.to_string()]);
    assert!(complete(&mut up.cli(), &["scale", ""]).contains(&"echo".to_string()));
    assert_eq!(complete(&mut up.cli(), &["units", "ec"]), vec!["echo".to_string()]);
}

/// What TAB offers for the last of `words` (empty: a new word), asked as the script
/// `completions bash` prints asks: one candidate a line.
fn complete(cmd: &mut std::process::Command, words: &[&str]) -> Vec<String> {
    let out = cmd
        .env("COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", words.len().to_string())
        .arg("--")
        .arg("flotilla")
        .args(words)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn scale_and_apply_wait_with_progress_and_every_action_speaks_json() {
    let dir = TempDir::new("cli-specs");
    // An app whose units fit on no node: scaling it can never finish.
    let big = spec_variant(
        &dir,
        "big.toml",
        &[
            ("name = \"echo\"", "name = \"big\""),
            ("min = 1\nmax = 6\ninitial = 2", "min = 0\nmax = 4\ninitial = 0"),
            ("cpu = \"250m\"", "cpu = \"64\""),
        ],
    );
    let up = Up::start("cli-wait", &["--agents", "3", "--shards", "2", "--app", ECHO, "--app", &big]);
    wait_for("2 running echo units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));

    // Without a scheme, FLOTILLA_ADDR means http://.
    let bare = up.addr.strip_prefix("http://").unwrap().to_string();
    let nodes = json(&run_ok(up.cli().env("FLOTILLA_ADDR", &bare).args(["nodes", "--json"])));
    assert_eq!(nodes.as_array().unwrap().len(), 3);

    // scale --wait: progress on stderr, one line per change, exit 0 once 4/4 run.
    let out = up.cli().env("FLOTILLA_ADDR", &bare).args(["scale", "echo", "--units", "4", "--wait"]).output().unwrap();
    let (stdout, progress) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{stdout}\n{progress}");
    assert!(stdout.trim_end().ends_with("echo: 4/4 units running"), "{stdout}");
    assert!(progress.lines().any(|l| l.starts_with("echo: ") && l.contains("/4 units running")), "{progress}");
    assert!(!progress.contains('\r') && !progress.contains('\x1b'), "not a terminal: plain lines: {progress:?}");
    assert_eq!(running(&up).len(), 4);

    // --json: the API's answer, one document, even with --wait.
    let answer = json(&run_ok(up.cli().args(["scale", "echo", "--units", "3", "--wait", "--json"])));
    assert_eq!((answer["app"].as_str(), answer["desired_units"].as_u64()), (Some("echo"), Some(3)));

    // An impossible size: non-zero after the timeout, which is named, with where it stood.
    let out = up.cli().args(["scale", "big", "--units", "2", "--wait", "--timeout", "2s"]).output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("timed out after 2s (--timeout) waiting for big") && err.contains("0/2 units running"),
        "{err}"
    );
    assert!(err.contains("queued"), "{err}");

    // apply --wait: every unit rolls to the new template and runs.
    let changed = spec_variant(&dir, "echo-v2.toml", &[("cpu = \"250m\"", "cpu = \"300m\"")]);
    let out = up.cli().args(["apply", &changed, "--wait", "--timeout", "90s"]).output().unwrap();
    let (stdout, progress) = (String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{stdout}\n{progress}");
    assert!(stdout.contains("unit(s) will roll"), "{stdout}");
    assert!(stdout.trim_end().ends_with("echo: 3/3 units running on the new spec"), "{stdout}");
    assert!(progress.contains("on the old spec"), "progress shows the roll: {progress}");
    let answer = json(&run_ok(up.cli().args(["apply", &changed, "--json"])));
    assert_eq!(answer["result"], "no unit's template changed");

    // status: shards, nodes, apps by state, what is pending.
    let s = json(&run_ok(up.cli().args(["status", "--json"])));
    assert_eq!(s["shards"].as_array().unwrap().len(), 2);
    assert!(s["shards"].as_array().unwrap().iter().all(|sh| sh["state"] == "serving"), "{s}");
    assert_eq!(s["nodes"]["total"], 3);
    assert_eq!(s["nodes"]["by_status"]["alive"], 3);
    assert!(s["nodes"]["allocated"]["cpu_millis"].as_u64().unwrap() >= 3 * 600, "{s}");
    let echo = s["apps"].as_array().unwrap().iter().find(|a| a["app"] == "echo").unwrap();
    assert_eq!((echo["desired"].as_u64(), echo["running"].as_u64()), (Some(3), Some(3)), "{s}");
    let pending = s["pending"].as_array().unwrap();
    assert!(pending.iter().any(|p| p["app"] == "big" && p["queued_units"] == 2), "{s}");
    let text = run_ok(up.cli().arg("status"));
    assert!(text.contains("Shards") && text.contains("3 alive") && text.contains("big: 2 unit(s) queued"), "{text}");

    // A missing token names the file looked at, and how to give one.
    let d = up.data.join("nowhere");
    let out =
        run(&["scale", "echo", "--units", "2"], &[("FLOTILLA_ADDR", &bare), ("FLOTILLA_DATA", d.to_str().unwrap())]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("nowhere/api-token") && err.contains("FLOTILLA_TOKEN") && err.contains("--token"), "{err}");
    // A bad address is named.
    let out = run(&["nodes"], &[("FLOTILLA_ADDR", "http://")]);
    assert!(stderr(&out).contains("\"http://\"") && stderr(&out).contains("FLOTILLA_ADDR"), "{}", stderr(&out));

    // Logs `up` writes to files carry no colour codes.
    let log = std::fs::read_to_string(up.data.join("agents").join("node-1.log")).unwrap();
    assert!(log.contains("INFO") && !log.contains('\x1b'), "{log}");
    assert!(!std::fs::read_to_string(up.data.join("up.err")).unwrap().contains('\x1b'));
}

#[test]
fn every_process_logs_json_when_asked() {
    let up = Up::start("cli-logjson", &["--agents", "1", "--shards", "1", "--app", ECHO, "--log-format", "json"]);
    wait_for("a running echo unit", Duration::from_secs(30), || (!running(&up).is_empty()).then_some(()));
    let dir = TempDir::new("cli-logjson-shard");
    let mut procs = Group::new();
    let d = dir.to_str().unwrap();
    let args = ["--log-format", "json", "aggregator", "--listen", "127.0.0.1:0", "--data", d, "--print-addrs"];
    let pid = procs.spawn(&args, &dir.join("shard.err"));
    procs.addrs(pid);
    // `up` itself, its agent (a child it started), and a standalone shard.
    for (what, file) in [
        ("up", up.data.join("up.err")),
        ("agent", up.data.join("agents").join("node-1.log")),
        ("aggregator", dir.join("shard.err")),
    ] {
        let text = wait_for(&format!("{what} logs"), Duration::from_secs(10), || {
            std::fs::read_to_string(&file).ok().filter(|t| !t.trim().is_empty())
        });
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: {e}: {line:?}"));
            assert!(v["level"].is_string() && v["fields"].is_object(), "{what}: {line}");
        }
    }
}

#[test]
fn completions_and_join_token_json_need_no_cluster() {
    // Each shell's script asks the binary for candidates at each TAB.
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = run_ok(flotilla().args(["completions", shell]));
        assert!(script.contains("COMPLETE") && script.contains("flotilla"), "{shell}: {script}");
    }
    let subcommands = complete(&mut flotilla(), &[""]);
    for sub in ["nodes", "scale", "status", "completions"] {
        assert!(subcommands.iter().any(|s| s == sub), "completions offer {sub}: {subcommands:?}");
    }
    assert_eq!(complete(&mut flotilla(), &["--log"]), vec!["--log-format".to_string()], "not the old --log-json");
    assert_eq!(complete(&mut flotilla(), &["scale", "--wa"]), vec!["--wait".to_string()]);
    // No cluster answers: no names, at once, and no error on the terminal.
    let none = complete(flotilla().env("FLOTILLA_ADDR", "http://127.0.0.1:9"), &["scale", "e"]);
    assert!(none.is_empty(), "{none:?}");
    // Outside the repository the demo pool is built in: the autoscaler gets as far as
    // the control plane (none here), not stopped by a relative examples/pool.toml.
    let out = flotilla()
        .current_dir("/")
        .args(["autoscaler", "--control", "http://127.0.0.1:9", "--data", "/nonexistent/flotilla"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("control plane") && !err.contains("pool.toml"), "{err}");
    // ... but still taken: it is `--log-format json`.
    let out =
        flotilla().args(["--log-json", "join-token", "retire", "--json", "--data", "/nonexistent/x"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("unexpected argument"), "{out:?}");
    let dir = TempDir::new("cli-join-token");
    let d = dir.to_str().unwrap();
    let v = json(&run_ok(flotilla().args(["join-token", "rotate", "--json", "--data", d])));
    assert_eq!(v["accepted"], 1);
    assert!(v["new_token"].as_str().is_some_and(|t| t.len() == 64), "{v}");
    let v = json(&run_ok(flotilla().args(["join-token", "retire", "--json", "--data", d])));
    assert_eq!(v["retired"], 0);
}
