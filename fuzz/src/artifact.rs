//! The artifact wire target: the frames a peer sends over QUIC, the manifest an origin or
//! a peer answers with, and the bitfield a tracker answer carries.

use flotilla_artifact::manifest::{MAX_PIECE, MAX_PIECES, MAX_SIZE, MIN_PIECE, Manifest, ManifestError};
use flotilla_artifact::wire::{Hello, MAX_BODY, Request, Status, WireError};
use flotilla_artifact::{Bitfield, Digest};

/// Bytes 5..8 of a manifest (after the version), which `Manifest::decode` does not read
/// and `Manifest::encode` writes as zeros.
pub const MANIFEST_RESERVED: std::ops::Range<usize> = 5..8;
/// The first byte with this bit set: the bitfield's length is the big-endian u32 that
/// follows it, and its text the bytes after that. Clear: the text is the rest of the
/// input and the length is fitted to it, `4 * text.len()` less the byte's low 3 bits.
pub const BITFIELD_EXPLICIT_LEN: u8 = 0x80;

/// Artifact wire input, read every way the network hands such bytes over:
/// - the whole input as a manifest (the origin's `/manifest` body);
/// - the whole input as a hello (read to its end), and the prefix its own length byte
///   names;
/// - the first 37 bytes as a request (as a peer reads one), and the whole input;
/// - the first 5 bytes as an answer's status and the rest as its body, which for an `Ok`
///   of exactly that length is decoded as a manifest (a peer's answer to a manifest
///   request);
/// - the input as text (lossy UTF-8) as a bitfield of a tracker's answer, its length
///   taken from the first bytes (see [`BITFIELD_EXPLICIT_LEN`]).
///
/// Whatever decodes must encode back to the bytes it came from (but for the fields the
/// decoder ignores, which must encode as zeros) and decode again to the same value.
pub fn artifact_wire(data: &[u8]) {
    manifest(data);
    hello(data);
    if let Some(n) = data.get(8) {
        hello(&data[..data.len().min(8 + 1 + usize::from(*n) + 32)]);
    }
    request(data);
    request(&data[..data.len().min(Request::LEN)]);
    let _ = status(data);
    if data.len() >= Status::LEN {
        let (head, body) = data.split_at(Status::LEN);
        if let Ok(Status::Ok(n)) = status(head)
            && body.len() == n as usize
        {
            manifest(body);
        }
    }
    bitfield(data);
}

fn manifest(b: &[u8]) {
    let m = match Manifest::decode(b) {
        Ok(m) => m,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            if let ManifestError::Length { got, want } = e {
                assert_eq!(got, b.len());
                assert_ne!(got, want);
            }
            return;
        }
    };
    assert!(m.size <= MAX_SIZE, "{m:?}");
    assert!(m.piece_size.is_power_of_two() && (MIN_PIECE..=MAX_PIECE).contains(&m.piece_size), "{m:?}");
    assert!(m.count() <= MAX_PIECES);
    assert_eq!(u64::from(m.count()), m.size.div_ceil(u64::from(m.piece_size)), "pieces that do not make the size");
    if let Some(last) = m.count().checked_sub(1) {
        let (start, len) = m.piece(last);
        assert!(len > 0 && len <= m.piece_size, "last piece of {len} bytes: {m:?}");
        assert_eq!(start + u64::from(len), m.size, "the pieces end before or after the artifact");
    }
    assert_eq!(m.piece(m.count()).1, 0, "a piece past the last");

    let enc = m.encode();
    assert!(enc.len() <= MAX_BODY as usize, "a manifest no answer can carry");
    assert_eq!(enc.len(), b.len());
    assert!(enc[MANIFEST_RESERVED].iter().all(|x| *x == 0));
    let mut canonical = b.to_vec();
    canonical[MANIFEST_RESERVED].fill(0);
    assert_eq!(enc, canonical, "the manifest encodes to other bytes than it came from");
    assert_eq!(Manifest::decode(&enc).as_ref(), Ok(&m));
}

fn hello(b: &[u8]) {
    let Ok(h) = Hello::decode(b) else { return };
    assert!(!h.node.is_empty() && h.node.len() <= 253, "node {:?}", h.node);
    let enc = h.encode();
    assert!(enc.len() <= Hello::MAX_LEN);
    assert_eq!(enc, b, "the hello encodes to other bytes than it came from");
    assert_eq!(Hello::decode(&enc).as_ref(), Ok(&h));
}

fn request(b: &[u8]) {
    let r = match Request::decode(b) {
        Ok(r) => r,
        Err(e) => {
            if b.len() != Request::LEN {
                assert_eq!(e, WireError::Length { got: b.len(), want: Request::LEN });
            }
            return;
        }
    };
    assert_eq!(r.digest(), Digest(b[1..33].try_into().unwrap()));
    let enc = r.encode();
    match r {
        // A manifest request's piece index is not read: it encodes as 0.
        Request::Manifest(_) => {
            assert_eq!(enc[..33], b[..33], "the request encodes to other bytes than it came from");
            assert_eq!(enc[33..], [0; 4]);
        }
        // Every other kind carries its piece index.
        _ => assert_eq!(enc, b, "the request encodes to other bytes than it came from"),
    }
    assert_eq!(Request::decode(&enc), Ok(r));
}

fn status(b: &[u8]) -> Result<Status, WireError> {
    let s = match Status::decode(b) {
        Ok(s) => s,
        Err(e) => {
            if b.len() != Status::LEN {
                assert_eq!(e, WireError::Length { got: b.len(), want: Status::LEN });
            }
            return Err(e);
        }
    };
    let enc = s.encode();
    match s {
        Status::Ok(n) => {
            assert!(n <= MAX_BODY, "an answer of {n} bytes accepted");
            assert_eq!(enc, b, "the status encodes to other bytes than it came from");
        }
        // Only an `Ok` has a length: another status's is not read and encodes as 0.
        Status::Missing | Status::Busy => {
            assert_eq!(enc[0], b[0]);
            assert_eq!(enc[1..], [0; 4]);
        }
    }
    assert_eq!(Status::decode(&enc), Ok(s));
    Ok(s)
}

fn bitfield(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else { return };
    let (len, text) = if first & BITFIELD_EXPLICIT_LEN != 0 {
        let Some((len, text)) = rest.split_first_chunk::<4>() else { return };
        (u32::from_be_bytes(*len), String::from_utf8_lossy(text))
    } else {
        let text = String::from_utf8_lossy(rest);
        let bits = u32::try_from(text.len() / 2 * 8).unwrap_or(u32::MAX);
        (bits.saturating_sub(u32::from(first & 7)), text)
    };
    let b = match Bitfield::from_hex(&text, len) {
        Ok(b) => b,
        Err(e) => {
            assert!(!e.is_empty());
            return;
        }
    };
    assert_eq!(b.len(), len);
    // The doc: "the wrong length, a non-hex digit or a bit past `len` is an error".
    assert_eq!(text.len(), 2 * (len as usize).div_ceil(8), "a bitfield of the wrong length accepted");
    assert!(text.bytes().all(|c| c.is_ascii_hexdigit()), "a bitfield that is not hex accepted: {text:?}");
    assert_eq!(b.ones().count() as u32, b.count(), "a bit past the last");
    let hex = b.to_hex();
    assert_eq!(hex, text.to_ascii_lowercase(), "the bitfield writes other hex than it read");
    assert_eq!(Bitfield::from_hex(&hex, len).as_ref(), Ok(&b));
}
