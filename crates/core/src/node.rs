use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use triomphe::ThinArc;

use crate::limits::{MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_LABELS, MAX_NODE_ID_LEN};

/// A node's stable name (its hostname by default). Cheap to clone: views share it.
///
/// A thin pointer (8 bytes, the length lives in the allocation): a shard keeps a copy
/// in the node's session, its view record and its view key, so the 8 bytes a fat
/// `Arc<str>` spends on the length count three times a node (issue #19).
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(ThinArc<(), u8>);

impl PartialEq for NodeId {
    fn eq(&self, other: &Self) -> bool {
        self.0.ptr() == other.0.ptr() || self.as_str() == other.as_str()
    }
}

impl Eq for NodeId {}

impl PartialOrd for NodeId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NodeId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for NodeId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

/// Eq, Ord and Hash are the text's, so a map keyed by ids can be searched with a `&str`
/// without building an id (an allocation) first.
impl std::borrow::Borrow<str> for NodeId {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdError {
    #[error("node id is empty")]
    Empty,
    #[error("node id is {0} bytes long (at most {MAX_NODE_ID_LEN})")]
    TooLong(usize),
    #[error("node id {0:?} has characters other than [A-Za-z0-9._-]")]
    BadCharacter(String),
}

impl NodeId {
    pub fn new(s: &str) -> Result<Self, NodeIdError> {
        if s.is_empty() {
            return Err(NodeIdError::Empty);
        }
        if s.len() > MAX_NODE_ID_LEN {
            return Err(NodeIdError::TooLong(s.len()));
        }
        if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err(NodeIdError::BadCharacter(s.to_string()));
        }
        Ok(NodeId(ThinArc::from_header_and_slice((), s.as_bytes())))
    }

    /// Where the id's bytes live, found without reading them (to prefetch them).
    pub fn location(&self) -> *const u8 {
        self.0.ptr().cast()
    }

    pub fn as_str(&self) -> &str {
        // SAFETY: the bytes were copied from a `&str` in `new` and are never changed.
        unsafe { std::str::from_utf8_unchecked(&self.0.slice) }
    }
}

impl TryFrom<String> for NodeId {
    type Error = NodeIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        NodeId::new(&s)
    }
}

impl From<NodeId> for String {
    fn from(n: NodeId) -> String {
        n.as_str().to_owned()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// Chosen by the agent at start (its start time in nanoseconds, so it only grows):
/// a restarted agent is a new node, and an older incarnation never replaces a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Incarnation(pub u64);

/// Where a node stands, as its shard sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    Alive,
    /// Missed heartbeats for `suspect_after`; not yet given up.
    Suspect,
    /// Leaving on purpose (PreStop, SIGTERM): take no new work, move work away.
    Draining,
    /// Silent for `dead_after`: its work must be replaced.
    Dead,
    /// Its shard is unreachable or recovering. Never treated as Dead.
    Unknown,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Alive => "alive",
            NodeStatus::Suspect => "suspect",
            NodeStatus::Draining => "draining",
            NodeStatus::Dead => "dead",
            NodeStatus::Unknown => "unknown",
        }
    }

    pub const ALL: [NodeStatus; 5] =
        [NodeStatus::Alive, NodeStatus::Suspect, NodeStatus::Draining, NodeStatus::Dead, NodeStatus::Unknown];

    /// Compact encoding for atomics on the heartbeat path.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    pub fn from_u8(v: u8) -> Option<NodeStatus> {
        NodeStatus::ALL.get(usize::from(v)).copied()
    }
}

impl fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node's labels, validated: bounded in count and length, keys in a
/// Kubernetes-like alphabet. `domain` names the failure domain (and picks the shard).
///
/// Also holds what placement ranks the node by among the pool's
/// (`unit_shape::preference`), worked out whenever the labels change: the planner reads
/// it for every node it considers, and a label lookup there is a cache miss per node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<String, String>", into = "BTreeMap<String, String>")]
pub struct Labels {
    map: BTreeMap<String, String>,
    preference: (bool, std::cmp::Reverse<u64>),
}

impl Default for Labels {
    fn default() -> Self {
        Labels::with(BTreeMap::new())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    #[error("{0} labels (at most {MAX_LABELS})")]
    TooMany(usize),
    #[error(
        "label key {0:?} is empty, longer than {MAX_LABEL_KEY_LEN} bytes or has characters other than [A-Za-z0-9._/-]"
    )]
    BadKey(String),
    #[error("label {key:?} has a value longer than {MAX_LABEL_VALUE_LEN} bytes or with control characters")]
    BadValue { key: String },
    #[error("label {0:?} is not of the form KEY=VALUE")]
    NotKeyValue(String),
}

impl Labels {
    pub fn new() -> Self {
        Labels::default()
    }

    pub fn from_map(map: BTreeMap<String, String>) -> Result<Self, LabelError> {
        if map.len() > MAX_LABELS {
            return Err(LabelError::TooMany(map.len()));
        }
        for (k, v) in &map {
            validate_label(k, v)?;
        }
        Ok(Labels::with(map))
    }

