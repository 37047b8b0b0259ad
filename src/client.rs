//! Client commands: they find the control plane at `$FLOTILLA_ADDR` (`https://` when it
//! serves HTTPS, trusting the CA in `--ca` / `$FLOTILLA_CA`; without a scheme,
//! `http://` is assumed). Every command takes `--json`; the actions (`scale`, `apply`,
//! `node drain`) take `--wait` too (see [`crate::wait`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

use crate::table::Table;
use crate::wait::{WaitArgs, wait_until};

const DEFAULT_ADDR: &str = "http://127.0.0.1:7700";

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The control plane's address (`http://` is assumed when it has no scheme).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
}

/// The control plane's base URL from `--addr` / `$FLOTILLA_ADDR`: `127.0.0.1:7700`
/// means `http://127.0.0.1:7700` (as `up` prints it, but without the scheme people
/// leave off); anything that is still no URL is named in the error.
pub fn base_url(addr: &str) -> anyhow::Result<String> {
    let addr = addr.trim();
    let with_scheme = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    let url = reqwest::Url::parse(&with_scheme).map_err(|e| {
        anyhow::anyhow!(
            "the control plane address {addr:?} (--addr or $FLOTILLA_ADDR) is not a URL like http://127.0.0.1:7700: {e}"
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        bail!(
            "the control plane address {addr:?} (--addr or $FLOTILLA_ADDR) is not an http:// or https:// URL with a host"
        );
    }
    Ok(with_scheme.trim_end_matches('/').to_string())
}

/// An HTTP client that also trusts the certificates in `ca` (PEM) for HTTPS. Without
/// `ca` it trusts no certificate authority at all: plain HTTP only.
pub fn http_client(ca: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading the CA file {}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("parsing the CA file {}", ca.display()))?;
        if certs.is_empty() {
            bail!("the CA file {} holds no PEM certificate", ca.display());
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().context("building the HTTP client")
}

/// The control plane as one command talks to it: its base URL and a client.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    client: reqwest::Client,
}

impl Api {
    pub fn new(addr: &str, ca: Option<&Path>) -> anyhow::Result<Api> {
        Ok(Api { base: base_url(addr)?, client: http_client(ca)? })
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        send(self.client.get(&url), &self.base).await.with_context(|| url.clone())
    }

    async fn write(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Body>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let req = self.client.request(method, &url).bearer_auth(token);
        let req = match body {
            Some(Body::Json(v)) => req.json(&v),
            Some(Body::Text(t)) => req.body(t),
            None => req,
        };
        send(req, &self.base).await
    }
}

pub async fn get(a: &ListArgs, path: &str) -> anyhow::Result<Value> {
    Api::new(&a.addr, a.ca.as_deref())?.get(path).await
}

/// The control plane answered with an error status (as opposed to not answering):
/// `--wait` gives up at once on a 4xx, where waiting cannot help.
#[derive(Debug)]
pub struct Refused {
    pub status: reqwest::StatusCode,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Refused {}

/// Sends a request to the control plane; its JSON answer, or its error message.
async fn send(req: reqwest::RequestBuilder, addr: &str) -> anyhow::Result<Value> {
    let hint = if addr.starts_with("https://") {
        " (set FLOTILLA_ADDR; for HTTPS, --ca or $FLOTILLA_CA names the CA that signed its certificate)"
    } else {
        " (set FLOTILLA_ADDR)"
    };
    let resp = req.send().await.with_context(|| format!("reaching the control plane at {addr}{hint}"))?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let message = body.pointer("/error/message").and_then(Value::as_str).unwrap_or("no message").to_string();
        return Err(Refused { status, message }.into());
    }
    Ok(body)
}

/// Prints `v` as pretty JSON on stdout.
pub fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn gib(bytes: u64) -> String {
    format!("{:.1}Gi", bytes as f64 / (1u64 << 30) as f64)
}

/// A node's STATUS as kubectl shows `Ready,SchedulingDisabled`: its liveness, then
/// `cordoned` or `draining` when an operator set them.
pub fn node_status(r: &Value) -> String {
    let base = r["status"].as_str().unwrap_or("unknown");
    let drain = r["drain_requested"] == true;
    let extra = if drain && base != "draining" {
        ",draining"
    } else if r["cordoned"] == true && !drain {
        ",cordoned"
    } else {
        ""
    };
    format!("{base}{extra}")
}

/// `used/total` of one resource of a node row, CPU in millicores, memory in GiB.
fn allocation(r: &Value, key: &str) -> String {
    let n = |p: &str| r.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (used, total) = (n(&format!("/allocated/{key}")), n(&format!("/capacity/{key}")));
    if key == "cpu_millis" {
        format!("{used}m/{total}m")
    } else {
        format!("{:.1}/{}", used as f64 / (1u64 << 30) as f64, gib(total))
    }
}

pub async fn nodes(a: ListArgs) -> anyhow::Result<()> {
    let v = get(&a, "/v1/nodes").await?;
    if a.json {
        return print_json(&v);
    }
    let rows = v.as_array().cloned().unwrap_or_default();
    let mut t = Table::new(&["NODE", "STATUS", ">SHARD", "DOMAIN", "PRIO", ">CPU", ">MEMORY", ">MEMBERS", ">HEALTH"]);
    for r in &rows {
        let s = |p: &str| r.pointer(p).and_then(Value::as_str).unwrap_or("-").to_string();
        t.row(vec![
            s("/node_id"),
            node_status(r),
            r["shard"].as_u64().unwrap_or(0).to_string(),
            r.pointer("/labels/domain").and_then(Value::as_str).unwrap_or("default").to_string(),
            s("/labels/priority"),
            allocation(r, "cpu_millis"),
            allocation(r, "memory_bytes"),
            r["workloads"].as_u64().map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
            format!("{:.2}", r.pointer("/health/score").and_then(Value::as_f64).unwrap_or(0.0)),
        ]);
    }
    t.print();
    println!("{} nodes", rows.len());
    // A drain that waits says why, under the table (one request per draining node).
    for r in rows.iter().filter(|r| r["drain_requested"] == true) {
        let Some(id) = r["node_id"].as_str() else { continue };
        if let Ok(v) = get(&a, &format!("/v1/nodes/{id}")).await {
            for line in drain_waiting(&v) {
                println!("{id}: {line}");
            }
        }
    }
    Ok(())
}

/// The token given on the command line or in `$FLOTILLA_TOKEN`, else the one in the data dir.
fn token(given: Option<String>) -> anyhow::Result<String> {
    match given {
        Some(t) => Ok(t),
        None => token_from_data().map_err(|e| {
            anyhow::anyhow!(
                "no API token: {e:#}. Set $FLOTILLA_TOKEN or --token, or $FLOTILLA_DATA to the data dir \
                 of the cluster (`flotilla up` writes DATA/api-token)"
            )
        }),
    }
}

/// `$FLOTILLA_DATA`, else `./.flotilla`.
pub fn data_dir() -> std::path::PathBuf {
    std::env::var_os("FLOTILLA_DATA").map(Into::into).unwrap_or_else(|| "./.flotilla".into())
}

/// The API token from `$FLOTILLA_DATA/api-token` (default data dir `./.flotilla`).
pub fn token_from_data() -> anyhow::Result<String> {
    let path = data_dir().join("api-token");
    let t = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?.trim().to_string();
    anyhow::ensure!(!t.is_empty(), "{} is empty", path.display());
    Ok(t)
}

#[derive(Debug, Args)]
pub struct UnitsArgs {
    /// The app.
    pub app: String,
    #[command(flatten)]
    pub list: ListArgs,
}

pub async fn apps(a: ListArgs) -> anyhow::Result<()> {
    let v = get(&a, "/v1/apps").await?;
    if a.json {
        return print_json(&v);
    }
    let mut t = Table::new(&["APP", ">DESIRED", ">MIN", ">MAX", "POLICY", "SPEC", "SCHEDULER", "UNITS BY STATE"]);
    let mut decisions = Vec::new();
    for r in v.as_array().cloned().unwrap_or_default() {
        let n = |p: &str| r.pointer(p).and_then(Value::as_u64).unwrap_or(0).to_string();
        let states = r["units"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        // A standalone scheduler the control plane could not reach: say so, with why.
        let states = match r["unreachable"].as_bool() {
            Some(true) => {
                format!("unreachable: {}", r.pointer("/error/message").and_then(Value::as_str).unwrap_or("?"))
            }
            _ => states,
        };
        let a = &r["autoscaling"];
        let policy = match (a["policy_name"].as_str(), a["policy"].as_str()) {
            (Some(name), _) => name.to_string(),
            (None, Some(p)) => p.to_string(),
            (None, None) if a.is_null() => "-".to_string(),
            (None, None) => "(unknown)".to_string(),
        };
        let app = r["app"].as_str().unwrap_or("-").to_string();
        if r["store"]["healthy"] == Value::Bool(false) {
            let error = r["store"]["error"].as_str().unwrap_or("?");
            decisions.push(format!(
                "{app}: store failing: {error} (changes are refused with store_unavailable; the scheduler reopens it and resumes by itself)"
            ));
        }
        if let Some(d) = a.get("last_decision").filter(|d| !d.is_null()) {
            let action = d["action"].as_str().unwrap_or("-");
            decisions.push(format!("{app}: last decision: {action}: {}", d["explanation"].as_str().unwrap_or("")));
        }
        decisions.extend(rollout_lines(&app, &r));
        let source = r.pointer("/spec/source").and_then(Value::as_str).unwrap_or("-").to_string();
        // The instance serving the app; `(standby)` while it holds no lease.
        let scheduler = match (
            r.pointer("/scheduler/instance").and_then(Value::as_str),
            r.pointer("/scheduler/role").and_then(Value::as_str),
        ) {
            (Some(i), Some("active")) => i.to_string(),
            (Some(i), Some(role)) => {
                if let Some(why) = r.pointer("/scheduler/waiting").and_then(Value::as_str) {
                    decisions.push(format!("{app}: scheduler {i} is a {role}: {why}"));
                }
                format!("{i} ({role})")
            }
            _ => "-".to_string(),
        };
        t.row(vec![app, n("/desired_units"), n("/min_units"), n("/max_units"), policy, source, scheduler, states]);
    }
    t.print();
    for d in decisions {
        println!("{d}");
    }
    Ok(())
}

/// What `apps` says under the table about an app's spec and rollout: a rollout in
/// progress or failed (with why), and why a spec was reverted.
fn rollout_lines(app: &str, r: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    if r.pointer("/spec/source").and_then(Value::as_str) == Some("revert") {
        let why = r.pointer("/spec/reason").and_then(Value::as_str).unwrap_or("");
        lines.push(format!("{app}: spec reverted to the last one that ran: {why}"));
    }
    let template = r.pointer("/rollout/template").and_then(Value::as_str).unwrap_or("-");
    match r.pointer("/rollout/state").and_then(Value::as_str) {
        Some("in_progress") => lines.push(format!("{app}: rollout of template {template} in progress")),
        Some("failed") => {
            let why = r.pointer("/rollout/reason").and_then(Value::as_str).unwrap_or("");
            lines.push(format!("{app}: rollout of template {template} failed: {why}"));
        }
        _ => {}
    }
    lines
}

pub async fn units(a: UnitsArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/units", a.app)).await?;
    if a.list.json {
        return print_json(&v);
    }
    let mut t = Table::new(&["UNIT", "STATE", "DOMAIN", ">GEN", "MEMBERS"]);
    let mut why = Vec::new();
    for u in v.as_array().cloned().unwrap_or_default() {
        let members: Vec<String> = u["members"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| format!("{}@{}", m["member"].as_str().unwrap_or("?"), m["node_id"].as_str().unwrap_or("-")))
            .collect();
        let id = u["unit_id"].as_str().unwrap_or("-").to_string();
        if let Some(r) = u["unplaced_reason"].as_str() {
            why.push(format!("{id}: why: {r}"));
        }
        // A member that waits (start order), or cannot start (no free port): why.
        for m in u["members"].as_array().into_iter().flatten() {
            let state = m["state"].as_str().unwrap_or("");
            if let Some(msg) = m["message"].as_str().filter(|_| matches!(state, "waiting" | "failed")) {
                let member = m["member"].as_str().unwrap_or("?");
                why.push(format!("{id}: {member} {state}: {}", msg.lines().last().unwrap_or(msg)));
            }
        }
        if let Some(n) = u["placement_note"].as_str() {
            why.push(format!("{id}: note: {n}"));
        }
        for m in u["surge"].as_array().into_iter().flatten() {
            let s = |k: &str| m[k].as_str().unwrap_or("-").to_string();
            why.push(format!(
                "{id}: surge: {}@{} {} (replaces its {})",
                s("member"),
                s("node_id"),
                s("state"),
                s("member")
            ));
        }
        t.row(vec![
            id,
            u["state"].as_str().unwrap_or("-").to_string(),
            u["domain"].as_str().unwrap_or("-").to_string(),
            u["generation"].as_u64().unwrap_or(0).to_string(),
            members.join(" "),
        ]);
    }
    t.print();
    for w in why {
        println!("{w}");
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    pub action: NodeAction,
    /// The control plane's address (`http://` is assumed when it has no scheme).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = DEFAULT_ADDR, global = true)]
    pub addr: String,
    /// The API token (default: $FLOTILLA_TOKEN, else $FLOTILLA_DATA/api-token).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// Print the control plane's answer as JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum NodeAction {
    /// No new placements on NODE; what runs there stays.
    Cordon { node: String },
    /// Cordon NODE, replace the members it runs elsewhere first, then stop them.
    Drain {
        node: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Allow placements on NODE again (ends a drain too).
    Uncordon { node: String },
}

pub async fn node(a: NodeArgs) -> anyhow::Result<()> {
    let api = Api::new(&a.addr, a.ca.as_deref())?;
    let token = token(a.token)?;
    let (verb, node, wait) = match &a.action {
        NodeAction::Cordon { node } => ("cordon", node, None),
        NodeAction::Drain { node, wait } => ("drain", node, Some(wait)),
        NodeAction::Uncordon { node } => ("uncordon", node, None),
    };
    let body = api.write(reqwest::Method::POST, &format!("/v1/nodes/{node}/{verb}"), &token, None).await?;
    let state = match (body["cordoned"] == true, body["drain_requested"] == true) {
        (_, true) => "draining: its members move elsewhere, then stop",
        (true, false) => "cordoned",
        (false, _) => "uncordoned",
    };
    if !a.json {
        println!("{node}: {state}");
    }
    if let Some(w) = wait.filter(|w| w.wait) {
        let done = wait_until(w.timeout, &format!("the drain of {node}"), || drain_progress(&api, node)).await?;
        if !a.json {
            println!("{done}");
        }
    }
    if a.json {
        print_json(&body)?;
    }
    Ok(())
}

/// Where a drain of `node` stands: done when no member runs there and nothing is
/// allocated on it (or the node left the view).
async fn drain_progress(api: &Api, node: &str) -> anyhow::Result<(bool, String)> {
    let v = match api.get(&format!("/v1/nodes/{node}")).await {
        Err(e) if e.downcast_ref::<Refused>().is_some_and(|r| r.status == reqwest::StatusCode::NOT_FOUND) => {
            return Ok((true, format!("{node}: drained (it left the cluster)")));
        }
        other => other?,
    };
    let members: Vec<String> = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or("?");
            format!("{}/{}/{}", s("app"), s("unit_id"), s("member"))
        })
        .collect();
    let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (cpu, mem, workloads) = (n("/allocated/cpu_millis"), n("/allocated/memory_bytes"), n("/workloads"));
    if members.is_empty() && cpu == 0 && mem == 0 && workloads == 0 {
        return Ok((true, format!("{node}: drained, no member runs there")));
    }
    let mut line = format!("{node}: {}, {} member(s) left", node_status(&v), members.len().max(workloads as usize));
    if !members.is_empty() {
        let shown: Vec<&str> = members.iter().take(3).map(String::as_str).collect();
        let more = if members.len() > 3 { ", …" } else { "" };
        line.push_str(&format!(" ({}{more})", shown.join(", ")));
    }
    line.push_str(&format!(", {cpu}m CPU and {} allocated", gib(mem)));
    for w in drain_waiting(&v) {
        line.push_str(&format!("; {w}"));
    }
    Ok((false, line))
}

/// Why a drain waits, one line per unit, from a `GET /v1/nodes/{node}` answer.
fn drain_waiting(v: &Value) -> Vec<String> {
    v.pointer("/drain/waiting")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|w| {
            let s = |k: &str| w[k].as_str().unwrap_or("?");
            format!("drain waits on {}/{}: {}", s("app"), s("unit_id"), s("reason"))
        })
        .collect()
}

/// Where a mutating command sends its request, and with which token.
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// The control plane's address (`http://` is assumed when it has no scheme).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// The API token (default: $FLOTILLA_TOKEN, else $FLOTILLA_DATA/api-token).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
    /// Print the control plane's answer as JSON.
    #[arg(long)]
    pub json: bool,
}

