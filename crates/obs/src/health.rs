//! `/healthz` and `/readyz`, served beside `/metrics` by every process, so an
//! orchestrator (Kubernetes probes) can tell a process that is alive from one that can
//! do its job.
//!
//! `/healthz` answers 200 while the process serves HTTP at all: a liveness probe that
//! fails means the process is wedged and should be restarted. `/readyz` answers 200 only
//! when every readiness gate the process registered holds (an agent registered with its
//! shard, a shard serving, a scheduler holding a view and its store, a router with a
//! route table), else 503 with a one-line JSON reason naming the first gate that does
//! not: the process is up but traffic (or a rollout) should wait.
//!
//! A process registers its gates on the process-wide [`readiness`] before it serves, so
//! `/readyz` is never briefly ready before the gates exist.

use std::sync::{Arc, Mutex, OnceLock};

use axum::http::StatusCode;

/// A test run on each `/readyz` request: `Err(reason)` while not ready.
type Check = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

enum Probe {
    /// Flipped by the process as things happen (see [`Flag`]).
    Flag(Arc<Mutex<Option<String>>>),
    /// Asked on every request, for state the process already keeps.
    Check(Check),
}

/// The readiness gates of one process. `/readyz` is ready when all of them are (a
/// process with none is ready as soon as it serves).
#[derive(Default)]
pub struct Readiness {
    gates: Mutex<Vec<(String, Probe)>>,
}

/// A gate a process opens and closes itself: [`Flag::ready`] when the condition holds,
/// [`Flag::not_ready`] with the reason when it stops holding.
#[derive(Clone)]
pub struct Flag(Arc<Mutex<Option<String>>>);

impl Flag {
    pub fn ready(&self) {
        *lock(&self.0) = None;
    }

    pub fn not_ready(&self, reason: impl Into<String>) {
        *lock(&self.0) = Some(reason.into());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves a plain value behind: still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Readiness {
    /// A new gate `name`, not ready for `reason` until the process says otherwise.
    pub fn flag(&self, name: &str, reason: impl Into<String>) -> Flag {
        let state = Arc::new(Mutex::new(Some(reason.into())));
        lock(&self.gates).push((name.to_string(), Probe::Flag(state.clone())));
        Flag(state)
    }

    /// A gate `name` decided by `check` on every `/readyz` request.
    pub fn check(&self, name: &str, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        lock(&self.gates).push((name.to_string(), Probe::Check(Box::new(check))));
    }

    /// `Ok` when every gate holds, else the first that does not as `NAME: REASON`.
    pub fn status(&self) -> Result<(), String> {
        for (name, probe) in lock(&self.gates).iter() {
            let result = match probe {
                Probe::Flag(state) => lock(state).clone().map_or(Ok(()), Err),
                Probe::Check(check) => check(),
            };
            if let Err(reason) = result {
                return Err(format!("{name}: {reason}"));
            }
        }
        Ok(())
    }
}

/// The process-wide gates that `/readyz` reports.
pub fn readiness() -> Arc<Readiness> {
    static GLOBAL: OnceLock<Arc<Readiness>> = OnceLock::new();
    GLOBAL.get_or_init(Default::default).clone()
}

/// `GET /healthz` and `GET /readyz` for the process-wide [`readiness`].
pub fn router() -> axum::Router {
    router_for(readiness())
}

/// `GET /healthz` and `GET /readyz` for `gates` (a test's own, or the process's).
pub fn router_for(gates: Arc<Readiness>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new().route("/healthz", get(|| async { "ok" })).route(
        "/readyz",
        get(move || {
            let gates = gates.clone();
            async move {
                let (status, body) = match gates.status() {
                    Ok(()) => (StatusCode::OK, serde_json::json!({"ready": true})),
                    Err(reason) => {
                        (StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"ready": false, "reason": reason}))
                    }
                };
                (status, [(axum::http::header::CONTENT_TYPE, "application/json")], format!("{body}\n"))
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_gate_holds_and_the_first_failing_one_is_named() {
        let r = Readiness::default();
        assert_eq!(r.status(), Ok(()), "no gates: ready");
        let registered = r.flag("registered", "not registered yet");
        let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = up.clone();
        r.check(
            "view",
            move || {
                if seen.load(std::sync::atomic::Ordering::Relaxed) { Ok(()) } else { Err("no view".into()) }
            },
        );
        assert_eq!(r.status(), Err("registered: not registered yet".into()));
        registered.ready();
        assert_eq!(r.status(), Err("view: no view".into()));
        up.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(r.status(), Ok(()));
        registered.not_ready("the shard went away");
        assert_eq!(r.status(), Err("registered: the shard went away".into()));
    }

    #[tokio::test]
    async fn readyz_answers_503_with_a_one_line_json_reason() {
        let gates = Arc::new(Readiness::default());
        let flag = gates.flag("shard", "starting");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding a loopback port");
        let addr = listener.local_addr().expect("the bound address");
        let app = router_for(gates);
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connecting");
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.expect("writing");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("reading");
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        let out = get("/readyz").await;
        assert!(out.starts_with("HTTP/1.1 503"), "{out}");
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
        assert_eq!(body.lines().count(), 1, "{body:?}");
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(v, serde_json::json!({"ready": false, "reason": "shard: starting"}));
        flag.ready();
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        server.abort();
    }
}
