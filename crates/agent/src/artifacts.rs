//! The agent's side of artifacts: its flags, starting the cache and swarm
//! ([`flotilla_artifact::Artifacts`]), and what a member waits for before it starts.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use flotilla_artifact::fetch::{Config, Progress, Want};
use flotilla_artifact::unpack::Format;
use flotilla_artifact::{Artifacts, Digest, Source};
use flotilla_proto::v1;

use crate::catalogue as m;

#[derive(Debug, Clone, clap::Args)]
pub struct ArtifactArgs {
    /// The control plane (`http://HOST:7700`): the origin of `flotilla://` artifacts and
    /// the tracker that tells agents which peers hold which pieces. Without it, only
    /// `http(s)://` artifacts are fetched, each from its source.
    #[arg(long, env = "FLOTILLA_CONTROL_PLANE")]
    pub control_plane: Option<String>,
    /// The artifact cache's size cap (default `20Gi`); unused artifacts are evicted past it. The
    /// node offers it as the custom resource `artifact-cache`, so an app whose artifacts
    /// no node could hold is refused when it is applied.
    #[arg(long, env = "FLOTILLA_ARTIFACT_CACHE", value_parser = flotilla_core::quantity::memory_bytes)]
    pub artifact_cache: Option<u64>,
    /// The UDP port peers fetch pieces from (QUIC); 0: any free port.
    #[arg(long, default_value_t = 0)]
    pub peer_port: u16,
    /// This node cannot take connections (behind NAT): it only dials peers, and serves
    /// the ones it dialled.
    #[arg(long)]
    pub peer_no_listen: bool,
    /// What this node sends its peers, at most, in bytes a second (`50Mi`).
    #[arg(long, value_parser = flotilla_core::quantity::memory_bytes)]
    pub artifact_upload_rate: Option<u64>,
    /// What this node fetches, at most, in bytes a second (peers and origin together).
    #[arg(long, value_parser = flotilla_core::quantity::memory_bytes)]
    pub artifact_download_rate: Option<u64>,
    /// Pieces sent to peers at once, at most.
    #[arg(long, default_value_t = 8)]
    pub artifact_max_uploads: usize,
    /// FOR TESTS: flip a byte of every piece this node sends, to play a corrupted peer.
    #[arg(long, hide = true)]
    pub test_corrupt_uploads: bool,
}

impl ArtifactArgs {
    pub fn problems(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Some(cp) = &self.control_plane
            && !(cp.starts_with("http://") || cp.starts_with("https://"))
        {
            errors.push(format!("--control-plane: {cp:?} is not an http:// or https:// URL"));
        }
        if !(1..=1024).contains(&self.artifact_max_uploads) {
            errors.push("--artifact-max-uploads: within 1..=1024".into());
        }
        errors
    }
}

/// Starts the cache and the peer port (on every address: the one advertised may be a
/// NAT's). `tokens`: the join tokens this node holds, newest first (a rotation keeps it
/// talking to peers on either).
pub fn start(
    args: &ArtifactArgs,
    node: &str,
    data_dir: &Path,
    advertise: &str,
    tokens: &[String],
) -> anyhow::Result<Arc<Artifacts>> {
    let ip = match advertise.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let cfg = Config {
        node: node.to_string(),
        dir: data_dir.join("artifacts"),
        cap: args.artifact_cache.unwrap_or(flotilla_core::DEFAULT_ARTIFACT_CACHE),
        origin: args.control_plane.clone(),
        keys: flotilla_artifact::auth::PeerKeys::from_tokens(tokens),
        bind: SocketAddr::new(ip, args.peer_port),
        listen: !args.peer_no_listen,
        advertise: advertise.to_string(),
        upload_rate: args.artifact_upload_rate,
        download_rate: args.artifact_download_rate,
        max_uploads: args.artifact_max_uploads,
        corrupt_uploads: args.test_corrupt_uploads,
    };
    let a = Artifacts::start(cfg)?;
    tracing::info!(peer_port = ?a.peer_addr(), origin = ?args.control_plane, "artifact cache ready");
    Ok(a)
}

