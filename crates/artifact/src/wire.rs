//! The peer protocol's frames. Every frame has a fixed header and a length checked
//! against a limit before anything is allocated: a peer is input from the network.
//!
//! A connection starts with one stream on which each side sends a [`Hello`] proving it
//! holds the cluster's key (bound to this TLS session, so it cannot be relayed); then
//! either side opens a stream per [`Request`], answered by a [`Status`] and its bytes.

use crate::digest::Digest;
use crate::manifest::{MAX_PIECE, MAX_PIECES};

pub const ALPN: &[u8] = b"flotilla-p2p/1";
/// The largest answer: a piece, or a manifest of [`MAX_PIECES`] pieces.
pub const MAX_BODY: u32 = if MAX_PIECE > 24 + 32 * MAX_PIECES { MAX_PIECE } else { 24 + 32 * MAX_PIECES };
const MAX_NODE: usize = 253;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("frame is {got} bytes, {want} expected")]
    Length { got: usize, want: usize },
    #[error("unknown request kind {0}")]
    Kind(u8),
    #[error("unknown status {0}")]
    Status(u8),
    #[error("node name of {0} bytes is empty, too long or not UTF-8")]
    Node(usize),
    #[error("answer of {0} bytes is above the limit of {MAX_BODY}")]
    Body(u32),
}

/// Proof that the sender holds the cluster's key, for this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Which of the cluster's keys (tokens rotate, so a cluster may hold two).
    pub key_id: [u8; 8],
    pub node: String,
    pub mac: [u8; 32],
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 1 + self.node.len() + 32);
        out.extend_from_slice(&self.key_id);
        out.push(self.node.len() as u8);
        out.extend_from_slice(self.node.as_bytes());
        out.extend_from_slice(&self.mac);
        out
    }

    /// The longest hello there is: what a reader reads at most.
    pub const MAX_LEN: usize = 8 + 1 + MAX_NODE + 32;

    pub fn decode(b: &[u8]) -> Result<Hello, WireError> {
        let n = *b.get(8).ok_or(WireError::Length { got: b.len(), want: 9 })? as usize;
        let want = 8 + 1 + n + 32;
        if b.len() != want {
            return Err(WireError::Length { got: b.len(), want });
        }
        let node = std::str::from_utf8(&b[9..9 + n]).map_err(|_| WireError::Node(n))?;
        if node.is_empty() || n > MAX_NODE {
            return Err(WireError::Node(n));
        }
        let mut key_id = [0u8; 8];
        key_id.copy_from_slice(&b[..8]);
        let mut mac = [0u8; 32];
        mac.copy_from_slice(&b[9 + n..]);
        Ok(Hello { key_id, node: node.to_string(), mac })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Manifest(Digest),
    Piece(Digest, u32),
    /// Not a request: a datagram saying the sender now holds a piece, so its peers need
    /// not wait for the tracker's next answer to ask it.
    Have(Digest, u32),
}

impl Request {
    pub const LEN: usize = 37;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        let (kind, d, i) = match self {
            Request::Manifest(d) => (1, d, 0),
            Request::Piece(d, i) => (2, d, *i),
            Request::Have(d, i) => (3, d, *i),
        };
        out[0] = kind;
        out[1..33].copy_from_slice(&d.0);
        out[33..].copy_from_slice(&i.to_be_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<Request, WireError> {
        if b.len() != Self::LEN {
            return Err(WireError::Length { got: b.len(), want: Self::LEN });
        }
        let mut d = [0u8; 32];
        d.copy_from_slice(&b[1..33]);
        let i = u32::from_be_bytes([b[33], b[34], b[35], b[36]]);
        match b[0] {
            1 => Ok(Request::Manifest(Digest(d))),
            2 => Ok(Request::Piece(Digest(d), i)),
            3 => Ok(Request::Have(Digest(d), i)),
            k => Err(WireError::Kind(k)),
        }
    }

    pub fn digest(&self) -> Digest {
        match self {
            Request::Manifest(d) | Request::Piece(d, _) | Request::Have(d, _) => *d,
        }
    }
}

/// The head of an answer; `Ok` is followed by `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok(u32),
    /// The peer does not hold it (any more): ask someone else.
    Missing,
    /// The peer is at its upload limit: ask someone else, or later.
    Busy,
}

impl Status {
    pub const LEN: usize = 5;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let (s, len) = match self {
            Status::Ok(n) => (0, *n),
            Status::Missing => (1, 0),
            Status::Busy => (2, 0),
        };
        let l = len.to_be_bytes();
        [s, l[0], l[1], l[2], l[3]]
    }

    pub fn decode(b: &[u8]) -> Result<Status, WireError> {
        if b.len() != Self::LEN {
            return Err(WireError::Length { got: b.len(), want: Self::LEN });
        }
        let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]);
        match b[0] {
            0 if len > MAX_BODY => Err(WireError::Body(len)),
            0 => Ok(Status::Ok(len)),
            1 => Ok(Status::Missing),
            2 => Ok(Status::Busy),
            s => Err(WireError::Status(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let h = Hello { key_id: [1; 8], node: "node-7".into(), mac: [9; 32] };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        for r in
            [Request::Manifest(Digest([3; 32])), Request::Piece(Digest([4; 32]), 77), Request::Have(Digest([5; 32]), 9)]
        {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        for s in [Status::Ok(12), Status::Missing, Status::Busy] {
            assert_eq!(Status::decode(&s.encode()).unwrap(), s);
        }
    }

    #[test]
    fn bad_frames_are_named() {
        assert_eq!(Request::decode(&[0; 3]).unwrap_err(), WireError::Length { got: 3, want: 37 });
        assert_eq!(Request::decode(&[9; 37]).unwrap_err(), WireError::Kind(9));
        assert_eq!(Status::decode(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err(), WireError::Body(u32::MAX));
        assert_eq!(Status::decode(&[7, 0, 0, 0, 0]).unwrap_err(), WireError::Status(7));
        let mut h = Hello { key_id: [1; 8], node: "n".into(), mac: [0; 32] }.encode();
        h[9] = 0xff;
        assert_eq!(Hello::decode(&h).unwrap_err(), WireError::Node(1));
        assert!(matches!(Hello::decode(&[0; 4]).unwrap_err(), WireError::Length { .. }));
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Hello::decode(&b);
            let _ = Request::decode(&b);
            let _ = Status::decode(&b);
        }
    }
}
