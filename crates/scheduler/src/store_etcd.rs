//! The distributed store: an app's state in etcd, one key per record.
//!
//! Key layout, under `PREFIX/apps/APP/`:
//!
//! | key | value |
//! |---|---|
//! | `meta/spec`, `meta/previous_spec`, `meta/good_spec` | spec TOML |
//! | `meta/desired`, `meta/desired_secondary`, `meta/next_generation`, `meta/fencing_token` | decimal |
//! | `meta/override`, `meta/spec_origin`, `meta/rollout` | JSON |
//! | `meta/file_fingerprint` | text |
//! | `units/UNIT_ID` | a unit record (JSON) |
//! | `intents/TXN_ID` | an intent (JSON) |
//! | `decisions/SEQ` (20 digits) | an autoscaling decision (JSON) |
//! | `versions/N` (20 digits) | a spec version (JSON: the spec, its origin, its template) |
//! | `leader` | the active scheduler's lease key (not state: see `flotilla_etcd`) |
//!
//! One record per key keeps every put small (a unit is well under 1 KiB), so a pass's
//! writes are one transaction of one operation per record written, and a load is one
//! paged range read. etcd refuses a transaction of more than 128 operations
//! (`--max-txn-ops`) or 1.5 MiB (`--max-request-bytes`) by default, so a batch beyond
//! [`MAX_TXN_OPS`] operations or [`MAX_TXN_BYTES`] is split into several transactions,
//! written in order: the `meta/` keys and versions first (the generation counter goes
//! ahead before any unit that uses it; a spec lands with its version), then intents, units
//! and decisions. A crash between two of
//! them leaves records that are each whole and a counter that is never behind: units
//! whose record did not land are re-queued, claims without a record are released by the
//! orphan sweep, so a split batch never places anything twice. A pass of up to about
//! 100 records (every pass but a mass placement) is one transaction.
//!
//! Fencing: once [`EtcdStore::fence`] names the lease this scheduler holds, every
//! transaction also requires the lease key's create revision to equal its token, so a
//! deposed scheduler cannot write either, however late its request arrives.
//!
//! The `Store` trait is synchronous and is called from the scheduler's async tasks, so
//! etcd is driven by a thread of its own with its own single-threaded runtime, owning
//! the client; callers send it requests over a channel and wait for the answer (as they
//! wait for an fsync with redb), and never run a runtime inside a runtime worker.

use crate::catalogue as m;
use flotilla_core::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_etcd::etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use flotilla_etcd::{Endpoints, Lease, within};

use crate::store::{DECISIONS_KEPT, Intent, SpecVersion, Store, StoreError, Stored, UnitRecord, VERSIONS_KEPT, Write};

/// Operations per transaction at most: below etcd's default `--max-txn-ops` (128), with
/// room for the fence comparison.
pub const MAX_TXN_OPS: usize = 100;
/// Bytes of keys and values per transaction at most: below etcd's default
/// `--max-request-bytes` (1.5 MiB).
pub const MAX_TXN_BYTES: usize = 1 << 20;
/// Keys per page of a load.
const PAGE: i64 = 500;

/// One key's new value, or its deletion.
#[derive(Debug, Clone, PartialEq)]
struct Op {
    key: String,
    value: Option<String>,
}

/// What the etcd thread is asked.
enum Job {
    Load { app: String, reply: std::sync::mpsc::SyncSender<Result<Stored, StoreError>> },
    Txns { txns: Vec<Vec<Op>>, fence: Option<Lease>, reply: std::sync::mpsc::SyncSender<Result<(), StoreError>> },
    Probe { reply: std::sync::mpsc::SyncSender<Result<(), StoreError>> },
}

/// The etcd store of one app: its fence, over a connection (a thread and a client)
/// that the apps of one process share ([`EtcdStore::sharing`]). Every call is one request
/// to that thread.
pub struct EtcdStore {
    conn: Arc<Connection>,
    fence: Mutex<Option<Lease>>,
}

