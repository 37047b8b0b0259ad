//! One active scheduler per app, any number of standbys (`flotilla scheduler` run
//! twice or more on the same store).
//!
//! - etcd (`--store etcd://...`): each process campaigns for `PREFIX/apps/APP/leader`, a
//!   key bound to an etcd lease of `--lease-ttl`; the holder's fencing token is the key's
//!   create revision. The others wait on the key and take over when it goes (the holder
//!   died, was paused past its TTL, or resigned on SIGTERM).
//! - redb (`--store redb:PATH`): redb locks its file, so a second process waits until
//!   the first one is gone; each run takes the stored token plus one.
//!
//! A process hosting a directory of apps (`--apps-dir`) opens the store once: the redb
//! file's lock is then the lease of all of them, while on etcd each app campaigns for its
//! own lease over the one client, so standbys take apps over one by one.
//!
//! The first time a process holds the lease it loads the app from the store and starts
//! its scheduler. When it loses the lease the scheduler stays, acts on nothing (no
//! commit, release or store write leaves it; see `flotilla_scheduler::Leader`) and keeps
//! publishing its last routes, while this loop campaigns again; once it holds the lease
//! again the scheduler reloads the app from the store and adopts from the view. A
//! process is never restarted to change role.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flotilla_etcd::{Campaign, Endpoints, Leadership, Lease, Waiting};
use flotilla_scheduler::catalogue as m;
use flotilla_scheduler::{Leader, Store};

/// Where an app's state lives (`--store`).
#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    Redb(PathBuf),
    Etcd(Endpoints),
}

impl Backend {
    pub fn parse(s: &str) -> anyhow::Result<Backend> {
        if let Some(path) = s.strip_prefix("redb:") {
            anyhow::ensure!(!path.is_empty(), "--store redb:PATH needs a path");
            return Ok(Backend::Redb(PathBuf::from(path)));
        }
        if s.starts_with(flotilla_etcd::SCHEME) {
            return Ok(Backend::Etcd(Endpoints::parse(s).context("--store")?));
        }
        anyhow::bail!("--store {s:?}: expected redb:PATH or etcd://HOST:PORT[,HOST:PORT]...")
    }
}

/// How to build the app's scheduler once this process holds the lease.
pub struct Parts {
    pub spec: flotilla_scheduler::AppSpec,
    pub cluster: Arc<flotilla_view::ClusterView>,
    pub aggregators: Vec<String>,
    pub dialer: flotilla_proto::dial::Dialer,
    /// Shared by every app of the process.
    pub channels: flotilla_scheduler::ShardChannels,
    pub unknown_grace: Duration,
    pub state: Arc<flotilla_control::ControlState>,
    pub leader: Leader,
}

impl Parts {
    fn start(&self, store: Arc<dyn Store>) -> anyhow::Result<()> {
        let (scheduler, handle) = flotilla_scheduler::Scheduler::new(
            self.spec.clone(),
            self.cluster.clone(),
            self.aggregators.clone(),
            store,
        )?;
        let scheduler = scheduler
            .with_dialer(self.dialer.clone())
            .with_channels(self.channels.clone())
            .with_unknown_grace(self.unknown_grace)
            .with_policies(self.state.policies.book())
            .with_leader(self.leader.clone());
        self.state.apps.add_local(handle);
        tokio::spawn(scheduler.run());
        Ok(())
    }
}

/// The lease options (`--store-prefix`, `--lease-ttl`).
pub struct LeaseOptions {
    pub prefix: String,
    pub ttl: Duration,
}

/// The lease this process holds, given up on shutdown so a standby takes over at once.
pub type Held = Arc<tokio::sync::Mutex<Option<Leadership>>>;

/// Gives the lease up (SIGTERM): the etcd lease is revoked, the key goes, a standby
/// takes over without waiting for the TTL.
pub async fn resign(held: &Held) {
    if let Some(l) = held.lock().await.take() {
        l.resign().await;
    }
}

fn became_active(app: &str, token: u64) {
    metrics::counter!(m::SCHEDULER_TAKEOVERS.name, "app" => app.to_string()).increment(1);
    metrics::gauge!(m::SCHEDULER_LEADER.name, "app" => app.to_string()).set(1.0);
    metrics::gauge!(m::SCHEDULER_FENCING_TOKEN.name, "app" => app.to_string()).set(token as f64);
}

/// The store, opened once for every app this process hosts (`--apps-dir`): one redb
/// file, whose lock is the lease of all of them, or one etcd client over which each app
/// campaigns for its own lease.
pub enum Opened {
    Redb(PathBuf, Arc<dyn Store>),
    /// The client the apps campaign with, and the store connection their stores share.
    Etcd(Box<flotilla_etcd::Client>, flotilla_scheduler::EtcdStore),
}

