//! The heartbeat datagram and its protection.
//!
//! ```text
//! offset size field
//!  0      2   magic  "FH" (agent -> shard heartbeat) or "FR" (shard -> agent reply)
//!  2      1   format: 2 (tagged, what agents send) or 1 (encrypted, older agents)
//!  3      1   node id length L (0 in replies)
//!  4      8   session id (big endian)
//! 12      8   sequence number, strictly increasing per session and direction
//! 20      8   incarnation
//! 28      L   node id
//! 28+L    ..  format 2: the body protobuf || SipHash-2-4-128(everything before the tag)
//!             format 1: ChaCha20-Poly1305(body protobuf) || 16-byte tag; the header is the AAD
//! ```
//!
//! The session key is HKDF-SHA256(master secret; session id, incarnation, node id),
//! so a shard restarted with the same secret can open heartbeats of sessions it has
//! never seen, and a session key is useless for any other node id or incarnation.
//!
//! Format 2 authenticates without encrypting. What a heartbeat carries (health figures,
//! the assignment version, the agent's clock) is published in the cluster view anyway;
//! what the shard's decisions rest on is that nobody else can speak for the node and
//! that nothing is replayed, which the tag, the key's binding and the sequence number
//! give. Opening ChaCha20-Poly1305 cost ~0.24 µs a datagram (a fifth of the shard's
//! CPU at 100k nodes); SipHash over the same bytes ~0.04 µs (BENCHMARKS.md). Its key is
//! the session key's first 16 bytes; the magic is inside the tagged bytes, so a reply
//! cannot pass for a heartbeat. Format 1 (nonce = direction + sequence) is still opened
//! and answered in kind, for agents of earlier releases during an upgrade.

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;

use flotilla_core::MAX_NODE_ID_LEN;

pub const MAGIC_HEARTBEAT: [u8; 2] = *b"FH";
pub const MAGIC_REPLY: [u8; 2] = *b"FR";
pub const HEADER_FIXED_LEN: usize = 28;
pub const TAG_LEN: usize = 16;
/// No valid heartbeat is larger; anything bigger is dropped unread.
pub const MAX_DATAGRAM_LEN: usize = 1024;
pub const KEY_LEN: usize = 32;

pub type SessionKey = [u8; KEY_LEN];

/// How a datagram is protected: byte 2 of every datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The body encrypted with ChaCha20-Poly1305 (agents of earlier releases).
    Aead = 1,
    /// The body in clear under a SipHash-2-4 tag: what agents send.
    Mac = 2,
}

impl Format {
    fn from_byte(b: u8) -> Option<Format> {
        match b {
            1 => Some(Format::Aead),
            2 => Some(Format::Mac),
            _ => None,
        }
    }
}

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
    pub format: Format,
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
    let format = Format::from_byte(buf[2]).ok_or(DatagramError::BadVersion)?;
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
    Ok(Header { magic, format, session_id: be(4..12), seq: be(12..20), incarnation: be(20..28), node_id })
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

/// Appends a sealed datagram to `out` (cleared first), in `header.format`; its magic says
/// which way it goes. `body` is the encoded protobuf.
pub fn seal(key: &SessionKey, header: &Header<'_>, body: &[u8], out: &mut Vec<u8>) -> Result<(), DatagramError> {
    let dir = match header.magic {
        MAGIC_HEARTBEAT => Direction::ToShard,
        MAGIC_REPLY => Direction::ToAgent,
        _ => return Err(DatagramError::BadMagic),
    };
    if header.node_id.len() > MAX_NODE_ID_LEN {
        return Err(DatagramError::BadNodeId);
    }
    out.clear();
    out.extend_from_slice(&header.magic);
    out.push(header.format as u8);
    out.push(header.node_id.len() as u8);
    out.extend_from_slice(&header.session_id.to_be_bytes());
    out.extend_from_slice(&header.seq.to_be_bytes());
    out.extend_from_slice(&header.incarnation.to_be_bytes());
    out.extend_from_slice(header.node_id.as_bytes());
    let hlen = out.len();
    out.extend_from_slice(body);
    match header.format {
        Format::Mac => {
            let tag = mac(key, out);
            out.extend_from_slice(&tag);
        }
        Format::Aead => {
            let (aad, payload) = out.split_at_mut(hlen);
            let tag = aead_key(key)
                .seal_in_place_separate_tag(nonce(dir, header.seq), Aad::from(&*aad), payload)
                .map_err(|_| DatagramError::BadSeal)?;
            out.extend_from_slice(tag.as_ref());
        }
    }
    if out.len() > MAX_DATAGRAM_LEN {
        return Err(DatagramError::Oversized);
    }
    Ok(())
}

/// Verifies `datagram` and returns its body: in place for [`Format::Mac`], decrypted into
/// `scratch` for [`Format::Aead`].
pub fn open<'a>(
    key: &SessionKey,
    dir: Direction,
    datagram: &'a [u8],
    header: &Header<'_>,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], DatagramError> {
    let hlen = header.len();
    if datagram.len() < hlen + TAG_LEN {
        return Err(DatagramError::Truncated);
    }
    match header.format {
        Format::Mac => {
            let expected = match dir {
                Direction::ToShard => MAGIC_HEARTBEAT,
                Direction::ToAgent => MAGIC_REPLY,
            };
            let (tagged, tag) = datagram.split_at(datagram.len() - TAG_LEN);
            if header.magic != expected || !tags_equal(&mac(key, tagged), tag) {
                return Err(DatagramError::BadSeal);
            }
            Ok(&tagged[hlen..])
        }
        Format::Aead => {
            scratch.clear();
            scratch.extend_from_slice(&datagram[hlen..]);
            aead_key(key)
                .open_in_place(nonce(dir, header.seq), Aad::from(&datagram[..hlen]), scratch)
                .map(|plain| &*plain)
                .map_err(|_| DatagramError::BadSeal)
        }
    }
}

