//! Scoped tokens as an operator uses them (issue #36, item 5): `token create` prints a
//! token once; each scope allows what it names and a token without it gets 403 naming
//! the scope; a per-app token may change only its apps; the name is recorded with each
//! change; a revoked token is refused; a bad edit of the tokens file keeps the tokens in
//! force; tokens survive a restart of `up`; the single API token still does everything.

use std::time::Duration;

use flotilla_testkit::{TempDir, Up, get_text, http, metric, metrics_page, run_ok, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

/// `token create NAME ARGS…`: the token, alone on the last line.
fn create(up: &Up, name: &str, args: &[&str]) -> String {
    let out = run_ok(up.cli().args(["token", "create", name]).args(args));
    let last = out.lines().last().unwrap().trim().to_string();
    assert!(last.starts_with("flt_") && !last.contains(' '), "{out}");
    last
}

fn echo_with(memory: &str) -> String {
    std::fs::read_to_string(ECHO).unwrap().replacen("memory = \"64Mi\"", &format!("memory = \"{memory}\""), 1)
}

#[test]
fn scopes_allow_what_they_name_per_app_tokens_stay_in_their_apps_and_names_are_recorded() {
    let dir = TempDir::new("tokens-specs");
    let mut up = Up::start("tokens", &["--agents", "4", "--shards", "1", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let ci = create(&up, "ci", &["--scope", "deploy", "--apps", "echo"]);
    let ops = create(&up, "ops", &["--scope", "operate"]);
    let reader = create(&up, "reader", &["--scope", "read"]);
    let file = std::fs::read_to_string(up.data.join("tokens.toml")).unwrap();
    assert!(!file.contains(&ci) && file.contains("name = \"ci\""), "the file keeps hashes only:\n{file}");

    // deploy on echo: apply works and is recorded under its name; scaling is not its scope.
    let spec = dir.path().join("72Mi.toml");
    std::fs::write(&spec, echo_with("72Mi")).unwrap();
    let out = run_ok(up.cli().args(["apply", spec.to_str().unwrap()]).env("FLOTILLA_TOKEN", &ci));
    assert!(out.starts_with("echo: version 2"), "{out}");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&ci), r#"{"units": 3}"#);
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    assert_eq!(body["error"]["message"], "token \"ci\" lacks the operate scope (it has deploy)", "{body}");
    let (status, body) = http(&up.addr, "POST", "/v1/nodes/node-1/cordon", Some(&ci), "");
    assert_eq!(status, 403, "{body}");
    let (status, body) = http(&up.addr, "PUT", "/v1/policies/p", Some(&ci), "");
    assert!(body["error"]["message"].as_str().unwrap().contains("limited to some apps"), "{status} {body}");

    // operate: scale, cordon and rollback work; apply does not; its name is on the rollback.
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&ops), r#"{"units": 3}"#);
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&up.addr, "POST", "/v1/nodes/node-4/cordon", Some(&ops), "");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/spec", Some(&ops), &echo_with("80Mi"));
    assert_eq!(body["error"]["message"], "token \"ops\" lacks the deploy scope (it has operate)", "{status}");
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/rollback", Some(&ops), "");
    assert_eq!(status, 200, "{body}");
    // read: reads (and its secrets stay hidden), changes nothing; tokens are admin's.
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&reader), r#"{"units": 2}"#);
    assert_eq!(status, 403);
    let (status, body) = http(&up.addr, "GET", "/v1/tokens", Some(&ops), "");
    assert_eq!(status, 403, "{body}");
    let (_, me) = http(&up.addr, "GET", "/v1/whoami", Some(&ci), "");
    assert_eq!(me, serde_json::json!({"name": "ci", "scopes": ["deploy"], "apps": ["echo"], "open": false}));
    let (_, me) = http(&up.addr, "GET", "/v1/whoami", None, "");
    assert_eq!((me["name"].clone(), me["scopes"].clone()), (Value::Null, serde_json::json!(["read"])));

    let history: Value = serde_json::from_str(&run_ok(up.cli().args(["history", "echo", "--json"]))).unwrap();
    let by: Vec<(&str, Option<&str>)> = history["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["source"].as_str().unwrap(), v["by"].as_str()))
        .collect();
    assert_eq!(by, vec![("rollback", Some("ops")), ("api", Some("ci")), ("file", None)], "{history}");
    let page = metrics_page(&up.addr);
    assert!(metric(&page, "flotilla_api_forbidden_total", "scope=\"operate\"").unwrap_or(0.0) >= 2.0, "{page}");
    assert_eq!(metric(&page, "flotilla_api_tokens", ""), Some(3.0));

    // The single API token (admin) does everything, as before.
    let table = run_ok(up.cli().args(["token", "list"]));
    assert!(
        table.contains("ci") && table.contains("deploy") && table.contains("echo") && table.contains("reader"),
        "{table}"
    );

    // A bad hand edit is refused whole: the tokens in force stay (read on SIGHUP).
    let path = up.data.join("tokens.toml");
    std::fs::write(&path, file.replace("\"deploy\"", "\"superuser\"")).unwrap();
    flotilla_testkit::signal(up.pid().unwrap(), libc::SIGHUP);
    wait_for("the bad file refused", Duration::from_secs(10), || {
        metric(&metrics_page(&up.addr), "flotilla_api_tokens_reloaded_total", "result=\"error\"")
    });
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/plan", Some(&ci), &echo_with("80Mi"));
    assert_eq!(status, 200, "the ci token still works: {body}");
    std::fs::write(&path, &file).unwrap();

    // Revoked: refused at once. The rest survive a restart.
    run_ok(up.cli().args(["token", "revoke", "ci"]));
    let (status, _) = http(&up.addr, "POST", "/v1/apps/echo/plan", Some(&ci), &echo_with("80Mi"));
    assert_eq!(status, 401);
    assert!(up.restart(), "up stops cleanly");
    wait_for("the API after the restart", Duration::from_secs(30), || get_text(&up.addr, "/v1/apps"));
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&ops), r#"{"units": 2}"#);
    assert_eq!(status, 200, "{body}");
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&ci), r#"{"units": 2}"#);
    assert_eq!(status, 401);

    // Refusals name what is wrong.
    let out = up.cli().args(["token", "create", "x", "--scope", "root"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("unknown scope \"root\""), "{stderr}");
    let out = up.cli().args(["token", "create", "ops", "--scope", "read"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("the name is taken"));
}
