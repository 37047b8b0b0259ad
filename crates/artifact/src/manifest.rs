//! A manifest lists the sha256 of every piece of an artifact, so a piece from any peer
//! is checked the moment it arrives instead of after the whole artifact is in.
//!
//! Its encoding is fixed-size fields and a count that must agree with the size: a
//! manifest from a peer is input from the network and is checked as such.

use std::io::Read;

use crate::digest::{Digest, Hasher};

const MAGIC: &[u8; 4] = b"FLAM";
const VERSION: u8 = 1;
const HEADER: usize = 24;

/// The smallest and largest piece: small enough that 32 hosts share a 32 MB artifact
/// piece by piece, large enough that a 140 GB model has a few thousand pieces.
pub const MIN_PIECE: u32 = 1 << 20;
pub const MAX_PIECE: u32 = 1 << 28;
/// How many pieces an artifact is cut into at most (before pieces grow past the minimum).
const TARGET_PIECES: u64 = 8192;
pub const MAX_PIECES: u32 = 1 << 20;
/// 4 TiB: past any model, so a larger size is a lie.
pub const MAX_SIZE: u64 = 1 << 42;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub size: u64,
    pub piece_size: u32,
    pub pieces: Vec<Digest>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("a manifest is at least {HEADER} bytes, this one {0}")]
    Short(usize),
    #[error("not a manifest (bad magic)")]
    Magic,
    #[error("manifest version {0} is not supported (this agent reads {VERSION})")]
    Version(u8),
    #[error("artifact size {0} is above the limit of {MAX_SIZE} bytes")]
    Size(u64),
    #[error("piece size {0} is not a power of two between {MIN_PIECE} and {MAX_PIECE}")]
    PieceSize(u32),
    #[error("{count} pieces of {piece_size} bytes do not make {size} bytes")]
    Count { count: u32, piece_size: u32, size: u64 },
    #[error("manifest is {got} bytes, {want} expected for its piece count")]
    Length { got: usize, want: usize },
}

/// The piece size for an artifact of `size` bytes.
pub fn piece_size_for(size: u64) -> u32 {
    let want = size.div_ceil(TARGET_PIECES).next_power_of_two();
    want.clamp(u64::from(MIN_PIECE), u64::from(MAX_PIECE)) as u32
}

impl Manifest {
    /// Reads an artifact through once: its manifest and its digest.
    pub fn build(mut from: impl Read, size: u64) -> std::io::Result<(Manifest, Digest)> {
        let piece_size = piece_size_for(size);
        let mut whole = Hasher::default();
        let mut pieces = Vec::new();
        let mut buf = vec![0u8; piece_size as usize];
        let mut left = size;
        while left > 0 {
            let n = left.min(u64::from(piece_size)) as usize;
            from.read_exact(&mut buf[..n])?;
            whole.update(&buf[..n]);
            pieces.push(Digest::of(&buf[..n]));
            left -= n as u64;
        }
        Ok((Manifest { size, piece_size, pieces }, whole.finish()))
    }

    pub fn count(&self) -> u32 {
        self.pieces.len() as u32
    }

    /// Where piece `i` starts, and its length.
    pub fn piece(&self, i: u32) -> (u64, u32) {
        let start = u64::from(i) * u64::from(self.piece_size);
        (start, self.size.saturating_sub(start).min(u64::from(self.piece_size)) as u32)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + 32 * self.pieces.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[VERSION, 0, 0, 0]);
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.piece_size.to_be_bytes());
        out.extend_from_slice(&self.count().to_be_bytes());
        for p in &self.pieces {
            out.extend_from_slice(&p.0);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, ManifestError> {
        if b.len() < HEADER {
            return Err(ManifestError::Short(b.len()));
        }
        if &b[..4] != MAGIC {
            return Err(ManifestError::Magic);
        }
        if b[4] != VERSION {
            return Err(ManifestError::Version(b[4]));
        }
        let u64_at = |i: usize| b[i..i + 8].iter().fold(0u64, |a, x| a << 8 | u64::from(*x));
        let u32_at = |i: usize| b[i..i + 4].iter().fold(0u32, |a, x| a << 8 | u32::from(*x));
        let (size, piece_size, count) = (u64_at(8), u32_at(16), u32_at(20));
        if size > MAX_SIZE {
            return Err(ManifestError::Size(size));
        }
        if !piece_size.is_power_of_two() || !(MIN_PIECE..=MAX_PIECE).contains(&piece_size) {
            return Err(ManifestError::PieceSize(piece_size));
        }
        if count > MAX_PIECES || u64::from(count) != size.div_ceil(u64::from(piece_size)) {
            return Err(ManifestError::Count { count, piece_size, size });
        }
        let want = HEADER + 32 * count as usize;
        if b.len() != want {
            return Err(ManifestError::Length { got: b.len(), want });
        }
        let pieces = b[HEADER..]
            .chunks_exact(32)
            .map(|c| {
                let mut d = [0u8; 32];
                d.copy_from_slice(c);
                Digest(d)
            })
            .collect();
        Ok(Manifest { size, piece_size, pieces })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_built_manifest_round_trips_and_names_the_whole() {
        let data: Vec<u8> = (0..(3 * MIN_PIECE as usize + 17)).map(|i| (i % 251) as u8).collect();
        let (m, d) = Manifest::build(&data[..], data.len() as u64).unwrap();
        assert_eq!(d, Digest::of(&data));
        assert_eq!((m.count(), m.piece_size), (4, MIN_PIECE));
        assert_eq!(m.piece(3), (3 * u64::from(MIN_PIECE), 17));
        assert_eq!(m.pieces[3], Digest::of(&data[3 * MIN_PIECE as usize..]));
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        let (empty, _) = Manifest::build(&[][..], 0).unwrap();
        assert_eq!(Manifest::decode(&empty.encode()).unwrap().count(), 0);
    }

    #[test]
    fn pieces_grow_only_for_large_artifacts() {
        assert_eq!(piece_size_for(128 << 20), MIN_PIECE);
        assert_eq!(piece_size_for(140_000_000_000), 32 << 20);
        assert_eq!(piece_size_for(MAX_SIZE), MAX_PIECE);
    }

    #[test]
    fn lies_in_a_manifest_are_named() {
        let (m, _) = Manifest::build(&[7u8; 10][..], 10).unwrap();
        let good = m.encode();
        let with = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            Manifest::decode(&b).unwrap_err()
        };
        assert_eq!(Manifest::decode(&good[..5]).unwrap_err(), ManifestError::Short(5));
        assert_eq!(with(0, b"XXXX"), ManifestError::Magic);
        assert_eq!(with(4, &[9]), ManifestError::Version(9));
        assert!(matches!(with(8, &u64::MAX.to_be_bytes()), ManifestError::Size(_)));
        assert!(matches!(with(16, &3u32.to_be_bytes()), ManifestError::PieceSize(3)));
        assert!(matches!(with(20, &2u32.to_be_bytes()), ManifestError::Count { count: 2, .. }));
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(Manifest::decode(&long).unwrap_err(), ManifestError::Length { .. }));
    }

    proptest! {
        #[test]
        fn decoding_any_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Manifest::decode(&b);
        }
    }
}
