//! The client side of `WatchView`: a local, lock-free copy of every shard's view.

use crate::catalogue as m;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use flotilla_core::{Backoff, NodeId};
use flotilla_proto::dial::Dialer;
use flotilla_proto::v1::{self, view_service_client::ViewServiceClient, view_update::Update};
use imbl::OrdMap;

use crate::interest::Changed;
use crate::record::{ShardView, Version};
use crate::wire::{WireError, delta_from_wire, record_from_wire};

/// One shard's view as this process knows it.
#[derive(Debug, Clone)]
pub struct ShardSlot {
    pub view: Arc<ShardView>,
    /// False while the stream to the shard is down: its nodes are then `Unknown`.
    pub connected: bool,
    /// The view's node ids by domain.
    pub domains: crate::domains::Domains,
    /// The nodes each app has workloads on.
    pub apps: crate::apps::AppNodes,
    /// When the follower stored this slot (Unix ms; 0 before the first store): the
    /// dashboard shows how long ago each shard's view last changed.
    pub updated_unix_ms: u64,
}

impl ShardSlot {
    /// `view` with its indexes built.
    pub fn of(view: Arc<ShardView>, connected: bool) -> ShardSlot {
        let (domains, apps) = (crate::domains::Domains::of(&view), crate::apps::AppNodes::of(&view));
        ShardSlot { view, connected, domains, apps, updated_unix_ms: 0 }
    }
}

/// The merged view: one slot per shard, in `--aggregators` order. Readers load a
/// slot without locking; one follower task per shard writes it.
pub struct ClusterView {
    slots: Vec<ArcSwap<ShardSlot>>,
    /// Readers woken only by changes of their nodes ([`crate::Interest`]).
    interests: Arc<std::sync::Mutex<crate::interest::Registry>>,
    /// Why each shard's stream last failed, until it delivers again: for status pages,
    /// never read on the placement path.
    errors: std::sync::Mutex<Vec<Option<String>>>,
}

impl ClusterView {
    pub fn new(shards: usize) -> Arc<Self> {
        let slots = (0..shards)
            .map(|i| ArcSwap::from_pointee(ShardSlot::of(Arc::new(ShardView::empty(i as u32, 0)), false)))
            .collect();
        Arc::new(ClusterView {
            slots,
            interests: Default::default(),
            errors: std::sync::Mutex::new(vec![None; shards]),
        })
    }

    /// The shards not connected now, each with why its stream last failed (when it did).
    pub fn unreachable(&self) -> Vec<(usize, Option<String>)> {
        use flotilla_core::LockExt;
        let errors = self.errors.lock_or_recover();
        (0..self.slots.len())
            .filter(|i| !self.slots[*i].load().connected)
            .map(|i| (i, errors.get(i).cloned().flatten()))
            .collect()
    }

    fn set_error(&self, shard: usize, error: Option<String>) {
        use flotilla_core::LockExt;
        if let Some(e) = self.errors.lock_or_recover().get_mut(shard) {
            *e = error;
        }
    }

    pub fn shards(&self) -> usize {
        self.slots.len()
    }

    pub fn slot(&self, shard: usize) -> Arc<ShardSlot> {
        self.slots[shard].load_full()
    }

    /// Every shard's slot, loaded once each.
    pub fn slots(&self) -> Vec<Arc<ShardSlot>> {
        self.slots.iter().map(|s| s.load_full()).collect()
    }

    /// A reader woken by every change until it names the nodes it depends on.
    pub fn interest(&self) -> crate::Interest {
        crate::Interest::new(self.interests.clone())
    }

    /// Sets shard `shard`'s view directly, as a follower would on a snapshot: for tests
    /// and tools that hold a view without a shard to follow.
    pub fn install(&self, shard: usize, view: ShardView, connected: bool) {
        self.store(shard, ShardSlot::of(Arc::new(view), connected), Changed::All);
    }

    /// Stores `slot` as shard `shard`'s, stamped with the time, and wakes the readers of
    /// what changed.
    fn store(&self, shard: usize, mut slot: ShardSlot, changed: Changed<'_>) {
        slot.updated_unix_ms = flotilla_core::now_ms();
        self.slots[shard].store(Arc::new(slot));
        flotilla_core::LockExt::lock_or_recover(&*self.interests).wake(changed);
    }
}