/// How often the join-token file is read again for the peers' keys.
const KEYS_RELOAD: std::time::Duration = std::time::Duration::from_secs(10);

/// The join tokens in a token file's text, newest first.
pub fn tokens_in(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// Follows the join-token file, so a rotation reaches the peers' keys without a restart:
/// after `join-token rotate` this node proves and accepts either token, and after
/// `retire` only the new one, as its peers do.
pub fn follow_keys(arts: Arc<Artifacts>, file: std::path::PathBuf, mut current: Vec<String>) {
    let arts = Arc::downgrade(&arts);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(KEYS_RELOAD);
        loop {
            tick.tick().await;
            let Some(arts) = arts.upgrade() else { return };
            // Unreadable or empty (mid-rewrite): the keys in force stay.
            let Some(tokens) = std::fs::read_to_string(&file).ok().map(|t| tokens_in(&t)) else { continue };
            if tokens.is_empty() || tokens == current {
                continue;
            }
            tracing::info!(tokens = tokens.len(), "join tokens changed: peers' keys follow");
            arts.set_keys(flotilla_artifact::auth::PeerKeys::from_tokens(&tokens));
            current = tokens;
        }
    });
}

fn want(a: &v1::Artifact) -> Result<(Want, Source), String> {
    let digest = Digest::parse(&a.sha256).map_err(|e| format!("artifact {}: {e}", a.dest))?;
    let source = Source::parse(&a.source)?;
    let unpack = match a.unpack.as_str() {
        "" | "none" => None,
        u => Some(Format::parse(u)?),
    };
    Ok((Want { digest, source: source.clone(), unpack }, source))
}

/// Starts fetching a warm request's artifacts (`flotilla artifact warm`), ahead of
/// members that will need them. Best effort: a fetch that fails is tried again only when
/// something asks for it again (another warm, or a member). Nothing pins them: the cache
/// may evict them again for artifacts members use.
pub fn warm(arts: Option<&Arc<Artifacts>>, req: &v1::WarmRequest, node_id: &str) -> v1::WarmReply {
    let refuse = |code: &'static str, message: String| {
        metrics::counter!(m::WARM_REQUESTS.name, "result" => code).increment(1);
        v1::WarmReply { error: Some(v1::ErrorReply { code: code.into(), message }), ..Default::default() }
    };
    if req.node_id != node_id {
        return refuse("invalid", format!("this is node {node_id}, not {}", req.node_id));
    }
    let max = flotilla_proto::MAX_WARM_ARTIFACTS;
    if req.artifacts.is_empty() || req.artifacts.len() > max || !req.artifacts.iter().all(flotilla_proto::artifact_fits)
    {
        return refuse("invalid", format!("artifacts: 1 to {max}, each under 4 KiB"));
    }
    let wants = match req.artifacts.iter().map(want).collect::<Result<Vec<_>, _>>() {
        Ok(w) => w,
        Err(e) => return refuse("invalid", e),
    };
    let Some(arts) = arts else {
        return refuse("no_cache", format!("node {node_id} has no artifact cache (its agent's log says why)"));
    };
    let mut reply = v1::WarmReply::default();
    for ((w, _), a) in wants.iter().zip(&req.artifacts) {
        match arts.want(w) {
            Progress::Ready { .. } => reply.ready += 1,
            Progress::Fetching { .. } => reply.fetching += 1,
            Progress::Failed { why, lasting: true } => reply.failed.push(format!("{}: {why}", a.source)),
            // Nothing retries a warm by itself: the next warm (or a member) does.
            Progress::Failed { why, lasting: false } => {
                reply.failed.push(format!("{}: {why} (tried again when next asked for)", a.source));
            }
        }
    }
    metrics::counter!(m::WARM_REQUESTS.name, "result" => "ok").increment(1);
    tracing::info!(ready = reply.ready, fetching = reply.fetching, failed = reply.failed.len(), "warming artifacts");
    reply
}

