//! The cluster's artifact origin and its tracker: `flotilla artifact push` stores a
//! file here (content-addressed, with its manifest made once); agents read manifests and
//! pieces from here only for what no peer holds, and announce what they hold.
//!
//! The tracker is here rather than in the shards because a swarm is one artifact across
//! every domain: a shard sees only its own domains, so per-shard swarms would read the
//! origin once per shard. Its state is soft (agents announce again within seconds), so
//! a restarted control plane, or another replica, rebuilds it without a store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_artifact::auth::PeerKeys;
use flotilla_artifact::manifest::Manifest;
use flotilla_artifact::store::Store;
use flotilla_artifact::throttle::Throttle;
use flotilla_artifact::tracker::{Announce, Tracker};
use flotilla_artifact::{Bitfield, Digest};
use flotilla_core::LockExt;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::artifact_remote::Read;
use crate::auth::authorize;
use crate::catalogue as m;
use crate::tokens::Scope;
use crate::{ControlError, ControlState};

/// How long a push may wait for its next bytes.
const PUSH_STALL: std::time::Duration = std::time::Duration::from_secs(30);
/// How much of a whole artifact is read at once for a reader.
const CHUNK: usize = 256 << 10;

/// The origin: the store of pushed artifacts, the tracker and the cluster's keys.
pub struct Origin {
    store: Store,
    /// The largest push taken.
    max_bytes: u64,
    tracker: Mutex<Tracker>,
    keys: Mutex<PeerKeys>,
    /// What all readers of the origin may take together (bytes a second).
    rate: Throttle,
    /// FOR TESTS: the chance that a read is cut off before each chunk (an origin that
    /// drops connections).
    drop: f64,
    /// Where pushes are kept for every replica (`--artifact-origin-url`).
    remote: Option<crate::artifact_remote::Remote>,
    /// Sizes of artifacts only the origin URL holds, from their manifests: a piece read
    /// needs the size, and should not cost a manifest read each.
    remote_sizes: Mutex<HashMap<Digest, u64>>,
}

/// Sizes remembered from the origin URL, at most (then forgotten all at once).
const MAX_REMOTE_SIZES: usize = 4096;

impl Origin {
    pub fn open(
        dir: std::path::PathBuf,
        max_bytes: u64,
        rate: Option<u64>,
        drop: f64,
        remote: Option<crate::artifact_remote::Remote>,
    ) -> anyhow::Result<Arc<Origin>> {
        let origin = Arc::new(Origin {
            store: Store::open(dir, u64::MAX)?,
            max_bytes,
            tracker: Mutex::new(Tracker::default()),
            keys: Mutex::new(PeerKeys::from_tokens(&[])),
            rate: Throttle::new(rate),
            drop,
            remote,
            remote_sizes: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&origin);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tick.tick().await;
                let Some(o) = weak.upgrade() else { return };
                let mut t = o.tracker.lock_or_recover();
                t.sweep(Instant::now());
                let (swarms, peers) = t.size();
                metrics::gauge!(m::TRACKER_SWARMS.name).set(swarms as f64);
                metrics::gauge!(m::TRACKER_PEERS.name).set(peers as f64);
            }
        });
        Ok(origin)
    }

    /// The size of a pushed artifact: this replica's copy, or the origin URL's manifest
    /// (which an apply waits for at most `wait`); `None` if neither says.
    pub async fn size(&self, d: &Digest, wait: std::time::Duration) -> Option<u64> {
        if let Some(blob) = self.store.blob(d) {
            return std::fs::metadata(blob).ok().map(|m| m.len());
        }
        tokio::time::timeout(wait, self.remote_size(d)).await.ok()?.ok()
    }

    /// The size of what only the origin URL holds (404 if it does not, or there is none).
    async fn remote_size(&self, d: &Digest) -> Result<u64, ControlError> {
        if let Some(size) = self.remote_sizes.lock_or_recover().get(d) {
            return Ok(*size);
        }
        let size = remote_manifest(self, d).await?.size;
        let mut sizes = self.remote_sizes.lock_or_recover();
        if sizes.len() >= MAX_REMOTE_SIZES {
            sizes.clear();
        }
        sizes.insert(*d, size);
        Ok(size)
    }

    /// The join tokens changed: agents' proofs are checked against these.
    pub fn set_join_tokens(&self, tokens: &[String]) {
        *self.keys.lock_or_recover() = PeerKeys::from_tokens(tokens);
    }
}

pub fn routes() -> axum::Router<Arc<ControlState>> {
    axum::Router::new()
        .route("/v1/artifacts", axum::routing::put(push))
        .route("/v1/artifacts/{name}", axum::routing::get(read))
        .route("/v1/artifacts/{name}/manifest", axum::routing::get(manifest))
        .route("/v1/artifacts/{name}/announce", axum::routing::post(announce))
}

