//! Logs (issue #36, item 1): members' stdout and stderr, read through the control plane
//! from the agents (over their own QUIC connections), by member, by unit and for the
//! whole app with prefixes, tailed, followed, filtered by time; unknown names are 404s
//! that name them, garbage `since` a 400, and a member of a node that left a 410 that
//! says when.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use flotilla_testkit::{Up, get_text, http, run_ok, signal, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

/// The members' addresses of a running unit: (unit id, head address, head node).
fn a_running_unit(up: &Up) -> (String, String, String) {
    let u = wait_for("a running unit", Duration::from_secs(30), || running(up).into_iter().next());
    let head = u["members"].as_array().unwrap().iter().find(|m| m["member"] == "head").unwrap().clone();
    let s = |v: &Value| v.as_str().unwrap().to_string();
    (s(&u["unit_id"]), s(&head["address"]), s(&head["node_id"]))
}

fn logs(up: &Up, args: &[&str]) -> String {
    let mut all = vec!["logs"];
    all.extend_from_slice(args);
    run_ok(up.cli().args(&all))
}

#[test]
fn members_logs_are_read_tailed_followed_and_interleaved_and_bad_asks_are_named() {
    let mut up = Up::start("logs", &["--agents", "3", "--shards", "1", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let (unit, head, node) = a_running_unit(&up);
    let member = format!("{unit}/head");

    // stderr: the echo server's start; stdout: a line per request it answered.
    let err = logs(&up, &["echo", &member, "--stderr"]);
    assert!(err.contains("echo-server listening"), "{err}");
    for i in 0..5 {
        assert!(get_text(&head, &format!("/hello-{i}")).is_some(), "the head answers");
    }
    let out = wait_for("the requests in the head's stdout", Duration::from_secs(10), || {
        let out = logs(&up, &["echo", &member]);
        out.contains("GET /hello-4 200").then_some(out)
    });
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("GET /hello-")).collect();
    assert_eq!(lines, (0..5).map(|i| format!("GET /hello-{i} 200")).collect::<Vec<_>>(), "in order, each once");
    assert_eq!(logs(&up, &["echo", &member, "--tail", "1"]), "GET /hello-4 200\n");
    // With times: each line after the RFC 3339 time it was written.
    let stamped = logs(&up, &["echo", &member, "--tail", "1", "--timestamps"]);
    let (at, rest) = stamped.trim_end().split_once(' ').unwrap();
    assert!(flotilla_core::parse_rfc3339(at).is_some() && rest == "GET /hello-4 200", "{stamped}");
    assert!(logs(&up, &["echo", &member, "--since", "2000-01-01T00:00:00.000Z"]).contains("GET /hello-0"));

    // Followed: a line written later comes out of the running command.
    let mut follow =
        up.cli().args(["logs", "echo", &member, "-f", "--tail", "0"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut followed = BufReader::new(follow.stdout.take().unwrap()).lines();
    wait_for("the follower taking the line", Duration::from_secs(15), || {
        // Sent until it shows: the follower may subscribe after the first one.
        get_text(&head, "/followed");
        let line = followed.next()?.ok()?;
        (line == "GET /followed 200").then_some(())
    });
    signal(follow.id() as i32, libc::SIGTERM);
    let _ = follow.wait();

    // The whole app: every placed member's lines, after its unit/member prefix.
    let all = logs(&up, &["echo", "--stderr"]);
    let members: usize = running(&up).iter().map(|u| u["members"].as_array().unwrap().len()).sum();
    let listening: Vec<&str> = all.lines().filter(|l| l.contains("echo-server listening")).collect();
    assert!(listening.len() >= members, "a start line per member: {all}");
    assert!(listening.iter().all(|l| l.contains(" | ")), "{all}");
    assert!(all.lines().any(|l| l.starts_with(&member)), "{all}");
    let one_unit = logs(&up, &["echo", &unit]);
    assert!(
        one_unit.lines().any(|l| l.starts_with(&format!("{member} ")) && l.ends_with("GET /hello-0 200")),
        "{one_unit}"
    );

    // Logs may hold what members should not show anyone: reading them takes a token.
    let path =
        |app: &str, unit: &str, member: &str, q: &str| format!("/v1/apps/{app}/units/{unit}/members/{member}/logs{q}");
    let (status, _) = http(&up.addr, "GET", &path("echo", &unit, "head", ""), None, "");
    assert_eq!(status, 401);
    let token = up.token();
    // A token for other apps' logs reads none of these.
    let created = run_ok(up.cli().args(["token", "create", "other-reader", "--scope", "read", "--apps", "other"]));
    let other = created.lines().last().unwrap().trim().to_string();
    let (status, v) = http(&up.addr, "GET", &path("echo", &unit, "head", ""), Some(&other), "");
    assert_eq!(status, 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("echo"), "{v}");

    // Bad asks: what is unknown is named; a garbage since says what it takes.
    for (p, names) in [
        (path("nope", &unit, "head", ""), "nope"),
        (path("echo", "u-none", "head", ""), "u-none"),
        (path("echo", &unit, "ghost", ""), "ghost"),
    ] {
        let (status, v) = http(&up.addr, "GET", &p, Some(&token), "");
        assert_eq!(status, 404, "{p}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(names), "{v}");
    }
    let (status, v) = http(&up.addr, "GET", &path("echo", &unit, "head", "?since=yesterday"), Some(&token), "");
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("10m"), "{v}");
    let (status, v) = http(&up.addr, "GET", &path("echo", &unit, "head", "?colour=red"), Some(&token), "");
    assert_eq!((status, v["error"]["code"].as_str()), (400, Some("bad_request")), "{v}");
    let cli = up.cli().args(["logs", "echo", &member, "--since", "soon"]).output().unwrap();
    assert!(!cli.status.success() && String::from_utf8_lossy(&cli.stderr).contains("RFC 3339"), "{cli:?}");

    // The head's node leaves: its members' logs went with it (410, saying when).
    signal(-up.agent_pid(&node), libc::SIGKILL);
    let v = wait_for("a 410 for the lost node's member", Duration::from_secs(40), || {
        let (status, v) = http(&up.addr, "GET", &path("echo", &unit, "head", ""), Some(&token), "");
        (status == 410).then_some(v)
    });
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(&node) && message.contains("left at"), "{v}");
    assert_eq!(v["error"]["code"], "node_gone");

    let metrics = get_text(&up.addr, "/metrics").unwrap_or_default();
    assert!(metrics.contains("flotilla_shard_log_relays_total{result=\"ok\"}"), "the relays are counted");
    assert!(up.stop());
}
