//! Where `flotilla aggregator` keeps its persisted state (cordons, drains, fencing marks):
//! the data dir by default, etcd under the key prefix with `--store etcd://…`, so a shard
//! started on another machine (or a standby taking over) finds them.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flotilla_aggregator::persist::SaveFuture;
use flotilla_aggregator::{FileState, ShardState, StateStore};

/// The shard state in etcd: one key, `PREFIX/shards/I-of-N/state`, written only while
/// this process holds the shard's lease (`fence`): a deposed shard, cut off from etcd
/// while its successor took over, must not overwrite what the successor saved.
pub struct EtcdState {
    client: flotilla_etcd::Client,
    key: String,
    fence: flotilla_etcd::Lease,
    timeout: Duration,
}

impl EtcdState {
    pub fn new(
        client: flotilla_etcd::Client,
        fence: flotilla_etcd::Lease,
        prefix: &str,
        shard: usize,
        shards: usize,
    ) -> Self {
        let key = flotilla_etcd::key(prefix, &format!("shards/{shard}-of-{shards}/state"));
        EtcdState { client, key, fence, timeout: flotilla_etcd::REQUEST_TIMEOUT }
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
        use flotilla_etcd::etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let (mut client, key, timeout, fence) =
            (self.client.clone(), self.key.clone(), self.timeout, self.fence.clone());
        Box::pin(async move {
            let token = i64::try_from(fence.token()).unwrap_or(-1);
            let txn = Txn::new()
                .when([Compare::create_revision(fence.key(), CompareOp::Equal, token)])
                .and_then([TxnOp::put(key.as_str(), bytes, None)]);
            let answer = flotilla_etcd::within(timeout, "writing the shard state", client.txn(txn))
                .await
                .with_context(|| format!("writing the shard state to etcd key {key}"))?;
            if !answer.succeeded() {
                fence.lose("etcd refused a shard-state write: another process holds the shard's lease");
                anyhow::bail!("fenced: {} no longer has token {token}; the shard state was not written", fence.key());
            }
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
    etcd: Option<(flotilla_etcd::Client, flotilla_etcd::Lease)>,
    prefix: &str,
    data: &std::path::Path,
    shard: usize,
    shards: usize,
) -> anyhow::Result<(Arc<dyn StateStore>, ShardState)> {
    match etcd {
        Some((client, fence)) => {
            let state = EtcdState::new(client, fence, prefix, shard, shards);
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

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_aggregator::StateStore;

    /// A shard deposed while cut off from etcd cannot overwrite its successor's state:
    /// the write is conditional on the lease key still being the one it created.
    #[tokio::test]
    async fn a_deposed_shard_cannot_write_the_state() {
        let etcd = flotilla_testkit::Etcd::start("shard-state-fence");
        let endpoints = flotilla_etcd::Endpoints::parse(&etcd.endpoint()).unwrap();
        let client = flotilla_etcd::connect(&endpoints, flotilla_etcd::REQUEST_TIMEOUT).await.unwrap();
        let campaign = flotilla_etcd::Campaign {
            key: flotilla_etcd::key("/fence-test", "shards/0-of-1/leader"),
            value: "a".into(),
            ttl: Duration::from_secs(5),
            request_timeout: flotilla_etcd::REQUEST_TIMEOUT,
        };
        let first = flotilla_etcd::try_acquire(&client, &campaign).await.unwrap().unwrap();
        let a = EtcdState::new(client.clone(), first.lease().clone(), "/fence-test", 0, 1);
        a.save(b"{}".to_vec()).await.unwrap();
        // Its key goes (its lease lapsed, say) and another process takes the shard.
        let mut c = client.clone();
        c.delete(campaign.key.as_str(), None).await.unwrap();
        let second = flotilla_etcd::try_acquire(&client, &campaign).await.unwrap().unwrap();
        let b = EtcdState::new(client.clone(), second.lease().clone(), "/fence-test", 0, 1);
        let e = format!("{:#}", a.save(b"{\"stale\":1}".to_vec()).await.unwrap_err());
        assert!(e.contains("fenced"), "{e}");
        tokio::time::timeout(Duration::from_secs(5), first.lease().lost())
            .await
            .expect("the deposed one lost its lease");
        b.save(b"{}".to_vec()).await.unwrap();
        let stored = c.get(b.key.as_str(), None).await.unwrap();
        assert_eq!(stored.kvs()[0].value(), b"{}", "the successor's write stands");
    }
}
