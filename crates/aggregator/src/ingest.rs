//! The heartbeat path: sealed UDP datagrams, received in batches, each touching
//! only its own node's atomics. The view hears about a node only when its status
//! or published health changes.

use crate::catalogue as m;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use flotilla_core::{Hysteresis, NodeStatus, health_score};
use flotilla_proto::seal::{self, DatagramError, Direction, Header, MAGIC_HEARTBEAT, MAGIC_REPLY};
use flotilla_proto::{convert, heartbeat_body, v1};
use prost::Message;

use crate::liveness::record_loss;
use crate::registry::{Change, NodeLive, Registry, SessionsRead};
use crate::stats::{HeartbeatDrop, ShardStats};

/// The state one ingest loop needs; `heard` is the whole per-datagram logic.
pub struct Ingest {
    registry: Arc<Registry>,
    stats: Arc<ShardStats>,
    hysteresis: Hysteresis,
    /// Where an older agent's encrypted (format 1) body is decrypted; a tagged body is
    /// read in place. Goes with format 1.
    scratch: Vec<u8>,
    /// Key derivations for unknown sessions allowed in the current second (HKDF is
    /// the one costly step an attacker could trigger).
    unknown_budget: (u64, u32),
    /// Accepted, not yet added to `stats`; and of those, how many were in the older,
    /// encrypted format.
    accepted: u64,
    accepted_encrypted: u64,
    /// The reply buffer of [`Ingest::receive_batch`], kept between batches.
    reply: Vec<u8>,
}

/// Derivations of unknown-session keys per second before further ones are dropped.
const UNKNOWN_SESSIONS_PER_SECOND: u32 = 20_000;

impl Ingest {
    pub fn new(registry: Arc<Registry>, stats: Arc<ShardStats>) -> Self {
        Ingest {
            registry,
            stats,
            hysteresis: Hysteresis::default(),
            scratch: Vec::with_capacity(256),
            unknown_budget: (0, 0),
            accepted: 0,
            accepted_encrypted: 0,
            reply: Vec::with_capacity(128),
        }
    }

    /// Processes one datagram. On success returns the reply to send, if the agent
    /// must act; every drop is counted with its reason.
    pub fn handle(&mut self, datagram: &[u8], now_ms: u64, reply: &mut Vec<u8>) -> Result<(), HeartbeatDrop> {
        let registry = self.registry.clone();
        let sessions = registry.read_sessions();
        let r = self.receive(&sessions, datagram, now_ms, reply);
        drop(sessions);
        self.flush_counts();
        r
    }

    /// Processes a receive call's datagrams under one read of the sessions, having asked
    /// for every session they name first: each heartbeat's session is a random slot of a
    /// large table, and its cache miss is what the per-datagram work waits for most
    /// (BENCHMARKS.md, heartbeats against the kernel). `answer(i, reply)` sends datagram
    /// `i`'s reply. The count of accepted heartbeats is published once per batch.
    pub fn receive_batch(&mut self, batch: &Batch<'_>, now_ms: u64, mut answer: impl FnMut(usize, &[u8])) {
        let registry = self.registry.clone();
        let sessions = registry.read_sessions();
        let mut named = [0u64; BATCH];
        for (i, named) in named.iter_mut().enumerate().take(batch.len()) {
            if let Some(id) = seal::peek_session_id(batch.datagram(i)) {
                sessions.prefetch(id);
                *named = id;
            }
        }
        let mut reply = std::mem::take(&mut self.reply);
        for i in 0..batch.len() {
            // Two datagrams ahead, the session is likely in cache: ask for its node id.
            if let Some(&ahead) = named.get(i + 2).filter(|&&s| s != 0) {
                sessions.prefetch_node_id(ahead);
            }
            reply.clear();
            let _ = self.receive(&sessions, batch.datagram(i), now_ms, &mut reply);
            if !reply.is_empty() {
                answer(i, &reply);
            }
        }
        self.reply = reply;
        drop(sessions);
        self.flush_counts();
    }

