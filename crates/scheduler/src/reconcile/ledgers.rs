//! Talking to the shards' ledgers: one gRPC client per shard, commit and release, and
//! the scheduler's one place that builds wire claims and keys.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::LockExt;

use flotilla_proto::dial::{Dialer, GrpcChannel};
use flotilla_proto::status::RemoteError;
use flotilla_proto::v1::{self, ledger_service_client::LedgerServiceClient};

use crate::planner::Placement;
use crate::spec::{AppSpec, ArtifactSpec, MemberTemplate};
use crate::store::{MemberRecord, UnitRecord};

/// How long a shard may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a commit did not come back with verdicts.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The shard refused the request before acting on it: nothing was applied.
    #[error("commit to shard {shard}: {error}")]
    Refused { shard: usize, error: RemoteError },
    /// The claims may or may not hold on the shard (the call failed in flight).
    #[error("commit to shard {shard}: {message}")]
    Unknown { shard: usize, message: String },
}

type Client = LedgerServiceClient<GrpcChannel>;

/// One connection to each shard's ledger, shared by the schedulers it is given to (the
/// apps of one `flotilla scheduler --apps-dir` process): a connection keeps itself alive
/// with a ping a second, and a thousand apps with one each to every shard sent and
/// answered thousands a second while idle. A call whose connection failed drops it, so the
/// next call, whichever app makes it, connects afresh.
#[derive(Clone)]
pub struct ShardChannels {
    shards: Arc<Vec<SharedChannel>>,
}

#[derive(Default)]
struct SharedChannel {
    state: std::sync::Mutex<ChannelState>,
    /// Held while connecting: apps that need the shard at once wait for one connection.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct ChannelState {
    client: Option<Client>,
    /// Counts connections, so a failure drops only the one it happened on.
    generation: u64,
    /// Which of the shard's addresses (`a|b`) the next connection tries.
    alternate: usize,
    /// Connection attempts made, and why the last one failed: apps that waited for an
    /// attempt that failed take its error rather than each trying (and waiting) in turn.
    attempts: u64,
    error: Option<String>,
}

impl ShardChannels {
    /// Channels to `shards` shards, none connected yet.
    pub fn new(shards: usize) -> Self {
        ShardChannels { shards: Arc::new((0..shards).map(|_| SharedChannel::default()).collect()) }
    }
}

/// The scheduler's connections to every shard, by shard index ([`ShardChannels`], its
/// own unless it was given shared ones).
pub struct Ledgers {
    addrs: Vec<String>,
    pub(super) channels: ShardChannels,
    /// The client in use for each shard, with the generation of its connection.
    clients: Vec<Option<(Client, u64)>>,
    pub(super) dialer: Dialer,
    /// Carried on every request: the lease's token, so a shard refuses a deposed
    /// scheduler whose request arrives after a newer one's.
    pub(super) fencing_token: u64,
    /// Checked before every request: nothing leaves once the lease is lost (or a newer
    /// one is held that the scheduler has not reloaded under yet).
    pub(super) leader: crate::leader::Leader,
    /// Transaction ids' random suffixes.
    pub(super) rng: rand::rngs::StdRng,
}

impl Ledgers {
    pub fn new(addrs: Vec<String>) -> Self {
        Ledgers {
            clients: vec![None; addrs.len()],
            channels: ShardChannels::new(addrs.len()),
            addrs,
            dialer: Dialer::network(),
            fencing_token: crate::leader::LOCAL_TOKEN,
            leader: crate::leader::Leader::always("local"),
            rng: rand::SeedableRng::seed_from_u64(rand::random()),
        }
    }

    /// `Err(why)` unless this scheduler still holds the lease it loaded its state under.
    fn check_lease(&self, op: &'static str) -> Result<(), String> {
        match self.leader.held() {
            Some(l) if l.token() == self.fencing_token => Ok(()),
            Some(l) => {
                metrics::counter!(crate::catalogue::SCHEDULER_NOT_LEADER.name, "op" => op).increment(1);
                Err(format!("a newer lease (token {}) is held; the state is reloaded first", l.token()))
            }
            None => {
                metrics::counter!(crate::catalogue::SCHEDULER_NOT_LEADER.name, "op" => op).increment(1);
                Err("this scheduler no longer holds the app's lease".into())
            }
        }
    }

    pub fn shards(&self) -> usize {
        self.addrs.len()
    }

