//! `flotilla-loadtest heartbeats`: simulated agents register over real QUIC with real
//! shard processes, then send one sealed heartbeat per node per second over real UDP,
//! one heartbeat per datagram (as real agents send), many nodes sharing a socket. Then
//! the same flows go to bare receivers (`sink`) for as long, to set the shard's figure
//! beside the kernel's.

mod sink;

use flotilla_core::LockExt;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use flotilla_proto::seal::{self, Format, Header, MAGIC_HEARTBEAT};
use flotilla_proto::v1::{self, view_service_client::ViewServiceClient, view_update::Update};
use hdrhistogram::Histogram;
use prost::Message;

use crate::common::{Data, ShardProc, SimNode, flotilla_bin, machine, node_index, pct_ms, register_nodes};

#[derive(Debug, Args)]
pub struct HeartbeatArgs {
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Length of the measured window (after a 2 s warm-up).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Nodes per second whose heartbeat flips their health class (view lag samples).
    #[arg(long, default_value_t = 50)]
    pub flips_per_second: usize,
    /// UDP sockets the simulated nodes share, each its own source port: the distinct
    /// flows the shard sees (real agents send from one flow each, so a few flows
    /// carrying many nodes would flatter any batching in the kernel).
    #[arg(long, default_value_t = 1000)]
    pub sockets: usize,
    #[arg(long)]
    pub json: bool,
    /// The `flotilla` binary (default: next to this one).
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
}

/// A pending lag measurement: when the flipping heartbeat left, and which way it flipped.
pub type Pending = Arc<Mutex<HashMap<usize, (Instant, bool)>>>;

