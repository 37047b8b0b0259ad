//! The sealed UDP heartbeat.
//!
//! ```text
//! offset size field
//!  0      2   magic  "FH" (agent -> shard heartbeat) or "FR" (shard -> agent reply)
//!  2      1   format version (1)
//!  3      1   node id length L (0 in replies)
//!  4      8   session id (big endian)
//! 12      8   sequence number, strictly increasing per session and direction
//! 20      8   incarnation
//! 28      L   node id
//! 28+L    ..  ChaCha20-Poly1305(body protobuf) || 16-byte tag; the header is the AAD
//! ```
//!
//! The session key is HKDF-SHA256(master secret; session id, incarnation, node id),
//! so a shard restarted with the same secret can open heartbeats of sessions it has
//! never seen, and a session key is useless for any other node id or incarnation.
//! The nonce is the direction byte and the sequence number, unique per key because
//! sequence numbers never repeat within a direction.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;

use flotilla_core::MAX_NODE_ID_LEN;

pub const MAGIC_HEARTBEAT: [u8; 2] = *b"FH";
pub const MAGIC_REPLY: [u8; 2] = *b"FR";
pub const FORMAT_VERSION: u8 = 1;
pub const HEADER_FIXED_LEN: usize = 28;
pub const TAG_LEN: usize = 16;
/// No valid heartbeat is larger; anything bigger is dropped unread.
pub const MAX_DATAGRAM_LEN: usize = 1024;
pub const KEY_LEN: usize = 32;

pub type SessionKey = [u8; KEY_LEN];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    ToShard = 0,
    ToAgent = 1,
}

/// Why a datagram was dropped; `as_str` is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DatagramError {
    #[error("datagram shorter than its header")]
    Truncated,
    #[error("datagram larger than {MAX_DATAGRAM_LEN} bytes")]
    Oversized,
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported format version")]
    BadVersion,
    #[error("node id is not valid")]
    BadNodeId,
    #[error("seal does not verify")]
    BadSeal,
    #[error("body does not decode")]
    BadBody,
}

impl DatagramError {
    pub fn as_str(self) -> &'static str {
        match self {
            DatagramError::Truncated => "truncated",
            DatagramError::Oversized => "oversized",
            DatagramError::BadMagic => "bad_magic",
            DatagramError::BadVersion => "bad_version",
            DatagramError::BadNodeId => "bad_node_id",
            DatagramError::BadSeal => "forged",
            DatagramError::BadBody => "malformed",
        }
    }
}

/// The clear-text header of a datagram, borrowing the node id from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    pub magic: [u8; 2],
    pub session_id: u64,
    pub seq: u64,
    pub incarnation: u64,
    pub node_id: &'a str,
}

impl Header<'_> {
    pub fn len(&self) -> usize {
        HEADER_FIXED_LEN + self.node_id.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Parses and bounds-checks the header; cheap, done before any cryptography.
pub fn parse_header(buf: &[u8]) -> Result<Header<'_>, DatagramError> {
    if buf.len() > MAX_DATAGRAM_LEN {
        return Err(DatagramError::Oversized);
    }
    if buf.len() < HEADER_FIXED_LEN + TAG_LEN {
        return Err(DatagramError::Truncated);
    }
    let magic = [buf[0], buf[1]];
    if magic != MAGIC_HEARTBEAT && magic != MAGIC_REPLY {
        return Err(DatagramError::BadMagic);
    }
    if buf[2] != FORMAT_VERSION {
        return Err(DatagramError::BadVersion);
    }
    let id_len = usize::from(buf[3]);
    if id_len > MAX_NODE_ID_LEN {
        return Err(DatagramError::BadNodeId);
    }
    if buf.len() < HEADER_FIXED_LEN + id_len + TAG_LEN {
        return Err(DatagramError::Truncated);
    }
    let be = |r: std::ops::Range<usize>| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[r]);
        u64::from_be_bytes(b)
    };
    let node_id =
        std::str::from_utf8(&buf[HEADER_FIXED_LEN..HEADER_FIXED_LEN + id_len]).map_err(|_| DatagramError::BadNodeId)?;
    Ok(Header { magic, session_id: be(4..12), seq: be(12..20), incarnation: be(20..28), node_id })
}

/// The session id a datagram's header names, read without checking the rest (a hint, to
/// prefetch the session before [`parse_header`] checks it all).
pub fn peek_session_id(buf: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(buf.get(4..12)?.try_into().ok()?))
}

/// Derives the per-session key from the shard's master secret.
pub fn derive_session_key(master: &[u8], session_id: u64, incarnation: u64, node_id: &str) -> SessionKey {
    let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"flotilla-session-v1");
    let prk = salt.extract(master);
    let sid = session_id.to_be_bytes();
    let inc = incarnation.to_be_bytes();
    let info = [&sid[..], &inc[..], node_id.as_bytes()];
    let mut key = [0u8; KEY_LEN];
    // Cannot fail: 32 bytes is within HKDF-SHA256's output limit.
    if let Ok(okm) = prk.expand(&info, hkdf::HKDF_SHA256) {
        let _ = okm.fill(&mut key);
    }
    key
}

fn nonce(dir: Direction, seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[0] = dir as u8;
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

#[allow(clippy::expect_used, reason = "ChaCha20-Poly1305 accepts any 32-byte key, and a SessionKey is 32 bytes")]
fn aead_key(key: &SessionKey) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).expect("32-byte ChaCha20 key"))
}

