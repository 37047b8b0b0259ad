//! Artifacts with real agents: members that need a pushed file and an HTTP origin's
//! archive wait in `fetching` (saying why while the origin lacks the file), start once
//! both are in their directory, and get the pushed file mostly from each other; a
//! rollout fetches before it stops anything; `artifact warm` fills a node's cache ahead
//! of a scale-up; a wrong digest fails the member with the digest it got, and nothing of
//! it stays cached.

use std::io::{Read, Write};
use std::time::Duration;

use flotilla_artifact::Digest;
use flotilla_testkit::{TempDir, Up, metric, metrics_page, run_ok, wait_for};
use serde_json::Value;

/// Serves `body` to every GET on loopback (no ranges: an origin as plain as they come).
fn http_origin(body: Vec<u8>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut b).is_ok_and(|n| n == 1) {
                    head.push(b[0]);
                }
                let _ = write!(conn, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
                let _ = conn.write_all(&body);
            });
        }
    });
    format!("http://{addr}/bundle.tar.gz")
}

fn spec(name: &str, artifacts: &str) -> String {
    format!(
        r#"
name = "{name}"
[unit]
workers = 0
[unit.head]
command = "/bin/sh"
args = ["-c", "test -r model.bin && test -r code/hello.txt && exec sleep 600"]
cpu = "100m"
memory = "32Mi"
{artifacts}
[constraints]
allow_low_priority = true
[units]
min = 0
max = 4
initial = 3
[spread]
members = "spread"
max_units_per_node = 1
"#
    )
}

fn members(up: &Up, app: &str) -> Vec<Value> {
    up.units(app).iter().flat_map(|u| u["members"].as_array().cloned().unwrap_or_default()).collect()
}

