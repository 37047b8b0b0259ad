//! The agent's artifact service: fetches what its members need, from peers first and
//! from the origin only what no peer holds, and serves what it holds to its peers.
//!
//! One task a fetch. It asks the tracker every [`ANNOUNCE`] who holds which pieces (and
//! which pieces it may read from the origin), keeps up to [`MAX_INFLIGHT`] piece
//! requests out (rarest first, [`PER_PEER`] at most a peer), checks every piece against
//! the manifest as it lands, and checks the whole against its sha256 at the end. A peer
//! that sends a bad piece is banned for that artifact. Without a tracker (none
//! configured, or unreachable) it reads from the origin alone.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use flotilla_core::{Backoff, LockExt};
use rand::SeedableRng;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::auth::PeerKeys;
use crate::bitfield::Bitfield;
use crate::catalogue as m;
use crate::digest::{Digest, Hasher, Source};
use crate::manifest::Manifest;
use crate::peer::{Holdings, Limits, PeerError, Peers};
use crate::picker::Picker;
use crate::store::{Partial, Store, StoreError};
use crate::throttle::Throttle;
use crate::tracker::Answer;
use crate::unpack::Format;
use crate::wire::{MAX_BODY, Request};

/// How often a fetching node tells the tracker what it holds.
pub const ANNOUNCE: Duration = Duration::from_secs(1);
/// How often a node holding whole artifacts says so.
const SEED_ANNOUNCE: Duration = Duration::from_secs(15);
const MAX_INFLIGHT: usize = 16;
const PER_PEER: usize = 4;
/// Origin reads one node keeps going at once. Few, so the tracker spreads the origin's
/// pieces over many nodes, each of which then serves its share to the rest; a node asks
/// for the next one as soon as one lands.
const ORIGIN_INFLIGHT: usize = 4;
/// With nothing in flight and nothing arriving for this long, read from the origin
/// whatever no peer offers (a tracker that lost its peers, leases held by a dead node).
const STALL: Duration = Duration::from_secs(3);
/// Peers one fetch connects to before it needs them (to hear their HAVEs), at most.
const MAX_CONNECT: usize = 16;
/// A peer that answered missing (it evicted the artifact) is not asked again for this long.
const MISSING_COOLDOWN: Duration = Duration::from_secs(1);
/// A peer that answered busy is not asked again for this long: short, since its uploads
/// free up every few dozen milliseconds, and meanwhile other peers' links are used.
const BUSY_REST: Duration = Duration::from_millis(200);
/// A fetch that lands nothing for this long gives up (and is retried after its back-off).
const NO_PROGRESS: Duration = Duration::from_secs(120);
/// A peer that failed a transport is not asked again for this long.
const COOLDOWN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct Config {
    pub node: String,
    /// The cache's directory and size cap.
    pub dir: PathBuf,
    pub cap: u64,
    /// The control plane: the origin of `flotilla://` artifacts, and the tracker.
    pub origin: Option<String>,
    pub keys: PeerKeys,
    /// The peer port's address; `listen` false: only dial out (behind NAT).
    pub bind: SocketAddr,
    pub listen: bool,
    /// The host peers reach this node at.
    pub advertise: String,
    pub upload_rate: Option<u64>,
    pub download_rate: Option<u64>,
    pub max_uploads: usize,
    /// FOR TESTS: every piece sent has a byte flipped (a corrupted peer).
    pub corrupt_uploads: bool,
}

/// What a member needs of an artifact.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Want {
    pub digest: Digest,
    pub source: Source,
    pub unpack: Option<Format>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The whole, verified (and its unpacked tree, if asked for).
    Ready {
        blob: PathBuf,
        tree: Option<PathBuf>,
    },
    Fetching {
        done: u64,
        total: u64,
        bytes_per_second: u64,
    },
    /// The last attempt failed; another starts after its back-off. `lasting`: it will
    /// fail again the same way (a wrong digest, too large for the cache, a refused
    /// archive), as opposed to an origin or a disk that may come back.
    Failed {
        why: String,
        lasting: bool,
    },
}

enum Entry {
    Running { done: u64, total: u64, rate: u64 },
    Failed { why: String, lasting: bool, retry_at: Instant, backoff: Backoff },
}

/// What peers may be handed: whole artifacts, and the verified pieces of partial ones.
struct Shared {
    store: Store,
    corrupt: bool,
    partials: Mutex<HashMap<Digest, Arc<Mutex<Partial>>>>,
    manifests: Mutex<HashMap<Digest, Manifest>>,
}