/// What the apps of one process share: the etcd thread and what it last said.
struct Connection {
    prefix: String,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    failing: Arc<Mutex<Option<String>>>,
    /// When etcd last answered a probe: each app's pass probes with an empty write, and
    /// one answer a second serves all of them.
    probed: Mutex<Option<std::time::Instant>>,
    timeout: Duration,
}

/// How long one probe's answer stands for every app of the connection.
const PROBE_FRESH: Duration = Duration::from_secs(1);

impl EtcdStore {
    /// A store on `endpoints` under `prefix` (see [`flotilla_etcd::check_prefix`]). Does
    /// not wait for etcd: an unreachable etcd shows as [`Store::failing`] and as errors.
    pub fn open(endpoints: &Endpoints, prefix: &str, timeout: Duration) -> Result<EtcdStore, StoreError> {
        flotilla_etcd::check_prefix(prefix).map_err(|e| StoreError(e.to_string()))?;
        let (jobs, rx) = tokio::sync::mpsc::unbounded_channel();
        let endpoints = endpoints.clone();
        let failing = Arc::new(Mutex::new(None));
        let prefix = prefix.trim_end_matches('/').to_string();
        std::thread::Builder::new()
            .name("etcd-store".into())
            .spawn({
                let failing = failing.clone();
                let prefix = prefix.clone();
                move || serve(endpoints, prefix, timeout, rx, failing)
            })
            .map_err(|e| StoreError(format!("starting the etcd store's thread: {e}")))?;
        metrics::gauge!(m::STORE_HEALTHY.name).set(1.0);
        let conn = Connection { prefix, jobs, failing, probed: Mutex::new(None), timeout };
        Ok(EtcdStore { conn: Arc::new(conn), fence: Mutex::new(None) })
    }

    /// Another app's store on this one's connection, with a fence of its own: a process
    /// hosting many apps (`scheduler --apps-dir`) runs one etcd thread and client, not
    /// one per app.
    pub fn sharing(&self) -> EtcdStore {
        EtcdStore { conn: self.conn.clone(), fence: Mutex::new(None) }
    }

    /// Whether a probe answered within [`PROBE_FRESH`] and nothing failed since.
    fn probe_fresh(&self) -> bool {
        self.conn.failing.lock_or_recover().is_none()
            && self.conn.probed.lock_or_recover().is_some_and(|t| t.elapsed() < PROBE_FRESH)
    }

    /// From now on every write requires `lease` to still be this scheduler's: its key's
    /// create revision must equal its token. A refused write marks the lease lost.
    pub fn fence(&self, lease: Lease) {
        *self.fence.lock_or_recover() = Some(lease);
    }

    /// `PREFIX/apps/APP/`.
    fn app_prefix(&self, app: &str) -> String {
        format!("{}/apps/{app}/", self.conn.prefix)
    }

    fn ask<T>(
        &self,
        job: impl FnOnce(std::sync::mpsc::SyncSender<Result<T, StoreError>>) -> Job,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.conn.jobs.send(job(tx)).map_err(|_| StoreError("the etcd store's thread stopped".into()))?;
        // The thread bounds each request by `timeout`; a load pages, so allow it more.
        let timeout = self.conn.timeout;
        rx.recv_timeout(timeout * 4 + Duration::from_secs(1))
            .map_err(|_| StoreError(format!("etcd did not answer within {:?}", timeout * 4)))?
    }

