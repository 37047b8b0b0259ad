//! The proxy's client connections, bounded as HAProxy's `maxconn` and `timeout
//! http-request` / `timeout client` bound them: a connection that sends no request head
//! within the header timeout, or sits idle between requests past the idle timeout, is
//! closed; and the proxy holds at most so many connections in all and from one source
//! address. At a cap a new connection closes the idlest connection (of its source, then
//! of all) to make room, so idle and stalled clients cost nothing that real ones need;
//! only when none is idle is the new one refused. Out of file descriptors, the accept
//! loop sheds the idlest too.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_core::LockExt;
use tokio::sync::Notify;

use crate::catalogue as m;

/// The limits on client connections (`flotilla route --client-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// From a request's first byte to its whole head.
    pub header_timeout: Duration,
    /// Between requests on a keep-alive connection.
    pub idle_timeout: Duration,
    /// Client connections of the whole proxy (every thread).
    pub max_connections: usize,
    /// Client connections from one source address.
    pub max_per_source: usize,
    /// How long one write of an answer may wait for the client to read before the
    /// connection is closed: a client that asks and never reads holds nothing for long.
    pub write_timeout: Duration,
}

impl Default for ClientLimits {
    fn default() -> Self {
        let max = default_max_connections();
        ClientLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: max,
            max_per_source: (max / 2).max(1),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Half the file descriptors the process may open, less a margin for listeners, logs
/// and the metrics server: each client connection may hold a backend connection too.
pub fn default_max_connections() -> usize {
    let soft = flotilla_obs::process::open_file_limit().unwrap_or(1 << 20).min(1 << 20);
    (usize::try_from(soft).unwrap_or(1 << 20).saturating_sub(128) / 2).max(64)
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// At `max_per_source` with none of that source's connections idle.
    SourceFull,
    /// At `max_connections` with no connection idle.
    Full,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::SourceFull => "source_full",
            Refused::Full => "full",
        }
    }
}

struct Conn {
    source: IpAddr,
    /// Since when it waits for a request, in ms since [`Clients::epoch`] plus one; 0
    /// while a request is under way. An atomic, so marking it costs a request no lock.
    idle_since: Arc<AtomicU64>,
    close: Arc<Notify>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    conns: HashMap<u64, Conn>,
    per_source: HashMap<IpAddr, usize>,
}

impl Registry {
    /// The connection idle longest, of `source` when given.
    fn idlest(&self, source: Option<IpAddr>) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, c)| source.is_none_or(|s| c.source == s))
            .map(|(id, c)| (c.idle_since.load(Ordering::Relaxed), *id))
            .filter(|(since, _)| *since != 0)
            .min()
            .map(|(_, id)| id)
    }

    /// Closes connection `id`: it leaves the counts now, its task sees the signal.
    fn evict(&mut self, id: u64) {
        if let Some(c) = self.remove(id) {
            c.close.notify_one();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        if let Some(n) = self.per_source.get_mut(&c.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&c.source);
            }
        }
        Some(c)
    }
}

/// The live client connections of one proxy, shared by its threads.
pub struct Clients {
    limits: ClientLimits,
    epoch: Instant,
    registry: Mutex<Registry>,
}

/// One admitted connection; dropping it frees its place.
pub struct Admitted {
    clients: Arc<Clients>,
    id: u64,
    idle_since: Arc<AtomicU64>,
    close: Arc<Notify>,
}

impl Clients {
    pub fn new(limits: ClientLimits) -> Arc<Self> {
        Arc::new(Clients { limits, epoch: Instant::now(), registry: Mutex::new(Registry::default()) })
    }

    pub fn limits(&self) -> ClientLimits {
        self.limits
    }

    /// Admits a connection from `source`, closing the idlest one (of the source at its
    /// cap, else of all at the proxy's) to make room. Returns how many it closed.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Result<(Admitted, usize), Refused> {
        let mut r = self.registry.lock_or_recover();
        let mut evicted = 0;
        if r.per_source.get(&source).copied().unwrap_or(0) >= self.limits.max_per_source {
            let id = r.idlest(Some(source)).ok_or(Refused::SourceFull)?;
            r.evict(id);
            evicted += 1;
        }
        if r.conns.len() >= self.limits.max_connections {
            let id = r.idlest(None).ok_or(Refused::Full)?;
            r.evict(id);
            evicted += 1;
        }
        let id = r.next_id;
        r.next_id += 1;
        let (idle_since, close) = (Arc::new(AtomicU64::new(self.now())), Arc::new(Notify::new()));
        r.conns.insert(id, Conn { source, idle_since: idle_since.clone(), close: close.clone() });
        *r.per_source.entry(source).or_default() += 1;
        metrics::gauge!(m::CLIENT_CONNECTIONS.name).set(r.conns.len() as f64);
        Ok((Admitted { clients: self.clone(), id, idle_since, close }, evicted))
    }

    /// Now, as `Conn::idle_since` counts (never 0).
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Closes the idlest connection (the process ran out of file descriptors).
    pub fn shed_idlest(&self) -> bool {
        let mut r = self.registry.lock_or_recover();
        match r.idlest(None) {
            Some(id) => {
                r.evict(id);
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.registry.lock_or_recover().conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Admitted {
    /// The connection waits for a request (`true`) or serves one (`false`).
    pub fn set_idle(&self, idle: bool) {
        self.idle_since.store(if idle { self.clients.now() } else { 0 }, Ordering::Relaxed);
    }

    /// Resolves once the connection is closed to make room for another.
    pub async fn evicted(&self) {
        self.close.notified().await
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut r = self.clients.registry.lock_or_recover();
        r.remove(self.id);
        metrics::gauge!(m::CLIENT_CONNECTIONS.name).set(r.conns.len() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_source: usize) -> ClientLimits {
        ClientLimits { max_connections: max, max_per_source: per_source, ..ClientLimits::default() }
    }

    #[tokio::test]
    async fn a_full_proxy_closes_the_idlest_connection_for_a_new_one() {
        let clients = Clients::new(limits(3, 10));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let (first, _) = clients.admit(a).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let (second, _) = clients.admit(a).unwrap();
        let (third, _) = clients.admit(a).unwrap();
        for c in [&second, &third] {
            c.set_idle(false);
        }
        // Full: the one idle connection (the first) makes room.
        let (_fourth, evicted) = clients.admit(a).unwrap();
        assert_eq!((evicted, clients.len()), (1, 3));
        tokio::time::timeout(Duration::from_secs(1), first.evicted()).await.expect("the idlest is told to close");
        // Full, and nothing idle but the newcomer: busy connections are never closed.
        _fourth.set_idle(false);
        assert_eq!(clients.admit(a).err(), Some(Refused::Full));
        drop(second);
        assert!(clients.admit(a).is_ok(), "a closed connection frees its place");
    }

    #[test]
    fn one_source_cannot_take_every_place() {
        let clients = Clients::new(limits(10, 2));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let held: Vec<_> = (0..2).map(|_| clients.admit(a).unwrap().0).collect();
        for h in &held {
            h.set_idle(false);
        }
        assert_eq!(clients.admit(a).err(), Some(Refused::SourceFull));
        assert!(clients.admit(b).is_ok(), "another source still gets in");
        held[0].set_idle(true);
        let (_, evicted) = clients.admit(a).unwrap();
        assert_eq!(evicted, 1, "its own idle connection makes room");
    }

    #[test]
    fn the_default_cap_leaves_room_for_backend_connections() {
        let max = default_max_connections();
        assert!(max >= 64);
        let l = ClientLimits::default();
        assert!(l.max_per_source <= l.max_connections);
    }
}