impl Holdings for Shared {
    fn manifest(&self, d: &Digest) -> Option<Vec<u8>> {
        self.manifests.lock_or_recover().get(d).map(Manifest::encode)
    }

    fn piece(&self, d: &Digest, i: u32) -> Option<Vec<u8>> {
        let partial = self.partials.lock_or_recover().get(d).cloned();
        let mut piece = match partial {
            Some(p) => p.lock_or_recover().read_piece(i, false)?,
            None => {
                let m = self.manifests.lock_or_recover().get(d).cloned()?;
                let piece = self.store.read_blob_piece(d, &m, i)?;
                // Members hold links to the file: one that changed it does not get its
                // node banned by every peer.
                (m.pieces.get(i as usize) == Some(&Digest::of(&piece))).then_some(piece)?
            }
        };
        if self.corrupt
            && let Some(b) = piece.first_mut()
        {
            *b ^= 0xff;
        }
        Some(piece)
    }
}

pub struct Artifacts {
    cfg: Config,
    shared: Arc<Shared>,
    peers: Arc<Peers>,
    http: reqwest::Client,
    entries: Mutex<HashMap<Want, Entry>>,
    pinned: Mutex<HashSet<Digest>>,
    origin_limit: Throttle,
    tracker_failed: std::sync::atomic::AtomicBool,
    downloads: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
}

impl Artifacts {
    pub fn start(cfg: Config) -> anyhow::Result<Arc<Artifacts>> {
        let store = Store::open(cfg.dir.clone(), cfg.cap)?;
        let held = store.complete();
        let shared = Arc::new(Shared {
            store,
            corrupt: cfg.corrupt_uploads,
            partials: Mutex::new(HashMap::new()),
            manifests: Mutex::new(held.into_iter().collect()),
        });
        let limits = Limits {
            upload: Throttle::new(cfg.upload_rate),
            download: Throttle::new(cfg.download_rate),
            uploads: tokio::sync::Semaphore::new(cfg.max_uploads.max(1)),
        };
        let peers = Peers::start(cfg.node.clone(), cfg.keys.clone(), cfg.bind, cfg.listen, shared.clone(), limits)?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(Duration::from_secs(30))
            .build()
            .context("building the origin's HTTP client")?;
        let me = Arc::new(Artifacts {
            origin_limit: Throttle::new(cfg.download_rate),
            cfg,
            shared,
            peers,
            http,
            entries: Mutex::new(HashMap::new()),
            pinned: Mutex::new(HashSet::new()),
            tracker_failed: std::sync::atomic::AtomicBool::new(false),
            downloads: Mutex::new(HashMap::new()),
        });
        tokio::spawn(me.clone().seed_loop());
        Ok(me)
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peers.listen_addr()
    }

    /// The join tokens changed: new proofs use the first.
    pub fn set_keys(&self, keys: PeerKeys) {
        self.peers.set_keys(keys);
    }

    /// The artifacts assigned members use: never evicted.
    pub fn pin(&self, digests: HashSet<Digest>) {
        *self.pinned.lock_or_recover() = digests;
    }

    /// Where `w` stands; starts (or, after its back-off, restarts) fetching it.
    pub fn want(self: &Arc<Self>, w: &Want) -> Progress {
        if let Some(blob) = self.shared.store.blob(&w.digest) {
            let tree = match w.unpack {
                None => None,
                Some(f) => match self.shared.store.unpacked_if_there(&w.digest, f) {
                    Some(t) => Some(t),
                    None => return self.running_or_start(w),
                },
            };
            self.shared.store.touch(&w.digest);
            return Progress::Ready { blob, tree };
        }
        self.running_or_start(w)
    }