    /// The operations of `batch`: one per key, the last write of a key winning (etcd
    /// refuses a transaction that names a key twice), meta keys first.
    fn ops(&self, app: &str, batch: &[Write]) -> Result<Vec<Op>, StoreError> {
        let base = self.app_prefix(app);
        let mut order: Vec<String> = Vec::new();
        let mut last: HashMap<String, Option<String>> = HashMap::new();
        let mut put = |key: String, value: Option<String>| {
            if !last.contains_key(&key) {
                order.push(key.clone());
            }
            last.insert(key, value);
        };
        for w in batch {
            let meta = |name: &str| format!("{base}meta/{name}");
            match w {
                Write::Spec(t) => put(meta("spec"), Some(t.clone())),
                Write::PreviousSpec(t) => put(meta("previous_spec"), Some(t.clone())),
                Write::DesiredUnits(n) => put(meta("desired"), Some(n.to_string())),
                Write::DesiredSecondary(n) => put(meta("desired_secondary"), Some(n.to_string())),
                Write::Override(o) => put(meta("override"), Some(json(o)?)),
                Write::Decision(seq, text) => {
                    put(format!("{base}decisions/{seq:020}"), Some(text.clone()));
                    let old = seq.wrapping_sub(DECISIONS_KEPT as u64);
                    put(format!("{base}decisions/{old:020}"), None);
                }
                Write::Version(v) => {
                    put(format!("{base}versions/{:020}", v.version), Some(json(v)?));
                    let old = v.version.wrapping_sub(VERSIONS_KEPT);
                    put(format!("{base}versions/{old:020}"), None);
                }
                Write::NextGeneration(g) => put(meta("next_generation"), Some(g.to_string())),
                Write::FencingToken(t) => put(meta("fencing_token"), Some(t.to_string())),
                Write::Unit(u) => put(format!("{base}units/{}", u.unit_id), Some(json(u)?)),
                Write::DeleteUnit(id) => put(format!("{base}units/{id}"), None),
                Write::Intent(i) => put(format!("{base}intents/{}", i.txn_id), Some(json(i)?)),
                Write::DeleteIntent(id) => put(format!("{base}intents/{id}"), None),
                Write::SpecOrigin(o) => put(meta("spec_origin"), Some(json(o)?)),
                Write::FileFingerprint(f) => put(meta("file_fingerprint"), Some(f.clone())),
                Write::GoodSpec(t) => put(meta("good_spec"), Some(t.clone())),
                Write::Rollout(r) => put(meta("rollout"), Some(json(r)?)),
            }
        }
        let rank = |k: &str| {
            let rest = &k[base.len()..];
            // A spec and its version go together (the same rank keeps the batch's order, and
            // an apply's batch is far below one transaction's bounds).
            match rest {
                r if r.starts_with("meta/") || r.starts_with("versions/") => 0,
                r if r.starts_with("intents/") => 1,
                r if r.starts_with("units/") => 2,
                r if r.starts_with("decisions/") => 3,
                _ => 4,
            }
        };
        let mut ops: Vec<Op> = order.into_iter().map(|key| Op { value: last.remove(&key).flatten(), key }).collect();
        // Stable: within a kind, keys keep the batch's order.
        ops.sort_by_key(|o| rank(&o.key));
        Ok(ops)
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError(e.to_string()))
}

/// Splits `ops` into transactions of at most [`MAX_TXN_OPS`] operations and
/// [`MAX_TXN_BYTES`] bytes, in order. A single operation larger than the byte bound is
/// an error: etcd would refuse it.
fn split(ops: Vec<Op>) -> Result<Vec<Vec<Op>>, StoreError> {
    let mut txns: Vec<Vec<Op>> = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let size = op.key.len() + op.value.as_ref().map_or(0, String::len);
        if size > MAX_TXN_BYTES {
            return Err(StoreError(format!("{}: {size} bytes, more than etcd takes in one request", op.key)));
        }
        match txns.last_mut() {
            Some(t) if t.len() < MAX_TXN_OPS && bytes + size <= MAX_TXN_BYTES => {
                bytes += size;
                t.push(op);
            }
            _ => {
                bytes = size;
                txns.push(vec![op]);
            }
        }
    }
    Ok(txns)
}

