//! Just enough BitTorrent to set up the baseline: a single-file `.torrent` (bencoded,
//! SHA-1 pieces) and its info hash, for aria2 and opentracker.

use ring::digest::{SHA1_FOR_LEGACY_USE_ONLY, digest};

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(format!("{}:", b.len()).as_bytes());
    out.extend_from_slice(b);
}

fn int(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(format!("i{n}e").as_bytes());
}

/// The `.torrent` for `data` named `name`, announced at `tracker`; and its info hash (hex).
pub fn torrent(name: &str, data: &[u8], piece: usize, tracker: &str) -> (Vec<u8>, String) {
    let pieces: Vec<u8> =
        data.chunks(piece).flat_map(|c| digest(&SHA1_FOR_LEGACY_USE_ONLY, c).as_ref().to_vec()).collect();
    // Keys in sorted order, as bencoding requires.
    let mut info = b"d".to_vec();
    bytes(&mut info, b"length");
    int(&mut info, data.len() as u64);
    bytes(&mut info, b"name");
    bytes(&mut info, name.as_bytes());
    bytes(&mut info, b"piece length");
    int(&mut info, piece as u64);
    bytes(&mut info, b"pieces");
    bytes(&mut info, &pieces);
    info.push(b'e');
    let hash: String = digest(&SHA1_FOR_LEGACY_USE_ONLY, &info).as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let mut t = b"d".to_vec();
    bytes(&mut t, b"announce");
    bytes(&mut t, tracker.as_bytes());
    bytes(&mut t, b"info");
    t.extend_from_slice(&info);
    t.push(b'e');
    (t, hash)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_torrent_is_bencoded_with_sorted_keys_and_one_sha1_a_piece() {
        let (t, hash) = super::torrent("a.bin", b"abc", 2, "http://t/announce");
        let text = String::from_utf8_lossy(&t);
        assert!(text.starts_with(
            "d8:announce17:http://t/announce4:infod6:lengthi3e4:name5:a.bin12:piece lengthi2e6:pieces40:"
        ));
        assert!(text.ends_with("ee"));
        assert_eq!(hash.len(), 40);
    }
}
