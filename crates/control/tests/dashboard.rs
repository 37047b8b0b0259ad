//! The dashboard's server side over a real socket: the embedded page, the event
//! stream's snapshot and a change after it, node pages and their refusals, an app's
//! spec and a refused rollback, a pool's node type bounds, and a standalone scheduler
//! that does not answer, listed and streamed as unreachable.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use flotilla_control::{ControlState, HttpOptions};
use flotilla_core::{Labels, NodeId, Resources};
use flotilla_view::{ClusterView, NodeRecord, ShardView};
use serde_json::{Value, json};

fn node(id: &str, shard: u32, domain: &str, priority: Option<&str>) -> NodeRecord {
    let mut r = NodeRecord::blank(NodeId::new(id).unwrap());
    let mut l = Labels::new();
    l.insert("domain", domain).unwrap();
    if let Some(p) = priority {
        l.insert("priority", p).unwrap();
    }
    r.labels = Arc::new(l);
    r.shard = shard;
    r.capacity = Resources::new(4000, 8 << 30, 0).into();
    r
}

fn view(shard: u32, seq: u64, nodes: Vec<NodeRecord>) -> ShardView {
    let mut v = ShardView::empty(shard, 1);
    v.version.seq = seq;
    for n in nodes {
        v.insert(Arc::new(n));
    }
    v
}

const SPEC: &str = "name = \"echo\"\n[unit]\nworkers = 0\n[unit.head]\ncommand = \"sleep\"\ncpu = \"100m\"\n\
                    memory = \"1Mi\"\n[units]\nmin = 0\nmax = 4\ninitial = 0\n";

/// A control API over two shards' views (5 nodes) and one in-process app, `echo`, whose
/// scheduler runs against an empty cluster of its own (it places nothing). Token `secret`.
async fn start() -> (SocketAddr, Arc<ClusterView>, tokio::sync::oneshot::Sender<()>) {
    start_with(HttpOptions::default()).await
}