    /// One datagram, counted: accepted ones in `accepted` (published per batch, sparing a
    /// shared atomic per datagram), refusals at once (they are rare).
    fn receive(
        &mut self,
        sessions: &SessionsRead<'_>,
        datagram: &[u8],
        now_ms: u64,
        reply: &mut Vec<u8>,
    ) -> Result<(), HeartbeatDrop> {
        let r = self.handle_inner(sessions, datagram, now_ms, reply);
        match r {
            Ok(_) => self.accepted += 1,
            Err(e) => self.stats.reject(e),
        }
        r
    }

    /// Adds the heartbeats accepted since the last call to the shard's counters.
    fn flush_counts(&mut self) {
        if self.accepted > 0 {
            self.stats.accept(self.accepted, self.accepted_encrypted);
            (self.accepted, self.accepted_encrypted) = (0, 0);
        }
    }

    fn handle_inner(
        &mut self,
        sessions: &SessionsRead<'_>,
        datagram: &[u8],
        now_ms: u64,
        reply: &mut Vec<u8>,
    ) -> Result<(), HeartbeatDrop> {
        if datagram.is_empty() {
            return Err(HeartbeatDrop::Empty);
        }
        let header = seal::parse_header(datagram).map_err(HeartbeatDrop::Datagram)?;
        if header.magic != MAGIC_HEARTBEAT {
            return Err(HeartbeatDrop::Datagram(DatagramError::BadMagic));
        }
        match sessions.get(header.session_id) {
            Some(live) => self.heard(live, datagram, &header, now_ms, reply),
            None => self.unknown_session(datagram, &header, now_ms, reply),
        }
    }

    /// A heartbeat of a session this shard holds.
    fn heard(
        &mut self,
        live: &NodeLive,
        datagram: &[u8],
        header: &Header<'_>,
        now_ms: u64,
        reply: &mut Vec<u8>,
    ) -> Result<(), HeartbeatDrop> {
        if live.node_id.as_str() != header.node_id || live.incarnation != header.incarnation {
            return Err(HeartbeatDrop::WrongNode);
        }
        let plain = seal::open(&live.key, Direction::ToShard, datagram, header, &mut self.scratch)
            .map_err(HeartbeatDrop::Datagram)?;
        let body = heartbeat_body::decode(plain).map_err(|_| HeartbeatDrop::Datagram(DatagramError::BadBody))?;
        let sample = convert::health(body.health).map_err(|_| HeartbeatDrop::Datagram(DatagramError::BadBody))?;
        // Only an authenticated datagram may advance the sequence.
        let prev = live.last_seq.fetch_max(header.seq, Ordering::AcqRel);
        if prev >= header.seq {
            return Err(HeartbeatDrop::Replayed);
        }
        // Sequence numbers skipped since the last one are heartbeats the network lost.
        // A healthy link (nothing lost, nothing remembered) costs one load, not a CAS.
        let lost = if prev == 0 { 0 } else { header.seq - prev - 1 };
        if lost > 0 || live.loss.load(Ordering::Relaxed) != 0 {
            let _ = live.loss.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| Some(record_loss(l, lost)));
        }
        match live.status() {
            NodeStatus::Dead => {
                reply_to(&live.key, header, v1::HeartbeatAction::Reregister, "declared dead", reply);
                return Err(HeartbeatDrop::DeadNode);
            }
            status @ (NodeStatus::Suspect | NodeStatus::Unknown) => {
                live.heard(now_ms);
                if live.transition(status, NodeStatus::Alive, now_ms) {
                    self.registry.emit(Change::Dirty(live.session()));
                }
            }
            NodeStatus::Alive | NodeStatus::Draining => live.heard(now_ms),
        }
        let published = live.health_millis.load(Ordering::Acquire);
        if let Some(new) = self.hysteresis.update(published, health_score(&sample)) {
            live.health_millis.store(new, Ordering::Release);
            self.registry.emit(Change::Health(live.session(), sample));
        }
        if header.format == seal::Format::Aead {
            self.accepted_encrypted += 1;
        }
        Ok(())
    }

    /// A session this shard does not hold. If the seal verifies under the key this
    /// shard's secret derives for it, the shard restarted (or forgot a dead node):
    /// ask the agent to register again. Otherwise it is a forgery.
    fn unknown_session(
        &mut self,
        datagram: &[u8],
        header: &Header<'_>,
        now_ms: u64,
        reply: &mut Vec<u8>,
    ) -> Result<(), HeartbeatDrop> {
        let second = now_ms / 1000;
        if self.unknown_budget.0 != second {
            self.unknown_budget = (second, 0);
        }
        if self.unknown_budget.1 >= UNKNOWN_SESSIONS_PER_SECOND {
            return Err(HeartbeatDrop::UnknownSession);
        }
        self.unknown_budget.1 += 1;
        let key =
            seal::derive_session_key(self.registry.master(), header.session_id, header.incarnation, header.node_id);
        if seal::open(&key, Direction::ToShard, datagram, header, &mut self.scratch).is_err() {
            return Err(HeartbeatDrop::UnknownSession);
        }
        reply_to(&key, header, v1::HeartbeatAction::Reregister, "unknown session", reply);
        Err(HeartbeatDrop::Forgotten)
    }
}

