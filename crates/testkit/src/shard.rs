//! A shard in the test's own process, reached over real QUIC, UDP and gRPC on loopback,
//! for tests that look inside it (its ledger, view and counters) as they drive it.

use std::time::Duration;

use flotilla_agent::client::{ShardConnection, client_endpoint};
use flotilla_aggregator::{ShardConfig, ShardHandle, Timeouts, TlsMaterial};
use flotilla_proto::v1;

use crate::TempDir;

/// The join token a [`LocalShard`] accepts.
pub const JOIN_TOKEN: &str = "join";

/// Liveness timeouts no test outlasts: nodes that never heartbeat stay Alive.
pub const PATIENT: Timeouts = Timeouts { suspect_after_ms: 60_000, dead_after_ms: 120_000, retention_ms: 60_000 };

/// A shard ([`PATIENT`], publishing every 5 ms) and a QUIC endpoint that trusts it.
pub struct LocalShard {
    pub shard: ShardHandle,
    pub endpoint: quinn::Endpoint,
    /// Holds the CA the endpoint trusts.
    pub dir: TempDir,
}

impl LocalShard {
    /// Starts shard 0 of 1 on a free port, with `configure` applied to its configuration.
    pub async fn start(name: &str, configure: impl FnOnce(&mut ShardConfig)) -> LocalShard {
        let dir = TempDir::new(name);
        let (tls, cert_pem, _) = TlsMaterial::self_signed(&["localhost", "127.0.0.1"]).unwrap();
        std::fs::write(dir.join("ca.crt"), cert_pem).unwrap();
        let listen = "127.0.0.1:0".parse().unwrap();
        let mut config = ShardConfig::new(listen, 0, 1, b"master-secret".to_vec(), vec![JOIN_TOKEN.into()], tls);
        config.timeouts = PATIENT;
        config.batch_window = Duration::from_millis(5);
        configure(&mut config);
        let shard = flotilla_aggregator::start(config).await.unwrap();
        let endpoint = client_endpoint(&dir.join("ca.crt"), "127.0.0.1:0".parse().unwrap()).unwrap();
        LocalShard { shard, endpoint, dir }
    }

    /// A new QUIC connection, as an agent opens one.
    pub async fn connect(&self) -> ShardConnection {
        ShardConnection::connect(&self.endpoint, self.shard.addr, "127.0.0.1").await.unwrap()
    }

    /// Waits until the shard has published version `seq`.
    pub async fn wait_version(&self, seq: u64) {
        let what = format!("the view to reach seq {seq}");
        crate::wait_for_async(&what, Duration::from_secs(5), || {
            (self.shard.publisher.load().version.seq >= seq).then_some(())
        })
        .await
    }
}

/// Node `node` of incarnation 1 in failure domain `domain`, with `cpu_millis` and 1 GiB,
/// registering with `token`.
pub fn registration(node: &str, token: &str, domain: &str, cpu_millis: u64) -> v1::RegisterRequest {
    v1::RegisterRequest {
        protocol_version: flotilla_core::PROTOCOL_VERSION,
        join_token: token.into(),
        node_id: node.into(),
        incarnation: 1,
        labels: [("domain".to_string(), domain.to_string())].into_iter().collect(),
        capacity: Some(v1::Resources { cpu_millis, memory_bytes: 1 << 30, ..Default::default() }),
        ..Default::default()
    }
}