async fn start_with(options: HttpOptions) -> (SocketAddr, Arc<ClusterView>, tokio::sync::oneshot::Sender<()>) {
    flotilla_obs::metrics_handle();
    let cluster = ClusterView::new(2);
    cluster.install(
        0,
        view(0, 1, vec![node("n1", 0, "a", None), node("n2", 0, "a", Some("low")), node("n3", 0, "a", None)]),
        true,
    );
    cluster.install(1, view(1, 1, vec![node("n4", 1, "b", None), node("n5", 1, "b", None)]), true);
    let spec = flotilla_scheduler::AppSpec::parse(SPEC).unwrap();
    let store: Arc<dyn flotilla_scheduler::Store> = Arc::new(flotilla_scheduler::MemStore::default());
    let (scheduler, handle) = flotilla_scheduler::Scheduler::new(spec, ClusterView::new(0), vec![], store).unwrap();
    tokio::spawn(scheduler.run());
    let apps = flotilla_control::apps::Apps::default();
    apps.add_local(handle);
    let state = Arc::new(ControlState {
        cluster: cluster.clone(),
        shards: vec!["s0:1".into(), "s1:1".into()],
        api_token: flotilla_core::SharedToken::new(Some("secret".into())),
        tokens: Default::default(),
        journal: Default::default(),
        series: Default::default(),
        apps,
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
    (addr, cluster, stop)
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

#[tokio::test]
async fn the_page_and_its_files_are_served_with_their_types() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let r = http.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/html"));
    assert_eq!(header(&r, "cache-control"), "no-cache");
    // No other site frames the page; it runs only its own scripts (issue #35 item 8).
    assert_eq!(header(&r, "x-frame-options"), "DENY");
    assert!(header(&r, "content-security-policy").contains("frame-ancestors 'none'"));
    assert!(header(&r, "content-security-policy").contains("script-src 'self';"));
    assert_eq!(header(&r, "x-content-type-options"), "nosniff");
    assert!(r.text().await.unwrap().contains("<html"));
    let r = http.get(format!("http://{addr}/ui/app.js")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "text/javascript; charset=utf-8");
    assert_eq!(header(&r, "cache-control"), "no-cache");
    let r = http.get(format!("http://{addr}/ui/vendor/uPlot.min.css")).send().await.unwrap();
    assert!(header(&r, "content-type").starts_with("text/css"));
    let r = http.get(format!("http://{addr}/ui/nothing.js")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "not_found");
}

#[tokio::test]
async fn nodes_come_in_pages_filtered_and_bad_queries_are_named() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let get = |q: &str| http.get(format!("http://{addr}/v1/nodes{q}")).send();
    let r = get("").await.unwrap();
    assert_eq!(header(&r, "x-total-count"), "5");
    let all: Vec<Value> = r.json().await.unwrap();
    let ids: Vec<&str> = all.iter().map(|n| n["node_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["n1", "n2", "n3", "n4", "n5"]);
    assert_eq!(all[0]["labels"]["domain"], "a");

    let r = get("?offset=1&limit=2").await.unwrap();
    assert_eq!(header(&r, "x-total-count"), "5");
    let page: Vec<Value> = r.json().await.unwrap();
    assert_eq!(page.iter().map(|n| n["node_id"].as_str().unwrap()).collect::<Vec<_>>(), ["n2", "n3"]);
    let r = get("?offset=9&limit=2").await.unwrap();
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 0);

    let r = get("?domain=b&limit=10").await.unwrap();
    assert_eq!(header(&r, "x-total-count"), "2");
    let r = get("?priority=low").await.unwrap();
    assert_eq!(r.json::<Vec<Value>>().await.unwrap()[0]["node_id"], "n2");
    let r = get("?label=domain%3Da&status=alive&priority=high").await.unwrap();
    assert_eq!(header(&r, "x-total-count"), "2");

    for (q, named) in [
        ("?limit=0", "limit"),
        ("?limit=5001", "limit"),
        ("?status=sleepy", "status"),
        ("?colour=red", "colour"),
        ("?label=x", "label"),
    ] {
        let r = get(q).await.unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "bad_request", "{q}");
        assert!(v["error"]["message"].as_str().unwrap().contains(named), "{q}: {v}");
    }
    let metrics = http.get(format!("http://{addr}/metrics")).send().await.unwrap().text().await.unwrap();
    let bad = flotilla_testkit::metric(&metrics, "flotilla_http_requests_rejected_total", "reason=\"bad_query\"")
        .unwrap_or(0.0);
    assert!(bad >= 5.0, "{bad}");

    let one: Value = http.get(format!("http://{addr}/v1/nodes/n4")).send().await.unwrap().json().await.unwrap();
    assert_eq!((one["node_id"].as_str(), one["shard"].as_u64()), (Some("n4"), Some(1)));
    assert_eq!(one["members"], json!([]));
    let r = http.get(format!("http://{addr}/v1/nodes/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn an_apps_spec_is_shown_and_a_rollback_without_a_previous_one_is_a_conflict() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let r = http.get(format!("http://{addr}/v1/apps/echo/spec")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-flotilla-has-previous"), "false");
    assert!(header(&r, "content-type").starts_with("text/plain"));
    let text = r.text().await.unwrap();
    assert!(flotilla_scheduler::AppSpec::parse(&text).is_ok(), "{text}");

    let url = format!("http://{addr}/v1/apps/echo/rollback");
    assert_eq!(http.post(&url).send().await.unwrap().status(), 401);
    let r = http.post(&url).bearer_auth("secret").send().await.unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "no_previous_spec");
    let r = http.post(format!("http://{addr}/v1/apps/nope/rollback")).bearer_auth("secret").send().await.unwrap();
    assert_eq!(r.status(), 404);

    // After an apply, the old spec is there to go back to.
    let changed = SPEC.replace("100m", "200m");
    let r =
        http.put(format!("http://{addr}/v1/apps/echo/spec")).bearer_auth("secret").body(changed).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = http.get(format!("http://{addr}/v1/apps/echo/spec")).send().await.unwrap();
        if header(&r, "x-flotilla-has-previous") == "true" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the new spec never showed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = http.post(&url).bearer_auth("secret").send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_pools_node_type_bounds_are_checked_kept_and_handed_to_its_autoscaler() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let url = format!("http://{addr}/v1/pools/p/node_types/t");
    assert_eq!(http.put(&url).json(&json!({"min": 1, "max": 2})).send().await.unwrap().status(), 401);
    for bad in [json!({"min": 3, "max": 2}), json!({"min": 0, "max": 100_001}), json!({"min": 1})] {
        let r = http.put(&url).bearer_auth("secret").json(&bad).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    let r = http.put(&url).bearer_auth("secret").json(&json!({"min": 1, "max": 2})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report = json!({"instances": [], "node_types": [{"name": "t"}]});
    let r = http.post(format!("http://{addr}/v1/pools/p/report")).bearer_auth("secret").json(&report).send().await;
    let answer: Value = r.unwrap().json().await.unwrap();
    assert_eq!(answer["bounds"], json!({"t": {"min": 1, "max": 2}}));
    let answer = flotilla_pool::cluster::answer_of(&answer).unwrap();
    assert_eq!(answer.bounds["t"], flotilla_pool::cluster::TypeBounds { min: 1, max: 2 });
    let pool: Value = http.get(format!("http://{addr}/v1/pools/p")).send().await.unwrap().json().await.unwrap();
    assert_eq!(pool["bounds"]["t"]["max"], 2);
    // Once the pool has reported its types, a bound must name one of them.
    let r = http
        .put(format!("http://{addr}/v1/pools/p/node_types/u"))
        .bearer_auth("secret")
        .json(&json!({"min": 0, "max": 1}));
    assert_eq!(r.send().await.unwrap().status(), 400);
}

/// Reads SSE messages off `resp` until `stop` says so (or 10 s pass).
async fn read_events(
    resp: &mut reqwest::Response,
    buf: &mut String,
    mut stop: impl FnMut(&str, &Value) -> bool,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let msg: String = buf.drain(..end + 2).collect();
            let event = msg.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("").to_string();
            let data = msg.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("null");
            let data: Value = serde_json::from_str(data).unwrap();
            let done = stop(&event, &data);
            out.push((event, data));
            if done {
                return out;
            }
        }
        let chunk = tokio::time::timeout_at(deadline, resp.chunk()).await.expect("events in time").unwrap();
        buf.push_str(std::str::from_utf8(&chunk.expect("the stream stays open")).unwrap());
    }
}

/// A `nodes` message's columns as one row per node: `[id, status, shard, domain,
/// priority, health, cpu_cap, cpu_alloc, mem_cap, mem_alloc, gpu_cap, gpu_alloc, flags,
/// incarnation]`, strings and capacities looked up as the page does.
fn rows_of(msg: &Value) -> Vec<Value> {
    let col = |k: &str| msg[k].as_array().unwrap_or_else(|| panic!("column {k} in {msg}")).clone();
    let (strings, capacities) = (col("strings"), col("capacities"));
    let text = |k: &str, i: usize| strings[msg[k][i].as_u64().unwrap() as usize].clone();
    (0..col("id").len())
        .map(|i| {
            let cap = &capacities[msg["capacity"][i].as_u64().unwrap() as usize];
            json!([
                msg["id"][i],
                text("status", i),
                msg["shard"][i],
                text("domain", i),
                text("priority", i),
                msg["health"][i],
                cap[0],
                msg["cpu_alloc"][i],
                cap[1],
                msg["mem_alloc"][i],
                cap[2],
                msg["gpu_alloc"][i],
                msg["flags"][i],
                msg["incarnation"][i]
            ])
        })
        .collect()
}

#[tokio::test]
async fn the_event_stream_sends_a_snapshot_then_what_changed() {
    let (addr, cluster, _stop) = start().await;
    let mut resp = reqwest::get(format!("http://{addr}/v1/events")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "content-type"), "text/event-stream");
    let mut buf = String::new();
    let snap = read_events(&mut resp, &mut buf, |e, _| e == "snapshot_end").await;
    assert_eq!(snap[0], ("snapshot_begin".to_string(), json!({"nodes_total": 5, "ui": flotilla_control::ui::BUILD})));
    let rows: Vec<Value> = snap.iter().filter(|(e, _)| e == "nodes").flat_map(|(_, d)| rows_of(d)).collect();
    assert_eq!(rows.len(), 5);
    let ids: Vec<&str> = rows.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(ids, ["n1", "n2", "n3", "n4", "n5"], "a snapshot is by id");
    let n2 = rows.iter().find(|r| r[0] == "n2").unwrap();
    assert_eq!(*n2, json!(["n2", "alive", 0, "a", "low", 1.0, 4000, 0, 8u64 << 30, 0, 0, 0, 0, 1]));
    let fed = &snap.iter().find(|(e, _)| e == "federation").expect("a federation summary").1;
    assert_eq!(fed["domains"][0]["nodes"], json!({"alive": 3}));
    assert_eq!(fed["shards"][1]["address"], "s1:1");
    let app = &snap.iter().find(|(e, _)| e == "app").expect("the app").1;
    assert_eq!(app["app"], "echo");
    assert_eq!(app["summary"]["max_units"], 4);
    assert!(app["units"].is_array() && app["decisions"].is_array() && app["capacity"].is_object());

    // n3 is cordoned, n1 leaves: one `nodes` message with just that.
    let mut n3 = node("n3", 0, "a", None);
    n3.cordoned = true;
    cluster.install(0, view(0, 2, vec![node("n2", 0, "a", Some("low")), n3]), true);
    let after = read_events(&mut resp, &mut buf, |e, _| e == "nodes").await;
    let (_, nodes) = after.last().unwrap();
    assert_eq!(nodes["removed"], json!(["n1"]));
    let rows = rows_of(nodes);
    assert_eq!(rows.len(), 1, "{nodes}");
    assert_eq!(
        (rows[0][0].as_str(), rows[0][12].as_u64()),
        (Some("n3"), Some(u64::from(flotilla_control::events::CORDONED)))
    );

    let metrics = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    assert!(flotilla_testkit::metric(&metrics, "flotilla_events_snapshots_total", "").unwrap_or(0.0) >= 1.0);
    assert!(flotilla_testkit::metric(&metrics, "flotilla_events_subscribers", "").unwrap_or(0.0) >= 1.0);
}

/// A process hosting many apps registers them in one call, and `GET /v1/apps` asks it
/// once for all of them: the fake scheduler below answers two requests in all (the
/// registration's check and one listing), then is gone.
#[tokio::test]
async fn a_process_registers_its_apps_in_one_call_and_is_asked_once_for_them() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let register =
        |body: Value| http.post(format!("http://{addr}/v1/schedulers")).bearer_auth("secret").json(&body).send();
    let listed = r#"[{"app": "svc-a", "scheduler": {"instance": "p"}, "desired_units": 3},
                     {"app": "svc-b", "scheduler": {"instance": "p"}, "desired_units": 4},
                     {"app": "svc-d", "unreachable": true, "error": {"code": "forward_loop"}}]"#;
    let process = flotilla_testkit::answer_then_vanish(listed, 2);
    let r = register(json!({"apps": ["svc-a", "svc-b", "svc-c", "svc-d", "echo", "svc-a"], "url": process})).await;
    let r = r.unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["registered"], 2, "{body}");
    let refused: Vec<(&str, &str)> = body["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["app"].as_str().unwrap(), r["error"]["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        refused,
        [("echo", "conflict"), ("svc-c", "not_a_scheduler"), ("svc-d", "not_a_scheduler")],
        "echo runs here; svc-c is not listed; svc-d is listed without its scheduler: {body}"
    );
    assert!(body["refused"][2]["error"]["message"].as_str().unwrap().contains("forward_loop"), "{body}");

    let rows: Vec<Value> = http.get(format!("http://{addr}/v1/apps")).send().await.unwrap().json().await.unwrap();
    let by_app: Vec<(&str, Option<u64>, &str)> = rows
        .iter()
        .map(|a| (a["app"].as_str().unwrap(), a["desired_units"].as_u64(), a["scheduler_url"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        by_app,
        [("echo", Some(0), ""), ("svc-a", Some(3), process.as_str()), ("svc-b", Some(4), process.as_str())]
    );
    // Registered again (the process does so every few seconds): not checked again.
    let r = register(json!({"apps": ["svc-a", "svc-b"], "url": process})).await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"registered": 2, "refused": []}));
    // Gone now: both its apps are listed unreachable, from one failed ask.
    let rows: Vec<Value> = http.get(format!("http://{addr}/v1/apps")).send().await.unwrap().json().await.unwrap();
    assert!(rows[1..].iter().all(|a| a["unreachable"] == true && a["scheduler_url"] == process.as_str()), "{rows:?}");

    for (bad, why) in [
        (json!({"app": "x", "apps": ["y"], "url": process}), "not both"),
        (json!({"apps": [], "url": process}), "no app"),
        (json!({"apps": ["ok", "Not-a-name"], "url": process}), "Not-a-name"),
        (json!({"apps": vec!["a"; 10_001], "url": process}), "more than 10000"),
    ] {
        let r = register(bad).await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains(why), "{why}: {body}");
    }
}