/// Seals a reply telling the agent what to do into `out` (left empty if it cannot be sealed).
fn reply_to(key: &seal::SessionKey, hb: &Header<'_>, action: v1::HeartbeatAction, why: &str, out: &mut Vec<u8>) {
    let body = v1::HeartbeatReply { action: action as i32, reason: why.to_string() }.encode_to_vec();
    let header = Header {
        magic: MAGIC_REPLY,
        format: hb.format,
        session_id: hb.session_id,
        seq: hb.seq,
        incarnation: hb.incarnation,
        node_id: "",
    };
    if seal::seal(key, &header, &body, out).is_err() {
        out.clear();
    }
}

/// Datagrams one receive call takes at most.
const BATCH: usize = 64;
/// Receive buffer per datagram: anything above `MAX_DATAGRAM_LEN` is refused as
/// oversized, so a longer one cut to this length is refused all the same.
const DATAGRAM_BUFFER: usize = 2048;
/// After a receive call that found fewer than [`BATCH`] datagrams, the loop waits this
/// long before the next, so that at any rate one call takes many datagrams (each one
/// heartbeat from its own agent) instead of the shard waking per datagram. It delays a
/// heartbeat by at most this much, against seconds of failure detection.
const GATHER: std::time::Duration = std::time::Duration::from_millis(1);
/// How often a blocked receive looks at the stop flag.
pub(crate) const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Receives heartbeats on `socket` in batches until `shutdown` fires. The receiving is
/// a thread of its own blocked in `recvmmsg` (no readiness polling through the async
/// runtime), so an idle shard spends nothing and a busy one one system call per batch.
pub async fn run(
    socket: std::net::UdpSocket,
    mut ingest: Ingest,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use std::sync::atomic::AtomicBool;
    /// Stops the thread however this future ends (shutdown, or the task aborted).
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let flag = stop.0.clone();
    let batch_sizes = metrics::histogram!(m::HEARTBEAT_BATCH_DATAGRAMS.name);
    let thread = std::thread::Builder::new().name("heartbeats".into()).spawn(move || {
        receive_batches(&socket, &flag, |batch| {
            ingest.receive_batch(&batch, flotilla_core::now_ms(), |i, reply| {
                if let Some(to) = batch.sender(i) {
                    // Best effort: the agent asks again with its next heartbeat.
                    let _ = socket.send_to(reply, to);
                }
            });
            batch_sizes.record(batch.len() as f64);
        })
    })?;
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }
    drop(stop);
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    Ok(())
}

/// What one receive call took: up to [`BATCH`] datagrams and their senders.
pub struct Batch<'a> {
    bufs: &'a [[u8; DATAGRAM_BUFFER]],
    hdrs: &'a [libc::mmsghdr],
    addrs: &'a [libc::sockaddr_storage],
}