/// The digests `assignments` use: the cache keeps them.
pub fn in_use(assignments: &[v1::Assignment]) -> HashSet<Digest> {
    let arts = assignments.iter().filter_map(|a| a.workload.as_ref()).flat_map(|w| &w.artifacts);
    arts.filter_map(|a| Digest::parse(&a.sha256).ok()).collect()
}

/// Where a member stands with its artifacts.
#[derive(Debug, PartialEq, Eq)]
pub enum Prepared {
    /// All there, placed in its working directory.
    Ready,
    /// Still arriving (or retrying): what to show.
    Fetching(String),
    /// It cannot start: what to show.
    Failed(String),
}

/// Asks for every artifact a member needs; once all are there, places them in `cwd`.
pub fn prepare(arts: &Arc<Artifacts>, list: &[v1::Artifact], cwd: &Path) -> Prepared {
    let (mut done, mut total, mut rate, mut waiting, mut retrying) = (0u64, 0u64, 0u64, 0, None);
    let mut ready = Vec::new();
    for a in list {
        let (w, source) = match want(a) {
            Ok(x) => x,
            Err(e) => return Prepared::Failed(e),
        };
        match arts.want(&w) {
            Progress::Ready { blob, tree } => ready.push((a, w, source, blob, tree)),
            Progress::Fetching { done: d, total: t, bytes_per_second } => {
                (done, total, rate, waiting) = (done + d, total + t, rate + bytes_per_second, waiting + 1);
            }
            Progress::Failed { why, lasting: true } => return Prepared::Failed(why),
            Progress::Failed { why, lasting: false } => {
                waiting += 1;
                retrying = Some(why);
            }
        }
    }
    if waiting > 0 {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let mut msg =
            format!("fetching {waiting} of {} artifacts: {:.1} of {:.1} MiB", list.len(), mib(done), mib(total));
        if rate > 0 {
            msg += &format!(" at {:.1} MiB/s", mib(rate));
        }
        if let Some(why) = retrying {
            msg += &format!("; retrying after: {why}");
        }
        return Prepared::Fetching(msg);
    }
    for (a, w, source, blob, tree) in ready {
        let name = source.file_name(&w.digest);
        if let Err(e) = flotilla_artifact::place::place(cwd, &a.dest, &name, &blob, tree.as_deref(), a.mode) {
            return Prepared::Failed(format!("artifact {}: {e}", a.dest));
        }
    }
    Prepared::Ready
}

#[cfg(test)]
mod tests {
    use super::*;

    fn art(sha256: &str) -> v1::Artifact {
        v1::Artifact { source: format!("flotilla://sha256:{sha256}"), sha256: sha256.into(), ..Default::default() }
    }

    #[test]
    fn a_warm_request_is_checked_before_anything_is_fetched() {
        let code = |r: v1::WarmReply| r.error.map(|e| (e.code, e.message)).unwrap_or_default();
        let good = art(&"ab".repeat(32));
        let req = |node: &str, artifacts: Vec<v1::Artifact>| v1::WarmRequest { node_id: node.into(), artifacts };
        let (c, msg) = code(warm(None, &req("n2", vec![good.clone()]), "n1"));
        assert_eq!(c, "invalid");
        assert!(msg.contains("this is node n1, not n2"), "{msg}");
        assert_eq!(code(warm(None, &req("n1", vec![]), "n1")).0, "invalid", "nothing to warm");
        let many = vec![good.clone(); flotilla_proto::MAX_WARM_ARTIFACTS + 1];
        assert_eq!(code(warm(None, &req("n1", many), "n1")).0, "invalid");
        let (c, msg) = code(warm(None, &req("n1", vec![art("xyz")]), "n1"));
        assert_eq!(c, "invalid");
        assert!(msg.contains("artifact"), "{msg}");
        let (c, msg) = code(warm(None, &req("n1", vec![good]), "n1"));
        assert_eq!(c, "no_cache");
        assert!(msg.contains("no artifact cache"), "{msg}");
    }
}