    async fn client(&mut self, shard: usize) -> anyhow::Result<Client> {
        let entry = self.addrs.get(shard).ok_or_else(|| anyhow::anyhow!("no shard {shard}"))?;
        let shared = self.channels.shards.get(shard).ok_or_else(|| anyhow::anyhow!("no channel for shard {shard}"))?;
        let seen = {
            // The connection in use, or a newer one another app made since.
            let state = shared.state.lock_or_recover();
            if let Some(client) = state.client.clone() {
                let mine = self.clients.get(shard).and_then(Option::as_ref);
                if let Some((mine, _)) = mine.filter(|(_, g)| *g == state.generation) {
                    return Ok(mine.clone());
                }
                self.clients[shard] = Some((client.clone(), state.generation));
                return Ok(client);
            }
            state.attempts
        };
        let _one_connects = shared.connecting.lock().await;
        let addr = {
            let mut state = shared.state.lock_or_recover();
            if let Some(client) = state.client.clone() {
                self.clients[shard] = Some((client.clone(), state.generation));
                return Ok(client);
            }
            if state.attempts > seen {
                let why = state.error.as_deref().unwrap_or("no connection");
                anyhow::bail!("connecting to shard {shard}: {why}");
            }
            // `a|b`: the shard's active process and its standbys; each new connection
            // after a failure tries the next.
            state.alternate += 1;
            flotilla_core::shard_alternate(entry, state.alternate - 1)
        };
        let connected = self.dialer.connect(addr, Some(CONNECT_TIMEOUT)).await;
        let mut state = shared.state.lock_or_recover();
        state.attempts += 1;
        let client = match connected {
            Ok(channel) => LedgerServiceClient::new(channel),
            Err(e) => {
                state.error = Some(format!("{addr}: {e}"));
                return Err(e.into());
            }
        };
        state.generation += 1;
        state.client = Some(client.clone());
        self.clients[shard] = Some((client.clone(), state.generation));
        Ok(client)
    }