    fn running_or_start(self: &Arc<Self>, w: &Want) -> Progress {
        let mut entries = self.entries.lock_or_recover();
        match entries.get(w) {
            Some(Entry::Running { done, total, rate }) => {
                return Progress::Fetching { done: *done, total: *total, bytes_per_second: *rate };
            }
            Some(Entry::Failed { why, lasting, retry_at, .. }) if Instant::now() < *retry_at => {
                return Progress::Failed { why: why.clone(), lasting: *lasting };
            }
            _ => {}
        }
        let backoff = match entries.remove(w) {
            Some(Entry::Failed { backoff, .. }) => backoff,
            _ => Backoff::new(Duration::from_secs(1), Duration::from_secs(10)).with_jitter(0.3),
        };
        entries.insert(w.clone(), Entry::Running { done: 0, total: 0, rate: 0 });
        metrics::gauge!(m::FETCHING.name).increment(1.0);
        let (me, w) = (self.clone(), w.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let span = tracing::info_span!("artifact_fetch", artifact = %w.digest);
            let result = tracing::Instrument::instrument(me.fetch(&w), span).await;
            metrics::gauge!(m::FETCHING.name).decrement(1.0);
            let mut entries = me.entries.lock_or_recover();
            match result {
                Ok(()) => {
                    metrics::counter!(m::FETCHES.name, "result" => "ok").increment(1);
                    metrics::histogram!(m::FETCH_SECONDS.name).record(started.elapsed().as_secs_f64());
                    entries.remove(&w);
                }
                Err(e) => {
                    let lasting = matches!(
                        e.downcast_ref::<StoreError>(),
                        Some(StoreError::Mismatch { .. } | StoreError::TooLarge { .. } | StoreError::Unpack { .. })
                    );
                    let mismatch = matches!(e.downcast_ref::<StoreError>(), Some(StoreError::Mismatch { .. }));
                    metrics::counter!(m::FETCHES.name, "result" => if mismatch { "mismatch" } else { "error" })
                        .increment(1);
                    let why = match e.downcast_ref::<StoreError>() {
                        Some(s) => s.to_string(),
                        None => format!("{e:#}"),
                    };
                    tracing::warn!(artifact = %w.digest, %why, "fetch failed");
                    let mut backoff = backoff;
                    let retry_at = Instant::now() + backoff.next_wait();
                    entries.insert(w, Entry::Failed { why, lasting, retry_at, backoff });
                }
            }
        });
        Progress::Fetching { done: 0, total: 0, bytes_per_second: 0 }
    }

    fn report(&self, w: &Want, done: u64, total: u64, rate: u64) {
        let mut entries = self.entries.lock_or_recover();
        if let Some(e) = entries.get_mut(w) {
            *e = Entry::Running { done, total, rate };
        }
        let all: u64 = entries.values().map(|e| if let Entry::Running { rate, .. } = e { *rate } else { 0 }).sum();
        metrics::gauge!(m::FETCH_RATE.name).set(all as f64);
    }

    async fn fetch(self: &Arc<Self>, w: &Want) -> anyhow::Result<()> {
        // One download a digest (two members may unpack it differently): the second
        // waits, then finds the whole there.
        let lock = self.downloads.lock_or_recover().entry(w.digest).or_default().clone();
        let _one = lock.lock().await;
        if self.shared.store.blob(&w.digest).is_none() {
            match self.manifest(w).await? {
                Some(manifest) => self.swarm(w, manifest).await?,
                None => self.whole_from_origin(w).await?,
            }
        }
        if let Some(f) = w.unpack {
            let (store, d) = (self.shared.clone(), w.digest);
            tokio::task::spawn_blocking(move || store.store.unpacked(&d, f)).await??;
        }
        Ok(())
    }

    fn origin_url(&self, w: &Want) -> Option<String> {
        match &w.source {
            Source::Http(url) => Some(url.clone()),
            Source::Cluster(d) => {
                self.cfg.origin.as_ref().map(|o| format!("{}/v1/artifacts/{d}", o.trim_end_matches('/')))
            }
        }
    }

    /// The manifest: kept from before, from the cluster's origin, or from a peer that
    /// holds the whole (an HTTP origin has none); `None`: nobody has one yet.
    async fn manifest(self: &Arc<Self>, w: &Want) -> anyhow::Result<Option<Manifest>> {
        if let Some(m) = self.shared.store.manifest(&w.digest) {
            return Ok(Some(m));
        }
        if let (Source::Cluster(_), Some(url)) = (&w.source, self.origin_url(w)) {
            let body = self.origin_get(&format!("{url}/manifest"), None, u64::from(MAX_BODY)).await?;
            return Ok(Some(Manifest::decode(&body).context("the origin's manifest")?));
        }
        let Ok(answer) = self.announce(&w.digest, &Bitfield::new(0), 0, false).await else { return Ok(None) };
        for p in answer.peers.iter().filter(|p| p.have.is_full() && !p.have.is_empty()) {
            let Ok(conn) = self.peers.connection(&p.node, p.addr.as_deref()).await else { continue };
            if let Ok(b) = self.peers.request(&conn, Request::Manifest(w.digest), MAX_BODY).await
                && let Ok(m) = Manifest::decode(&b)
            {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// An HTTP origin's artifact that no peer holds yet: read whole, checked, and then
    /// served to peers with the manifest made of it.
    async fn whole_from_origin(&self, w: &Want) -> anyhow::Result<()> {
        let url = self
            .origin_url(w)
            .ok_or_else(|| anyhow!("no origin for {} (the agent has no --control-plane)", w.digest))?;
        let mut resp = self.http.get(&url).send().await.with_context(|| format!("reading {url}"))?;
        if !resp.status().is_success() {
            bail!("{url} answered {}", resp.status());
        }
        let total = resp.content_length().unwrap_or(0);
        let pinned = self.pinned.lock_or_recover().clone();
        if total > 0 {
            self.shared.store.make_room(&w.digest, total, &pinned)?;
        }
        let part = self.shared.store.part_path(&w.digest)?;
        let mut out = tokio::fs::File::create(&part).await.with_context(|| format!("creating {}", part.display()))?;
        let (mut hash, mut done, mut meter) = (Hasher::default(), 0u64, Meter::new());
        while let Some(chunk) = resp.chunk().await.with_context(|| format!("reading {url}"))? {
            self.origin_limit.take(chunk.len() as u64).await;
            hash.update(&chunk);
            out.write_all(&chunk).await.with_context(|| format!("writing {}", part.display()))?;
            done += chunk.len() as u64;
            metrics::counter!(m::BYTES.name, "from" => "origin").increment(chunk.len() as u64);
            self.report(w, done, total.max(done), meter.rate(done));
            if self.shared.store.cap() < done {
                self.shared.store.remove(&w.digest);
                return Err(StoreError::TooLarge { digest: w.digest, size: done, cap: self.shared.store.cap() }.into());
            }
        }
        out.flush().await?;
        drop(out);
        let (shared, d, got) = (self.shared.clone(), w.digest, hash.finish());
        tokio::task::spawn_blocking(move || shared.store.seal_whole(d, done, got)).await??;
        if let Some(m) = self.shared.store.manifest(&w.digest) {
            let _ = self.announce(&w.digest, &Bitfield::full(m.count()), 0, false).await;
            self.shared.manifests.lock_or_recover().insert(w.digest, m);
        }
        Ok(())
    }

    async fn swarm(self: &Arc<Self>, w: &Want, manifest: Manifest) -> anyhow::Result<()> {
        let d = w.digest;
        let pinned = self.pinned.lock_or_recover().clone();
        self.shared.store.make_room(&d, manifest.size, &pinned)?;
        let (shared, m2) = (self.shared.clone(), manifest.clone());
        let partial = tokio::task::spawn_blocking(move || shared.store.begin(d, m2)).await??;
        let mut picker = Picker::new(partial.have.clone());
        let partial = Arc::new(Mutex::new(partial));
        self.shared.partials.lock_or_recover().insert(d, partial.clone());
        self.shared.manifests.lock_or_recover().insert(d, manifest.clone());
        let result = self.swarm_loop(w, &manifest, &partial, &mut picker).await;
        self.shared.partials.lock_or_recover().remove(&d);
        result?;
        // (Duplicate requests still out may write a piece again: the same bytes.)
        let shared = self.shared.clone();
        let sealed = tokio::task::spawn_blocking(move || {
            Ok::<_, anyhow::Error>(shared.store.finish(&partial.lock_or_recover())?)
        })
        .await?;
        if let Err(e) = sealed {
            self.shared.manifests.lock_or_recover().remove(&d);
            let _ = self.announce(&d, &Bitfield::new(manifest.count()), 0, true).await;
            return Err(e);
        }
        let _ = self.announce(&d, &Bitfield::full(manifest.count()), 0, false).await;
        Ok(())
    }

    async fn swarm_loop(
        self: &Arc<Self>,
        w: &Want,
        manifest: &Manifest,
        partial: &Arc<Mutex<Partial>>,
        picker: &mut Picker,
    ) -> anyhow::Result<()> {
        let d = w.digest;
        let mut rng = rand::rngs::StdRng::from_os_rng();
        let (tx, mut rx) = mpsc::channel::<Landed>(MAX_INFLIGHT + ORIGIN_INFLIGHT);
        let mut addrs: HashMap<String, Option<String>> = HashMap::new();
        let mut banned: HashSet<String> = HashSet::new();
        let mut cooling: HashMap<String, Instant> = HashMap::new();
        let mut resting: HashMap<String, Instant> = HashMap::new();
        let mut from_origin: HashSet<u32> = HashSet::new();
        let mut haves = self.peers.haves();
        let (mut next_announce, mut last_landed) = (Instant::now(), Instant::now());
        let mut meter = Meter::new();
        let mut failures = 0u32;
        let origin = self.origin_url(w);
        let total = manifest.size;
        loop {
            let done = partial.lock_or_recover().done_bytes();
            self.report(w, done, total, meter.rate(done));
            if picker.is_complete() {
                return Ok(());
            }
            let now = Instant::now();
            if now.duration_since(last_landed) > NO_PROGRESS {
                bail!("nothing arrived for {NO_PROGRESS:?} (no peer holds the rest, and the origin did not send it)");
            }
            if now >= next_announce {
                next_announce = now + ANNOUNCE;
                let room = if origin.is_some() { ORIGIN_INFLIGHT.saturating_sub(from_origin.len()) } else { 0 };
                let stalled = picker.in_flight() == 0 && now.duration_since(last_landed) >= STALL;
                let mut grant = match self.announce(&d, picker.have(), room as u32, false).await {
                    Ok(answer) => {
                        cooling.retain(|_, until| *until > now);
                        for p in answer.peers {
                            if p.node == self.cfg.node || banned.contains(&p.node) || cooling.contains_key(&p.node) {
                                continue;
                            }
                            picker.learn(&p.node, p.have);
                            if p.addr.is_some() && !addrs.contains_key(&p.node) && addrs.len() < MAX_CONNECT {
                                // Connected early, so its HAVEs reach this node as they happen.
                                let (peers, node, addr) = (self.peers.clone(), p.node.clone(), p.addr.clone());
                                tokio::spawn(async move { peers.connection(&node, addr.as_deref()).await });
                            }
                            addrs.insert(p.node, p.addr);
                        }
                        answer.origin
                    }
                    Err(e) => {
                        tracing::debug!(error = %format!("{e:#}"), "no tracker: reading from the origin alone");
                        Vec::new()
                    }
                };
                if grant.is_empty() && (stalled || self.tracker_down()) {
                    grant = (0..manifest.count()).filter(|i| !picker.have().get(*i)).take(room).collect();
                }
                for piece in grant {
                    let Some(url) = origin.clone() else { break };
                    if from_origin.len() >= ORIGIN_INFLIGHT || picker.have().get(piece) || !from_origin.insert(piece) {
                        continue;
                    }
                    picker.claim(piece);
                    let job =
                        self.clone().land_from_origin(url, manifest.piece(piece), piece, partial.clone(), tx.clone());
                    tokio::spawn(job);
                }
            }
            resting.retain(|node, until| {
                let still = *until > now;
                if !still {
                    picker.wake(node);
                }
                still
            });
            while picker.in_flight() < MAX_INFLIGHT {
                let Some((piece, node)) = picker.next(PER_PEER, &mut rng) else { break };
                tracing::debug!(piece, peer = %node, "asking");
                let addr = addrs.get(&node).cloned().flatten();
                let len = manifest.piece(piece).1;
                let job = self.clone().land_from_peer(node, addr, (d, piece, len), partial.clone(), tx.clone());
                tokio::spawn(job);
            }
            let landed = tokio::select! {
                l = rx.recv() => l,
                h = haves.recv() => {
                    if let Ok((node, hd, piece)) = h
                        && hd == d
                        && !banned.contains(&node)
                    {
                        picker.learn_one(&node, piece);
                    }
                    None
                }
                _ = tokio::time::sleep_until(resting.values().fold(next_announce, |a, b| a.min(*b))) => None,
            };
            let Some(l) = landed else { continue };
            tracing::debug!(piece = l.piece, from = ?l.peer, ok = l.result.is_ok(), in_flight = picker.in_flight(), "landed");
            if l.result.is_ok() {
                self.peers.broadcast_have(d, l.piece);
            }
            match l.peer {
                None => {
                    from_origin.remove(&l.piece);
                    if l.result.is_err() {
                        picker.unclaim(l.piece);
                    }
                    match l.result {
                        Ok(n) => {
                            metrics::counter!(m::BYTES.name, "from" => "origin").increment(n);
                            picker.got(l.piece);
                            last_landed = Instant::now();
                            // Its lease is spent: ask for the next origin piece now.
                            next_announce = last_landed;
                        }
                        Err(Failure::Bad) => {
                            metrics::counter!(m::PIECES_REJECTED.name, "from" => "origin").increment(1);
                            failures += 1;
                        }
                        Err(Failure::Store(e)) => return Err(e.into()),
                        Err(Failure::Peer(e)) => {
                            tracing::debug!(piece = l.piece, error = %e, "origin read failed");
                            failures += 1;
                        }
                    }
                    if failures > 0 && failures.is_multiple_of(20) {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                Some(node) => {
                    let ok = l.result.is_ok();
                    picker.finished(l.piece, &node, ok);
                    match l.result {
                        Ok(n) => {
                            metrics::counter!(m::BYTES.name, "from" => "peer").increment(n);
                            last_landed = Instant::now();
                        }
                        Err(Failure::Bad) => {
                            metrics::counter!(m::PIECES_REJECTED.name, "from" => "peer").increment(1);
                            tracing::warn!(peer = %node, piece = l.piece, "a bad piece: the peer is banned for this artifact");
                            picker.forget(&node);
                            banned.insert(node);
                        }
                        Err(Failure::Store(e)) => return Err(e.into()),
                        Err(Failure::Peer(PeerError::Transport(why))) => {
                            tracing::debug!(peer = %node, %why, "peer unreachable");
                            picker.forget(&node);
                            cooling.insert(node, Instant::now() + COOLDOWN);
                        }
                        Err(Failure::Peer(PeerError::Busy)) => {
                            // Its uploads are full: others are asked, for pieces it may not hold.
                            picker.rest(&node);
                            resting.insert(node, Instant::now() + BUSY_REST);
                        }
                        Err(Failure::Peer(PeerError::Missing)) => {
                            // It no longer holds it (evicted): ask others for a while.
                            picker.forget(&node);
                            cooling.insert(node, Instant::now() + MISSING_COOLDOWN);
                        }
                    }
                }
            }
        }
    }

    /// Whether the last announce failed: then the origin serves everything.
    fn tracker_down(&self) -> bool {
        self.tracker_failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn land_from_peer(
        self: Arc<Self>,
        node: String,
        addr: Option<String>,
        (d, piece, len): (Digest, u32, u32),
        partial: Arc<Mutex<Partial>>,
        tx: mpsc::Sender<Landed>,
    ) {
        let result = async {
            let conn = self.peers.connection(&node, addr.as_deref()).await.map_err(Failure::Peer)?;
            // No more than the piece's length is read (nor allocated) from a peer.
            let bytes = self.peers.request(&conn, Request::Piece(d, piece), len).await.map_err(Failure::Peer)?;
            write(partial, piece, bytes).await
        }
        .await;
        let _ = tx.send(Landed { piece, peer: Some(node), result }).await;
    }

    async fn land_from_origin(
        self: Arc<Self>,
        url: String,
        (start, len): (u64, u32),
        piece: u32,
        partial: Arc<Mutex<Partial>>,
        tx: mpsc::Sender<Landed>,
    ) {
        let range = (start, start + u64::from(len).saturating_sub(1));
        let result = match self.origin_get(&url, Some(range), u64::from(len)).await {
            Ok(bytes) => write(partial, piece, bytes).await,
            Err(e) => Err(Failure::Peer(PeerError::Transport(format!("{e:#}")))),
        };
        let _ = tx.send(Landed { piece, peer: None, result }).await;
    }

    async fn origin_get(&self, url: &str, range: Option<(u64, u64)>, max: u64) -> anyhow::Result<Vec<u8>> {
        let mut req = self.http.get(url);
        if let Some((a, b)) = range {
            req = req.header("range", format!("bytes={a}-{b}"));
        }
        let mut resp = req.send().await.with_context(|| format!("reading {url}"))?;
        if !resp.status().is_success() {
            bail!("{url} answered {}", resp.status());
        }
        if range.is_some() && resp.status() != reqwest::StatusCode::PARTIAL_CONTENT {
            bail!("{url} does not serve byte ranges");
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.with_context(|| format!("reading {url}"))? {
            if (body.len() + chunk.len()) as u64 > max {
                bail!("{url} sent more than the {max} bytes asked for");
            }
            self.origin_limit.take(chunk.len() as u64).await;
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Tells the tracker what this node holds of `d`; answers peers and origin pieces.
    async fn announce(&self, d: &Digest, have: &Bitfield, want_origin: u32, stopped: bool) -> anyhow::Result<Answer> {
        let no_tracker = || {
            self.tracker_failed.store(true, std::sync::atomic::Ordering::Relaxed);
            anyhow!("no tracker (no --control-plane, or no join token)")
        };
        let origin = self.cfg.origin.as_ref().ok_or_else(no_tracker)?;
        let token = self.peers.keys().tracker_token(&self.cfg.node).ok_or_else(no_tracker)?;
        let addr = self.peers.listen_addr().map(|a| format!("{}:{}", self.cfg.advertise, a.port()));
        let body = serde_json::json!({
            "node": self.cfg.node,
            "addr": addr,
            "pieces": have.len(),
            "have": have.to_hex(),
            "want_origin": want_origin,
            "stopped": stopped,
        });
        let url = format!("{}/v1/artifacts/{d}/announce", origin.trim_end_matches('/'));
        let answer = async {
            let resp =
                self.http.post(&url).bearer_auth(token).json(&body).timeout(Duration::from_secs(5)).send().await?;
            if !resp.status().is_success() {
                bail!("the tracker answered {}", resp.status());
            }
            let v: serde_json::Value = resp.json().await?;
            Ok(answer_from_json(&v, have.len()))
        }
        .await;
        self.tracker_failed.store(answer.is_err(), std::sync::atomic::Ordering::Relaxed);
        answer
    }

    /// Keeps the tracker told of every whole artifact this node holds.
    async fn seed_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SEED_ANNOUNCE);
        loop {
            tick.tick().await;
            let held: Vec<(Digest, u32)> =
                self.shared.manifests.lock_or_recover().iter().map(|(d, m)| (*d, m.count())).collect();
            for (d, count) in held {
                if self.shared.store.blob(&d).is_some() {
                    let _ = self.announce(&d, &Bitfield::full(count), 0, false).await;
                }
            }
        }
    }

    pub fn close(&self) {
        self.peers.close();
    }
}

/// A tracker's answer, as this node reads it: a malformed peer entry is skipped.
fn answer_from_json(v: &serde_json::Value, pieces: u32) -> Answer {
    let peers = v["peers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    let node = p["node"].as_str()?.to_string();
                    let n = p["pieces"].as_u64().filter(|n| *n <= u64::from(crate::manifest::MAX_PIECES))? as u32;
                    let have = Bitfield::from_hex(p["have"].as_str()?, if pieces == 0 { n } else { pieces }).ok()?;
                    Some(crate::tracker::PeerInfo { node, addr: p["addr"].as_str().map(str::to_string), have })
                })
                .collect()
        })
        .unwrap_or_default();
    let origin = v["origin"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).filter(|x| *x < u64::from(pieces)).map(|x| x as u32).collect())
        .unwrap_or_default();
    Answer { peers, origin }
}

enum Failure {
    Bad,
    Store(StoreError),
    Peer(PeerError),
}

struct Landed {
    piece: u32,
    /// `None`: the origin.
    peer: Option<String>,
    result: Result<u64, Failure>,
}

/// Checks a piece against the manifest and writes it, off the async threads.
async fn write(partial: Arc<Mutex<Partial>>, piece: u32, bytes: Vec<u8>) -> Result<u64, Failure> {
    let n = bytes.len() as u64;
    let r = tokio::task::spawn_blocking(move || partial.lock_or_recover().write_piece(piece, &bytes)).await;
    match r {
        Ok(Ok(())) => Ok(n),
        Ok(Err(StoreError::BadPiece { .. })) => Err(Failure::Bad),
        Ok(Err(e)) => Err(Failure::Store(e)),
        Err(e) => Err(Failure::Peer(PeerError::Transport(e.to_string()))),
    }
}

/// Bytes a second over the last couple of seconds.
struct Meter {
    mark: (Instant, u64),
    rate: u64,
}

impl Meter {
    fn new() -> Meter {
        Meter { mark: (Instant::now(), 0), rate: 0 }
    }

    fn rate(&mut self, done: u64) -> u64 {
        let elapsed = self.mark.0.elapsed();
        if elapsed >= Duration::from_secs(2) {
            self.rate = (done.saturating_sub(self.mark.1) as f64 / elapsed.as_secs_f64()) as u64;
            self.mark = (Instant::now(), done);
        }
        self.rate
    }
}