/// The dashboard's stream reads a scheduler process's apps in one request: the fake
/// process answers two in all (the registration's check and one `?view=full` listing),
/// and both its apps are streamed whole from that one answer. A control plane lists
/// only its own apps that way.
#[tokio::test]
async fn the_stream_reads_a_process_apps_in_one_request() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let row = |app: &str, units: u32| {
        json!({"app": app, "scheduler": {"instance": "p"},
               "summary": {"app": app, "desired_units": units, "scheduler": {"instance": "p"}},
               "units": [{"unit_id": format!("{app}-1"), "state": "running", "domain": "a"}],
               "routes": {"app": app, "routes": []}, "decisions": [], "capacity": null})
    };
    let process = flotilla_testkit::answer_then_vanish(&json!([row("svc-a", 3), row("svc-b", 4)]).to_string(), 2);
    let r = http
        .post(format!("http://{addr}/v1/schedulers"))
        .bearer_auth("secret")
        .json(&json!({"apps": ["svc-a", "svc-b"], "url": process}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"registered": 2, "refused": []}));

    let mut resp = reqwest::get(format!("http://{addr}/v1/events")).await.unwrap();
    let mut buf = String::new();
    let mut apps = std::collections::BTreeMap::new();
    read_events(&mut resp, &mut buf, |e, d| {
        if e == "app" && d["app"] != "echo" {
            apps.insert(d["app"].as_str().unwrap().to_string(), d.clone());
        }
        apps.len() == 2
    })
    .await;
    for (app, units) in [("svc-a", 3), ("svc-b", 4)] {
        let v = &apps[app];
        assert_eq!(v["summary"]["desired_units"], units, "{v}");
        assert_eq!(v["summary"]["scheduler_url"], process.as_str(), "{v}");
        assert_eq!(v["units"][0]["unit_id"], format!("{app}-1"), "{v}");
    }

    let full: Vec<Value> =
        http.get(format!("http://{addr}/v1/apps?view=full")).send().await.unwrap().json().await.unwrap();
    assert_eq!(full.len(), 1, "only the apps this process runs: {full:?}");
    assert_eq!(full[0]["app"], "echo");
    for key in ["summary", "units", "routes", "decisions", "capacity"] {
        assert!(full[0].get(key).is_some(), "{key}: {}", full[0]);
    }
    let demand: Vec<Value> =
        http.get(format!("http://{addr}/v1/apps?view=demand")).send().await.unwrap().json().await.unwrap();
    let echo = &demand[0];
    assert_eq!((echo["app"].as_str(), echo["queued"]["primary"].as_u64()), (Some("echo"), Some(0)), "{echo}");
    assert!(echo["unit_shape"].is_object() && echo.get("spec").is_none(), "{echo}");
    for bad in ["view=everything", "full=true"] {
        assert_eq!(http.get(format!("http://{addr}/v1/apps?{bad}")).send().await.unwrap().status(), 400, "{bad}");
    }
}