fn origin(s: &ControlState) -> Result<&Arc<Origin>, ControlError> {
    s.artifacts.as_ref().ok_or(ControlError::NoArtifactStore)
}

fn digest(name: &str) -> Result<Digest, ControlError> {
    Digest::parse(name).map_err(|e| ControlError::BadRequest(format!("artifact name: {e}")))
}

/// `PUT /v1/artifacts`: the body is the file, streamed to disk and hashed on the way.
#[utoipa::path(put, path = "/v1/artifacts", tag = "artifacts", security(("bearer" = [])),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "the file"),
    responses((status = 201, description = "scope deploy: `{name, sha256, size}`, name is `flotilla://sha256:HEX`", body = Object),
              (status = 401, body = crate::answers::ErrorBody), (status = 403, body = crate::answers::ErrorBody),
              (status = 409, description = "`no_artifact_store`: the control plane keeps no artifacts", body = crate::answers::ErrorBody),
              (status = 413, description = "larger than the origin takes", body = crate::answers::ErrorBody),
              (status = 502, description = "`origin_unreachable`: the origin URL did not take it (kept here; push it again)", body = crate::answers::ErrorBody)))]
pub(crate) async fn push(
    State(s): State<Arc<ControlState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/artifacts").increment(1);
    authorize(&s, &headers, Scope::Deploy, None)?;
    let o = origin(&s)?;
    let result = store_body(o, body).await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(ControlError::TooLarge { .. }) => "too_large",
        Err(_) => "error",
    };
    metrics::counter!(m::ARTIFACT_PUSHES.name, "result" => outcome).increment(1);
    let (d, size) = result?;
    tracing::info!(artifact = %d, size, "artifact pushed");
    let name = format!("{}{d}", flotilla_artifact::digest::CLUSTER_SCHEME);
    Ok((StatusCode::CREATED, Json(json!({"name": name, "sha256": d.hex(), "size": size}))).into_response())
}

async fn store_body(o: &Arc<Origin>, body: Body) -> Result<(Digest, u64), ControlError> {
    let incoming = o.store.incoming_path();
    let storage = |e: std::io::Error| ControlError::Storage(format!("{}: {e}", incoming.display()));
    let mut file = tokio::fs::File::create(&incoming).await.map_err(storage)?;
    let (mut hash, mut size) = (flotilla_artifact::digest::Hasher::default(), 0u64);
    let mut body = body;
    let read = async {
        loop {
            let frame = match tokio::time::timeout(PUSH_STALL, body.frame()).await {
                Err(_) => return Err(ControlError::BodyTimeout { secs: PUSH_STALL.as_secs() }),
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return Err(ControlError::BadRequest(format!("reading the body: {e}"))),
                Ok(Some(Ok(f))) => f,
            };
            let Ok(data) = frame.into_data() else { continue };
            size += data.len() as u64;
            if size > o.max_bytes {
                return Err(ControlError::TooLarge { max: o.max_bytes as usize });
            }
            hash.update(&data);
            file.write_all(&data).await.map_err(storage)?;
        }
    }
    .await;
    let flushed = file.flush().await.map_err(storage);
    drop(file);
    if let Err(e) = read.and(flushed) {
        let _ = tokio::fs::remove_file(&incoming).await;
        return Err(e);
    }
    let d = hash.finish();
    if let Some(blob) = o.store.blob(&d) {
        let _ = tokio::fs::remove_file(&incoming).await;
        upload(o, &d, &blob).await?;
        return Ok((d, size));
    }
    let part = o.store.part_path(&d).map_err(|e| ControlError::Storage(e.to_string()))?;
    tokio::fs::rename(&incoming, &part).await.map_err(storage)?;
    let sealing = o.clone();
    let blob = tokio::task::spawn_blocking(move || sealing.store.seal_whole(d, size, d))
        .await
        .map_err(|e| ControlError::Storage(e.to_string()))?
        .map_err(|e| ControlError::Storage(e.to_string()))?;
    upload(o, &d, &blob).await?;
    Ok((d, size))
}

/// Puts a push at the origin URL too, if there is one: the push succeeds only once it is
/// there, so any replica serves it.
async fn upload(o: &Origin, d: &Digest, blob: &std::path::Path) -> Result<(), ControlError> {
    let Some(remote) = &o.remote else { return Ok(()) };
    let manifest = o.store.manifest(d).ok_or_else(|| ControlError::Storage(format!("{d} has no manifest here")))?;
    remote
        .upload(d, blob, &manifest)
        .await
        .map_err(|e| ControlError::OriginUnreachable(format!("did not take it (it is kept here; push it again): {e}")))
}