/// Appends a sealed datagram to `out` (cleared first). `body` is the encoded protobuf.
pub fn seal(
    key: &SessionKey,
    dir: Direction,
    header: &Header<'_>,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), DatagramError> {
    if header.node_id.len() > MAX_NODE_ID_LEN {
        return Err(DatagramError::BadNodeId);
    }
    out.clear();
    out.extend_from_slice(&header.magic);
    out.push(FORMAT_VERSION);
    out.push(header.node_id.len() as u8);
    out.extend_from_slice(&header.session_id.to_be_bytes());
    out.extend_from_slice(&header.seq.to_be_bytes());
    out.extend_from_slice(&header.incarnation.to_be_bytes());
    out.extend_from_slice(header.node_id.as_bytes());
    let hlen = out.len();
    out.extend_from_slice(body);
    let (aad, payload) = out.split_at_mut(hlen);
    let tag = aead_key(key)
        .seal_in_place_separate_tag(nonce(dir, header.seq), Aad::from(&*aad), payload)
        .map_err(|_| DatagramError::BadSeal)?;
    out.extend_from_slice(tag.as_ref());
    if out.len() > MAX_DATAGRAM_LEN {
        return Err(DatagramError::Oversized);
    }
    Ok(())
}

/// Verifies and decrypts the body of `datagram` into `scratch`, returning the plaintext.
pub fn open<'s>(
    key: &SessionKey,
    dir: Direction,
    datagram: &[u8],
    header: &Header<'_>,
    scratch: &'s mut Vec<u8>,
) -> Result<&'s [u8], DatagramError> {
    let hlen = header.len();
    if datagram.len() < hlen + TAG_LEN {
        return Err(DatagramError::Truncated);
    }
    scratch.clear();
    scratch.extend_from_slice(&datagram[hlen..]);
    let plain = aead_key(key)
        .open_in_place(nonce(dir, header.seq), Aad::from(&datagram[..hlen]), scratch)
        .map_err(|_| DatagramError::BadSeal)?;
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(node: &str, seq: u64) -> Header<'_> {
        Header { magic: MAGIC_HEARTBEAT, session_id: 42, seq, incarnation: 7, node_id: node }
    }

    #[test]
    fn seal_open_round_trip() {
        let key = derive_session_key(b"secret", 42, 7, "n1");
        let mut buf = Vec::new();
        seal(&key, Direction::ToShard, &hdr("n1", 5), b"hello", &mut buf).unwrap();
        let h = parse_header(&buf).unwrap();
        assert_eq!(h, hdr("n1", 5));
        let mut scratch = Vec::new();
        assert_eq!(open(&key, Direction::ToShard, &buf, &h, &mut scratch).unwrap(), b"hello");
    }

    #[test]
    fn tampering_and_wrong_keys_are_detected() {
        let key = derive_session_key(b"secret", 42, 7, "n1");
        let mut buf = Vec::new();
        seal(&key, Direction::ToShard, &hdr("n1", 5), b"hello", &mut buf).unwrap();
        let mut scratch = Vec::new();
        // Another node id under the same session derives another key.
        let other = derive_session_key(b"secret", 42, 7, "n2");
        let h = parse_header(&buf).unwrap();
        assert_eq!(open(&other, Direction::ToShard, &buf, &h, &mut scratch), Err(DatagramError::BadSeal));
        // The header is authenticated: a changed sequence number breaks the seal.
        let mut forged = buf.clone();
        forged[19] ^= 1;
        let h = parse_header(&forged).unwrap();
        assert_eq!(open(&key, Direction::ToShard, &forged, &h, &mut scratch), Err(DatagramError::BadSeal));
        // A reply cannot be reflected back as a heartbeat.
        let h = parse_header(&buf).unwrap();
        assert_eq!(open(&key, Direction::ToAgent, &buf, &h, &mut scratch), Err(DatagramError::BadSeal));
    }

    #[test]
    fn headers_are_bounds_checked() {
        assert_eq!(parse_header(&[0u8; 10]), Err(DatagramError::Truncated));
        assert_eq!(parse_header(&vec![0u8; MAX_DATAGRAM_LEN + 1]), Err(DatagramError::Oversized));
        let mut b = vec![0u8; 64];
        assert_eq!(parse_header(&b), Err(DatagramError::BadMagic));
        b[..2].copy_from_slice(b"FH");
        assert_eq!(parse_header(&b), Err(DatagramError::BadVersion));
        b[2] = 1;
        b[3] = 200;
        assert_eq!(parse_header(&b), Err(DatagramError::BadNodeId));
        b[3] = 40;
        assert_eq!(parse_header(&b), Err(DatagramError::Truncated));
    }

    #[test]
    fn keys_depend_on_every_input() {
        let k = derive_session_key(b"m", 1, 1, "a");
        assert_eq!(k, derive_session_key(b"m", 1, 1, "a"));
        assert_ne!(k, derive_session_key(b"m2", 1, 1, "a"));
        assert_ne!(k, derive_session_key(b"m", 2, 1, "a"));
        assert_ne!(k, derive_session_key(b"m", 1, 2, "a"));
        assert_ne!(k, derive_session_key(b"m", 1, 1, "b"));
    }
}