impl Opened {
    /// Opens the store, waiting while another process holds the redb file (each app's
    /// status says so meanwhile).
    pub async fn open(backend: Backend, opts: &LeaseOptions, leaders: &[Leader]) -> anyhow::Result<Opened> {
        Ok(match backend {
            Backend::Redb(path) => {
                let store = open_redb(&path, leaders).await?;
                Opened::Redb(path, store)
            }
            Backend::Etcd(endpoints) => {
                let client = flotilla_etcd::connect(&endpoints, flotilla_etcd::REQUEST_TIMEOUT).await?;
                let store =
                    flotilla_scheduler::EtcdStore::open(&endpoints, &opts.prefix, flotilla_etcd::REQUEST_TIMEOUT)
                        .with_context(|| format!("opening the store {endpoints}"))?;
                Opened::Etcd(Box::new(client), store)
            }
        })
    }
}

/// Campaigns, starts the scheduler the first time, and campaigns again after every
/// loss; runs until the process ends.
#[tracing::instrument(skip_all, fields(app = %parts.spec.name, instance = %parts.leader.instance()))]
pub async fn run(opened: &Opened, opts: &LeaseOptions, parts: &Parts, held: &Held) -> anyhow::Result<()> {
    let app = parts.spec.name.clone();
    metrics::gauge!(m::SCHEDULER_LEADER.name, "app" => app.clone()).set(0.0);
    match opened {
        Opened::Redb(path, store) => {
            // redb's lock on the file is the lease: held until this process exits.
            let token = store.load(&app)?.fencing_token + 1;
            store.write(&app, &[flotilla_scheduler::Write::FencingToken(token)])?;
            parts.leader.set(Lease::local(&path.display().to_string(), token));
            became_active(&app, token);
            tracing::info!(token, "active (holding the store file's lock)");
            parts.start(store.clone())
        }
        Opened::Etcd(client, shared) => {
            // A store of its own per app, on the shared connection: each fences its
            // writes with its app's lease.
            let store = Arc::new(shared.sharing());
            let campaign = Campaign {
                key: flotilla_etcd::scheduler_leader_key(&opts.prefix, &app),
                value: parts.leader.instance().to_string(),
                ttl: opts.ttl,
                request_timeout: flotilla_etcd::REQUEST_TIMEOUT,
            };
            let mut started = false;
            loop {
                let leader = parts.leader.clone();
                let mut logged = String::new();
                let leadership = flotilla_etcd::campaign(client, &campaign, |w| {
                    let why = match w {
                        Waiting::Held(h) => format!("{} is active (token {})", h.value, h.token),
                        Waiting::Unreachable(e) => format!("cannot reach etcd: {e}"),
                    };
                    if why != logged {
                        tracing::info!(%why, "standby");
                        logged = why.clone();
                    }
                    leader.set_waiting(why);
                })
                .await;
                let lease = leadership.lease().clone();
                store.fence(lease.clone());
                parts.leader.set(lease.clone());
                became_active(&app, lease.token());
                tracing::info!(token = lease.token(), "active (holding the etcd lease)");
                *held.lock().await = Some(leadership);
                if !started {
                    match parts.start(store.clone()) {
                        Ok(()) => started = true,
                        Err(e) => {
                            // Give the lease up rather than hold it doing nothing.
                            tracing::warn!(error = %format!("{e:#}"), "cannot start the scheduler; resigning and trying again");
                            resign(held).await;
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    }
                }
                let why = lease.lost().await;
                metrics::counter!(m::SCHEDULER_LEASE_LOSSES.name, "app" => app.clone()).increment(1);
                metrics::gauge!(m::SCHEDULER_LEADER.name, "app" => app.clone()).set(0.0);
                tracing::warn!(%why, token = lease.token(), "lost the lease: acting on nothing until it is held again");
                held.lock().await.take();
            }
        }
    }
}

/// Opens the redb file, waiting while another scheduler holds it (redb locks it).
async fn open_redb(path: &std::path::Path, leaders: &[Leader]) -> anyhow::Result<Arc<dyn Store>> {
    let mut logged = false;
    loop {
        match flotilla_scheduler::RedbStore::open(path) {
            Ok(s) => return Ok(Arc::new(s)),
            Err(e) if e.0.contains("already open") => {
                if !logged {
                    tracing::info!(path = %path.display(), "standby: another scheduler has the store open; waiting for it");
                    logged = true;
                }
                for leader in leaders {
                    leader.set_waiting(format!("another scheduler has {} open", path.display()));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(anyhow::anyhow!("{e}"))
                    .with_context(|| format!("opening the store {} (its dir must be writable)", path.display()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_parse() {
        assert_eq!(Backend::parse("redb:/x/s.redb").unwrap(), Backend::Redb("/x/s.redb".into()));
        assert!(
            matches!(Backend::parse("etcd://127.0.0.1:2379,h:1").unwrap(), Backend::Etcd(e) if e.hosts().len() == 2)
        );
        for bad in ["redb:", "etcd://", "etcd://h", "mysql://x", "/path"] {
            assert!(Backend::parse(bad).is_err(), "{bad}");
        }
    }
}