impl WriteArgs {
    pub fn api(&self) -> anyhow::Result<Api> {
        Api::new(&self.addr, self.ca.as_deref())
    }

    /// `PUT path` with the token and `body` (JSON or TOML text); the control plane's answer.
    pub async fn put(&self, path: &str, body: Body) -> anyhow::Result<Value> {
        let api = self.api()?;
        let token = token(self.token.clone())?;
        api.write(reqwest::Method::PUT, path, &token, Some(body)).await
    }
}

pub enum Body {
    Json(Value),
    Text(String),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("size").required(true).args(["units", "min", "auto"])))]
pub struct ScaleArgs {
    /// The app.
    pub app: String,
    /// The desired number of units (on an autoscaled app: its floor and ceiling).
    #[arg(long)]
    pub units: Option<u32>,
    /// On an autoscaled app: the fewest units its policy may choose (with --max).
    #[arg(long, requires = "max")]
    pub min: Option<u32>,
    /// On an autoscaled app: the most units its policy may choose (with --min).
    #[arg(long, requires = "min")]
    pub max: Option<u32>,
    /// On an autoscaled app: lift the floor and ceiling set before.
    #[arg(long)]
    pub auto: bool,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
}

pub async fn scale(a: ScaleArgs) -> anyhow::Result<()> {
    let body = match (a.units, a.min, a.max) {
        (Some(n), _, _) => serde_json::json!({"units": n}),
        (None, Some(min), Some(max)) => serde_json::json!({"min": min, "max": max}),
        _ => serde_json::json!({"auto": true}),
    };
    let answer = a.write.put(&format!("/v1/apps/{}/scale", a.app), Body::Json(body)).await?;
    if !a.write.json {
        match (answer.get("desired_units"), answer.get("override")) {
            (Some(n), _) => println!("{}: desired units {n}", a.app),
            (None, Some(Value::Null)) => println!("{}: the autoscaling policy decides alone again", a.app),
            (None, Some(o)) => println!("{}: the policy decides within {}..={}", a.app, o["floor"], o["ceiling"]),
            (None, None) => println!("{}: {answer}", a.app),
        }
    }
    if a.wait.wait {
        // Until the app's status shows the new size, its old one may look finished.
        let want: Box<dyn Fn(u64) -> bool + Send + Sync> = match (a.units, a.min, a.max) {
            (Some(n), _, _) => Box::new(move |d| d == u64::from(n)),
            (None, Some(min), Some(max)) => Box::new(move |d| (u64::from(min)..=u64::from(max)).contains(&d)),
            _ => Box::new(|_| true),
        };
        let api = a.write.api()?;
        let what = format!("{} to reach its desired units", a.app);
        let done = wait_until(a.wait.timeout, &what, || app_progress(&api, &a.app, None, &*want)).await?;
        if !a.write.json {
            println!("{done}");
        }
    }
    if a.write.json {
        print_json(&answer)?;
    }
    Ok(())
}

