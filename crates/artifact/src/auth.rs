//! The cluster's key for artifacts: derived from the join token, which every agent of
//! the cluster already holds and no node outside it does. Peers prove they hold it over
//! each connection's TLS exporter (so a proof cannot be replayed on another connection);
//! agents show the tracker a token derived from it (never the join token itself).

use ring::hmac;

use crate::wire::Hello;

/// Which side of a connection a proof is for: the two proofs differ, so a peer cannot
/// echo the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Dialer,
    Listener,
}

/// The keys of the join tokens accepted now (newest first: proofs use the first).
#[derive(Clone)]
pub struct PeerKeys {
    keys: Vec<([u8; 8], hmac::Key)>,
}

impl std::fmt::Debug for PeerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerKeys({} keys)", self.keys.len())
    }
}

fn derive(token: &str) -> hmac::Key {
    let k = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
    hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&k, b"flotilla-artifacts-v1").as_ref())
}

fn key_id(key: &hmac::Key) -> [u8; 8] {
    let mut id = [0u8; 8];
    id.copy_from_slice(&hmac::sign(key, b"key-id").as_ref()[..8]);
    id
}

fn message(side: Side, exporter: &[u8], node: &str) -> Vec<u8> {
    let tag: &[u8] = match side {
        Side::Dialer => b"dialer",
        Side::Listener => b"listener",
    };
    [tag, &[0], exporter, &[0], node.as_bytes()].concat()
}

fn tracker_message(node: &str) -> Vec<u8> {
    [b"tracker\0".as_slice(), node.as_bytes()].concat()
}

impl PeerKeys {
    pub fn from_tokens(tokens: &[String]) -> PeerKeys {
        let keys = tokens.iter().filter(|t| !t.is_empty()).map(|t| derive(t)).map(|k| (key_id(&k), k)).collect();
        PeerKeys { keys }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether the key with this id is among these.
    pub fn holds(&self, key_id: &[u8; 8]) -> bool {
        self.keys.iter().any(|(id, _)| id == key_id)
    }

    /// This node's hello on a connection whose TLS exporter is `exporter`.
    pub fn hello(&self, side: Side, exporter: &[u8], node: &str) -> Option<Hello> {
        let (id, key) = self.keys.first()?;
        let mut mac = [0u8; 32];
        mac.copy_from_slice(hmac::sign(key, &message(side, exporter, node)).as_ref());
        Some(Hello { key_id: *id, node: node.to_string(), mac })
    }

    /// Whether `hello` proves its sender holds one of these keys, on this connection.
    pub fn verify(&self, side: Side, exporter: &[u8], hello: &Hello) -> bool {
        self.keys
            .iter()
            .filter(|(id, _)| *id == hello.key_id)
            .any(|(_, k)| hmac::verify(k, &message(side, exporter, &hello.node), &hello.mac).is_ok())
    }

    /// The bearer token node `node` shows the tracker: its own, so a token seen on the
    /// wire speaks for that node only.
    pub fn tracker_token(&self, node: &str) -> Option<String> {
        let (_, key) = self.keys.first()?;
        Some(hmac::sign(key, &tracker_message(node)).as_ref().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Whether a tracker request's bearer token is `node`'s, from a holder of a key.
    pub fn verify_tracker(&self, token: &str, node: &str) -> bool {
        let Ok(digest) = crate::digest::Digest::parse(token) else { return false };
        self.keys.iter().any(|(_, k)| hmac::verify(k, &tracker_message(node), &digest.0).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_holder_of_the_token_on_this_connection_is_believed() {
        let cluster = PeerKeys::from_tokens(&["new".into(), "old".into()]);
        let old_only = PeerKeys::from_tokens(&["old".into()]);
        let outsider = PeerKeys::from_tokens(&["guess".into()]);
        let h = old_only.hello(Side::Dialer, b"session-1", "n1").unwrap();
        assert!(cluster.verify(Side::Dialer, b"session-1", &h), "a rotated-out token still in the list is accepted");
        assert!(!cluster.verify(Side::Dialer, b"session-2", &h), "replayed on another connection");
        assert!(!cluster.verify(Side::Listener, b"session-1", &h), "echoed back as the other side");
        let forged = Hello { node: "n2".into(), ..h.clone() };
        assert!(!cluster.verify(Side::Dialer, b"session-1", &forged), "another node's name");
        let o = outsider.hello(Side::Dialer, b"session-1", "n1").unwrap();
        assert!(!cluster.verify(Side::Dialer, b"session-1", &o));
        assert!(PeerKeys::from_tokens(&[]).hello(Side::Dialer, b"s", "n").is_none());
        assert!(cluster.holds(&h.key_id) && !PeerKeys::from_tokens(&["new".into()]).holds(&h.key_id));
        let t = old_only.tracker_token("n1").unwrap();
        assert!(cluster.verify_tracker(&t, "n1"));
        assert!(!cluster.verify_tracker(&t, "n2"), "one node's token does not speak for another");
        assert!(!cluster.verify_tracker(&outsider.tracker_token("n1").unwrap(), "n1"));
        assert!(!cluster.verify_tracker("not hex", "n1"));
    }
}