    /// A call on `shard` failed with `status`: if its connection failed (not the shard's
    /// answer), the connection is dropped, unless another call already replaced it.
    fn drop_client(&mut self, shard: usize, status: &tonic::Status) {
        use tonic::Code;
        let connection_failed = matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Internal
        );
        if !connection_failed {
            return;
        }
        let Some((_, generation)) = self.clients.get_mut(shard).and_then(Option::take) else { return };
        if let Some(shared) = self.channels.shards.get(shard) {
            let mut state = shared.state.lock_or_recover();
            if state.generation == generation {
                state.client = None;
            }
        }
    }

    /// Commits each `(shard, txn_id, claims)` at once and returns each shard's verdicts,
    /// by shard, with how long its call took: a pass that places on several shards waits
    /// for the slowest one, not for their sum.
    pub async fn commit_all(
        &mut self,
        batches: Vec<(usize, String, Vec<v1::Claim>)>,
    ) -> Vec<(usize, Duration, Result<v1::CommitResponse, CommitError>)> {
        let mut calls = Vec::with_capacity(batches.len());
        let mut refused = Vec::new();
        for (shard, txn_id, claims) in batches {
            if let Err(message) = self.check_lease("commit") {
                let error =
                    RemoteError { kind: flotilla_core::ErrorKind::Unavailable, code: "not_leader".into(), message };
                refused.push((shard, Err(CommitError::Refused { shard, error })));
                continue;
            }
            match self.client(shard).await {
                Ok(mut client) => {
                    let req = v1::CommitRequest { txn_id, fencing_token: self.fencing_token, claims };
                    calls.push(async move {
                        let started = std::time::Instant::now();
                        let r = client.commit(req).await;
                        (shard, started.elapsed(), r)
                    });
                }
                Err(e) => {
                    refused.push((shard, Err(CommitError::Refused { shard, error: unreachable(format!("{e:#}")) })))
                }
            }
        }
        let mut out: Vec<_> = refused.into_iter().map(|(shard, r)| (shard, Duration::ZERO, r)).collect();
        for (shard, took, r) in futures_util::future::join_all(calls).await {
            out.push((shard, took, self.verdicts(shard, r)));
        }
        out.sort_by_key(|(shard, ..)| *shard);
        out
    }

    /// Commits `claims` on `shard` in one transaction and returns the shard's verdicts.
    pub async fn commit(
        &mut self,
        shard: usize,
        txn_id: String,
        claims: Vec<v1::Claim>,
    ) -> Result<v1::CommitResponse, CommitError> {
        match self.commit_all(vec![(shard, txn_id, claims)]).await.pop() {
            Some((_, _, r)) => r,
            None => Err(CommitError::Unknown { shard, message: "no answer".into() }),
        }
    }

    /// A commit call's outcome: a fenced verdict or error marks the shard as fenced; a
    /// failed call drops the shard's channel.
    fn verdicts(
        &mut self,
        shard: usize,
        r: Result<tonic::Response<v1::CommitResponse>, tonic::Status>,
    ) -> Result<v1::CommitResponse, CommitError> {
        match r {
            Ok(r) => {
                let r = r.into_inner();
                if r.results.iter().any(|c| c.reason == v1::RejectReason::Fenced as i32) {
                    self.fenced(shard);
                }
                Ok(r)
            }
            Err(status) => {
                self.drop_client(shard, &status);
                let error = RemoteError::from(status);
                if error.code == FENCED_CODE {
                    self.fenced(shard);
                }
                if error.certainly_not_applied() {
                    Err(CommitError::Refused { shard, error })
                } else {
                    Err(CommitError::Unknown { shard, message: error.message })
                }
            }
        }
    }

    /// Releases `keys` on `shard` in one request. Release is idempotent, so a retry is
    /// harmless.
    pub async fn release(&mut self, shard: usize, txn_id: String, keys: Vec<v1::ClaimKey>) -> anyhow::Result<()> {
        self.check_lease("release").map_err(|e| anyhow::anyhow!("release on shard {shard}: {e}"))?;
        let req = v1::ReleaseRequest { txn_id, fencing_token: self.fencing_token, keys };
        if let Err(status) = self.client(shard).await?.release(req).await {
            self.drop_client(shard, &status);
            let error = RemoteError::from(status);
            if error.code == FENCED_CODE {
                self.fenced(shard);
            }
            return Err(anyhow::anyhow!("release on shard {shard}: {}", error.message));
        }
        Ok(())
    }

    /// A transaction id: `tag` and a random suffix (seeded, so a simulation replays it).
    pub(super) fn txn_id(&mut self, tag: &str) -> String {
        use rand::Rng;
        format!("{tag}-{:016x}", self.rng.random::<u64>())
    }

    /// Releases the ledger entries of `members` of a unit (all of them when empty), on
    /// every shard that holds one.
    pub(super) async fn release_unit(&mut self, unit: &UnitRecord, members: &[String]) -> anyhow::Result<()> {
        for (shard, keys) in keys_by_shard(unit, members) {
            self.release_keys(shard, &format!("{}-release", unit.unit_id), keys).await?;
        }
        Ok(())
    }

    /// Releases `keys` on `shard` in one request tagged `tag`.
    pub(super) async fn release_keys(
        &mut self,
        shard: usize,
        tag: &str,
        keys: Vec<v1::ClaimKey>,
    ) -> anyhow::Result<()> {
        let txn_id = self.txn_id(tag);
        self.release(shard, txn_id, keys).await
    }

    /// A shard has seen a newer scheduler's token for the app: this one was deposed
    /// (its lease check had not noticed yet), so it gives the lease up at once rather
    /// than re-plan claims every shard will refuse.
    fn fenced(&self, shard: usize) {
        if let Some(lease) = self.leader.held() {
            tracing::warn!(shard, token = self.fencing_token, "a shard fenced this scheduler: giving up the lease");
            lease.lose(&format!("shard {shard} has seen a newer scheduler's fencing token"));
        }
    }
}

/// The code of a ledger call a shard refused for a stale fencing token.
const FENCED_CODE: &str = "fenced";

/// A connection that could not be made: nothing was sent, so nothing was applied.
fn unreachable(message: String) -> RemoteError {
    RemoteError { kind: flotilla_core::ErrorKind::Unavailable, code: "unreachable".into(), message }
}

/// The ledger key of one member of a unit.
pub fn claim_key(app: &str, unit: &str, member: &str, generation: u64) -> v1::ClaimKey {
    v1::ClaimKey { app: app.to_string(), unit: unit.to_string(), member: member.to_string(), generation }
}

/// The keys of `members` of `unit` (all of them when empty), grouped by the shard that
/// holds each.
pub fn keys_by_shard(unit: &UnitRecord, members: &[String]) -> BTreeMap<usize, Vec<v1::ClaimKey>> {
    let mut by_shard: BTreeMap<usize, Vec<v1::ClaimKey>> = BTreeMap::new();
    // All of them includes the members coming up to replace one (the surge).
    let surge = unit.surge.iter().filter(|_| members.is_empty());
    for m in unit.members.iter().filter(|m| members.is_empty() || members.contains(&m.member)).chain(surge) {
        if let Some(shard) = m.shard {
            by_shard.entry(shard as usize).or_default().push(claim_key(
                &unit.app,
                &unit.unit_id,
                &m.member,
                m.key_generation(unit.generation),
            ));
        }
    }
    by_shard
}