#[test]
fn members_start_once_their_pushed_and_http_artifacts_are_in_place_and_a_wrong_digest_fails_clearly() {
    let dir = TempDir::new("artifacts-files");
    // A 6 MiB "model" (six pieces) to push, and an archive served over plain HTTP.
    let model: Vec<u8> = (0..6u64 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let model_digest = Digest::of(&model);
    std::fs::write(dir.path().join("model.bin"), &model).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/hello.txt"), "hello\n").unwrap();
    let tgz = dir.path().join("bundle.tar.gz");
    run_ok(
        std::process::Command::new("tar").arg("czf").arg(&tgz).arg("-C").arg(dir.path().join("src")).arg("hello.txt"),
    );
    let bundle = std::fs::read(&tgz).unwrap();
    let url = http_origin(bundle.clone());
    let good = format!(
        r#"
[[unit.head.artifacts]]
source = "flotilla://{model_digest}"
sha256 = "{}"
dest = "model.bin"
[[unit.head.artifacts]]
source = "{url}"
sha256 = "{}"
dest = "code/"
unpack = "tar.gz"
"#,
        model_digest.hex(),
        Digest::of(&bundle).hex()
    );
    let wrong = Digest::of(b"not the bundle");
    let bad = format!("[[unit.head.artifacts]]\nsource = \"{url}\"\nsha256 = \"{}\"\ndest = \"x.tgz\"\n", wrong.hex());
    let (good_spec, bad_spec) = (dir.path().join("art.toml"), dir.path().join("bad.toml"));
    std::fs::write(&good_spec, spec("art", &good)).unwrap();
    std::fs::write(&bad_spec, spec("bad", &bad).replace("initial = 3", "initial = 1")).unwrap();
    let up = Up::start(
        "artifacts",
        &["--agents", "4", "--shards", "1", "--app", good_spec.to_str().unwrap(), "--app", bad_spec.to_str().unwrap()],
    );

    // The model is not pushed yet: the members fetch, and say what the origin answered.
    let waiting = wait_for("members fetching, retrying the origin", Duration::from_secs(60), || {
        let ms = members(&up, "art");
        (ms.len() == 3
            && ms.iter().all(|m| m["state"] == "fetching" && m["message"].as_str().is_some_and(|t| t.contains("404"))))
        .then_some(ms)
    });
    assert!(waiting[0]["message"].as_str().unwrap().contains("retrying"), "{waiting:?}");

    let pushed = run_ok(up.cli().args(["artifact", "push"]).arg(dir.path().join("model.bin")));
    assert_eq!(pushed.trim(), format!("flotilla://{model_digest}"));
    wait_for("every unit running with its artifacts", Duration::from_secs(90), || {
        let units = up.units("art");
        (units.len() == 3 && units.iter().all(|u| u["state"] == "running")).then_some(())
    });
    // In each member's directory: the model (read-only, whole) and the unpacked archive.
    for m in members(&up, "art") {
        let (node, unit) = (m["node_id"].as_str().unwrap(), m["unit"].as_str().unwrap_or_default());
        let base = up.agent_dir(node).join("workloads/art");
        let member_dir = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .flat_map(|u| std::fs::read_dir(u.path()).unwrap().flatten().map(|e| e.path()))
            .find(|p| p.join("model.bin").exists())
            .unwrap_or_else(|| panic!("no member dir with the model under {} ({unit})", base.display()));
        assert_eq!(std::fs::read(member_dir.join("model.bin")).unwrap(), model);
        assert_eq!(std::fs::read_to_string(member_dir.join("code/hello.txt")).unwrap(), "hello\n");
        assert!(std::fs::metadata(member_dir.join("model.bin")).unwrap().permissions().readonly());
    }
    // The origin sent about one copy; the rest went peer to peer.
    let origin_bytes =
        metric(&metrics_page(up.addr.trim_start_matches("http://")), "flotilla_origin_bytes_total", "").unwrap_or(0.0);
    let from_peers: f64 = (1..=4)
        .filter_map(|n| std::fs::read_to_string(up.agent_dir(&format!("node-{n}")).join("metrics.addr")).ok())
        .filter_map(|a| metric(&metrics_page(a.trim()), "flotilla_artifact_bytes_total", "from=\"peer\""))
        .sum();
    assert!(
        origin_bytes < 2.0 * model.len() as f64,
        "the origin sent {origin_bytes} bytes of a {} byte model",
        model.len()
    );
    assert!(from_peers >= model.len() as f64, "peers sent each other {from_peers} bytes");

    // A rollout to a spec with a new artifact is make-before-break: the replacements fetch
    // (the artifact is not even pushed yet) while every old unit keeps running.
    let v2: Vec<u8> = model.iter().map(|b| b ^ 0x5a).collect();
    let v2_digest = Digest::of(&v2);
    std::fs::write(dir.path().join("model-v2.bin"), &v2).unwrap();
    let v2_spec = dir.path().join("art-v2.toml");
    let good_v2 = good
        .replace(&format!("flotilla://{model_digest}"), &format!("flotilla://{v2_digest}"))
        .replace(&model_digest.hex(), &v2_digest.hex());
    std::fs::write(&v2_spec, spec("art", &good_v2)).unwrap();
    run_ok(up.cli().arg("apply").arg(&v2_spec));
    wait_for("a replacement fetching beside the running units", Duration::from_secs(60), || {
        let units = up.units("art");
        let running = units.iter().filter(|u| u["state"] == "running").count();
        let fetching = units
            .iter()
            .flat_map(|u| {
                u["members"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .chain(u["surge"].as_array().cloned().unwrap_or_default())
            })
            .any(|m| m["state"] == "fetching");
        assert!(units.is_empty() || running >= 2, "a unit stopped before its replacement had its artifact: {units:?}");
        (fetching && running == 3).then_some(())
    });
    run_ok(up.cli().args(["artifact", "push"]).arg(dir.path().join("model-v2.bin")));
    run_ok(up.cli().args(["apply", "--wait", "--timeout", "120s"]).arg(&v2_spec));

    // Warming ahead of a scale-up: the one node without a unit fetches v2 before any unit
    // needs it there, and the unit the scale-up puts there finds it cached.
    let used: Vec<String> = up
        .units("art")
        .iter()
        .filter(|u| u["state"] == "running")
        .flat_map(|u| u["members"].as_array().cloned().unwrap_or_default())
        .filter_map(|m| m["node_id"].as_str().map(str::to_string))
        .collect();
    let spare = (1..=4).map(|n| format!("node-{n}")).find(|n| !used.contains(n)).expect("a node without a unit");
    let v2_blob = up.agent_dir(&spare).join("artifacts").join(v2_digest.hex()).join("blob");
    assert!(!v2_blob.exists(), "{spare} holds v2 before it is warmed");
    let refused = up.cli().args(["artifact", "warm", "art", "--nodes", "gpu="]).output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("\"gpu=\" is not key=value"), "{refused:?}");
    let warmed = run_ok(up.cli().args(["artifact", "warm", "art", "--json", "--nodes", &spare]));
    let warmed: Value = serde_json::from_str(&warmed).unwrap();
    assert_eq!(warmed["artifacts"], 2, "{warmed}");
    let node = &warmed["nodes"][0];
    assert_eq!((node["node_id"].as_str(), node["error"].as_str()), (Some(spare.as_str()), None), "{warmed}");
    assert_eq!(node["ready"].as_u64().unwrap() + node["fetching"].as_u64().unwrap(), 2, "{warmed}");
    wait_for("v2 warmed on the spare node", Duration::from_secs(60), || v2_blob.exists().then_some(()));
    run_ok(up.cli().args(["scale", "art", "--units", "4"]));
    wait_for("four units running", Duration::from_secs(60), || {
        (up.units("art").iter().filter(|u| u["state"] == "running").count() == 4).then_some(())
    });

    // The wrong digest: the member fails naming both digests; nothing of it is cached.
    let failed = wait_for("the bad member failing", Duration::from_secs(60), || {
        members(&up, "bad")
            .into_iter()
            .find(|m| m["state"] == "failed" && m["message"].as_str().is_some_and(|t| t.contains("mismatch")))
    });
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains(&format!("artifact {wrong} sha256 mismatch (got {})", Digest::of(&bundle))), "{message}");
    let node = failed["node_id"].as_str().unwrap();
    assert!(!up.agent_dir(node).join("artifacts").join(wrong.hex()).exists(), "a wrong artifact stays cached");
    let text = run_ok(up.cli().args(["units", "bad"]));
    assert!(text.contains("sha256 mismatch"), "{text}");
}