/// Fills `s` from one key below the app's prefix (`rest` is the key without it).
fn load_key(s: &mut Stored, rest: &str, value: &str) -> Result<(), StoreError> {
    let bad = |e: &dyn std::fmt::Display| StoreError(format!("{rest}: {e}"));
    if let Some(name) = rest.strip_prefix("meta/") {
        match name {
            "spec" => s.spec = Some(value.to_string()),
            "previous_spec" => s.previous_spec = Some(value.to_string()),
            "desired" => s.desired_units = value.parse().ok(),
            "desired_secondary" => s.desired_secondary = value.parse().ok(),
            "override" => s.override_bounds = serde_json::from_str(value).map_err(|e| bad(&e))?,
            "next_generation" => s.next_generation = value.parse().unwrap_or(0),
            "fencing_token" => s.fencing_token = value.parse().unwrap_or(0),
            "spec_origin" => s.spec_origin = serde_json::from_str(value).ok(),
            "file_fingerprint" => s.file_fingerprint = Some(value.to_string()),
            "good_spec" => s.good_spec = Some(value.to_string()),
            "rollout" => s.rollout = serde_json::from_str(value).ok(),
            _ => {}
        }
    } else if rest.starts_with("units/") {
        let u: UnitRecord = serde_json::from_str(value).map_err(|e| bad(&e))?;
        s.units.insert(u);
    } else if rest.starts_with("intents/") {
        let i: Intent = serde_json::from_str(value).map_err(|e| bad(&e))?;
        s.intents.insert(i.txn_id.clone(), i);
    } else if let Some(Ok(seq)) = rest.strip_prefix("decisions/").map(str::parse) {
        s.decisions.insert(seq, value.to_string());
    } else if rest.starts_with("versions/") {
        let v: SpecVersion = serde_json::from_str(value).map_err(|e| bad(&e))?;
        s.versions.insert(v.version, v);
    }
    Ok(())
}

/// The end of the range of keys starting with `prefix` (its last byte plus one; the
/// prefixes here end in '/').
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// The etcd thread: one client, one request at a time, in order.
fn serve(
    endpoints: Endpoints,
    prefix: String,
    timeout: Duration,
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<Job>,
    failing: Arc<Mutex<Option<String>>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            *failing.lock_or_recover() = Some(format!("cannot start the etcd store's runtime: {e}"));
            return;
        }
    };
    rt.block_on(async move {
        let mut client: Option<flotilla_etcd::Client> = None;
        while let Some(job) = jobs.recv().await {
            if client.is_none() {
                match flotilla_etcd::connect(&endpoints, timeout).await {
                    Ok(c) => client = Some(c),
                    Err(e) => {
                        note(&failing, "connect", Err(&StoreError(e.to_string())));
                        refuse(job, StoreError(format!("unavailable: {e}")));
                        continue;
                    }
                }
            }
            let Some(c) = client.as_mut() else { continue };
            match job {
                Job::Load { app, reply } => {
                    let r = load(c, &format!("{prefix}/apps/{app}/"), timeout).await;
                    note(&failing, "load", r.as_ref().map(|_| ()));
                    let _ = reply.send(r);
                }
                Job::Txns { txns, fence, reply } => {
                    let r = write(c, txns, fence.as_ref(), timeout).await;
                    note(&failing, "write", r.as_ref().map(|_| ()));
                    let _ = reply.send(r);
                }
                Job::Probe { reply } => {
                    let probe = c.get(format!("{prefix}/"), Some(GetOptions::new().with_count_only()));
                    let r = within(timeout, "probing", probe).await.map(|_| ()).map_err(|e| StoreError(e.to_string()));
                    note(&failing, "probe", r.as_ref().map(|_| ()));
                    let _ = reply.send(r);
                }
            }
        }
    });
}

