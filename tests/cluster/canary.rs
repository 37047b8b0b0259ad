//! Progressive delivery through `flotilla route` under load (issue #41): a version that
//! fails requests and one that is slow are rolled back by their own numbers, a good one
//! is promoted through every step, and an operator promotes and aborts by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flotilla_testkit::{Group, TempDir, Up, get_text, metric, metrics_page, request, run_ok, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

/// The canary settings every test's new spec carries: short steps, few requests.
const CANARY: &str = "[rollout]\nstrategy = \"canary\"\nsteps = [\"20%\", \"50%\", \"100%\"]\nstep_interval = \"3s\"\n\
                      progress_deadline = \"60s\"\n";
/// A p99 ratio of 3: two loops of requests saturate 2 cores, and their scheduling stalls
/// are tens of milliseconds; the slow version is 30 ms against 1 ms (about 16×).
const ANALYSIS: &str = "[rollout.analysis]\nmax_error_rate = 0.05\nmax_p99_ratio = 3.0\nmin_requests = 30\n";

/// echo.toml whose head runs `echo-server` with `args`, with the canary settings and `extra`.
fn version(args: &str, extra: &str) -> String {
    let spec = std::fs::read_to_string(ECHO).unwrap();
    let head = format!("args = [\"echo-server\"{args}]");
    format!("{}\n{CANARY}{extra}{ANALYSIS}", spec.replacen("args = [\"echo-server\"]", &head, 1))
}

fn write(dir: &TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// `GET /v1/apps/echo/rollout` through the CLI.
fn status(up: &Up) -> Value {
    serde_json::from_str(&run_ok(up.cli().args(["rollout", "status", "echo", "--json"]))).unwrap()
}

/// A cluster with echo's two units running and a route proxy in front of them.
struct Bench {
    up: Up,
    procs: Group,
    proxy: String,
    metrics: String,
}

impl Bench {
    fn start(name: &str) -> Bench {
        let up = Up::start(name, &["--agents", "4", "--shards", "1", "--app", ECHO]);
        wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
        let mut procs = Group::new();
        let (proxy, metrics) = route(&up, &mut procs, "route.err", true);
        Bench { up, procs, proxy, metrics }
    }

    /// Requests through the proxy, one after another, until stopped.
    fn load(&self) -> Load {
        load_through(&self.proxy)
    }
}

/// A `flotilla route --app echo` following the stable endpoints (and any canary's): its
/// proxy and metrics addresses.
fn route(up: &Up, procs: &mut Group, log: &str, token: bool) -> (String, String) {
    // With the cluster's data dir the router's reports carry its API token; without it
    // (and no other token) they are refused.
    let data = if token { up.data.clone() } else { up.data.join("elsewhere") };
    let pid = procs.spawn_with_env(
        &["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"],
        &up.data.join(log),
        &[("FLOTILLA_ADDR", up.addr.as_str()), ("FLOTILLA_DATA", data.to_str().unwrap())],
    );
    let addrs = procs.addrs(pid);
    let proxy = addrs["listen"].as_str().unwrap().to_string();
    let metrics = addrs["metrics"].as_str().unwrap().to_string();
    wait_for("the proxy follows the endpoints", Duration::from_secs(20), || {
        metric(&get_text(&metrics, "/metrics")?, "flotilla_route_endpoints", "").filter(|n| *n >= 2.0)
    });
    (proxy, metrics)
}

/// Requests through `proxy`, one after another, until stopped.
fn load_through(proxy: &str) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, proxy) = (stop.clone(), proxy.to_string());
    let handle = std::thread::spawn(move || {
        let (mut ok, mut failed) = (0u64, 0u64);
        while !flag.load(Ordering::Relaxed) {
            if request(&proxy, "GET", "/who", "", "").status == 200 { ok += 1 } else { failed += 1 }
        }
        (ok, failed)
    });
    Load { stop, handle: Some(handle) }
}

struct Load {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(u64, u64)>>,
}