#[test]
fn an_artifact_no_cache_can_hold_is_refused_at_apply_and_one_of_unknown_size_fails_its_member() {
    let dir = TempDir::new("artifacts-cap-files");
    // 3 MiB against agents whose caches hold 2 MiB.
    let big: Vec<u8> = (0..3u64 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8).collect();
    let big_digest = Digest::of(&big);
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    let url = http_origin(big.clone());
    let app = |artifact: &str| {
        format!(
            "name = \"cap\"\n[unit]\nworkers = 0\n[unit.head]\ncommand = \"sleep\"\nargs = [\"600\"]\ncpu = \"100m\"\n\
             memory = \"32Mi\"\n{artifact}[constraints]\nallow_low_priority = true\n[units]\nmin = 0\nmax = 2\ninitial = 1\n"
        )
    };
    let artifact = |source: &str| {
        format!(
            "[[unit.head.artifacts]]\nsource = \"{source}\"\nsha256 = \"{}\"\ndest = \"big.bin\"\n",
            big_digest.hex()
        )
    };
    let (v1, pushed, over_http) =
        (dir.path().join("v1.toml"), dir.path().join("pushed.toml"), dir.path().join("http.toml"));
    std::fs::write(&v1, app("")).unwrap();
    std::fs::write(&pushed, app(&artifact(&format!("flotilla://{big_digest}")))).unwrap();
    std::fs::write(&over_http, app(&artifact(&url))).unwrap();
    let up = Up::start_with_env(
        "artifacts-cap",
        &["--agents", "2", "--shards", "1", "--app", v1.to_str().unwrap()],
        &[("FLOTILLA_ARTIFACT_CACHE", "2Mi")],
    );
    wait_for("the first version running", Duration::from_secs(60), || {
        up.units("cap").iter().any(|u| u["state"] == "running").then_some(())
    });
    let nodes: Value = serde_json::from_str(&run_ok(up.cli().args(["nodes", "--json"]))).unwrap();
    let offered = |n: &Value| n["capacity"][flotilla_core::ARTIFACT_CACHE_RESOURCE].as_u64();
    let nodes = nodes.as_array().cloned().unwrap_or_default();
    assert!(nodes.len() == 2 && nodes.iter().all(|n| offered(n) == Some(2 << 20)), "{nodes:?}");

    // Pushed, its size is known: the apply is refused, naming what would not fit where.
    run_ok(up.cli().args(["artifact", "push"]).arg(dir.path().join("big.bin")));
    let refused = up.cli().arg("apply").arg(&pushed).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("unit.head.artifacts need 3 MiB of artifact cache (flotilla://{big_digest} (3 MiB))"))
            && stderr.contains("the largest is 2 MiB (node-"),
        "{stderr}"
    );
    let plan = up.cli().args(["apply", "--plan"]).arg(&pushed).output().unwrap();
    assert!(String::from_utf8_lossy(&plan.stderr).contains("need 3 MiB of artifact cache"), "{plan:?}");
    let metrics = metrics_page(up.addr.trim_start_matches("http://"));
    assert!(metric(&metrics, "flotilla_api_errors_total", "code=\"invalid_spec\"").unwrap_or(0.0) >= 2.0);

    // Over HTTP its size is not known before the fetch: the apply is taken and the member
    // fails with the reason, which `units` shows.
    run_ok(up.cli().arg("apply").arg(&over_http));
    let failed = wait_for("the member failing on the cache cap", Duration::from_secs(60), || {
        members(&up, "cap").into_iter().find(|m| {
            m["state"] == "failed" && m["message"].as_str().is_some_and(|t| t.contains("above the cache cap"))
        })
    });
    let message = failed["message"].as_str().unwrap();
    assert!(message.contains(&format!("artifact {big_digest} is ")) && message.contains("2097152 bytes"), "{message}");
}