fn refuse(job: Job, e: StoreError) {
    match job {
        Job::Load { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Job::Txns { reply, .. } | Job::Probe { reply } => {
            let _ = reply.send(Err(e));
        }
    }
}

/// Keeps `failing` (for `apps`) and the store metrics up to date. A fenced write is
/// not etcd failing.
fn note(failing: &Mutex<Option<String>>, op: &'static str, r: Result<(), &StoreError>) {
    let mut f = failing.lock_or_recover();
    match r {
        Ok(()) => {
            if let Some(was) = f.take() {
                tracing::info!(error = %was, "etcd answers again");
                metrics::gauge!(m::STORE_HEALTHY.name).set(1.0);
            }
        }
        Err(e) if e.0.starts_with(FENCED) => {}
        Err(e) => {
            metrics::counter!(m::STORE_ERRORS.name, "op" => op).increment(1);
            metrics::gauge!(m::STORE_HEALTHY.name).set(0.0);
            if f.is_none() {
                tracing::warn!(error = %e.0, "etcd does not answer; writes wait until it does");
            }
            *f = Some(e.0.clone());
        }
    }
}

/// How a write refused by the fence begins.
pub const FENCED: &str = "fenced";

async fn load(c: &mut flotilla_etcd::Client, base: &str, timeout: Duration) -> Result<Stored, StoreError> {
    let mut s = Stored::default();
    let end = range_end(base);
    let mut from = base.as_bytes().to_vec();
    let mut revision = 0;
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if revision > 0 {
            // Every page at the first page's revision: one consistent snapshot.
            opts = opts.with_revision(revision);
        }
        let page = within(timeout, "loading the app", c.get(from.clone(), Some(opts)))
            .await
            .map_err(|e| StoreError(format!("unavailable: {e}")))?;
        if revision == 0 {
            revision = page.header().map_or(0, |h| h.revision());
        }
        for kv in page.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let rest = key.strip_prefix(base).unwrap_or(&key);
            load_key(&mut s, rest, &String::from_utf8_lossy(kv.value()))?;
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(s),
        }
    }
}

/// Writes a pass's transactions. The first (it holds the meta keys) goes alone, so a
/// unit is never stored ahead of the generation or token it carries; the rest name
/// independent units and decisions and go at once, so etcd commits them under shared
/// WAL fsyncs instead of one fsync per round trip.
async fn write(
    c: &mut flotilla_etcd::Client,
    txns: Vec<Vec<Op>>,
    fence: Option<&Lease>,
    timeout: Duration,
) -> Result<(), StoreError> {
    let mut txns = txns.into_iter();
    let Some(first) = txns.next() else { return Ok(()) };
    write_one(c.clone(), first, fence.cloned(), timeout).await?;
    let mut rest = tokio::task::JoinSet::new();
    for ops in txns {
        rest.spawn(write_one(c.clone(), ops, fence.cloned(), timeout));
    }
    let mut outcome = Ok(());
    while let Some(r) = rest.join_next().await {
        let r = r.map_err(|e| StoreError(format!("unavailable: the write task failed: {e}"))).and_then(|r| r);
        if outcome.is_ok() {
            outcome = r;
        }
    }
    outcome
}

/// One transaction, conditional on the writer's lease key when it has one.
async fn write_one(
    mut c: flotilla_etcd::Client,
    ops: Vec<Op>,
    fence: Option<Lease>,
    timeout: Duration,
) -> Result<(), StoreError> {
    let when: Vec<Compare> = fence
        .as_ref()
        .map(|l| vec![Compare::create_revision(l.key(), CompareOp::Equal, i64::try_from(l.token()).unwrap_or(-1))])
        .unwrap_or_default();
    let then: Vec<TxnOp> = ops
        .into_iter()
        .map(|o| match o.value {
            Some(v) => TxnOp::put(o.key, v, None),
            None => TxnOp::delete(o.key, None),
        })
        .collect();
    let answer = within(timeout, "writing", c.txn(Txn::new().when(when).and_then(then)))
        .await
        .map_err(|e| StoreError(format!("unavailable: {e}")))?;
    if !answer.succeeded() {
        let (key, token) = fence.as_ref().map(|l| (l.key().to_string(), l.token())).unwrap_or_default();
        if let Some(l) = &fence {
            l.lose("the store refused a write: another scheduler holds the lease");
        }
        metrics::counter!(m::STORE_FENCED.name).increment(1);
        return Err(StoreError(format!(
            "{FENCED}: {key} no longer has token {token}: another scheduler took over; this transaction was not applied"
        )));
    }
    metrics::counter!(m::STORE_WRITES.name).increment(1);
    Ok(())
}