pub async fn run(a: HeartbeatArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.nodes >= 1 && a.nodes <= 2_000_000, "--nodes must be within 1..=2000000");
    anyhow::ensure!(a.shards >= 1 && a.shards <= 64, "--shards must be within 1..=64");
    anyhow::ensure!(a.sockets >= 1 && a.sockets <= 4096, "--sockets must be within 1..=4096");
    let bin = flotilla_bin(a.flotilla.clone())?;
    let data = Data::create("hb")?;
    println!("machine: {}", machine());
    // Registration of every node finishes before the first heartbeat is sent, so the
    // timeouts must outlast it; they do not change the ingest path being measured.
    // A million nodes take longer than 20 s to register on this machine: scale them.
    let suspect = (a.nodes as u64 / 5_000).max(20);
    let liveness =
        ["--suspect-after".into(), format!("{suspect}s"), "--dead-after".into(), format!("{}s", suspect * 3 / 2)];
    println!("liveness: {}; one heartbeat per node per second", liveness.join(" "));
    let mut shards = Vec::new();
    for i in 0..a.shards {
        shards.push(ShardProc::spawn(&bin, &data.dir, i, a.shards, &liveness)?);
    }
    let rss_empty: Vec<u64> = shards.iter().map(ShardProc::rss_bytes).collect();
    let mut heap_empty = 0.0;
    for s in &shards {
        heap_empty += s.metric("flotilla_heap_bytes").await?;
    }

    let started = Instant::now();
    let nodes = register_nodes(&shards, &data, a.nodes, 8000).await?.nodes;
    let reg_secs = started.elapsed().as_secs_f64();
    println!("registered {} nodes in {:.1}s ({:.0}/s)", nodes.len(), reg_secs, nodes.len() as f64 / reg_secs);

    // Watch every shard's view to time health flips from heartbeat to delta.
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let lag = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let measuring = Arc::new(AtomicBool::new(false));
    let snapshots = Arc::new(tokio::sync::Semaphore::new(0));
    for shard in &shards {
        let mut client = ViewServiceClient::new(data.dialer()?.connect(&shard.addr, None).await?)
            .max_decoding_message_size(flotilla_proto::MAX_GRPC_MESSAGE);
        let mut stream = client.watch_view(v1::WatchViewRequest { from_version: None }).await?.into_inner();
        let (pending, lag, measuring, snapshots) = (pending.clone(), lag.clone(), measuring.clone(), snapshots.clone());
        tokio::spawn(async move {
            while let Ok(Some(u)) = stream.message().await {
                let d = match u.update {
                    Some(Update::Delta(d)) => d,
                    Some(Update::Snapshot(c)) if c.last => {
                        snapshots.add_permits(1);
                        continue;
                    }
                    _ => continue,
                };
                let now = Instant::now();
                for r in d.upserts {
                    let Some(i) = node_index(&r.node_id) else { continue };
                    let score = r.health.map(|h| h.score).unwrap_or(1.0);
                    let mut p = pending.lock_or_recover();
                    if let Some(&(sent, high)) = p.get(&i)
                        && ((high && score <= 0.3) || (!high && score >= 0.9))
                    {
                        p.remove(&i);
                        if measuring.load(Ordering::Relaxed) {
                            let us = now.duration_since(sent).as_micros() as u64;
                            let _ = lag.lock_or_recover().record(us.max(1));
                        }
                    }
                }
            }
        });
    }

    // The shard's heap holds a subscriber's snapshot while it is being sent: measure after.
    tokio::time::timeout(Duration::from_secs(120), snapshots.acquire_many(a.shards as u32))
        .await
        .map_err(|_| anyhow::anyhow!("the view subscribers got no snapshot within 120 s"))??
        .forget();
    let nodes = Arc::new(nodes);
    let dests = Arc::new(Mutex::new(shards.iter().map(|s| s.heartbeat).collect::<Vec<SocketAddr>>()));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let datagram_bytes = Arc::new(AtomicU64::new(0));
    let sender = {
        let (nodes, dests, stop, sent, pending, db) =
            (nodes.clone(), dests.clone(), stop.clone(), sent.clone(), pending.clone(), datagram_bytes.clone());
        let (flips, sockets) = (a.flips_per_second, a.sockets);
        std::thread::spawn(move || send_loop(&nodes, &dests, sockets, flips, &stop, &sent, &pending, &db))
    };

    tokio::time::sleep(Duration::from_secs(2)).await; // warm-up: every node heartbeating
    let rss_full: Vec<u64> = shards.iter().map(ShardProc::rss_bytes).collect();
    // The least of five samples 200 ms apart: what the nodes hold, not a batch in flight.
    let mut heap_full = 0.0;
    for s in &shards {
        let mut least = f64::MAX;
        for _ in 0..5 {
            least = least.min(s.metric("flotilla_heap_bytes").await?);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        heap_full += least;
    }
    measuring.store(true, Ordering::Relaxed);
    let cpu0: Vec<f64> = shards.iter().map(ShardProc::cpu_seconds).collect();
    let ingest0: Option<f64> = shards.iter().map(ShardProc::ingest_cpu_seconds).sum();
    let mut acc0 = 0.0;
    let (mut bytes0, mut versions0, mut rejected0) = (0.0, 0.0, 0.0);
    for s in &shards {
        acc0 += s.metric("flotilla_heartbeats_received_total").await?;
        bytes0 += s.metric("flotilla_view_bytes_copied_total").await?;
        versions0 += s.metric("flotilla_view_versions_total").await?;
        rejected0 += s.metric("flotilla_heartbeats_rejected_total").await?;
    }
    let sent0 = sent.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let window = t0.elapsed().as_secs_f64();
    let cpu1: Vec<f64> = shards.iter().map(ShardProc::cpu_seconds).collect();
    let ingest1: Option<f64> = shards.iter().map(ShardProc::ingest_cpu_seconds).sum();
    let (mut acc1, mut bytes1, mut versions1, mut rejected1) = (0.0, 0.0, 0.0, 0.0);
    for s in &shards {
        acc1 += s.metric("flotilla_heartbeats_received_total").await?;
        bytes1 += s.metric("flotilla_view_bytes_copied_total").await?;
        versions1 += s.metric("flotilla_view_versions_total").await?;
        rejected1 += s.metric("flotilla_heartbeats_rejected_total").await?;
    }
    let sent1 = sent.load(Ordering::Relaxed);
    measuring.store(false, Ordering::Relaxed);

    // The same flows to bare receivers, after a second for the switch to settle.
    let sink = sink::Sink::start(a.shards)?;
    *dests.lock_or_recover() = sink.addrs.clone();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (sunk0, sink_cpu0, t0) = (sink.received(), sink.cpu_seconds()?, Instant::now());
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let (sunk, sink_cpu) = (sink.received() - sunk0, sink.cpu_seconds()? - sink_cpu0);
    let sink_window = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    drop(sink);

    let absorbed = acc1 - acc0;
    let cpu: f64 = cpu1.iter().zip(&cpu0).map(|(b, a)| b - a).sum();
    let lag = lag.lock_or_recover().clone();
    let rss_per_node = rss_full.iter().zip(&rss_empty).map(|(f, e)| f.saturating_sub(*e)).sum::<u64>() as f64
        / nodes.len().max(1) as f64;
    let versions = (versions1 - versions0).max(1.0);
    let per_dgram = datagram_bytes.load(Ordering::Relaxed) as f64 / sent1.max(1) as f64;
    let per_cpu = if cpu > 0.0 { absorbed / cpu } else { 0.0 };
    let sink_per_cpu = if sink_cpu > 0.0 { sunk as f64 / sink_cpu } else { 0.0 };
    // The receive thread alone, like for like with the bare receivers (the rest of the
    // process is the applier, the view streams and the runtime).
    let ingest_cpu = ingest1.zip(ingest0).map(|(b, a)| b - a);
    let ingest_per_cpu = ingest_cpu.map(|c| if c > 0.0 { absorbed / c } else { 0.0 });
    let ratio =
        |per_cpu: f64| if sink_per_cpu > 0.0 { (per_cpu / sink_per_cpu * 1000.0).round() / 1000.0 } else { 0.0 };
    let result = serde_json::json!({
        "scenario": "heartbeats",
        "nodes": nodes.len(),
        "shards": a.shards,
        "seconds": a.seconds,
        "heartbeats_per_datagram": 1,
        "source_flows": a.sockets,
        "heartbeat_datagram_bytes": per_dgram.round(),
        "heartbeats_sent_per_second": ((sent1 - sent0) as f64 / window).round(),
        "heartbeats_per_second": (absorbed / window).round(),
        "heartbeats_rejected": rejected1 - rejected0,
        "shard_cpu_seconds": (cpu * 100.0).round() / 100.0,
        "heartbeats_per_shard_cpu_second": per_cpu.round(),
        "kernel_sink_per_second": (sunk as f64 / sink_window).round(),
        "kernel_sink_per_cpu_second": sink_per_cpu.round(),
        "ratio_to_kernel": ratio(per_cpu),
        "ingest_thread_cpu_seconds": ingest_cpu.map(|c| (c * 100.0).round() / 100.0),
        "heartbeats_per_ingest_thread_cpu_second": ingest_per_cpu.map(f64::round),
        "ingest_thread_ratio_to_kernel": ingest_per_cpu.map(ratio),
        "view_lag_p50_ms": pct_ms(&lag, 0.5),
        "view_lag_p99_ms": pct_ms(&lag, 0.99),
        "view_lag_samples": lag.len(),
        "shard_rss_bytes_per_node": rss_per_node.round(),
        "shard_heap_bytes_per_node": ((heap_full - heap_empty) / nodes.len().max(1) as f64).round(),
        "view_bytes_copied_per_version": ((bytes1 - bytes0) / versions).round(),
        "view_versions_per_second": ((versions1 - versions0) / window).round(),
        "registrations_per_second": (nodes.len() as f64 / reg_secs).round(),
    });
    println!(
        "absorbed {:.0} heartbeats/s using {:.2} shard CPU-seconds over {:.1}s ({:.2} in the receive thread)",
        absorbed / window,
        cpu,
        window,
        ingest_cpu.unwrap_or(f64::NAN)
    );
    println!(
        "bare receivers on the same flows: {:.0} datagrams/s using {:.2} CPU-seconds ({:.0} per CPU-second; the shard {:.2} of that)",
        sunk as f64 / sink_window,
        sink_cpu,
        sink_per_cpu,
        if sink_per_cpu > 0.0 { per_cpu / sink_per_cpu } else { 0.0 }
    );
    println!(
        "view lag p50 {:.1} ms, p99 {:.1} ms ({} samples); shard RSS {:.0} bytes/node; {:.0} bytes allocated per view version",
        pct_ms(&lag, 0.5),
        pct_ms(&lag, 0.99),
        lag.len(),
        rss_per_node,
        (bytes1 - bytes0) / versions
    );
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}