    fn with(map: BTreeMap<String, String>) -> Self {
        let preference = crate::unit_shape::preference(|k| map.get(k).map(String::as_str));
        Labels { map, preference }
    }

    /// `unit_shape::preference` of these labels.
    pub fn pool_preference(&self) -> (bool, std::cmp::Reverse<u64>) {
        self.preference
    }

    /// Parses `KEY=VALUE` as given on a command line.
    pub fn parse_pair(s: &str) -> Result<(String, String), LabelError> {
        let (k, v) = s.split_once('=').ok_or_else(|| LabelError::NotKeyValue(s.to_string()))?;
        validate_label(k, v)?;
        Ok((k.to_string(), v.to_string()))
    }

    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), LabelError> {
        validate_label(key, value)?;
        if !self.map.contains_key(key) && self.map.len() >= MAX_LABELS {
            return Err(LabelError::TooMany(self.map.len() + 1));
        }
        self.map.insert(key.to_string(), value.to_string());
        self.preference = crate::unit_shape::preference(|k| self.map.get(k).map(String::as_str));
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// The failure domain (`domain` label), `default` when unset.
    pub fn domain(&self) -> &str {
        self.get("domain").unwrap_or(crate::DEFAULT_DOMAIN)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.map
    }
}

fn validate_label(key: &str, value: &str) -> Result<(), LabelError> {
    let key_ok = !key.is_empty()
        && key.len() <= MAX_LABEL_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b));
    if !key_ok {
        return Err(LabelError::BadKey(key.to_string()));
    }
    if value.len() > MAX_LABEL_VALUE_LEN || value.chars().any(char::is_control) {
        return Err(LabelError::BadValue { key: key.to_string() });
    }
    Ok(())
}

impl TryFrom<BTreeMap<String, String>> for Labels {
    type Error = LabelError;
    fn try_from(m: BTreeMap<String, String>) -> Result<Self, Self::Error> {
        Labels::from_map(m)
    }
}

impl From<Labels> for BTreeMap<String, String> {
    fn from(l: Labels) -> Self {
        l.map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_id_is_one_thin_pointer_that_compares_by_its_text() {
        assert_eq!(std::mem::size_of::<NodeId>(), 8);
        assert_eq!(std::mem::size_of::<Option<NodeId>>(), 8);
        let (a, b) = (NodeId::new("node-a").unwrap(), NodeId::new("node-b").unwrap());
        assert_eq!(a, NodeId::new("node-a").unwrap(), "equal text, separate allocations");
        assert!(a < b);
        assert_eq!(a.as_str(), "node-a");
        assert_eq!(format!("{a} {a:?}"), "node-a \"node-a\"");
        let state = std::hash::RandomState::new();
        assert_eq!(
            std::hash::BuildHasher::hash_one(&state, &a),
            std::hash::BuildHasher::hash_one(&state, "node-a"),
            "hashes as its text, so a map keyed by ids can be probed with a &str"
        );
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"node-a\"");
        assert_eq!(serde_json::from_str::<NodeId>("\"node-b\"").unwrap(), b);
    }

    #[test]
    fn node_ids_are_validated() {
        assert!(NodeId::new("node-1.eu_a").is_ok());
        assert_eq!(NodeId::new(""), Err(NodeIdError::Empty));
        assert!(matches!(NodeId::new("a b"), Err(NodeIdError::BadCharacter(_))));
        assert!(matches!(NodeId::new(&"x".repeat(MAX_NODE_ID_LEN + 1)), Err(NodeIdError::TooLong(_))));
    }

    #[test]
    fn labels_are_bounded() {
        let mut l = Labels::new();
        for i in 0..MAX_LABELS {
            l.insert(&format!("k{i}"), "v").unwrap();
        }
        assert_eq!(l.insert("one-more", "v"), Err(LabelError::TooMany(MAX_LABELS + 1)));
        l.insert("k0", "replaced").unwrap();
        assert!(matches!(Labels::parse_pair("novalue"), Err(LabelError::NotKeyValue(_))));
        assert!(matches!(Labels::parse_pair(&format!("{}=v", "k".repeat(64))), Err(LabelError::BadKey(_))));
        assert!(matches!(Labels::parse_pair(&format!("k={}", "v".repeat(129))), Err(LabelError::BadValue { .. })));
        assert!(matches!(Labels::parse_pair("k=a\nb"), Err(LabelError::BadValue { .. })));
        assert_eq!(Labels::parse_pair("topology.kubernetes.io/zone=eu-1a").unwrap().1, "eu-1a");
    }

    #[test]
    fn domain_defaults() {
        let mut l = Labels::new();
        assert_eq!(l.domain(), "default");
        l.insert("domain", "cluster-a").unwrap();
        assert_eq!(l.domain(), "cluster-a");
    }

    #[test]
    fn status_round_trips_through_u8() {
        for s in NodeStatus::ALL {
            assert_eq!(NodeStatus::from_u8(s.to_u8()), Some(s));
        }
        assert_eq!(NodeStatus::from_u8(200), None);
        assert_eq!(serde_json::to_string(&NodeStatus::Draining).unwrap(), "\"draining\"");
    }
}