/// The claims that place unit `unit_id` as `p` says, each member under the generation
/// `generation` gives it (the unit's, or its own when replaced alone); a secondary unit
/// may take low-priority nodes.
pub fn claims(
    spec: &AppSpec,
    unit_id: &str,
    generation: &dyn Fn(&str) -> u64,
    secondary: bool,
    p: &Placement,
) -> Vec<v1::Claim> {
    let templates = spec.members();
    p.members
        .iter()
        .filter_map(|m| {
            templates.iter().find(|(name, _, _)| *name == m.member).map(|(member, role, t)| (m, member, role, t))
        })
        .map(|(m, member, role, t)| {
            let t = t.alternative(m.alternative);
            v1::Claim {
                key: Some(claim_key(&spec.name, unit_id, member, generation(member))),
                node_id: m.node.to_string(),
                incarnation: m.incarnation,
                resources: Some((&t.resources()).into()),
                allow_low_priority: spec.allows_low_priority(&t, secondary),
                group: unit_id.to_string(),
                workload: Some(workload(spec, role, &t)),
            }
        })
        .collect()
}

/// What a member of `role` built from `t` runs: the template's command, its named ports
/// (the routing port, when it declares it, as its main port) and whom it starts after.
pub fn workload(spec: &AppSpec, role: &str, t: &MemberTemplate) -> v1::Workload {
    let main_port = spec.routing.port.clone().filter(|p| t.ports.contains(p)).unwrap_or_default();
    v1::Workload {
        role: role.to_string(),
        command: t.command.clone(),
        args: t.args.clone(),
        env: t.env.clone().into_iter().collect(),
        readiness_path: t.readiness_path.clone().unwrap_or_default(),
        restart: t.restart.clone().unwrap_or_default(),
        ports: t.ports.clone(),
        port_ranges: t.port_ranges.clone().into_iter().collect(),
        main_port,
        after: t.after.clone().unwrap_or_default(),
        artifacts: t.artifacts.iter().map(ArtifactSpec::wire).collect(),
    }
}

/// The members of a unit as placed by `p` on `shard`, each with its group's template
/// fingerprint from `roles` (`Fingerprints::roles`).
pub fn member_records(
    spec: &AppSpec,
    roles: &std::collections::BTreeMap<String, String>,
    p: &Placement,
    shard: usize,
) -> Vec<MemberRecord> {
    let templates = spec.members();
    let role_of = |member: &str| templates.iter().find(|(n, _, _)| n == member).map_or("worker", |(_, r, _)| *r);
    p.members
        .iter()
        .map(|m| MemberRecord {
            member: m.member.clone(),
            role: role_of(&m.member).to_string(),
            node_id: Some(m.node.to_string()),
            incarnation: m.incarnation,
            shard: Some(shard as u32),
            address: None,
            state: None,
            usage: None,
            ports: Default::default(),
            message: None,
            generation: None,
            alternative: m.alternative,
            template: roles.get(role_of(&m.member)).cloned(),
            surged_unix_ms: None,
        })
        .collect()
}