impl Load {
    /// Requests answered well and not.
    fn end(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits for the rollout to leave `in_progress`; its record (a failed canary's is
/// replaced at once by its revert's: see [`reverted`]).
fn ended(up: &Up, within: Duration) -> Value {
    wait_for("the rollout ends", within, || {
        let s = status(up);
        (s["rollout"]["state"] != "in_progress").then(|| s["rollout"].clone())
    })
}

/// The units of `template` that are not terminated.
fn of_template(up: &Up, template: &str) -> Vec<Value> {
    up.units("echo").into_iter().filter(|u| u["template"] == template && u["state"] != "terminated").collect()
}

/// `apps --json`'s row for echo.
fn echo_app(up: &Up) -> Value {
    let apps: Value = serde_json::from_str(&run_ok(up.cli().args(["apps", "--json"]))).unwrap();
    apps.as_array().unwrap().iter().find(|a| a["app"] == "echo").unwrap().clone()
}

/// The canary of `canary`'s template shifting traffic; its status.
fn shifting(up: &Up) -> Value {
    wait_for("the first step shifts traffic", Duration::from_secs(30), || {
        let s = status(up);
        s["canary"]["step_started_unix_ms"].as_u64().map(|_| s)
    })
}

/// Waits for the spec to be reverted to `stable` for a reason containing `why`; the reason.
fn reverted(up: &Up, stable: &str, why: &str, within: Duration) -> String {
    wait_for("the spec is reverted", within, || {
        let app = echo_app(up);
        let reason = app["spec"]["reason"].as_str().unwrap_or("");
        (app["spec"]["source"] == "revert" && app["spec"]["template"] == stable && reason.contains(why))
            .then(|| reason.to_string())
    })
}

/// The app runs `stable` again and `canary`'s units are gone; the routes split no more.
fn assert_reverted(b: &Bench, stable: &str, canary: &str) {
    wait_for("the new version's units are released", Duration::from_secs(20), || {
        of_template(&b.up, canary).is_empty().then_some(())
    });
    assert_eq!(running(&b.up).iter().filter(|u| u["template"] == stable).count(), 2, "the stable units serve on");
    let split = metric(&get_text(&b.metrics, "/metrics").unwrap(), "flotilla_route_split_share", "app=\"echo\"");
    assert_eq!(split, Some(0.0), "the routes split no more");
}

#[test]
fn a_failing_and_a_slow_version_are_rolled_back_by_their_own_numbers() {
    let dir = TempDir::new("canary-bad-specs");
    let b = Bench::start("canary-bad");
    let stable = status(&b.up)["template"].as_str().unwrap().to_string();
    let load = b.load();

    // 20 % of the new version's answers are 500s: the first step fails as soon as it has
    // its 30 requests, well within its 3 s.
    let bad = write(&dir, "bad.toml", &version(", \"--error-rate\", \"0.2\"", ""));
    let t0 = Instant::now();
    run_ok(b.up.cli().args(["apply", &bad]));
    let seen = shifting(&b.up);
    assert_eq!((seen["canary"]["step"].as_u64(), seen["canary"]["share"].as_f64()), (Some(1), Some(0.2)), "{seen}");
    assert_eq!(seen["canary"]["steps"], serde_json::json!(["20%", "50%", "100%"]));
    let canary = seen["rollout"]["template"].as_str().unwrap().to_string();
    let reason = reverted(&b.up, &stable, "error rate", Duration::from_secs(30));
    eprintln!("the failing version was rolled back after {:?}: {reason}", t0.elapsed());
    assert!(reason.contains("step 1 failed") && reason.contains("error rate"), "{reason}");
    assert!(reason.contains("max_error_rate 5.0%") && reason.contains("new: "), "{reason}");
    assert_reverted(&b, &stable, &canary);
    let (ok, errors) = load.end();
    eprintln!("{ok} answered, {errors} failed");
    assert!(errors > 0, "the new version had its share");
    assert!((errors as f64) < 0.05 * (ok + errors) as f64, "only the canary's share failed: {errors} of {ok}");
    // Nothing fails once it is gone.
    let load = b.load();
    std::thread::sleep(Duration::from_secs(2));
    let (ok, errors) = load.end();
    assert_eq!(errors, 0, "{ok} answered after the rollback");

    // The same app, a version 30 ms slower: judged at the step's end on the p99.
    let load = b.load();
    let slow = write(&dir, "slow.toml", &version(", \"--delay\", \"30ms\"", ""));
    run_ok(b.up.cli().args(["apply", &slow]));
    let slow_template = shifting(&b.up)["rollout"]["template"].as_str().unwrap().to_string();
    // The failing version's revert first: wait for this one's.
    let reason = reverted(&b.up, &stable, "max_p99_ratio", Duration::from_secs(40));
    assert!(reason.contains("max_p99_ratio 3"), "{reason}");
    assert_reverted(&b, &stable, &slow_template);
    let (_, errors) = load.end();
    assert_eq!(errors, 0, "slow, not failing");

    let page = metrics_page(&b.up.addr);
    assert_eq!(metric(&page, "flotilla_rollout_canary_verdicts_total", "verdict=\"aborted\""), Some(2.0));
    assert_eq!(metric(&page, "flotilla_rollouts_reverted_total", "app=\"echo\""), Some(2.0));
    let router = get_text(&b.metrics, "/metrics").unwrap();
    let label = format!("version=\"{slow_template}\"");
    assert!(metric(&router, "flotilla_route_version_requests_total", &label).is_some(), "per-version counters");
    let decisions = run_ok(b.up.cli().args(["decisions", "echo"]));
    assert!(decisions.contains("canary aborted"), "{decisions}");
    let events = run_ok(b.up.cli().args(["events", "--type", "rollout"]));
    assert!(events.contains("canary aborted: step 1 failed"), "{events}");
}

#[test]
fn a_good_version_is_promoted_through_every_step_without_a_failed_request() {
    let dir = TempDir::new("canary-good-specs");
    let b = Bench::start("canary-good");
    let load = b.load();
    let good = write(&dir, "good.toml", &version(", \"--delay\", \"0s\"", ""));
    run_ok(b.up.cli().args(["apply", &good]));
    let mut steps = std::collections::BTreeSet::new();
    let done = wait_for("the rollout completes", Duration::from_secs(90), || {
        let s = status(&b.up);
        if let Some(step) = s["canary"]["step"].as_u64() {
            steps.insert(step);
            // The stable units serve on beside the new version's until the promotion.
            let stable = running(&b.up).iter().filter(|u| u["template"] != s["rollout"]["template"]).count();
            assert_eq!(stable, 2, "step {step}: {:?}", b.up.units("echo"));
        }
        (s["rollout"]["state"] != "in_progress").then_some(s)
    });
    assert_eq!(done["rollout"]["state"], "complete", "{done}");
    assert!(done["rollout"]["canary"]["promoted"] == true, "{done}");
    assert!(steps.contains(&1) && steps.contains(&3), "every step was seen: {steps:?}");
    let template = done["rollout"]["template"].as_str().unwrap();
    let units = running(&b.up);
    assert_eq!(units.len(), 2);
    assert!(units.iter().all(|u| u["template"] == template), "{units:?}");
    let (ok, errors) = load.end();
    eprintln!("promoted; {ok} answered, {errors} failed");
    assert_eq!(errors, 0, "no request failed through the rollout ({ok} answered)");
    let decisions = run_ok(b.up.cli().args(["decisions", "echo"]));
    assert_eq!(decisions.matches("canary passed").count(), 2, "{decisions}");
    assert!(decisions.contains("canary promoted"), "{decisions}");
}

#[test]
fn an_operator_promotes_and_aborts_and_a_canary_without_traffic_waits() {
    let dir = TempDir::new("canary-manual-specs");
    let mut b = Bench::start("canary-manual");

    // No traffic: the step waits for its requests and says so, rather than promoting blind.
    // Promote and abort are what this test is about: latency does not fail it.
    let lenient = |text: String| text.replace("max_p99_ratio = 3.0", "max_p99_ratio = 100.0");
    let one = write(&dir, "one.toml", &lenient(version(", \"--delay\", \"0s\"", "auto_promote = false\n")));
    run_ok(b.up.cli().args(["apply", &one]));
    let why = wait_for("the step waits for requests", Duration::from_secs(40), || {
        status(&b.up)["canary"]["waiting"].as_str().filter(|w| w.contains("min_requests")).map(str::to_string)
    });
    assert!(why.contains("0 of 30 requests"), "{why}");
    let text = run_ok(b.up.cli().args(["rollout", "status", "echo"]));
    assert!(text.contains("canary step 1 of 3") && text.contains("waits: step 1 waits for min_requests"), "{text}");
    let apps = run_ok(b.up.cli().args(["apps"]));
    assert!(apps.contains("canary of template") && apps.contains("at step 1"), "{apps}");

    // With traffic through two routers (their numbers add up) it passes every step, then
    // waits at the last for a promote.
    let load = b.load();
    let (second, _) = route(&b.up, &mut b.procs, "route-2.err", true);
    let load_2 = load_through(&second);
    wait_for("both routers report", Duration::from_secs(30), || {
        (status(&b.up)["canary"]["routers"].as_u64() == Some(2)).then_some(())
    });
    // A router without a token cannot tell the scheduler anything.
    let (third, third_metrics) = route(&b.up, &mut b.procs, "route-3.err", false);
    let load_3 = load_through(&third);
    wait_for("its reports are refused", Duration::from_secs(30), || {
        let page = get_text(&third_metrics, "/metrics")?;
        metric(&page, "flotilla_route_traffic_reports_total", "outcome=\"failed\"").filter(|n| *n >= 1.0)
    });
    assert_eq!(load_3.end().1, 0, "it routes all the same");
    assert!(status(&b.up)["canary"]["routers"].as_u64() <= Some(2), "not counted");
    wait_for("waits for promote at the last step", Duration::from_secs(60), || {
        let s = status(&b.up);
        assert!(!s["canary"].is_null(), "the canary failed: {}", echo_app(&b.up)["spec"]);
        s["canary"]["waiting"].as_str().filter(|w| w.contains("rollout promote")).map(|_| ())
    });
    let routes = run_ok(b.up.cli().args(["routes", "echo"]));
    assert!(routes.contains("VERSION") && routes.contains("canary: 100.0% of requests to version"), "{routes}");
    let out = run_ok(b.up.cli().args(["rollout", "promote", "echo"]));
    assert!(out.contains("promoted"), "{out}");
    let done = ended(&b.up, Duration::from_secs(60));
    assert_eq!(done["state"], "complete", "{done}");
    let promoted = done["template"].as_str().unwrap().to_string();

    // Another version, aborted by hand at its first step: back to the one that ran.
    let two = write(&dir, "two.toml", &version(", \"--delay\", \"1ms\"", ""));
    run_ok(b.up.cli().args(["apply", &two]));
    wait_for("the first step runs", Duration::from_secs(30), || {
        status(&b.up)["canary"]["step_started_unix_ms"].as_u64().map(|_| ())
    });
    let canary = status(&b.up)["rollout"]["template"].as_str().unwrap().to_string();
    let out = run_ok(b.up.cli().args(["rollout", "abort", "echo"]));
    assert!(out.contains("rollout aborted by api-token at step 1"), "{out}");
    reverted(&b.up, &promoted, "rollout aborted by api-token at step 1", Duration::from_secs(10));
    assert_reverted(&b, &promoted, &canary);
    let (_, errors) = load.end();
    assert_eq!(errors, 0);
    assert_eq!(load_2.end().1, 0);
    // Nothing to promote or abort now.
    let out = b.up.cli().args(["rollout", "abort", "echo"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no canary rollout in progress"));
    let events = run_ok(b.up.cli().args(["events", "--type", "rollout_abort"]));
    assert!(events.contains("aborted its canary"), "{events}");
}