/// How an app's units stand against its desired count, as one line; done when
/// `running == desired` and nothing is queued, starting or stopping. With
/// `template`, only units of that spec template count as running (`apply --wait`),
/// and none of an older one may be left.
async fn app_progress(
    api: &Api,
    app: &str,
    template: Option<&str>,
    want: &(dyn Fn(u64) -> bool + Send + Sync),
) -> anyhow::Result<(bool, String)> {
    let summary = api.get(&format!("/v1/apps/{app}")).await?;
    let units = api.get(&format!("/v1/apps/{app}/units")).await?;
    if let Some(t) = template
        && let Some(why) = rollout_failed(&summary, t)
    {
        // Waiting cannot help: give up at once, as on a 4xx.
        return Err(Refused { status: reqwest::StatusCode::CONFLICT, message: why }.into());
    }
    let desired = summary["desired_units"].as_u64().unwrap_or(0);
    let p = UnitCounts::of(units.as_array().map(Vec::as_slice).unwrap_or_default(), template);
    let done = want(desired) && p.done(desired);
    Ok((done, p.line(app, desired, template.is_some())))
}

/// Why the rollout to `template` cannot finish, from the app's summary: it failed, or
/// the app reverted to another spec.
fn rollout_failed(summary: &Value, template: &str) -> Option<String> {
    let r = &summary["rollout"];
    if r["template"].as_str() == Some(template) && r["state"] == "failed" {
        return Some(format!("the rollout failed: {}", r["reason"].as_str().unwrap_or("")));
    }
    let spec = &summary["spec"];
    if spec["source"] == "revert" && spec["template"].as_str().is_some_and(|t| t != template) {
        return Some(format!("the app reverted to the last spec that ran: {}", spec["reason"].as_str().unwrap_or("")));
    }
    None
}