/// What an agent reports about a member, as the member's state in the unit record.
pub fn workload_state(w: &v1::WorkloadStatus) -> &'static str {
    match v1::WorkloadState::try_from(w.state).unwrap_or(v1::WorkloadState::Unspecified) {
        v1::WorkloadState::Starting => "starting",
        v1::WorkloadState::Running => "running",
        v1::WorkloadState::Exited => "exited",
        v1::WorkloadState::Failed => "failed",
        v1::WorkloadState::Waiting => "waiting",
        v1::WorkloadState::Fetching => "fetching",
        v1::WorkloadState::Unspecified => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::UnitState;
    use crate::planner::PlacedMember;

    const ECHO: &str = include_str!("../../../../examples/echo.toml");

    fn node(s: &str) -> flotilla_core::NodeId {
        flotilla_core::NodeId::new(s).unwrap()
    }

    #[test]
    fn a_member_replaced_alone_has_its_own_generation_in_its_key() {
        let mut u = crate::testing::unit("echo-3", 3, UnitState::Running, &[("head", "n1"), ("worker-0", "n2")]);
        u.app = "echo".into();
        // The old worker's key, then a new worker coming up under generation 9 (the surge).
        let old = keys_by_shard(&u, &["worker-0".to_string()]);
        assert_eq!(old[&0], vec![claim_key("echo", "echo-3", "worker-0", 3)]);
        u.surge.push(MemberRecord { node_id: Some("n4".into()), generation: Some(9), ..u.members[1].clone() });
        let all: Vec<v1::ClaimKey> = keys_by_shard(&u, &[]).into_values().flatten().collect();
        assert_eq!(all.len(), 3, "releasing the whole unit releases the surge too: {all:?}");
        assert!(all.contains(&claim_key("echo", "echo-3", "worker-0", 9)));
        assert!(all.contains(&claim_key("echo", "echo-3", "worker-0", 3)));
        // Naming the member releases only the one in place, not the one coming up.
        assert_eq!(keys_by_shard(&u, &["worker-0".to_string()])[&0], vec![claim_key("echo", "echo-3", "worker-0", 3)]);
        // After the swap the member's key carries its own generation; the head keeps the unit's.
        u.members[1] = u.surge.remove(0);
        assert_eq!((u.generation_of("worker-0"), u.generation_of("head")), (9, 3));
        let spec = AppSpec::parse(ECHO).unwrap();
        let p = Placement {
            domain: "d".into(),
            shard: 0,
            members: vec![PlacedMember { member: "worker-0".into(), node: node("n5"), incarnation: 1, alternative: 0 }],
            note: None,
        };
        let c = claims(&spec, "echo-3", &|m| u.generation_of(m), false, &p);
        assert_eq!(c[0].key, Some(claim_key("echo", "echo-3", "worker-0", 9)));
        // A unit record from before per-member generations reads back with none.
        let json =
            serde_json::to_string(&crate::testing::unit("a-1", 1, UnitState::Running, &[("head", "n1")])).unwrap();
        assert!(!json.contains("\"generation\":null") && !json.contains("surge"), "{json}");
        let back: UnitRecord = serde_json::from_str(&json).unwrap();
        assert_eq!((back.generation_of("head"), back.surge.len()), (1, 0));
    }

    /// A member placed as an alternative is claimed as that build (its args, env laid
    /// over the template's, resources) with its role's own priority setting, and its
    /// record says which alternative and which group.
    #[test]
    fn a_member_placed_as_an_alternative_is_claimed_and_recorded_as_it() {
        let spec = AppSpec::parse(&format!(
            "{ECHO}\n[unit.groups.gpu]\ncommand = \"infer\"\nargs = [\"--cuda\"]\ncpu = \"1\"\nmemory = \"1Gi\"\n\
             gpu = 1\ncount = 1\nallow_low_priority = false\nenv = {{ A = \"1\" }}\n\
             [[unit.groups.gpu.alternatives]]\nargs = [\"--npu\"]\ncpu = \"2\"\nenv = {{ B = \"2\" }}\n"
        ))
        .unwrap();
        let placed = |alternative| Placement {
            domain: "d".into(),
            shard: 0,
            members: vec![PlacedMember { member: "gpu-0".into(), node: node("n5"), incarnation: 1, alternative }],
            note: None,
        };
        let c = claims(&spec, "echo-1", &|_| 1, false, &placed(1));
        let w = c[0].workload.as_ref().unwrap();
        assert_eq!((w.role.as_str(), w.args.as_slice()), ("gpu", &["--npu".to_string()][..]));
        assert_eq!((w.env.get("A"), w.env.get("B")), (Some(&"1".to_string()), Some(&"2".to_string())));
        assert_eq!(c[0].resources.as_ref().map(|r| (r.cpu_millis, r.gpu)), Some((2000, 1)));
        assert!(!c[0].allow_low_priority, "the group says no, over the app's yes");
        assert!(claims(&spec, "echo-1", &|_| 1, true, &placed(1))[0].allow_low_priority, "a secondary unit may");
        let c = claims(&spec, "echo-1", &|_| 1, false, &placed(0));
        assert_eq!(c[0].workload.as_ref().unwrap().args, ["--cuda"]);
        let r = member_records(&spec, &spec.fingerprints().roles, &placed(1), 0);
        assert_eq!((r[0].role.as_str(), r[0].alternative), ("gpu", 1));
        assert_eq!(r[0].template, spec.fingerprints().roles.get("gpu").cloned());
    }
}