/// Sends every node's heartbeat once a second, spread over 100 slots of 10 ms, with
/// sendmmsg in batches, to `dests` (by shard, read once a slot); a few nodes a second
/// flip their health class.
#[allow(clippy::too_many_arguments)]
pub fn send_loop(
    nodes: &[SimNode],
    dests: &Mutex<Vec<SocketAddr>>,
    n_sockets: usize,
    flips_per_second: usize,
    stop: &AtomicBool,
    sent: &AtomicU64,
    pending: &Pending,
    datagram_bytes: &AtomicU64,
) {
    let sockets: Vec<std::net::UdpSocket> =
        (0..n_sockets).filter_map(|_| std::net::UdpSocket::bind("127.0.0.1:0").ok()).collect();
    if sockets.len() < n_sockets {
        eprintln!("only {} of {n_sockets} sockets could be opened (open-file limit?)", sockets.len());
    }
    let mut seq = vec![0u64; nodes.len()];
    let mut high = vec![false; nodes.len()];
    let mut out = Vec::with_capacity(256);
    let mut batches: Vec<Vec<(Vec<u8>, SocketAddr)>> = vec![Vec::new(); sockets.len()];
    let flip_every = nodes.len().checked_div(flips_per_second).map_or(usize::MAX, |n| n.max(1));
    let start = Instant::now();
    let mut round = 0u64;
    let now_ms = || {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    };
    while !stop.load(Ordering::Relaxed) {
        for slot in 0..100usize {
            let target = start + Duration::from_millis(round * 1000 + slot as u64 * 10);
            if let Some(wait) = target.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let mut i = slot;
            let jitter_seed = round as usize;
            // Where each shard's heartbeats go: the run may switch them to the sinks.
            let dests = dests.lock_or_recover().clone();
            while i < nodes.len() {
                let n = &nodes[i];
                seq[i] += 1;
                let flip =
                    (i.wrapping_mul(2_654_435_761) ^ jitter_seed.wrapping_mul(40_503)).is_multiple_of(flip_every);
                if flip {
                    high[i] = !high[i];
                }
                let base = if high[i] { 0.4 } else { 0.0 };
                let steal = base + ((i * 31 + round as usize * 17) % 20) as f32 / 1000.0;
                let body = v1::HeartbeatBody {
                    health: Some(v1::HealthSample {
                        cpu_utilisation: 0.5,
                        cpu_steal: steal,
                        load_per_core: 0.5,
                        memory_pressure: 0.0,
                        preemption_notice: false,
                        workload_latency_ms: 0.0,
                    }),
                    assignment_version: 0,
                    sent_at_unix_ms: now_ms(),
                }
                .encode_to_vec();
                let h = Header {
                    magic: MAGIC_HEARTBEAT,
                    format: Format::Mac,
                    session_id: n.session_id,
                    seq: seq[i],
                    incarnation: n.incarnation,
                    node_id: &n.id,
                };
                if seal::seal(&n.key, &h, &body, &mut out).is_ok() {
                    if flip {
                        pending.lock_or_recover().insert(i, (Instant::now(), high[i]));
                    }
                    batches[i % sockets.len()].push((out.clone(), dests[n.shard]));
                }
                i += 100;
            }
            for (s, batch) in batches.iter_mut().enumerate() {
                let n = sendmmsg_all(&sockets[s], batch);
                sent.fetch_add(n as u64, Ordering::Relaxed);
                datagram_bytes.fetch_add(batch.iter().take(n).map(|(b, _)| b.len() as u64).sum(), Ordering::Relaxed);
                batch.clear();
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
        }
        round += 1;
    }
}

/// Sends every datagram with as few `sendmmsg` calls as possible; returns how many left.
fn sendmmsg_all(socket: &std::net::UdpSocket, msgs: &[(Vec<u8>, SocketAddr)]) -> usize {
    use std::os::fd::AsRawFd;
    let mut addrs: Vec<libc::sockaddr_in> = msgs
        .iter()
        .map(|(_, a)| {
            let SocketAddr::V4(v4) = a else { unreachable!("loadtest shards listen on IPv4 loopback") };
            libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
                sin_zero: [0; 8],
            }
        })
        .collect();
    let mut iovs: Vec<libc::iovec> =
        msgs.iter().map(|(b, _)| libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }).collect();
    let mut hdrs: Vec<libc::mmsghdr> = (0..msgs.len())
        .map(|i| {
            // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = &mut addrs[i] as *mut libc::sockaddr_in as *mut libc::c_void;
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            h.msg_hdr.msg_iov = &mut iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let mut done = 0;
    while done < hdrs.len() {
        let chunk = (hdrs.len() - done).min(256);
        // SAFETY: hdrs[done..done+chunk] are initialised mmsghdrs pointing at live buffers.
        let n = unsafe { libc::sendmmsg(socket.as_raw_fd(), hdrs.as_mut_ptr().add(done), chunk as u32, 0) };
        if n <= 0 {
            break;
        }
        done += n as usize;
    }
    done
}

/// Shard processes with simulated nodes registered and heartbeating once a second (some
/// flipping health class, so the view moves) until dropped: the cluster the `dashboard`
/// and `pool` scenarios measure against. Liveness is patient (suspect after 60 s) so a
/// loaded machine does not lose nodes meanwhile.
pub struct Heartbeating {
    /// Dropped first (the sender stopped before), then the data dir.
    pub shards: Vec<ShardProc>,
    pub data: Data,
    pub nodes: usize,
    stop: Arc<AtomicBool>,
    sender: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeating {
    /// `nodes` nodes of 8 CPU on `shards` shards of `bin`, `flips` a second flipping.
    pub async fn start(
        bin: &std::path::Path,
        tag: &str,
        nodes: usize,
        shards: usize,
        flips: usize,
    ) -> anyhow::Result<Self> {
        let data = Data::create(tag)?;
        let liveness = ["--suspect-after", "60s", "--dead-after", "90s"].map(String::from);
        let mut procs = Vec::new();
        for i in 0..shards {
            procs.push(ShardProc::spawn(bin, &data.dir, i, shards, &liveness)?);
        }
        let started = Instant::now();
        let sims = Arc::new(register_nodes(&procs, &data, nodes, 8000).await?.nodes);
        println!("registered {} nodes in {:.1}s", sims.len(), started.elapsed().as_secs_f64());
        let stop = Arc::new(AtomicBool::new(false));
        let sender = {
            let (sims, stop) = (sims.clone(), stop.clone());
            let dests = Mutex::new(procs.iter().map(|s| s.heartbeat).collect());
            std::thread::spawn(move || {
                let pending: Pending = Default::default();
                let (sent, bytes) = (AtomicU64::new(0), AtomicU64::new(0));
                send_loop(&sims, &dests, 16, flips, &stop, &sent, &pending, &bytes)
            })
        };
        Ok(Heartbeating { shards: procs, data, nodes: sims.len(), stop, sender: Some(sender) })
    }

    /// Stops the heartbeats (the shards stay up until dropped).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self.sender.take() {
            let _ = s.join();
        }
    }
}

impl Drop for Heartbeating {
    fn drop(&mut self) {
        self.stop();
    }
}