/// An app's units by what `--wait` reports of them.
#[derive(Debug, Default, PartialEq)]
pub struct UnitCounts {
    pub running: u64,
    /// Placing, allocated, starting or degraded.
    pub starting: u64,
    pub queued: u64,
    /// Draining or stopping, or replaced and about to be.
    pub stopping: u64,
    /// Active but on an older spec template (apply).
    pub old: u64,
    pub failed: u64,
    /// Why a queued unit is not placed, when its scheduler said.
    pub why_queued: Option<String>,
}

impl UnitCounts {
    pub fn of(units: &[Value], template: Option<&str>) -> UnitCounts {
        let mut c = UnitCounts::default();
        for u in units {
            let state = u["state"].as_str().unwrap_or("");
            let replaced = !u["replaced_by"].is_null();
            let current = template.is_none_or(|t| u["template"].as_str() == Some(t));
            match state {
                "terminated" => {}
                "failed" => c.failed += 1,
                "draining" | "stopping" => c.stopping += 1,
                _ if replaced => c.stopping += 1,
                _ if !current => c.old += 1,
                "running" => c.running += 1,
                "queued" => {
                    c.queued += 1;
                    if c.why_queued.is_none() {
                        c.why_queued = u["unplaced_reason"].as_str().map(str::to_string);
                    }
                }
                _ => c.starting += 1,
            }
        }
        c
    }

