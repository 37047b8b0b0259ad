//! Whether this process is its app's active scheduler: one per app holds a lease (an
//! etcd lease, or the lock on a redb file), and only the holder commits, releases or
//! writes the store, each request carrying the lease's fencing token. Standbys and a
//! holder that lost its lease keep publishing what they know (routes, status) and act
//! on nothing until they hold the lease again; then they reload the app from the store.

use flotilla_core::LockExt;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use flotilla_etcd::Lease;
use serde::Serialize;

/// The token a scheduler without any lease sends (the embedded `flotilla up`, tests).
pub const LOCAL_TOKEN: u64 = 1;

/// Shared between the campaign (which sets the lease) and the scheduler (which checks
/// it before acting). Cheap to clone.
#[derive(Clone)]
pub struct Leader {
    inner: Arc<Inner>,
}

struct Inner {
    instance: String,
    lease: ArcSwapOption<Lease>,
    /// Why a standby waits (who holds the lease, or why etcd cannot be asked).
    waiting: Mutex<Option<String>>,
    /// Counts the leases taken, so the scheduler acts on one at once rather than at its
    /// next tick (which a quiet app spaces out).
    taken: tokio::sync::watch::Sender<u64>,
}

/// What `apps` shows about the scheduler serving an app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Role {
    /// This process (`--instance`, default `HOST:PID`).
    pub instance: String,
    /// `active` while it holds the lease, else `standby`.
    pub role: &'static str,
    /// The token of the lease it holds or last held (0: never held one).
    pub fencing_token: u64,
    /// Why a standby waits: who holds the lease, or why the lease was lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

impl Leader {
    /// A standby: no lease until [`Leader::set`].
    pub fn standby(instance: &str) -> Leader {
        Leader {
            inner: Arc::new(Inner {
                instance: instance.into(),
                lease: ArcSwapOption::empty(),
                waiting: Mutex::default(),
                taken: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// Active for good with [`LOCAL_TOKEN`]: one scheduler per app by construction
    /// (`flotilla up`, tests, the simulation).
    pub fn always(instance: &str) -> Leader {
        let l = Leader::standby(instance);
        l.set(Lease::local("local", LOCAL_TOKEN));
        l
    }

    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// This process holds `lease` now.
    pub fn set(&self, lease: Lease) {
        *self.inner.waiting.lock_or_recover() = None;
        self.inner.lease.store(Some(Arc::new(lease)));
        self.inner.taken.send_modify(|n| *n += 1);
    }

    /// Changes each time this process takes a lease.
    pub fn taken(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.taken.subscribe()
    }

    /// Notes why a standby waits.
    pub fn set_waiting(&self, why: String) {
        *self.inner.waiting.lock_or_recover() = Some(why);
    }

    /// The lease while it is held (checked against the clock: a paused process that
    /// wakes up after its TTL gets `None` before doing anything).
    pub fn held(&self) -> Option<Lease> {
        self.inner.lease.load_full().filter(|l| l.is_held()).map(|l| (*l).clone())
    }

    /// Whether the lease is held now ([`Leader::held`] without taking a copy of it: a
    /// process hosting many apps asks for each of them several times a second).
    pub fn is_held(&self) -> bool {
        self.inner.lease.load().as_ref().is_some_and(|l| l.is_held())
    }

    /// The lease held or last held.
    pub fn last(&self) -> Option<Lease> {
        self.inner.lease.load_full().map(|l| (*l).clone())
    }

    /// What `apps` shows.
    pub fn role(&self) -> Role {
        let last = self.last();
        let held = last.as_ref().is_some_and(Lease::is_held);
        let waiting = if held {
            None
        } else {
            self.inner.waiting.lock_or_recover().clone().or_else(|| last.as_ref().and_then(Lease::lost_reason))
        };
        Role {
            instance: self.inner.instance.clone(),
            role: if held { "active" } else { "standby" },
            fencing_token: last.map_or(0, |l| l.token()),
            waiting,
        }
    }
}

/// This process's default name: `HOST:PID`.
pub fn default_instance() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "localhost".to_string() } else { host };
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_becomes_active_and_goes_back_when_its_lease_is_lost() {
        let l = Leader::standby("a");
        assert!(l.held().is_none());
        l.set_waiting("b holds it".into());
        assert_eq!(
            l.role(),
            Role { instance: "a".into(), role: "standby", fencing_token: 0, waiting: Some("b holds it".into()) }
        );
        l.set(Lease::local("k", 7));
        assert_eq!(l.held().map(|x| x.token()), Some(7));
        assert!(l.is_held());
        assert_eq!(l.role().role, "active");
        assert_eq!(l.role().waiting, None);
        l.last().unwrap().lose("taken over");
        assert!(l.held().is_none() && !l.is_held());
        assert_eq!(
            l.role(),
            Role { instance: "a".into(), role: "standby", fencing_token: 7, waiting: Some("taken over".into()) }
        );
        assert_eq!(Leader::always("x").held().map(|x| x.token()), Some(LOCAL_TOKEN));
    }
}