/// A `Range: bytes=A-B` (or `A-`) header, if there is one; past the end is clamped.
fn range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>, ControlError> {
    let Some(v) = headers.get(header::RANGE) else { return Ok(None) };
    let bad = || ControlError::BadRequest("Range must be one range, bytes=START-END".into());
    let spec = v.to_str().ok().and_then(|s| s.strip_prefix("bytes=")).ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = if b.trim().is_empty() { size.saturating_sub(1) } else { b.trim().parse().map_err(|_| bad())? };
    if a > b || a >= size {
        return Err(ControlError::BadRequest(format!("Range {a}-{b} is outside the artifact's {size} bytes")));
    }
    Ok(Some((a, b.min(size - 1))))
}

/// `GET /v1/artifacts/{name}`: the whole, or one byte range of it (206).
#[utoipa::path(get, path = "/v1/artifacts/{name}", tag = "artifacts", params(("name" = String, Path, description = "sha256:HEX")),
    responses((status = 200, description = "the artifact", content_type = "application/octet-stream"),
              (status = 206, description = "the range asked for", content_type = "application/octet-stream"),
              (status = 400, description = "a Range that is not one range inside the artifact", body = crate::answers::ErrorBody),
              (status = 404, description = "no such artifact", body = crate::answers::ErrorBody),
              (status = 502, description = "`origin_unreachable`: the origin URL failed the read", body = crate::answers::ErrorBody)))]
pub(crate) async fn read(
    State(s): State<Arc<ControlState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let (o, d) = (origin(&s)?.clone(), digest(&name)?);
    let storage = |e: std::io::Error| ControlError::Storage(e.to_string());
    // Here, or only at the origin URL (then its size is its manifest's).
    let (file, size) = match o.store.blob(&d) {
        Some(path) => {
            let file = tokio::fs::File::open(&path).await.map_err(storage)?;
            let size = file.metadata().await.map_err(storage)?.len();
            (Some(file), size)
        }
        None => (None, o.remote_size(&d).await?),
    };
    let (status, (start, end)) = match range(&headers, size)? {
        Some(r) => (StatusCode::PARTIAL_CONTENT, r),
        None => (StatusCode::OK, (0, size.saturating_sub(1))),
    };
    let len = if size == 0 { 0 } else { end - start + 1 };
    let bytes: futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>> = match (file, &o.remote) {
        (Some(mut file), _) => {
            file.seek(std::io::SeekFrom::Start(start)).await.map_err(storage)?;
            Box::pin(tokio_util::io::ReaderStream::with_capacity(file.take(len), CHUNK))
        }
        (None, Some(remote)) => {
            let asked = (status == StatusCode::PARTIAL_CONTENT).then_some((start, end));
            match remote.read(&d, size, asked).await.map_err(ControlError::OriginUnreachable)? {
                Read::Bytes(resp) => Box::pin(resp.bytes_stream().map(|c| c.map_err(std::io::Error::other))),
                Read::Missing => return Err(ControlError::NoSuchArtifact(d.to_string())),
            }
        }
        (None, None) => return Err(ControlError::NoSuchArtifact(d.to_string())),
    };
    let mut resp = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .header(header::ACCEPT_RANGES, "bytes");
    if status == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{size}"));
    }
    resp.body(Body::from_stream(metered(o, bytes, len))).map_err(|e| ControlError::Storage(e.to_string()))
}

/// The manifest of what only the origin URL holds (404 if it does not, or there is none).
async fn remote_manifest(o: &Origin, d: &Digest) -> Result<Manifest, ControlError> {
    let remote = o.remote.as_ref().ok_or_else(|| ControlError::NoSuchArtifact(d.to_string()))?;
    let m = remote.manifest(d).await.map_err(ControlError::OriginUnreachable)?;
    m.ok_or_else(|| ControlError::NoSuchArtifact(d.to_string()))
}

/// `len` bytes of `bytes`, each chunk waiting for the origin's rate; more than `len` is
/// an error (an origin URL that sends more than it was asked for).
fn metered(
    o: Arc<Origin>,
    bytes: futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>,
    len: u64,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send {
    futures_util::stream::unfold((o, bytes, len), |(o, mut bytes, left)| async move {
        if left == 0 {
            return None;
        }
        if o.drop > 0.0 && rand::random::<f64>() < o.drop {
            return Some((Err(std::io::Error::other("dropped on purpose (--test-origin-drop)")), (o, bytes, 0)));
        }
        let chunk = match bytes.next().await {
            Some(Ok(c)) if c.len() as u64 <= left => c,
            Some(Ok(_)) => return Some((Err(std::io::Error::other("the origin sent more than asked")), (o, bytes, 0))),
            Some(Err(e)) => return Some((Err(e), (o, bytes, 0))),
            None => return Some((Err(std::io::Error::other("the origin's bytes ended early")), (o, bytes, 0))),
        };
        o.rate.take(chunk.len() as u64).await;
        metrics::counter!(m::ORIGIN_BYTES.name).increment(chunk.len() as u64);
        let left = left - chunk.len() as u64;
        Some((Ok(chunk), (o, bytes, left)))
    })
}

/// `GET /v1/artifacts/{name}/manifest`: the piece hashes.
#[utoipa::path(get, path = "/v1/artifacts/{name}/manifest", tag = "artifacts", params(("name" = String, Path, description = "sha256:HEX")),
    responses((status = 200, description = "the manifest (binary: see crates/artifact/src/manifest.rs)", content_type = "application/octet-stream"),
              (status = 404, description = "no such artifact", body = crate::answers::ErrorBody),
              (status = 502, description = "`origin_unreachable`: the origin URL failed the read", body = crate::answers::ErrorBody)))]