    pub fn done(&self, desired: u64) -> bool {
        self.running == desired && self.starting == 0 && self.queued == 0 && self.stopping == 0 && self.old == 0
    }

    /// `echo: 3/6 units running, 1 starting, 2 queued`.
    pub fn line(&self, app: &str, desired: u64, rollout: bool) -> String {
        let new = if rollout { " on the new spec" } else { "" };
        let mut s = format!("{app}: {}/{desired} units running{new}", self.running);
        for (n, what) in [
            (self.starting, "starting"),
            (self.queued, "queued"),
            (self.old, "on the old spec"),
            (self.stopping, "stopping"),
            (self.failed, "failed"),
        ] {
            if n > 0 {
                s.push_str(&format!(", {n} {what}"));
            }
        }
        if let Some(why) = &self.why_queued {
            s.push_str(&format!(" (queued: {why})"));
        }
        s
    }
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The app's spec (TOML); the app it names is updated.
    pub file: std::path::PathBuf,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Checks the spec here (every problem at once), then hands it to the app's scheduler,
/// which rolls changed units through, `rollout.max_unavailable` at a time.
pub async fn apply(a: ApplyArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let spec = flotilla_scheduler::AppSpec::parse(&text).with_context(|| a.file.display().to_string())?;
    let body = a.write.put(&format!("/v1/apps/{}/spec", spec.name), Body::Text(text)).await?;
    if !a.write.json {
        println!("{}: {}", spec.name, body["result"].as_str().unwrap_or("applied"));
    }
    if a.wait.wait {
        // The scheduler marks each unit with the fingerprint of the template it was
        // started from; the rollout is over when every unit has this one and runs.
        let fingerprint = spec.template_fingerprint();
        let api = a.write.api()?;
        let what = format!("the rollout of {}", spec.name);
        let any = |_: u64| true;
        let done =
            wait_until(a.wait.timeout, &what, || app_progress(&api, &spec.name, Some(&fingerprint), &any)).await?;
        if !a.write.json {
            println!("{done}");
        }
    }
    if a.write.json {
        print_json(&body)?;
    }
    Ok(())
}

pub async fn routes(a: UnitsArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/routes", a.app)).await?;
    if a.list.json {
        return print_json(&v);
    }
    let mut t = Table::new(&["ENDPOINT", "NODE", "UNIT", ">WEIGHT"]);
    for r in v["routes"].as_array().cloned().unwrap_or_default() {
        t.row(vec![
            r["endpoint"].as_str().unwrap_or("-").to_string(),
            r["node_id"].as_str().unwrap_or("-").to_string(),
            r["unit_id"].as_str().unwrap_or("-").to_string(),
            format!("{:.2}", r["weight"].as_f64().unwrap_or(0.0)),
        ]);
    }
    t.print();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn addresses_without_a_scheme_are_http_and_bad_ones_are_named() {
        assert_eq!(base_url("127.0.0.1:7700").unwrap(), "http://127.0.0.1:7700");
        assert_eq!(base_url("https://cp.example:7700/").unwrap(), "https://cp.example:7700");
        assert_eq!(base_url("localhost:7700").unwrap(), "http://localhost:7700");
        let e = base_url("ftp://x").unwrap_err().to_string();
        assert!(e.contains("\"ftp://x\""), "{e}");
        let e = base_url("http://").unwrap_err().to_string();
        assert!(e.contains("\"http://\"") && e.contains("FLOTILLA_ADDR"), "{e}");
    }

    #[test]
    fn a_node_status_says_cordoned_or_draining_like_kubectl() {
        let row = |s: &str, c: bool, d: bool| json!({"status": s, "cordoned": c, "drain_requested": d});
        assert_eq!(node_status(&row("alive", false, false)), "alive");
        assert_eq!(node_status(&row("alive", true, false)), "alive,cordoned");
        assert_eq!(node_status(&row("alive", true, true)), "alive,draining");
        assert_eq!(node_status(&row("suspect", true, false)), "suspect,cordoned");
        assert_eq!(node_status(&row("draining", true, true)), "draining");
        assert_eq!(node_status(&row("dead", false, false)), "dead");
    }

    #[test]
    fn unit_counts_decide_when_a_wait_is_over() {
        let u = |state: &str, template: &str| json!({"state": state, "template": template, "replaced_by": null});
        let units = vec![u("running", "b"), u("running", "a"), u("queued", "b"), u("terminated", "a")];
        let c = UnitCounts::of(&units, None);
        assert_eq!((c.running, c.queued), (2, 1));
        assert!(!c.done(2));
        assert_eq!(c.line("echo", 3, false), "echo: 2/3 units running, 1 queued");
        let c = UnitCounts::of(&units, Some("b"));
        assert_eq!((c.running, c.old, c.queued), (1, 1, 1));
        assert!(!c.done(2));
        let mut replaced = u("running", "a");
        replaced["replaced_by"] = json!("echo-9");
        let c = UnitCounts::of(&[u("running", "b"), u("running", "b"), replaced], Some("b"));
        assert_eq!((c.running, c.stopping), (2, 1));
        assert!(!c.done(2));
        assert!(UnitCounts::of(&[u("running", "b"), u("running", "b")], Some("b")).done(2));
    }
}