impl Batch<'_> {
    pub fn len(&self) -> usize {
        self.hdrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hdrs.is_empty()
    }

    /// Datagram `i` (cut to [`DATAGRAM_BUFFER`] bytes: a longer one is refused anyway).
    pub fn datagram(&self, i: usize) -> &[u8] {
        &self.bufs[i][..(self.hdrs[i].msg_len as usize).min(DATAGRAM_BUFFER)]
    }

    pub fn sender(&self, i: usize) -> Option<SocketAddr> {
        socket_addr(&self.addrs[i], self.hdrs[i].msg_hdr.msg_namelen)
    }
}

/// The heartbeat receive loop without what a heartbeat means: blocking `recvmmsg` calls
/// into fixed buffers, `each` per non-empty batch, until `stop` is set (looked at every
/// [`STOP_POLL`] on a socket made by `crate::heartbeat_socket`). The shard runs it with [`Ingest`]; `flotilla-loadtest heartbeats` runs
/// it with nothing, on the same flows, to measure what the kernel's part costs.
pub fn receive_batches(
    socket: &std::net::UdpSocket,
    stop: &std::sync::atomic::AtomicBool,
    mut each: impl FnMut(Batch<'_>),
) {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let mut bufs = vec![[0u8; DATAGRAM_BUFFER]; BATCH];
    // SAFETY: all-zero sockaddr_storage, iovec and mmsghdr values are valid (null
    // pointers, zero lengths); every pointer is set below before the call.
    let mut addrs: Vec<libc::sockaddr_storage> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut iovs: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; BATCH];
    let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    while !stop.load(Ordering::Relaxed) {
        for i in 0..BATCH {
            iovs[i] = libc::iovec { iov_base: bufs[i].as_mut_ptr().cast(), iov_len: DATAGRAM_BUFFER };
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            hdrs[i].msg_len = 0;
        }
        // Blocks (up to STOP_POLL) for the first datagram, then takes what is queued.
        // SAFETY: hdrs point at BATCH live buffers and addresses owned by this frame.
        let n = unsafe {
            libc::recvmmsg(fd, hdrs.as_mut_ptr(), BATCH as libc::c_uint, libc::MSG_WAITFORONE, std::ptr::null_mut())
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted => {}
                _ => {
                    tracing::warn!(error = %e, "heartbeat receive failed");
                    std::thread::sleep(GATHER);
                }
            }
            continue;
        }
        let n = (n as usize).min(BATCH);
        if n > 0 {
            each(Batch { bufs: &bufs[..n], hdrs: &hdrs[..n], addrs: &addrs[..n] });
        }
        if n < BATCH {
            std::thread::sleep(GATHER);
        }
    }
}

