//! Where `flotilla aggregator` keeps its persisted state (cordons, drains, fencing marks):
//! the data dir by default, etcd under the key prefix with `--store etcd://…`, so a shard
//! started on another machine (or a standby taking over) finds them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flotilla_aggregator::persist::SaveFuture;
use flotilla_aggregator::{FileState, ShardState, StateStore};

/// The shard state in etcd: one key, `PREFIX/shards/I-of-N/state`.
pub struct EtcdState {
    client: flotilla_etcd::Client,
    key: String,
    timeout: Duration,
}

impl EtcdState {
    pub fn new(client: flotilla_etcd::Client, prefix: &str, shard: usize, shards: usize) -> Self {
        let key = flotilla_etcd::key(prefix, &format!("shards/{shard}-of-{shards}/state"));
        EtcdState { client, key, timeout: flotilla_etcd::REQUEST_TIMEOUT }
    }

    /// The saved state; an absent key is a shard that never saved any.
    pub async fn load(&self) -> anyhow::Result<ShardState> {
        let mut client = self.client.clone();
        let r = flotilla_etcd::within(self.timeout, "reading the shard state", client.get(self.key.as_str(), None))
            .await
            .with_context(|| format!("reading the shard state from etcd key {}", self.key))?;
        match r.kvs().first() {
            None => Ok(ShardState::default()),
            Some(kv) => ShardState::from_bytes(kv.value())
                .with_context(|| format!("the shard state in etcd key {} is not valid (fix or delete it)", self.key)),
        }
    }
}

impl StateStore for EtcdState {
    fn save(&self, bytes: Vec<u8>) -> SaveFuture {
        let (mut client, key, timeout) = (self.client.clone(), self.key.clone(), self.timeout);
        Box::pin(async move {
            flotilla_etcd::within(timeout, "writing the shard state", client.put(key.as_str(), bytes, None))
                .await
                .with_context(|| format!("writing the shard state to etcd key {key}"))?;
            Ok(())
        })
    }

    fn describe(&self) -> String {
        format!("etcd key {}", self.key)
    }
}

/// The state store: etcd when connected (`--store`), else the data dir's file; and what
/// it holds now.
pub async fn open(
    etcd: Option<flotilla_etcd::Client>,
    prefix: &str,
    data: &std::path::Path,
    shard: usize,
    shards: usize,
) -> anyhow::Result<(Arc<dyn StateStore>, ShardState)> {
    match etcd {
        Some(client) => {
            let state = EtcdState::new(client, prefix, shard, shards);
            let loaded = state.load().await?;
            Ok((Arc::new(state), loaded))
        }
        None => {
            let file = FileState::new(data.join(format!("shard-{shard}-of-{shards}.state.json")));
            let loaded = file.load()?;
            Ok((Arc::new(file), loaded))
        }
    }
}