impl Store for EtcdStore {
    fn load(&self, app: &str) -> Result<Stored, StoreError> {
        self.ask(|reply| Job::Load { app: app.to_string(), reply })
    }

    fn write(&self, app: &str, batch: &[Write]) -> Result<(), StoreError> {
        if batch.is_empty() {
            // Called every second: tells `failing` when etcd comes back (or goes).
            if self.probe_fresh() {
                return Ok(());
            }
            let r = self.ask(|reply| Job::Probe { reply });
            if r.is_ok() {
                *self.conn.probed.lock_or_recover() = Some(std::time::Instant::now());
            }
            return r;
        }
        let fence = self.fence.lock_or_recover().clone();
        if let Some(l) = &fence
            && !l.is_held()
        {
            metrics::counter!(m::STORE_FENCED.name).increment(1);
            return Err(StoreError(format!(
                "{FENCED}: this scheduler no longer holds {}: nothing was written",
                l.key()
            )));
        }
        let txns = split(self.ops(app, batch)?)?;
        self.ask(|reply| Job::Txns { txns, fence, reply })
    }

    fn failing(&self) -> Option<String> {
        self.conn.failing.lock_or_recover().clone()
    }

    fn write_blocks(&self, batch: &[Write]) -> bool {
        !batch.is_empty() || !self.probe_fresh()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{exercise, unit};
    use flotilla_testkit::Etcd;

    fn store(etcd: &Etcd, prefix: &str) -> EtcdStore {
        EtcdStore::open(&Endpoints::parse(&etcd.endpoint()).unwrap(), prefix, Duration::from_secs(2)).unwrap()
    }

    /// The same tests as memory and redb, against a real etcd.
    #[test]
    fn etcd_store() {
        let etcd = Etcd::start("store");
        exercise(&store(&etcd, "/flotilla"));
        // Another prefix is another world.
        assert_eq!(store(&etcd, "/other").load("echo").unwrap(), Stored::default());
        // A batch past etcd's 128 operations per transaction: split, and all of it lands.
        let s = store(&etcd, "/big");
        let batch: Vec<Write> = (0..450).map(|i| Write::Unit(unit(&format!("echo-{i}")).into())).collect();
        s.write("echo", &batch).unwrap();
        assert_eq!(s.load("echo").unwrap().units.len(), 450, "every page of the load is read");
        assert_eq!(s.failing(), None);
    }

    #[tokio::test]
    async fn a_deposed_scheduler_cannot_write_and_a_dead_etcd_shows_as_failing() {
        let mut etcd = Etcd::start("store-fence");
        let endpoints = Endpoints::parse(&etcd.endpoint()).unwrap();
        let client = flotilla_etcd::connect(&endpoints, Duration::from_secs(2)).await.unwrap();
        let campaign = |who: &str| flotilla_etcd::Campaign {
            key: flotilla_etcd::scheduler_leader_key("/f", "echo"),
            value: who.into(),
            ttl: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
        };
        let old = flotilla_etcd::try_acquire(&client, &campaign("old")).await.unwrap().unwrap();
        let s = Arc::new(store(&etcd, "/f"));
        s.fence(old.lease().clone());
        let blocking = |s: &Arc<EtcdStore>, w: Vec<Write>| {
            let s = s.clone();
            tokio::task::spawn_blocking(move || s.write("echo", &w))
        };
        blocking(&s, vec![Write::DesiredUnits(2)]).await.unwrap().unwrap();
        // The old holder is deposed behind its back (its key deleted, another takes it)
        // while its own clock still says it holds: etcd refuses its write.
        etcd.ctl(&["del", &campaign("x").key]);
        let new = flotilla_etcd::try_acquire(&client, &campaign("new")).await.unwrap().unwrap();
        assert!(new.token() > old.token());
        let refused = blocking(&s, vec![Write::DesiredUnits(9)]).await.unwrap().unwrap_err();
        assert!(refused.0.starts_with(FENCED), "{refused}");
        assert!(!old.lease().is_held(), "a fenced write tells the lease it is lost");
        assert_eq!(s.failing(), None, "etcd is fine; this scheduler is not the active one");
        // The new holder's store shares the connection (as the apps of one process do)
        // with a fence of its own: it writes, the deposed one still cannot.
        let fresh = Arc::new(s.sharing());
        fresh.fence(new.lease().clone());
        blocking(&fresh, vec![Write::DesiredUnits(3)]).await.unwrap().unwrap();
        assert!(blocking(&s, vec![Write::DesiredUnits(9)]).await.unwrap().unwrap_err().0.starts_with(FENCED));
        let l = fresh.clone();
        let got = tokio::task::spawn_blocking(move || l.load("echo")).await.unwrap().unwrap();
        assert_eq!(got.desired_units, Some(3), "the refused write left nothing behind");
        // etcd gone: writes fail and `failing` says why; back: the next probe clears it.
        drop(new);
        etcd.kill();
        let unfenced = Arc::new(store(&etcd, "/f"));
        assert!(blocking(&unfenced, vec![Write::DesiredUnits(4)]).await.unwrap().is_err());
        assert!(unfenced.failing().is_some());
        etcd.restart();
        let probe = unfenced.clone();
        flotilla_testkit::wait_for_async("etcd to answer again", Duration::from_secs(90), || {
            let p = probe.clone();
            std::thread::spawn(move || p.write("echo", &[])).join().ok()?.ok()
        })
        .await;
        assert_eq!(unfenced.failing(), None);
    }

    fn op(key: &str, len: usize) -> Op {
        Op { key: key.into(), value: Some("x".repeat(len)) }
    }

    #[test]
    fn batches_split_by_count_and_size_in_order() {
        let ops: Vec<Op> = (0..250).map(|i| op(&format!("k{i:03}"), 10)).collect();
        let txns = split(ops.clone()).unwrap();
        assert_eq!(txns.iter().map(Vec::len).collect::<Vec<_>>(), [100, 100, 50]);
        assert_eq!(txns.concat(), ops, "order kept");
        let big: Vec<Op> = (0..5).map(|i| op(&format!("b{i}"), 400 << 10)).collect();
        let txns = split(big).unwrap();
        assert_eq!(txns.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
        assert!(split(vec![op("huge", 2 << 20)]).unwrap_err().0.contains("more than etcd takes"));
        assert!(split(Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn ops_name_each_key_once_last_write_wins_and_meta_goes_first() {
        let (jobs, _rx) = tokio::sync::mpsc::unbounded_channel();
        let conn = Connection {
            prefix: "/f".into(),
            jobs,
            failing: Default::default(),
            probed: Mutex::new(None),
            timeout: Duration::from_secs(1),
        };
        let s = EtcdStore { conn: Arc::new(conn), fence: Mutex::new(None) };
        let ops = s
            .ops(
                "a",
                &[
                    Write::Decision(5, "five".into()),
                    Write::DeleteIntent("t".into()),
                    Write::NextGeneration(3),
                    Write::Decision(5 + DECISIONS_KEPT as u64, "later".into()),
                    Write::NextGeneration(4),
                ],
            )
            .unwrap();
        let keys: Vec<(&str, Option<&str>)> = ops.iter().map(|o| (o.key.as_str(), o.value.as_deref())).collect();
        assert_eq!(
            keys,
            [
                ("/f/apps/a/meta/next_generation", Some("4")),
                ("/f/apps/a/intents/t", None),
                ("/f/apps/a/decisions/00000000000000000005", None),
                (format!("/f/apps/a/decisions/{:020}", 5u64.wrapping_sub(DECISIONS_KEPT as u64)).as_str(), None),
                ("/f/apps/a/decisions/00000000000000000105", Some("later")),
            ]
        );
        assert_eq!(range_end("/f/apps/a/"), b"/f/apps/a0");
    }
}
