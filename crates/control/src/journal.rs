//! Events that last (`flotilla events`, `GET /v1/events/history`): node status changes,
//! unit transitions with their reasons, rollouts, autoscaling and pool decisions, and
//! operator actions with the token that made them, each with a sequence number.
//!
//! Kept in one redb file (`DATA/events.redb` for `up`), bounded by count and age
//! ([`Retention`]), or in memory when a process has no data dir. The live dashboard
//! stream (`/v1/events`) is another thing: it sends state, this keeps history.
//! [`crate::journal_watch`] turns state changes into events; handlers record what
//! operators did.

use crate::catalogue as m;
use flotilla_core::LockExt;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

const EVENTS: TableDefinition<u64, &str> = TableDefinition::new("events");

/// One event as kept and served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    pub seq: u64,
    pub at_unix_ms: u64,
    /// `node`, `unit`, `rollout`, `autoscaling`, `rebalance`, `pool`, or an operator action
    /// (`scale`, `apply`, `rollback`, `node_action`, `policy`, `pool_bounds`,
    /// `pool_floor`, `token`).
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The token that made an operator action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub message: String,
}

/// An event about to be recorded (its number and time are given then).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewEvent {
    pub kind: &'static str,
    pub app: Option<String>,
    pub node: Option<String>,
    pub unit: Option<String>,
    pub by: Option<String>,
    pub message: String,
}

impl NewEvent {
    pub fn new(kind: &'static str, message: impl Into<String>) -> NewEvent {
        NewEvent { kind, message: message.into(), ..Default::default() }
    }
    pub fn app(mut self, app: &str) -> NewEvent {
        self.app = Some(app.to_string());
        self
    }
    pub fn node(mut self, node: &str) -> NewEvent {
        self.node = Some(node.to_string());
        self
    }
    pub fn unit(mut self, unit: &str) -> NewEvent {
        self.unit = Some(unit.to_string());
        self
    }
    pub fn by(mut self, by: Option<String>) -> NewEvent {
        self.by = by;
        self
    }
}

/// How much history is kept: the newest `max_events`, none older than `max_age_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_events: u64,
    pub max_age_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { max_events: 100_000, max_age_ms: 7 * 86_400_000 }
    }
}

/// What `GET /v1/events/history` asks for. `after` pages forward by sequence number;
/// without it the newest `limit` matching events are returned.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub after: Option<u64>,
    pub since_unix_ms: Option<u64>,
    pub app: Option<String>,
    pub node: Option<String>,
    pub kind: Option<String>,
    pub limit: usize,
}

/// Most events one query returns.
pub const MAX_LIMIT: usize = 1_000;
/// Most events one query looks at (a filter that matches little stops here; a follower
/// goes on from where it stopped).
pub const MAX_SCANNED: usize = 100_000;

impl Query {
    fn matches(&self, e: &Event) -> bool {
        self.since_unix_ms.is_none_or(|t| e.at_unix_ms >= t)
            && self.app.as_ref().is_none_or(|a| e.app.as_ref() == Some(a))
            && self.node.as_ref().is_none_or(|n| e.node.as_ref() == Some(n))
            && self.kind.as_ref().is_none_or(|k| e.kind == *k)
    }
}

enum Backend {
    Memory(BTreeMap<u64, String>),
    /// Shared so a query reads without holding the writers' lock (redb readers see a
    /// snapshot).
    Redb(std::sync::Arc<Database>),
}

/// The events kept, and the number the next one gets.
pub struct Journal {
    inner: Mutex<(Backend, u64)>,
    retention: Retention,
}

impl Default for Journal {
    fn default() -> Self {
        Journal::memory(Retention::default())
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Journal {
    pub fn memory(retention: Retention) -> Journal {
        Journal { inner: Mutex::new((Backend::Memory(BTreeMap::new()), 1)), retention }
    }

    /// Opens (or creates) the file; numbering goes on after its newest event.
    pub fn open(path: &Path, retention: Retention) -> Result<Journal, String> {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| at(&e))?;
        }
        let db = Database::create(path).map_err(|e| at(&e))?;
        let w = db.begin_write().map_err(|e| at(&e))?;
        w.open_table(EVENTS).map_err(|e| at(&e))?;
        w.commit().map_err(|e| at(&e))?;
        let next = {
            let r = db.begin_read().map_err(|e| at(&e))?;
            let t = r.open_table(EVENTS).map_err(|e| at(&e))?;
            let kept = t.len().map_err(|e| at(&e))?;
            metrics::gauge!(m::JOURNAL_KEPT.name).set(kept as f64);
            t.last().map_err(|e| at(&e))?.map_or(1, |(k, _)| k.value() + 1)
        };
        Ok(Journal { inner: Mutex::new((Backend::Redb(std::sync::Arc::new(db)), next)), retention })
    }