pub(crate) async fn manifest(
    State(s): State<Arc<ControlState>>,
    Path(name): Path<String>,
) -> Result<Response, ControlError> {
    let (o, d) = (origin(&s)?, digest(&name)?);
    let m = match o.store.manifest(&d).filter(|_| o.store.blob(&d).is_some()) {
        Some(m) => m,
        None => remote_manifest(o, &d).await?,
    };
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], m.encode()).into_response())
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnnounceBody {
    node: String,
    /// `host:port` of its peer port; none behind NAT.
    #[serde(default)]
    addr: Option<String>,
    /// Pieces of the artifact (0: only asking who holds it).
    pieces: u32,
    /// Which it holds: hex, lowest piece first.
    have: String,
    #[serde(default)]
    want_origin: u32,
    #[serde(default)]
    stopped: bool,
}

/// `POST /v1/artifacts/{name}/announce`: an agent's news; the answer names peers and the
/// pieces it may read from the origin. Authenticated with a token derived from the
/// cluster's join token (agents hold no API token).
#[utoipa::path(post, path = "/v1/artifacts/{name}/announce", tag = "artifacts", security(("bearer" = [])), params(("name" = String, Path, description = "sha256:HEX")),
    request_body = AnnounceBody,
    responses((status = 200, description = "`{peers: [{node, addr, pieces, have}], origin: [piece]}`", body = Object),
              (status = 400, body = crate::answers::ErrorBody), (status = 401, description = "not an agent of this cluster", body = crate::answers::ErrorBody)))]
pub(crate) async fn announce(
    State(s): State<Arc<ControlState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ControlError> {
    let (o, d) = (origin(&s)?, digest(&name)?);
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_string();
    let bad = |e: String| {
        metrics::counter!(m::TRACKER_ANNOUNCES.name, "result" => "malformed").increment(1);
        ControlError::BadRequest(e)
    };
    let a: AnnounceBody = serde_json::from_slice(&body).map_err(|e| bad(format!("announce: {e}")))?;
    // Each node's token is its own: an agent speaks for itself only.
    if !o.keys.lock_or_recover().verify_tracker(&token, &a.node) {
        metrics::counter!(m::TRACKER_ANNOUNCES.name, "result" => "unauthenticated").increment(1);
        return Err(crate::limits::unauthenticated(
            "announces need the node's token, derived from the cluster's join token",
        ));
    }
    if a.node.is_empty() || a.node.len() > 253 || a.addr.as_ref().is_some_and(|x| x.len() > 300) {
        return Err(bad("announce: node must be 1-253 bytes, addr at most 300".into()));
    }
    if a.pieces > flotilla_artifact::manifest::MAX_PIECES {
        return Err(bad(format!("announce: {} pieces is above {}", a.pieces, flotilla_artifact::manifest::MAX_PIECES)));
    }
    // For an artifact this origin holds, the piece count is known: nobody fixes another.
    if let Some(m) = o.store.manifest(&d)
        && a.pieces != 0
        && a.pieces != m.count()
    {
        return Err(bad(format!("announce: {d} has {} pieces, not {}", m.count(), a.pieces)));
    }
    let have = Bitfield::from_hex(&a.have, a.pieces).map_err(|e| bad(format!("announce: have: {e}")))?;
    let mut rng = rand::rng();
    let answer = if a.pieces == 0 {
        o.tracker.lock_or_recover().peek(d, &mut rng)
    } else {
        let ann = Announce { node: a.node, addr: a.addr, have, want_origin: a.want_origin, stopped: a.stopped };
        o.tracker.lock_or_recover().announce(d, ann, Instant::now(), &mut rng).map_err(|e| bad(e.to_string()))?
    };
    metrics::counter!(m::TRACKER_ANNOUNCES.name, "result" => "ok").increment(1);
    let peers: Vec<Value> = answer
        .peers
        .iter()
        .map(|p| json!({"node": p.node, "addr": p.addr, "pieces": p.have.len(), "have": p.have.to_hex()}))
        .collect();
    Ok(Json(json!({"peers": peers, "origin": answer.origin})))
}
