//! The agent's artifact service: fetches what its members need, from peers first and
//! from the origin only what no peer holds, and serves what it holds to its peers.
//!
//! One task a fetch: the manifest (kept, from the origin, or from a peer), then the
//! swarm (`swarm.rs`) for the pieces, each checked against the manifest as it lands, and
//! the whole checked against its sha256 at the end. An HTTP origin's artifact that no
//! peer holds yet is read whole. Without a tracker (none configured, or unreachable) it
//! reads from the origin alone.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use flotilla_core::{Backoff, LockExt};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::auth::PeerKeys;
use crate::bitfield::Bitfield;
use crate::catalogue as m;
use crate::digest::{Digest, Hasher, Source};
use crate::manifest::Manifest;
use crate::peer::{Holdings, Limits, Peers};
use crate::store::{Partial, Store, StoreError};
use crate::throttle::Throttle;
use crate::tracker::Answer;
use crate::unpack::Format;
use crate::wire::{MAX_BODY, Request};

mod swarm;

/// How often a fetching node tells the tracker what it holds.
pub const ANNOUNCE: Duration = Duration::from_secs(1);
/// How often a node holding whole artifacts says so.
const SEED_ANNOUNCE: Duration = Duration::from_secs(15);

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
                    let full = disk_full(&e);
                    let lasting = !full
                        && matches!(
                            e.downcast_ref::<StoreError>(),
                            Some(StoreError::Mismatch { .. } | StoreError::TooLarge { .. } | StoreError::Unpack { .. })
                        );
                    let mismatch = matches!(e.downcast_ref::<StoreError>(), Some(StoreError::Mismatch { .. }));
                    metrics::counter!(m::FETCHES.name, "result" => if mismatch { "mismatch" } else { "error" })
                        .increment(1);
                    let mut why = match e.downcast_ref::<StoreError>() {
                        Some(s) => s.to_string(),
                        None => format!("{e:#}"),
                    };
                    if full {
                        why += " (the disk is full: what was fetched of it is removed, to give the space back)";
                    }
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
        let result = async {
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
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = &result
            && disk_full(e)
        {
            // The rest of the node needs the space more than a resume does. Under the
            // download's lock, so no other fetch of it is writing there; a sealed whole
            // (the unpacking filled the disk) stays.
            let (shared, d) = (self.shared.clone(), w.digest);
            let _ = tokio::task::spawn_blocking(move || {
                if shared.store.blob(&d).is_none() {
                    shared.store.remove(&d);
                }
            })
            .await;
        }
        result
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

/// Whether `e` comes of a full disk: a failure that passes once space is freed, so the
/// fetch is retried, not failed for good.
fn disk_full(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull))
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