/// SipHash-2-4 with a 128-bit output over `bytes`, keyed by the session key's first half.
fn mac(key: &SessionKey, bytes: &[u8]) -> [u8; TAG_LEN] {
    let mut k = [0u8; 16];
    k.copy_from_slice(&key[..16]);
    siphasher::sip128::SipHasher24::new_with_key(&k).hash(bytes).as_bytes()
}

/// Compares without an early exit, so the time taken says nothing of where a forged tag
/// first differs.
fn tags_equal(a: &[u8; TAG_LEN], b: &[u8]) -> bool {
    b.len() == TAG_LEN && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [Format; 2] = [Format::Mac, Format::Aead];

    fn hdr(format: Format, node: &str, seq: u64) -> Header<'_> {
        Header { magic: MAGIC_HEARTBEAT, format, session_id: 42, seq, incarnation: 7, node_id: node }
    }

    #[test]
    fn seal_open_round_trip() {
        let key = derive_session_key(b"secret", 42, 7, "n1");
        for format in FORMATS {
            let mut buf = Vec::new();
            seal(&key, &hdr(format, "n1", 5), b"hello", &mut buf).unwrap();
            assert_eq!(buf.len(), HEADER_FIXED_LEN + 2 + 5 + TAG_LEN);
            let h = parse_header(&buf).unwrap();
            assert_eq!(h, hdr(format, "n1", 5));
            let mut scratch = Vec::new();
            assert_eq!(open(&key, Direction::ToShard, &buf, &h, &mut scratch).unwrap(), b"hello");
            // Only the older format hides the body.
            let clear = buf.windows(5).any(|w| w == b"hello");
            assert_eq!(clear, format == Format::Mac, "{format:?}");
        }
    }

    #[test]
    fn tampering_and_wrong_keys_are_detected() {
        let key = derive_session_key(b"secret", 42, 7, "n1");
        for format in FORMATS {
            let mut buf = Vec::new();
            seal(&key, &hdr(format, "n1", 5), b"hello", &mut buf).unwrap();
            let mut scratch = Vec::new();
            // Another node id under the same session derives another key.
            let other = derive_session_key(b"secret", 42, 7, "n2");
            let h = parse_header(&buf).unwrap();
            assert_eq!(open(&other, Direction::ToShard, &buf, &h, &mut scratch), Err(DatagramError::BadSeal));
            // Every byte is covered: a changed sequence number, body or tag breaks the seal,
            // and so does a datagram relabelled as the other format.
            for at in [19, HEADER_FIXED_LEN + 3, buf.len() - 1] {
                let mut forged = buf.clone();
                forged[at] ^= 1;
                let h = parse_header(&forged).unwrap();
                assert_eq!(open(&key, Direction::ToShard, &forged, &h, &mut scratch), Err(DatagramError::BadSeal));
            }
            let mut relabelled = buf.clone();
            relabelled[2] = 3 - relabelled[2];
            let h = parse_header(&relabelled).unwrap();
            assert_eq!(open(&key, Direction::ToShard, &relabelled, &h, &mut scratch), Err(DatagramError::BadSeal));
            // A heartbeat cannot pass for a reply, nor a reply for a heartbeat: not as it
            // is, and not relabelled with the other magic either (the magic is sealed).
            let heartbeat = buf.clone();
            let reply = Header { magic: MAGIC_REPLY, node_id: "", ..hdr(format, "", 5) };
            seal(&key, &reply, b"again", &mut buf).unwrap();
            let h = parse_header(&buf).unwrap();
            assert_eq!(open(&key, Direction::ToAgent, &buf, &h, &mut scratch).unwrap(), b"again");
            for (datagram, dir, relabel) in
                [(&heartbeat, Direction::ToAgent, MAGIC_REPLY), (&buf, Direction::ToShard, MAGIC_HEARTBEAT)]
            {
                let h = parse_header(datagram).unwrap();
                assert_eq!(open(&key, dir, datagram, &h, &mut scratch), Err(DatagramError::BadSeal));
                let mut reflected = datagram.clone();
                reflected[..2].copy_from_slice(&relabel);
                let h = parse_header(&reflected).unwrap();
                assert_eq!(open(&key, dir, &reflected, &h, &mut scratch), Err(DatagramError::BadSeal), "{format:?}");
            }
        }
    }

    #[test]
    fn headers_are_bounds_checked() {
        assert_eq!(parse_header(&[0u8; 10]), Err(DatagramError::Truncated));
        assert_eq!(parse_header(&vec![0u8; MAX_DATAGRAM_LEN + 1]), Err(DatagramError::Oversized));
        let mut b = vec![0u8; 64];
        assert_eq!(parse_header(&b), Err(DatagramError::BadMagic));
        b[..2].copy_from_slice(b"FH");
        assert_eq!(parse_header(&b), Err(DatagramError::BadVersion));
        b[2] = 3;
        assert_eq!(parse_header(&b), Err(DatagramError::BadVersion));
        b[2] = 2;
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