    /// Records `events` in one write, in order. A store that refuses is logged and
    /// counted, never the caller's failure: history is a record, not the state.
    pub fn record(&self, events: Vec<NewEvent>) {
        if events.is_empty() {
            return;
        }
        let now = flotilla_core::system_ms();
        let mut g = self.inner.lock_or_recover();
        let (backend, next) = &mut *g;
        let first = *next;
        let rows: Vec<(u64, String, &'static str)> = events
            .into_iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let kind = e.kind;
                let ev = Event {
                    seq: first + i as u64,
                    at_unix_ms: now,
                    kind: kind.to_string(),
                    app: e.app,
                    node: e.node,
                    unit: e.unit,
                    by: e.by,
                    message: e.message,
                };
                serde_json::to_string(&ev).ok().map(|j| (ev.seq, j, kind))
            })
            .collect();
        let cutoff = now.saturating_sub(self.retention.max_age_ms);
        let result = match backend {
            Backend::Memory(map) => {
                for (seq, json, _) in &rows {
                    map.insert(*seq, json.clone());
                }
                trim_memory(map, self.retention.max_events, cutoff);
                Ok(map.len() as u64)
            }
            Backend::Redb(db) => write_redb(db, &rows, self.retention.max_events, cutoff),
        };
        match result {
            Ok(kept) => {
                *next = first + rows.len() as u64;
                for (_, _, kind) in &rows {
                    metrics::counter!(m::JOURNAL_RECORDED.name, "type" => *kind).increment(1);
                }
                metrics::gauge!(m::JOURNAL_KEPT.name).set(kept as f64);
            }
            Err(e) => {
                metrics::counter!(m::JOURNAL_ERRORS.name).increment(1);
                tracing::warn!(error = %e, events = rows.len(), "cannot record events");
            }
        }
    }

    /// An operator's action, with the name of the token that made it.
    pub fn action(&self, kind: &'static str, app: Option<&str>, by: Option<String>, message: String) {
        let mut e = NewEvent::new(kind, message).by(by);
        e.app = app.map(str::to_string);
        self.record(vec![e]);
    }

    /// The events `q` asks for, oldest first; the newest sequence number kept; and the
    /// last one looked at going forward (what a follower asks after next, so a filter
    /// that matches nothing is not scanned again from the same place).
    pub fn query(&self, q: &Query) -> Result<(Vec<Event>, u64, u64), String> {
        let limit = q.limit.clamp(1, MAX_LIMIT);
        let mut out = Vec::new();
        let mut scanned = 0usize;
        let mut last = q.after.unwrap_or(0);
        let mut take = |seq: u64, json: &str| -> bool {
            scanned += 1;
            last = last.max(seq);
            if let Ok(e) = serde_json::from_str::<Event>(json)
                && q.matches(&e)
            {
                out.push(e);
            }
            out.len() < limit && scanned < MAX_SCANNED
        };
        let (db, newest) = {
            let g = self.inner.lock_or_recover();
            let newest = g.1 - 1;
            match &g.0 {
                Backend::Memory(map) => {
                    match q.after {
                        Some(a) => {
                            for (k, j) in map.range(a.saturating_add(1)..) {
                                if !take(*k, j) {
                                    break;
                                }
                            }
                        }
                        None => {
                            for (k, j) in map.iter().rev() {
                                if !take(*k, j) {
                                    break;
                                }
                            }
                        }
                    }
                    (None, newest)
                }
                Backend::Redb(db) => (Some(db.clone()), newest),
            }
        };
        if let Some(db) = db {
            let r = db.begin_read().map_err(err)?;
            let t = r.open_table(EVENTS).map_err(err)?;
            match q.after {
                Some(a) => {
                    for row in t.range(a.saturating_add(1)..).map_err(err)? {
                        let (k, v) = row.map_err(err)?;
                        if !take(k.value(), v.value()) {
                            break;
                        }
                    }
                }
                None => {
                    for row in t.iter().map_err(err)?.rev() {
                        let (k, v) = row.map_err(err)?;
                        if !take(k.value(), v.value()) {
                            break;
                        }
                    }
                }
            }
        }
        if q.after.is_none() {
            out.reverse();
            last = newest;
        }
        Ok((out, newest, last))
    }
}