/// Keeps `cluster`'s slot `shard` current from the shard at `endpoint`
/// (`host:port` or a URL), reconnecting with jittered back-off. Runs until dropped.
pub async fn follow_shard(cluster: Arc<ClusterView>, shard: usize, endpoint: String, dialer: Dialer) {
    // Jitter from the clock rather than a thread RNG, so a simulation replays exactly.
    let clock_jitter =
        move || ((flotilla_core::now_ms() ^ (shard as u64).wrapping_mul(0x9E37_79B9)) % 1000) as f64 / 1000.0;
    let mut backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).with_jitter(0.5).jitter_from(clock_jitter);
    // `a|b`: the shard's active process and its standbys; a failed stream moves on.
    let mut alternate = 0;
    // Failures since the shard last delivered, and when one was last logged: the first
    // of a streak is a warning, the rest one line every 30 s.
    let (mut failures, mut logged) = (0u64, None::<std::time::Instant>);
    let mut interner = crate::interner::Interner::default();
    loop {
        let endpoint = flotilla_core::shard_alternate(&endpoint, alternate);
        let result = follow_once(&cluster, shard, endpoint, &dialer, &mut interner).await;
        if cluster.slot(shard).connected {
            // It delivered (and then the stream ended): a new streak starts from here.
            if failures > 0 {
                tracing::info!(shard, %endpoint, after_failures = failures, "following the shard's view again");
            }
            failures = 0;
            cluster.set_error(shard, None);
        }
        match result {
            Ok(()) => backoff.reset(),
            Err(e) => {
                failures += 1;
                metrics::counter!(m::FOLLOW_FAILURES.name, "shard" => shard.to_string()).increment(1);
                cluster.set_error(shard, Some(format!("{endpoint}: {e}")));
                if failures == 1 || logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                    tracing::warn!(shard, %endpoint, error = %e, failures, "cannot follow the shard's view; retrying with back-off");
                    logged = Some(std::time::Instant::now());
                } else {
                    tracing::debug!(shard, %endpoint, error = %e, "view stream failed");
                }
                alternate += 1;
            }
        }
        let cur = cluster.slot(shard);
        if cur.connected {
            cluster.store(shard, ShardSlot { connected: false, ..(*cur).clone() }, Changed::All);
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("status: {0}")]
    Status(#[from] tonic::Status),
    #[error("bad update: {0}")]
    Wire(#[from] WireError),
    #[error("no update or keep-alive for {:?}", flotilla_proto::VIEW_SILENCE_LIMIT)]
    Silent,
    #[error("delta from {0:?} does not follow our version {1:?}")]
    Gap(Version, Version),
}

/// The slot of `view` with the indexes the follower keeps beside it.
fn kept(
    view: &Arc<ShardView>,
    connected: bool,
    domains: &crate::domains::Domains,
    apps: &crate::apps::AppNodes,
) -> ShardSlot {
    ShardSlot { view: view.clone(), connected, domains: domains.clone(), apps: apps.clone(), updated_unix_ms: 0 }
}

async fn follow_once(
    cluster: &ClusterView,
    shard: usize,
    endpoint: &str,
    dialer: &Dialer,
    interner: &mut crate::interner::Interner,
) -> Result<(), FollowError> {
    let channel = dialer.connect(endpoint, None).await?;
    let mut client = ViewServiceClient::new(channel).max_decoding_message_size(flotilla_proto::MAX_GRPC_MESSAGE);
    let have = cluster.slot(shard);
    let from = (have.view.version.epoch != 0).then(|| have.view.version.into());
    let mut stream = client.watch_view(v1::WatchViewRequest { from_version: from }).await?.into_inner();
    let mut view = have.view.clone();
    let (mut domains, mut apps) = (have.domains.clone(), have.apps.clone());
    let mut building: Option<ShardView> = None;
    let mut connected = have.connected;
    loop {
        let update = tokio::time::timeout(flotilla_proto::VIEW_SILENCE_LIMIT, stream.message())
            .await
            .map_err(|_| FollowError::Silent)??;
        let Some(update) = update else { break };
        match update.update {
            Some(Update::Snapshot(chunk)) => {
                let b = building.get_or_insert_with(|| ShardView {
                    shard: chunk.shard,
                    version: chunk.version.unwrap_or_default().into(),
                    nodes: OrdMap::new(),
                });
                for r in chunk.nodes {
                    let mut r = record_from_wire(r)?;
                    interner.record(&mut r);
                    b.insert(Arc::new(r));
                }
                if chunk.last {
                    view = Arc::new(building.take().unwrap_or_else(|| ShardView::empty(shard as u32, 0)));
                    connected = true;
                    let slot = ShardSlot::of(view.clone(), connected);
                    (domains, apps) = (slot.domains.clone(), slot.apps.clone());
                    cluster.store(shard, slot, Changed::All);
                    metrics::counter!(m::SNAPSHOTS_RECEIVED.name).increment(1);
                }
            }
            Some(Update::Delta(d)) => {
                let mut d = delta_from_wire(d)?;
                for r in d.upserts.iter_mut().filter_map(Arc::get_mut) {
                    interner.record(r);
                }
                if d.published_unix_ms > 0 {
                    let age = flotilla_core::now_ms().saturating_sub(d.published_unix_ms);
                    metrics::histogram!(m::VIEW_LAG.name, "shard" => shard.to_string()).record(age as f64 / 1000.0);
                }
                let (next, replaced) = view.apply_replacing(&d).ok_or(FollowError::Gap(d.from, view.version))?;
                domains.apply(&d);
                apps.apply(&d, &replaced);
                view = Arc::new(next);
                // A stream that resumed with a delta: connectivity changed too.
                let reconnected = !std::mem::replace(&mut connected, true);
                let slot = kept(&view, connected, &domains, &apps);
                let touched: Vec<&NodeId> = d.upserts.iter().map(|r| &r.node_id).chain(&d.removed).collect();
                let changed = if reconnected { Changed::All } else { Changed::Nodes(shard as u32, &touched) };
                cluster.store(shard, slot, changed);
            }
            None => {
                // A keep-alive (no update): we are current.
                if !connected {
                    connected = true;
                    cluster.store(shard, kept(&view, connected, &domains, &apps), Changed::All);
                }
            }
        }
    }
    Ok(())
}
