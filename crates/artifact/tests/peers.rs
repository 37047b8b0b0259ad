//! The peer transport on loopback, with real QUIC: a node holding the cluster's key gets
//! pieces and manifests; one with another key is refused before it can ask anything,
//! until a rotation gives its token to the other side too, and one whose token is
//! retired is cut off; a node that only dials
//! (behind NAT) still serves the peer it dialled.

#![allow(clippy::unwrap_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flotilla_artifact::Digest;
use flotilla_artifact::auth::PeerKeys;
use flotilla_artifact::peer::{Holdings, Limits, PeerError, Peers};
use flotilla_artifact::throttle::Throttle;
use flotilla_artifact::wire::Request;

#[derive(Default)]
struct Pieces(Mutex<HashMap<(Digest, u32), Vec<u8>>>);

impl Holdings for Pieces {
    fn manifest(&self, _: &Digest) -> Option<Vec<u8>> {
        Some(b"a manifest".to_vec())
    }

    fn piece(&self, d: &Digest, i: u32) -> Option<Vec<u8>> {
        self.0.lock().unwrap().get(&(*d, i)).cloned()
    }
}

fn node(name: &str, token: &str, listen: bool, held: &[(Digest, u32, &[u8])]) -> Arc<Peers> {
    let pieces = Pieces::default();
    for (d, i, b) in held {
        pieces.0.lock().unwrap().insert((*d, *i), b.to_vec());
    }
    let limits =
        Limits { upload: Throttle::new(None), download: Throttle::new(None), uploads: tokio::sync::Semaphore::new(4) };
    let keys = PeerKeys::from_tokens(&[token.to_string()]);
    Peers::start(name.into(), keys, "127.0.0.1:0".parse().unwrap(), listen, Arc::new(pieces), limits).unwrap()
}

#[tokio::test]
async fn cluster_members_fetch_outsiders_are_refused_and_a_dialling_node_serves_back() {
    let d = Digest::of(b"artifact");
    let a = node("a", "join-token", true, &[(d, 0, b"piece zero")]);
    let a_addr = a.listen_addr().unwrap().to_string();

    // A member of the cluster: pieces and manifests; a piece it lacks is `Missing`.
    let b = node("b", "join-token", true, &[]);
    let conn = b.connection("a", Some(&a_addr)).await.unwrap();
    assert_eq!(b.request(&conn, Request::Piece(d, 0), 1 << 20).await.unwrap(), b"piece zero");
    assert_eq!(b.request(&conn, Request::Manifest(d), 1 << 20).await.unwrap(), b"a manifest");
    assert!(matches!(b.request(&conn, Request::Piece(d, 1), 1 << 20).await, Err(PeerError::Missing)));
    // An answer larger than asked for is refused, not read.
    assert!(matches!(b.request(&conn, Request::Piece(d, 0), 4).await, Err(PeerError::Transport(_))));

    // Another key: no connection, so nothing asked or served.
    let outsider = node("x", "a guess", true, &[]);
    let refused = outsider.connection("a", Some(&a_addr)).await;
    assert!(matches!(refused, Err(PeerError::Transport(_))), "{refused:?}");
    // Claiming to be another node: refused too.
    let liar = node("not-a", "join-token", true, &[]);
    assert!(liar.connection("a", Some(&liar.listen_addr().unwrap().to_string())).await.is_err());

    // Behind NAT: `n` only dials, and `a` asks `n` back on the connection `n` opened.
    let n = node("n", "join-token", false, &[(d, 7, b"piece seven")]);
    assert!(n.listen_addr().is_none());
    n.connection("a", Some(&a_addr)).await.unwrap();
    let back = a.connection("n", None).await.unwrap();
    assert_eq!(a.request(&back, Request::Piece(d, 7), 1 << 20).await.unwrap(), b"piece seven");
    // Without that connection it cannot be reached at all.
    assert!(matches!(b.connection("n", None).await, Err(PeerError::Transport(_))));

    // A rotation that makes the outsider's token the newest (`a` proves with its newest,
    // and takes either): it is in.
    a.set_keys(PeerKeys::from_tokens(&["a guess".to_string(), "join-token".to_string()]));
    let admitted = outsider.connection("a", Some(&a_addr)).await.unwrap();
    assert_eq!(outsider.request(&admitted, Request::Piece(d, 0), 1 << 20).await.unwrap(), b"piece zero");

    // Retiring "join-token" closes the connections of the peers that proved it (b's),
    // and keeps the one proved with the token still accepted.
    a.set_keys(PeerKeys::from_tokens(&["a guess".to_string()]));
    let closed = tokio::time::timeout(std::time::Duration::from_secs(5), conn.closed()).await;
    assert!(closed.is_ok(), "b's connection stays open after its token was retired");
    assert!(b.request(&conn, Request::Piece(d, 0), 1 << 20).await.is_err());
    assert!(b.connection("a", Some(&a_addr)).await.is_err(), "b is refused anew");
    assert_eq!(outsider.request(&admitted, Request::Piece(d, 0), 1 << 20).await.unwrap(), b"piece zero");
}