#[tokio::test]
async fn an_unreachable_standalone_scheduler_is_listed_and_streamed_as_unreachable() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let register = |app: &str, url: &str| {
        http.post(format!("http://{addr}/v1/schedulers"))
            .bearer_auth("secret")
            .json(&json!({"app": app, "url": url}))
            .send()
    };
    // A name that would steer the URL the control plane fetches is refused.
    assert_eq!(register("../../x", "http://127.0.0.1:7899").await.unwrap().status(), 400);
    // A URL that does not answer as the app's scheduler is refused, and counted.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let r = register("ghost", &format!("http://{closed}")).await.unwrap();
    assert_eq!(r.status(), 422);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_a_scheduler", "{body}");
    let wrong_app = flotilla_testkit::answer_then_vanish(r#"[{"app": "other", "scheduler": {"instance": "a"}}]"#, 1);
    assert_eq!(register("ghost", &wrong_app).await.unwrap().status(), 422);
    // One that answers, then goes away.
    let ghost = flotilla_testkit::answer_then_vanish(r#"[{"app": "ghost", "scheduler": {"instance": "a"}}]"#, 1);
    assert_eq!(register("ghost", &ghost).await.unwrap().status(), 204);
    // Re-registering the same URL is not checked again (it no longer answers).
    assert_eq!(register("ghost", &ghost).await.unwrap().status(), 204);
    let page = flotilla_obs::metrics_handle().render();
    let count = |result: &str| {
        flotilla_testkit::metric(
            &page,
            "flotilla_control_scheduler_registrations_total",
            &format!("result=\"{result}\""),
        )
    };
    assert!(count("refused").unwrap_or(0.0) >= 2.0 && count("accepted").unwrap_or(0.0) >= 1.0, "{page}");

    let r = http.get(format!("http://{addr}/v1/apps")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let rows: Vec<Value> = r.json().await.unwrap();
    assert_eq!(rows.iter().map(|a| a["app"].as_str().unwrap()).collect::<Vec<_>>(), ["echo", "ghost"]);
    assert!(rows[0].get("unreachable").is_none());
    assert_eq!(rows[1]["unreachable"], true);
    assert_eq!(rows[1]["scheduler_url"], ghost.as_str());
    assert_eq!(rows[1]["error"]["code"], "scheduler_unreachable");

    // The dashboard's stream shows it too, with the same summary.
    let mut resp = reqwest::get(format!("http://{addr}/v1/events")).await.unwrap();
    let mut buf = String::new();
    let seen = read_events(&mut resp, &mut buf, |e, d| e == "app" && d["app"] == "ghost").await;
    let (_, app) = seen.last().unwrap();
    assert_eq!(app["summary"]["unreachable"], true, "{app}");
    assert_eq!(app["units"], json!([]));
}

/// Issue #35 item 2: one address cannot take every stream place. Its 17th stream is
/// refused (429, saying so), while another address still gets one; a closed stream
/// gives its place back.
#[tokio::test]
async fn one_address_cannot_take_every_event_stream() {
    let (addr, _cluster, _stop) = start().await;
    let from = |ip: &str| {
        let local: std::net::IpAddr = ip.parse().unwrap();
        reqwest::Client::builder().local_address(local).build().unwrap()
    };
    let one = from("127.0.0.1");
    let url = format!("http://{addr}/v1/events");
    let mut held = Vec::new();
    for i in 0..flotilla_control::events::MAX_PER_PEER {
        let r = one.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "stream {i}");
        held.push(r);
    }
    let refused = one.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("from this address"), "{body}");
    assert_eq!(from("127.0.0.2").get(&url).send().await.unwrap().status(), 200, "another address gets in");
    drop(held.pop());
    let again = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let r = one.get(&url).send().await.unwrap();
            if r.status() == 200 {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert_eq!(again.await.expect("the place comes back").status(), 200);
}

/// Issue #35 item 4: a scheduler registered with the control plane's own URL is refused
/// at registration (its check is forwarded once, comes back marked, and is refused
/// there); and a request that arrives marked as forwarded (as one that came through a
/// replica's registration would) is never forwarded again: no loop of requests.
#[tokio::test]
async fn a_scheduler_registered_with_the_control_planes_own_url_makes_no_loop() {
    let (addr, _c, _stop) = start().await;
    let http = reqwest::Client::new();
    let own = format!("http://{addr}");
    let register = |app: &str, url: &str| {
        http.post(format!("{own}/v1/schedulers")).bearer_auth("secret").json(&json!({"app": app, "url": url})).send()
    };
    let r = register("zzz", &own).await.unwrap();
    assert_eq!(r.status(), 422);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("no_such_app"), "{body}");
    // Registered once as a scheduler that answers, zzz cannot move to the own URL either.
    let real = flotilla_testkit::answer_then_vanish(r#"[{"app": "zzz", "scheduler": {"instance": "a"}}]"#, 1);
    assert_eq!(register("zzz", &real).await.unwrap().status(), 204);
    let r = register("zzz", &own).await.unwrap();
    assert_eq!(r.status(), 422);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("forward_loop"), "{body}");

    let before = served(&own, "/v1/apps/{app}/units").await;
    let marked = |path: &str| http.get(format!("{own}{path}")).header(flotilla_control::limits::HOP_HEADER, "1").send();
    let r = marked("/v1/apps/zzz/units").await.unwrap();
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("forwarded"), "{body}");
    assert_eq!(served(&own, "/v1/apps/{app}/units").await - before, 1.0, "no forward");
    for path in ["/v1/apps/zzz", "/v1/apps/zzz/spec"] {
        assert_eq!(marked(path).await.unwrap().status(), 409, "{path}");
    }
    let r = http
        .put(format!("{own}/v1/apps/zzz/scale"))
        .header(flotilla_control::limits::HOP_HEADER, "1")
        .bearer_auth("secret")
        .json(&json!({"units": 2}))
        .send()
        .await;
    assert_eq!(r.unwrap().status(), 409);
}

