//! The cluster's artifact origin and its tracker: `flotilla artifact push` stores a
//! file here (content-addressed, with its manifest made once); agents read manifests and
//! pieces from here only for what no peer holds, and announce what they hold.
//!
//! The tracker is here rather than in the shards because a swarm is one artifact across
//! every domain: a shard sees only its own domains, so per-shard swarms would read the
//! origin once per shard. Its state is soft (agents announce again within seconds), so
//! a restarted control plane, or another replica, rebuilds it without a store.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_artifact::auth::PeerKeys;
use flotilla_artifact::store::Store;
use flotilla_artifact::throttle::Throttle;
use flotilla_artifact::tracker::{Announce, Tracker};
use flotilla_artifact::{Bitfield, Digest};
use flotilla_core::LockExt;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

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
}

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

    /// The size of a pushed artifact, if this replica holds it (one kept only at the
    /// origin URL counts as unknown: an apply does not wait on that server).
    pub fn size(&self, d: &Digest) -> Option<u64> {
        std::fs::metadata(self.store.blob(d)?).ok().map(|m| m.len())
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
              (status = 413, description = "larger than the origin takes", body = crate::answers::ErrorBody)))]
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
    let o2 = o.clone();
    let blob = tokio::task::spawn_blocking(move || o2.store.seal_whole(d, size, d))
        .await
        .map_err(|e| ControlError::Storage(e.to_string()))?
        .map_err(|e| ControlError::Storage(e.to_string()))?;
    upload(o, &d, &blob).await?;
    Ok((d, size))
}

/// Puts a push at the origin URL too, if there is one: the push succeeds only once it is
/// there, so any replica serves it.
async fn upload(o: &Origin, d: &Digest, blob: &std::path::Path) -> Result<(), ControlError> {
    let (Some(remote), Some(manifest)) = (&o.remote, o.store.manifest(d)) else { return Ok(()) };
    remote
        .upload(d, blob, &manifest)
        .await
        .map_err(|e| ControlError::Storage(format!("kept here, but not at the origin URL (push it again): {e}")))
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
              (status = 404, description = "no such artifact", body = crate::answers::ErrorBody)))]
pub(crate) async fn read(
    State(s): State<Arc<ControlState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    let (o, d) = (origin(&s)?.clone(), digest(&name)?);
    let Some(path) = o.store.blob(&d) else { return read_remote(o, d, &headers).await };
    let storage = |e: std::io::Error| ControlError::Storage(e.to_string());
    let mut file = tokio::fs::File::open(&path).await.map_err(storage)?;
    let size = file.metadata().await.map_err(storage)?.len();
    let (status, (start, end)) = match range(&headers, size)? {
        Some(r) => (StatusCode::PARTIAL_CONTENT, r),
        None => (StatusCode::OK, (0, size.saturating_sub(1))),
    };
    let len = if size == 0 { 0 } else { end - start + 1 };
    file.seek(std::io::SeekFrom::Start(start)).await.map_err(storage)?;
    let stream = futures_stream(o, file, len);
    let mut resp = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, len)
        .header(header::ACCEPT_RANGES, "bytes");
    if status == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{size}"));
    }
    resp.body(Body::from_stream(stream)).map_err(|e| ControlError::Storage(e.to_string()))
}

/// A read of what only the origin URL holds, passed on through this origin's rate.
async fn read_remote(o: Arc<Origin>, d: Digest, headers: &HeaderMap) -> Result<Response, ControlError> {
    let missing = || ControlError::NoSuchArtifact(d.to_string());
    let remote = o.remote.as_ref().ok_or_else(missing)?;
    let range = headers
        .get(header::RANGE)
        .map(|v| v.to_str().map_err(|_| ControlError::BadRequest("Range is not text".into())))
        .transpose()?;
    let resp = remote.read(&d, range).await.map_err(ControlError::Storage)?.ok_or_else(missing)?;
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::OK);
    let mut out = Response::builder().status(status).header(header::CONTENT_TYPE, "application/octet-stream");
    for h in [header::CONTENT_LENGTH, header::CONTENT_RANGE, header::ACCEPT_RANGES] {
        if let Some(v) = resp.headers().get(h.as_str()).and_then(|v| header::HeaderValue::from_bytes(v.as_bytes()).ok())
        {
            out = out.header(h, v);
        }
    }
    let stream = futures_util::StreamExt::then(resp.bytes_stream(), move |chunk| {
        let o = o.clone();
        async move {
            let chunk = chunk.map_err(std::io::Error::other)?;
            o.rate.take(chunk.len() as u64).await;
            metrics::counter!(m::ORIGIN_BYTES.name).increment(chunk.len() as u64);
            Ok::<_, std::io::Error>(chunk)
        }
    });
    out.body(Body::from_stream(stream)).map_err(|e| ControlError::Storage(e.to_string()))
}

/// The file's next `len` bytes, chunk by chunk, each waiting for the origin's rate.
fn futures_stream(
    o: Arc<Origin>,
    file: tokio::fs::File,
    len: u64,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send {
    futures_util::stream::unfold((o, file, len), |(o, mut file, left)| async move {
        if left == 0 {
            return None;
        }
        if o.drop > 0.0 && rand::random::<f64>() < o.drop {
            return Some((Err(std::io::Error::other("dropped on purpose (--test-origin-drop)")), (o, file, 0)));
        }
        let n = left.min(CHUNK as u64) as usize;
        let mut buf = vec![0u8; n];
        if let Err(e) = file.read_exact(&mut buf).await {
            return Some((Err(e), (o, file, 0)));
        }
        o.rate.take(n as u64).await;
        metrics::counter!(m::ORIGIN_BYTES.name).increment(n as u64);
        Some((Ok(bytes::Bytes::from(buf)), (o, file, left - n as u64)))
    })
}

/// `GET /v1/artifacts/{name}/manifest`: the piece hashes.
#[utoipa::path(get, path = "/v1/artifacts/{name}/manifest", tag = "artifacts", params(("name" = String, Path, description = "sha256:HEX")),
    responses((status = 200, description = "the manifest (binary: see crates/artifact/src/manifest.rs)", content_type = "application/octet-stream"),
              (status = 404, description = "no such artifact", body = crate::answers::ErrorBody)))]
pub(crate) async fn manifest(
    State(s): State<Arc<ControlState>>,
    Path(name): Path<String>,
) -> Result<Response, ControlError> {
    let (o, d) = (origin(&s)?, digest(&name)?);
    let mut m = o.store.manifest(&d).filter(|_| o.store.blob(&d).is_some());
    if let (None, Some(remote)) = (&m, &o.remote) {
        m = remote.manifest(&d).await.map_err(ControlError::Storage)?;
    }
    let m = m.ok_or_else(|| ControlError::NoSuchArtifact(d.to_string()))?;
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