fn trim_memory(map: &mut BTreeMap<u64, String>, max: u64, cutoff_ms: u64) {
    while map.len() as u64 > max {
        map.pop_first();
    }
    while map.first_key_value().is_some_and(|(_, j)| at_of(j) < cutoff_ms) {
        map.pop_first();
    }
}

/// An event's time, read from its JSON without the rest.
fn at_of(json: &str) -> u64 {
    #[derive(Deserialize)]
    struct At {
        at_unix_ms: u64,
    }
    serde_json::from_str::<At>(json).map_or(0, |a| a.at_unix_ms)
}

/// Writes `rows` and drops what retention no longer keeps, in one transaction; the
/// count kept after.
fn write_redb(db: &Database, rows: &[(u64, String, &'static str)], max: u64, cutoff_ms: u64) -> Result<u64, String> {
    let w = db.begin_write().map_err(err)?;
    let kept = {
        let mut t = w.open_table(EVENTS).map_err(err)?;
        for (seq, json, _) in rows {
            t.insert(*seq, json.as_str()).map_err(err)?;
        }
        let mut len = t.len().map_err(err)?;
        let mut trimmed = 0u64;
        while len > 0 {
            let Some((seq, old)) = t.first().map_err(err)?.map(|(k, v)| (k.value(), at_of(v.value()))) else { break };
            if len <= max && old >= cutoff_ms {
                break;
            }
            t.remove(seq).map_err(err)?;
            len -= 1;
            trimmed += 1;
        }
        metrics::counter!(m::JOURNAL_TRIMMED.name).increment(trimmed);
        len
    };
    w.commit().map_err(err)?;
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(j: &Journal) {
        j.record(vec![
            NewEvent::new("node", "node-1: alive → dead").node("node-1"),
            NewEvent::new("scale", "echo: desired units 3").app("echo").by(Some("ops".into())),
        ]);
        j.record(vec![NewEvent::new("unit", "echo-1: queued → running").app("echo").unit("echo-1")]);
        let all = |q: Query| {
            let (e, n, _) = j.query(&Query { limit: 100, ..q }).unwrap();
            (e, n)
        };
        let (events, newest) = all(Query::default());
        assert_eq!(newest, 3);
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(events[1].by.as_deref(), Some("ops"));
        let (echo, _) = all(Query { app: Some("echo".into()), ..Default::default() });
        assert_eq!(echo.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), vec!["scale", "unit"]);
        let (node, _) = all(Query { node: Some("node-1".into()), ..Default::default() });
        assert_eq!(node.len(), 1);
        let (after, _) = all(Query { after: Some(1), kind: Some("unit".into()), ..Default::default() });
        assert_eq!(after.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3]);
        // Without `after`, the newest `limit` matching, oldest first.
        let (tail, _, _) = j.query(&Query { limit: 2, ..Default::default() }).unwrap();
        // Going forward, a filter that matches nothing still moves the follower on.
        let (none, _, next) =
            j.query(&Query { after: Some(0), kind: Some("nope".into()), limit: 10, ..Default::default() }).unwrap();
        assert!(none.is_empty());
        assert_eq!(next, 3);
        assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3]);
        let (none, _) = all(Query { since_unix_ms: Some(u64::MAX), ..Default::default() });
        assert!(none.is_empty());
    }

    #[test]
    fn events_are_numbered_filtered_and_paged_in_memory_and_on_disk() {
        exercise(&Journal::memory(Retention::default()));
        let dir = std::env::temp_dir().join(format!("flotilla-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("events.redb");
        exercise(&Journal::open(&path, Retention::default()).unwrap());
        // Reopened: the events are there and numbering goes on.
        let j = Journal::open(&path, Retention::default()).unwrap();
        j.record(vec![NewEvent::new("apply", "echo: version 2").app("echo")]);
        let (events, newest, _) = j.query(&Query { limit: 10, ..Default::default() }).unwrap();
        assert_eq!((events.len(), newest, events[3].seq), (4, 4, 4));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn retention_keeps_the_newest_and_drops_the_old() {
        let dir = std::env::temp_dir().join(format!("flotilla-journal-trim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let r = Retention { max_events: 5, max_age_ms: 86_400_000 };
        for j in [Journal::memory(r), Journal::open(&dir.join("e.redb"), r).unwrap()] {
            for i in 0..12 {
                j.record(vec![NewEvent::new("unit", format!("{i}"))]);
            }
            let (events, newest, _) = j.query(&Query { limit: 100, ..Default::default() }).unwrap();
            assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![8, 9, 10, 11, 12]);
            assert_eq!(newest, 12);
        }
        // Past their age: an event older than the cutoff goes at the next write.
        let old = Journal::memory(Retention { max_events: 100, max_age_ms: 0 });
        old.record(vec![NewEvent::new("unit", "a")]);
        std::thread::sleep(std::time::Duration::from_millis(5));
        old.record(vec![NewEvent::new("unit", "b")]);
        let (events, _, _) = old.query(&Query { limit: 100, ..Default::default() }).unwrap();
        assert_eq!(events.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(), vec!["b"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// `GET /v1/events/history`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventsPage {
    pub events: Vec<Event>,
    pub newest: u64,
    pub next_after: u64,
}

/// `GET /v1/events/history?after=SEQ&since=1h&app=A&node=N&type=T&limit=N`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct HistoryParams {
    /// Only events after this sequence number (page on with `next_after`).
    after: Option<u64>,
    /// Only events this recent: a duration back from now (`90s`, `10m`, `1h30m`, `7d`).
    since: Option<String>,
    app: Option<String>,
    node: Option<String>,
    #[serde(rename = "type")]
    #[param(rename = "type")]
    kind: Option<String>,
    /// How many (the newest without `after`): 1..1000, 100 by default.
    limit: Option<usize>,
}

pub fn routes() -> axum::Router<std::sync::Arc<crate::ControlState>> {
    axum::Router::new().route("/v1/events/history", axum::routing::get(history))
}

/// The kept events matching the filters, oldest first: after `after` (page forward
/// with the answer's `next_after`), else the newest `limit` (default 100, at most
/// 1,000). `{"events": [...], "newest": SEQ, "next_after": SEQ}`.
#[utoipa::path(get, path = "/v1/events/history", operation_id = "event_history", tag = "events", params(HistoryParams),
    responses((status = 200, body = EventsPage), (status = 400, description = "a bad parameter, named with what is accepted", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "event_history", skip_all)]
pub(crate) async fn history(
    axum::extract::State(s): axum::extract::State<std::sync::Arc<crate::ControlState>>,
    params: Result<axum::extract::Query<HistoryParams>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<EventsPage>, crate::ControlError> {
    use crate::ControlError::BadRequest;
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/events/history").increment(1);
    let accepted = "it takes after=SEQ, since=DURATION, app=, node=, type=, limit=1..1000";
    let axum::extract::Query(p) = params.map_err(|e| BadRequest(format!("{}; {accepted}", e.body_text())))?;
    let since_unix_ms = match &p.since {
        None => None,
        Some(text) => {
            let d = flotilla_core::duration::parse(text).map_err(|e| {
                BadRequest(format!("since={text:?}: {e}; write a duration back from now: 90s, 10m, 1h30m, 7d"))
            })?;
            Some(flotilla_core::system_ms().saturating_sub(d.as_millis() as u64))
        }
    };
    let limit = p.limit.unwrap_or(100);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(BadRequest(format!("limit={limit}: between 1 and {MAX_LIMIT}")));
    }
    let q = Query { after: p.after, since_unix_ms, app: p.app, node: p.node, kind: p.kind, limit };
    let journal = s.journal.clone();
    let (events, newest, next_after) = tokio::task::spawn_blocking(move || journal.query(&q))
        .await
        .map_err(|e| crate::ControlError::Storage(e.to_string()))?
        .map_err(crate::ControlError::Storage)?;
    Ok(axum::Json(EventsPage { events, newest, next_after }))
}