/// How many requests the API (in this process) served on `route`.
async fn served(_base: &str, route: &str) -> f64 {
    let page = flotilla_obs::metrics_handle().render();
    page.lines()
        .filter(|l| l.starts_with("flotilla_api_requests_total") && l.contains(&format!("route=\"{route}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Issue #35 item 2: a client that opens the event stream and never reads holds nothing
/// for long. Its snapshot fills the socket, the write waits past the stall time, and
/// the server closes the connection: its descriptor is freed and the refusal counted.
#[tokio::test]
async fn a_stream_nobody_reads_is_closed_and_its_descriptor_freed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let options = HttpOptions { write_stall: Duration::from_millis(500), ..Default::default() };
    let (addr, cluster, _stop) = start_with(options).await;
    // A snapshot of 100,000 nodes: megabytes, far more than the sockets buffer.
    let many: Vec<NodeRecord> = (0..100_000).map(|i| node(&format!("m{i}"), 0, "a", None)).collect();
    cluster.install(0, view(0, 2, many), true);
    let fds = || std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    let before = fds();
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut client = sock.connect(addr).await.unwrap();
    client.write_all(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let stalled = || {
        let page = flotilla_obs::metrics_handle().render();
        flotilla_testkit::metric(&page, "flotilla_http_requests_rejected_total", "reason=\"write_stalled\"")
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while stalled().unwrap_or(0.0) < 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "the stalled write was never cut");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server's end is closed: only the client's socket is left of the two.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fds() > before + 1 {
        assert!(tokio::time::Instant::now() < deadline, "{} descriptors, {before} before", fds());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Reading now drains what the buffers held, then ends.
    let mut buf = vec![0u8; 64 * 1024];
    let read_all = async {
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_all).await.expect("the connection ends");
}
