//! One artifact's swarm: the loop that keeps piece requests out to peers (and the
//! origin's leased pieces), lands what arrives, and bans a peer that sends a bad piece.
//!
//! Every [`ANNOUNCE`] (and as soon as an origin piece lands) it tells the tracker what it
//! holds and hears who holds what; between answers, peers' HAVEs keep it current. It
//! keeps up to [`MAX_INFLIGHT`] requests out, rarest first, [`PER_PEER`] at most a peer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use flotilla_core::LockExt;
use rand::SeedableRng;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{ANNOUNCE, Artifacts, Meter, Want};
use crate::bitfield::Bitfield;
use crate::catalogue as m;
use crate::digest::Digest;
use crate::manifest::Manifest;
use crate::peer::PeerError;
use crate::picker::Picker;
use crate::store::{Partial, StoreError};
use crate::wire::Request;

const MAX_INFLIGHT: usize = 16;
/// Requests one node keeps out to one peer. Two, so a peer holding a fresh piece is not
/// asked for four at once by everyone while other peers' links idle (measured: 8 lab
/// hosts 15.9 s → 13.3 s, with one origin read a node).
const PER_PEER: usize = 2;
/// Origin reads one node keeps going at once. One, so the origin's link sends every
/// node's piece at a useful speed (with four a node, 8 nodes' 32 reads each crawled for
/// 2.7 s before any landed and could be passed on); the tracker spreads the origin's
/// pieces over the nodes, each of which then serves its share to the rest, and a node
/// asks for the next one as soon as one lands.
const ORIGIN_INFLIGHT: usize = 1;
/// Origin reads kept going by a node reading the origin alone (no tracker answers, or
/// nothing arrives): the origin is then its only source, so one at a time would be slow.
const FALLBACK_INFLIGHT: usize = 4;
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

impl Artifacts {
    pub(super) async fn swarm(self: &Arc<Self>, w: &Want, manifest: Manifest) -> anyhow::Result<()> {
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
                    // Alone: a wider window, refilled as pieces land (below), not per announce.
                    let room = FALLBACK_INFLIGHT.saturating_sub(from_origin.len());
                    grant = (0..manifest.count())
                        .filter(|i| !picker.have().get(*i) && !from_origin.contains(i))
                        .take(room)
                        .collect();
                }
                for piece in grant {
                    let Some(url) = origin.clone() else { break };
                    if from_origin.len() >= FALLBACK_INFLIGHT || picker.have().get(piece) || !from_origin.insert(piece)
                    {
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
                            // Its lease is spent: ask for the next origin piece now (and
                            // without a tracker, take the next piece at once).
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