/// The sender's address as `recvmmsg` filled it in.
fn socket_addr(a: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match i32::from(a.ss_family) {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and it is large enough.
            let v4 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(v4.sin_port))))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for a sockaddr_in6.
            let v6 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(v6.sin6_port),
                v6.sin6_flowinfo,
                v6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::tests::request;
    use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

    fn setup() -> (Ingest, Arc<Registry>, Arc<ShardStats>, UnboundedReceiver<Change>) {
        let (tx, rx) = unbounded_channel();
        let reg = Arc::new(Registry::new(0, 1, b"secret".to_vec(), vec!["tok".into()], tx));
        let stats = Arc::new(ShardStats::new(0));
        (Ingest::new(reg.clone(), stats.clone()), reg, stats, rx)
    }

    fn beat(key: &seal::SessionKey, sid: u64, inc: u64, node: &str, seq: u64, steal: f32) -> Vec<u8> {
        beat_as(seal::Format::Mac, key, sid, inc, node, seq, steal)
    }

    fn beat_as(
        format: seal::Format,
        key: &seal::SessionKey,
        sid: u64,
        inc: u64,
        node: &str,
        seq: u64,
        steal: f32,
    ) -> Vec<u8> {
        let body = v1::HeartbeatBody {
            health: Some(v1::HealthSample { cpu_steal: steal, ..Default::default() }),
            assignment_version: 0,
            sent_at_unix_ms: 0,
        }
        .encode_to_vec();
        let h = Header { magic: MAGIC_HEARTBEAT, format, session_id: sid, seq, incarnation: inc, node_id: node };
        let mut out = Vec::new();
        seal::seal(key, &h, &body, &mut out).unwrap();
        out
    }

    #[test]
    fn good_heartbeats_touch_only_liveness() {
        let (mut ing, reg, stats, mut rx) = setup();
        let live = reg.register(request("n1", 1, "a"), 0).unwrap();
        while rx.try_recv().is_ok() {}
        let mut reply = Vec::new();
        for seq in 1..=5 {
            let d = beat(&live.key, live.session_id, 1, "n1", seq, 0.005 * seq as f32);
            assert_eq!(ing.handle(&d, 100 * seq, &mut reply), Ok(()));
        }
        assert_eq!(stats.accepted(), 5);
        assert_eq!(reg.with_session(live.session_id, |l| l.last_seen_ms.load(Ordering::Relaxed)), Some(500));
        assert!(rx.try_recv().is_err(), "jitter inside the band changes nothing in the view");
        // A big health change is published once.
        let d = beat(&live.key, live.session_id, 1, "n1", 6, 0.3);
        ing.handle(&d, 600, &mut reply).unwrap();
        assert!(matches!(rx.try_recv(), Ok(Change::Health(_, _))));
    }

    /// A batch as the receive loop hands it over, over a real socket: good heartbeats of
    /// several sessions, a forgery, garbage and one from a forgotten session (answered).
    #[test]
    fn a_received_batch_is_handled_datagram_by_datagram_under_one_read() {
        let (mut ing, reg, stats, _rx) = setup();
        let nodes: Vec<_> = (0..5).map(|i| reg.register(request(&format!("n{i}"), 1, "a"), 0).unwrap()).collect();
        let shard = crate::heartbeat_socket(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let agent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut sent = 0;
        for (i, n) in nodes.iter().enumerate() {
            agent
                .send_to(&beat(&n.key, n.session_id, 1, &format!("n{i}"), 1, 0.0), shard.local_addr().unwrap())
                .unwrap();
            sent += 1;
        }
        let forged = beat(&[7u8; 32], nodes[0].session_id, 1, "n0", 2, 0.0);
        // A session this shard's secret derives but does not hold: asked to register again.
        let forgotten_key = seal::derive_session_key(b"secret", 999, 1, "gone");
        for d in [forged, b"garbage".to_vec(), beat(&forgotten_key, 999, 1, "gone", 1, 0.0)] {
            agent.send_to(&d, shard.local_addr().unwrap()).unwrap();
            sent += 1;
        }
        let (stop, mut seen, mut answered) = (std::sync::atomic::AtomicBool::new(false), 0, Vec::new());
        receive_batches(&shard, &stop, |batch| {
            ing.receive_batch(&batch, 1_000, |i, reply| answered.push((i, reply.len())));
            seen += batch.len();
            if seen >= sent {
                stop.store(true, Ordering::Relaxed);
            }
        });
        assert_eq!(seen, sent);
        assert_eq!(stats.accepted(), 5, "every good heartbeat, published once the batch is done");
        for n in &nodes {
            assert_eq!(reg.with_session(n.session_id, |l| l.last_seen_ms.load(Ordering::Relaxed)), Some(1_000));
        }
        assert_eq!(stats.rejected(HeartbeatDrop::Datagram(DatagramError::BadSeal)), 1);
        assert_eq!(stats.rejected(HeartbeatDrop::Datagram(DatagramError::Truncated)), 1);
        assert_eq!(stats.rejected(HeartbeatDrop::Forgotten), 1);
        assert_eq!(answered.len(), 1, "only the forgotten session is answered: {answered:?}");
        assert!(answered[0].1 > 0);
    }

    #[test]
    fn bad_datagrams_are_dropped_and_counted() {
        let (mut ing, reg, stats, _rx) = setup();
        let live = reg.register(request("n1", 1, "a"), 0).unwrap();
        let other = reg.register(request("n2", 1, "a"), 0).unwrap();
        let mut reply = Vec::new();
        let good = beat(&live.key, live.session_id, 1, "n1", 10, 0.0);
        assert!(ing.handle(&good, 1, &mut reply).is_ok());
        // Replay, and an older sequence number.
        assert_eq!(ing.handle(&good, 2, &mut reply), Err(HeartbeatDrop::Replayed));
        let old = beat(&live.key, live.session_id, 1, "n1", 9, 0.0);
        assert_eq!(ing.handle(&old, 2, &mut reply), Err(HeartbeatDrop::Replayed));
        // Forged: right header, wrong key; a forgery must not advance the sequence.
        let forged = beat(&[7u8; 32], live.session_id, 1, "n1", 1000, 0.0);
        assert_eq!(ing.handle(&forged, 3, &mut reply), Err(HeartbeatDrop::Datagram(DatagramError::BadSeal)));
        assert!(ing.handle(&beat(&live.key, live.session_id, 1, "n1", 11, 0.0), 3, &mut reply).is_ok());
        // A session speaking for another node id.
        let spoof = beat(&live.key, live.session_id, 1, "n2", 12, 0.0);
        assert_eq!(ing.handle(&spoof, 4, &mut reply), Err(HeartbeatDrop::WrongNode));
        let spoof = beat(&other.key, live.session_id, 1, "n1", 13, 0.0);
        assert_eq!(ing.handle(&spoof, 4, &mut reply), Err(HeartbeatDrop::Datagram(DatagramError::BadSeal)));
        // Malformed and oversized.
        assert_eq!(ing.handle(b"garbage", 5, &mut reply), Err(HeartbeatDrop::Datagram(DatagramError::Truncated)));
        assert_eq!(ing.handle(b"", 5, &mut reply), Err(HeartbeatDrop::Empty));
        assert_eq!(stats.rejected(HeartbeatDrop::Empty), 1);
        assert_eq!(ing.handle(&vec![0u8; 5000], 5, &mut reply), Err(HeartbeatDrop::Datagram(DatagramError::Oversized)));
        let mut truncated = beat(&live.key, live.session_id, 1, "n1", 14, 0.5);
        truncated.truncate(truncated.len() - 3);
        assert_eq!(ing.handle(&truncated, 5, &mut reply), Err(HeartbeatDrop::Datagram(DatagramError::BadSeal)));
        // A body that is sealed correctly but does not decode.
        let h = Header {
            magic: MAGIC_HEARTBEAT,
            format: seal::Format::Mac,
            session_id: live.session_id,
            seq: 15,
            incarnation: 1,
            node_id: "n1",
        };
        let mut junk = Vec::new();
        seal::seal(&live.key, &h, &[0xff, 0xff, 0xff], &mut junk).unwrap();
        assert_eq!(ing.handle(&junk, 6, &mut reply), Err(HeartbeatDrop::Datagram(DatagramError::BadBody)));
        assert_eq!(stats.rejected(HeartbeatDrop::Replayed), 2);
        assert_eq!(stats.rejected(HeartbeatDrop::WrongNode), 1);
        assert_eq!(stats.rejected(HeartbeatDrop::Datagram(DatagramError::BadSeal)), 3);
        assert_eq!(stats.accepted(), 2);
    }

    /// Agents of an earlier release encrypt their heartbeats: during an upgrade the shard
    /// accepts them beside tagged ones, and answers each in the format it came in.
    #[test]
    fn heartbeats_of_either_format_are_accepted_and_answered_in_kind() {
        let (mut ing, reg, stats, _rx) = setup();
        let live = reg.register(request("n1", 1, "a"), 0).unwrap();
        let mut reply = Vec::new();
        let older = beat_as(seal::Format::Aead, &live.key, live.session_id, 1, "n1", 1, 0.0);
        assert_eq!(ing.handle(&older, 100, &mut reply), Ok(()));
        assert_eq!(ing.handle(&beat(&live.key, live.session_id, 1, "n1", 2, 0.0), 200, &mut reply), Ok(()));
        // The sequence is one per session, whatever the format: a replay in the other is refused.
        let replay = beat_as(seal::Format::Aead, &live.key, live.session_id, 1, "n1", 2, 0.0);
        assert_eq!(ing.handle(&replay, 300, &mut reply), Err(HeartbeatDrop::Replayed));
        assert_eq!((stats.accepted(), stats.accepted_encrypted()), (2, 1));
        reg.with_session(live.session_id, |l| l.transition(NodeStatus::Alive, NodeStatus::Dead, 400));
        for (seq, format) in [(3, seal::Format::Aead), (4, seal::Format::Mac)] {
            reply.clear();
            let d = beat_as(format, &live.key, live.session_id, 1, "n1", seq, 0.0);
            assert_eq!(ing.handle(&d, 500, &mut reply), Err(HeartbeatDrop::DeadNode));
            let h = seal::parse_header(&reply).unwrap();
            assert_eq!((h.magic, h.format, h.seq), (MAGIC_REPLY, format, seq));
            let mut scratch = Vec::new();
            let body = seal::open(&live.key, Direction::ToAgent, &reply, &h, &mut scratch).unwrap();
            assert_eq!(v1::HeartbeatReply::decode(body).unwrap().action, v1::HeartbeatAction::Reregister as i32);
        }
    }

    #[test]
    fn a_restarted_shard_recognises_sessions_and_asks_for_registration() {
        let (mut ing, reg, stats, _rx) = setup();
        let live = reg.register(request("n1", 1, "a"), 0).unwrap();
        // A new shard with the same secret, knowing no sessions.
        let (mut fresh, _reg2, stats2, _rx2) = setup();
        let mut reply = Vec::new();
        let d = beat(&live.key, live.session_id, 1, "n1", 1, 0.0);
        assert_eq!(fresh.handle(&d, 1, &mut reply), Err(HeartbeatDrop::Forgotten));
        assert!(!reply.is_empty(), "the agent is told to register again");
        let h = seal::parse_header(&reply).unwrap();
        let mut scratch = Vec::new();
        let body = seal::open(&live.key, Direction::ToAgent, &reply, &h, &mut scratch).unwrap();
        let r = v1::HeartbeatReply::decode(body).unwrap();
        assert_eq!(r.action, v1::HeartbeatAction::Reregister as i32);
        assert_eq!(stats2.rejected(HeartbeatDrop::Forgotten), 1);
        // A session of a different secret is a plain unknown session.
        let alien = seal::derive_session_key(b"other", 5, 1, "x");
        let d = beat(&alien, 5, 1, "x", 1, 0.0);
        reply.clear();
        assert_eq!(ing.handle(&d, 1, &mut reply), Err(HeartbeatDrop::UnknownSession));
        assert!(reply.is_empty());
        assert_eq!(stats.rejected(HeartbeatDrop::UnknownSession), 1);
    }

    #[test]
    fn suspect_nodes_come_back_and_dead_ones_must_reregister() {
        let (mut ing, reg, _stats, mut rx) = setup();
        let live = reg.register(request("n1", 1, "a"), 0).unwrap();
        while rx.try_recv().is_ok() {}
        let transition = |from, to, at| reg.with_session(live.session_id, |l| l.transition(from, to, at)) == Some(true);
        let status = || reg.with_session(live.session_id, |l| l.status());
        assert!(transition(NodeStatus::Alive, NodeStatus::Suspect, 2000));
        let mut reply = Vec::new();
        ing.handle(&beat(&live.key, live.session_id, 1, "n1", 1, 0.0), 2100, &mut reply).unwrap();
        assert_eq!(status(), Some(NodeStatus::Alive));
        assert!(matches!(rx.try_recv(), Ok(Change::Dirty(_))));
        assert!(transition(NodeStatus::Alive, NodeStatus::Dead, 5000));
        assert_eq!(
            ing.handle(&beat(&live.key, live.session_id, 1, "n1", 2, 0.0), 5100, &mut reply),
            Err(HeartbeatDrop::DeadNode)
        );
        assert!(!reply.is_empty());
        assert_eq!(status(), Some(NodeStatus::Dead));
    }
}
