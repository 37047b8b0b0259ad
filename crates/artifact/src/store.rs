//! The node's artifact cache, content-addressed under the agent's data dir.
//!
//! `DIR/<hex>/` holds the manifest, the bytes (`part` while pieces arrive, with the
//! bitfield of the verified ones in `have`; `blob` once the whole was checked against
//! its sha256) and unpacked trees (`tree.<format>`, read-only, shared by members). A
//! restarted agent keeps the pieces it had: they are checked again before they count,
//! so a `have` written before a crash cannot vouch for bytes that never reached the disk.
//! Artifacts no member uses go, least recently used first, when room is needed.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::bitfield::Bitfield;
use crate::digest::{Digest, Hasher};
use crate::manifest::Manifest;
use crate::unpack::{self, Format, Limits};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("artifact {digest} sha256 mismatch (got {got})")]
    Mismatch { digest: Digest, got: Digest },
    #[error("piece {piece} of {digest} does not match the manifest")]
    BadPiece { digest: Digest, piece: u32 },
    #[error("artifact {digest} is {size} bytes, above the cache cap of {cap} bytes")]
    TooLarge { digest: Digest, size: u64, cap: u64 },
    #[error("the cache needs {need} more bytes and every artifact in it is in use")]
    Full { need: u64 },
    #[error("unpacking {digest}: {source}")]
    Unpack { digest: Digest, source: unpack::UnpackError },
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io { what, path: path.to_path_buf(), source }
}

pub struct Store {
    root: PathBuf,
    cap: u64,
}

/// An artifact whose pieces are arriving.
pub struct Partial {
    pub digest: Digest,
    pub manifest: Manifest,
    pub have: Bitfield,
    file: File,
    dir: PathBuf,
}

impl Store {
    pub fn open(root: PathBuf, cap: u64) -> Result<Store, StoreError> {
        fs::create_dir_all(&root).map_err(io("creating", &root))?;
        // Members get links into the cache: they must not depend on the agent's cwd.
        let root = fs::canonicalize(&root).map_err(io("resolving", &root))?;
        Ok(Store { root, cap })
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn dir(&self, d: &Digest) -> PathBuf {
        self.root.join(d.hex())
    }

    /// The verified whole, if this node has it.
    pub fn blob(&self, d: &Digest) -> Option<PathBuf> {
        let p = self.dir(d).join("blob");
        p.is_file().then_some(p)
    }

    pub fn manifest(&self, d: &Digest) -> Option<Manifest> {
        fs::read(self.dir(d).join("manifest")).ok().and_then(|b| Manifest::decode(&b).ok())
    }

    /// Marks `d` used now (the LRU order).
    pub fn touch(&self, d: &Digest) {
        let _ = File::create(self.dir(d).join("used"));
    }

    /// Starts (or resumes) fetching `d` described by `manifest`.
    pub fn begin(&self, d: Digest, manifest: Manifest) -> Result<Partial, StoreError> {
        let dir = self.dir(&d);
        fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let mpath = dir.join("manifest");
        fs::write(&mpath, manifest.encode()).map_err(io("writing", &mpath))?;
        let ppath = dir.join("part");
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&ppath)
            .map_err(io("opening", &ppath))?;
        file.set_len(manifest.size).map_err(io("sizing", &ppath))?;
        let said = fs::read_to_string(dir.join("have"))
            .ok()
            .and_then(|h| Bitfield::from_hex(h.trim(), manifest.count()).ok())
            .unwrap_or_else(|| Bitfield::new(manifest.count()));
        let mut p = Partial { digest: d, have: Bitfield::new(manifest.count()), manifest, file, dir };
        for i in said.ones() {
            if p.read_piece(i, true).is_some_and(|b| Digest::of(&b) == p.manifest.pieces[i as usize]) {
                p.have.set(i);
            }
        }
        self.touch(&d);
        Ok(p)
    }

    /// Checks the whole against its digest; the cache keeps it only if it matches.
    pub fn finish(&self, p: &Partial) -> Result<PathBuf, StoreError> {
        let part = p.dir.join("part");
        let got = hash_file(&part)?;
        if got != p.digest {
            self.remove(&p.digest);
            return Err(StoreError::Mismatch { digest: p.digest, got });
        }
        self.seal(&p.dir, &part)
    }

    /// A fresh path in the cache's directory for bytes whose digest is not known yet (a
    /// push); [`Store::complete`] and eviction pass it by.
    pub fn incoming_path(&self) -> PathBuf {
        self.root.join(format!("incoming-{}-{:016x}", std::process::id(), rand::random::<u64>()))
    }

    /// Where a whole artifact (from an origin without a manifest, or pushed to this
    /// origin) is written before [`Store::seal_whole`] checks it.
    pub fn part_path(&self, d: &Digest) -> Result<PathBuf, StoreError> {
        let dir = self.dir(d);
        fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        Ok(dir.join("part"))
    }

    /// Keeps the whole written at [`Store::part_path`] if its `size` bytes hashed to `d`
    /// (`got`), and makes its manifest so this node can serve it piece by piece.
    pub fn seal_whole(&self, d: Digest, size: u64, got: Digest) -> Result<PathBuf, StoreError> {
        let dir = self.dir(&d);
        let part = dir.join("part");
        let len = fs::metadata(&part).map(|m| m.len()).unwrap_or(u64::MAX);
        if got != d || len != size {
            self.remove(&d);
            return Err(StoreError::Mismatch { digest: d, got });
        }
        let file = File::open(&part).map_err(io("opening", &part))?;
        // The bytes on disk, not just those that streamed past: what is kept is checked.
        let (m, on_disk) = Manifest::build(std::io::BufReader::new(file), size).map_err(io("reading", &part))?;
        if on_disk != d {
            self.remove(&d);
            return Err(StoreError::Mismatch { digest: d, got: on_disk });
        }
        let mpath = dir.join("manifest");
        fs::write(&mpath, m.encode()).map_err(io("writing", &mpath))?;
        self.seal(&dir, &part)
    }

    /// Takes a whole artifact from `from` (blocking).
    pub fn put(&self, d: Digest, mut from: impl Read) -> Result<PathBuf, StoreError> {
        let part = self.part_path(&d)?;
        let mut out = File::create(&part).map_err(io("creating", &part))?;
        let (mut whole, mut size, mut buf) = (Hasher::default(), 0u64, vec![0u8; 1 << 20]);
        loop {
            let r = from.read(&mut buf).map_err(io("reading the source of", &part))?;
            if r == 0 {
                break;
            }
            size += r as u64;
            whole.update(&buf[..r]);
            out.write_all(&buf[..r]).map_err(io("writing", &part))?;
        }
        drop(out);
        self.seal_whole(d, size, whole.finish())
    }

    /// Every artifact held whole, with its manifest (what a restarted agent seeds).
    pub fn complete(&self) -> Vec<(Digest, Manifest)> {
        let Ok(rd) = fs::read_dir(&self.root) else { return Vec::new() };
        rd.flatten()
            .filter_map(|e| Digest::parse(&e.file_name().to_string_lossy()).ok())
            .filter(|d| self.blob(d).is_some())
            .filter_map(|d| self.manifest(&d).map(|m| (d, m)))
            .collect()
    }

    fn seal(&self, dir: &Path, part: &Path) -> Result<PathBuf, StoreError> {
        let blob = dir.join("blob");
        fs::set_permissions(part, fs::Permissions::from_mode(0o444)).map_err(io("sealing", part))?;
        fs::rename(part, &blob).map_err(io("sealing", &blob))?;
        let _ = fs::remove_file(dir.join("have"));
        let _ = File::create(dir.join("used"));
        Ok(blob)
    }

    /// Piece `i` of a whole artifact, for a peer.
    pub fn read_blob_piece(&self, d: &Digest, m: &Manifest, i: u32) -> Option<Vec<u8>> {
        let (start, len) = m.piece(i);
        let f = File::open(self.blob(d)?).ok()?;
        let mut buf = vec![0u8; len as usize];
        f.read_exact_at(&mut buf, start).ok()?;
        Some(buf)
    }

    /// The tree `d` unpacked to as `format`, if it was.
    pub fn unpacked_if_there(&self, d: &Digest, format: Format) -> Option<PathBuf> {
        let tree = self.dir(d).join(format!("tree.{}", format.as_str()));
        tree.is_dir().then_some(tree)
    }

    /// The tree `d` unpacks to as `format`: unpacked the first time, read-only after.
    pub fn unpacked(&self, d: &Digest, format: Format) -> Result<PathBuf, StoreError> {
        let tree = self.dir(d).join(format!("tree.{}", format.as_str()));
        if tree.is_dir() {
            return Ok(tree);
        }
        let blob = self.blob(d).ok_or_else(|| StoreError::Io {
            what: "unpacking",
            path: self.dir(d),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not fetched yet"),
        })?;
        let limits = Limits { max_bytes: self.cap, ..Limits::default() };
        unpack::unpack(&blob, format, &tree, limits).map_err(|source| StoreError::Unpack { digest: *d, source })?;
        Ok(tree)
    }

    /// Deletes `d` wholly (a failed check, or eviction).
    pub fn remove(&self, d: &Digest) {
        let dir = self.dir(d);
        let _ = unpack::make_writable(&dir);
        let _ = fs::remove_dir_all(&dir);
    }

    /// Makes room for `size` more bytes: evicts the least recently used artifacts not in
    /// `pinned` until the cache fits its cap.
    pub fn make_room(&self, d: &Digest, size: u64, pinned: &HashSet<Digest>) -> Result<(), StoreError> {
        if size > self.cap {
            return Err(StoreError::TooLarge { digest: *d, size, cap: self.cap });
        }
        let mut entries: Vec<(SystemTime, Digest, u64)> = Vec::new();
        let mut total = 0u64;
        for e in fs::read_dir(&self.root).map_err(io("listing", &self.root))?.flatten() {
            let Ok(digest) = Digest::parse(&e.file_name().to_string_lossy()) else { continue };
            if digest == *d {
                // What is there of it already is part of `size`.
                continue;
            }
            let bytes = du(&e.path());
            total += bytes;
            if !pinned.contains(&digest) {
                let used =
                    fs::metadata(e.path().join("used")).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
                entries.push((used, digest, bytes));
            }
        }
        entries.sort();
        let mut over = (total + size).saturating_sub(self.cap);
        for (_, digest, bytes) in entries {
            if over == 0 {
                break;
            }
            tracing::info!(artifact = %digest, bytes, "evicting an unused artifact");
            metrics::counter!(crate::catalogue::EVICTIONS.name).increment(1);
            self.remove(&digest);
            over = over.saturating_sub(bytes);
        }
        if over > 0 { Err(StoreError::Full { need: over }) } else { Ok(()) }
    }
}

impl Partial {
    /// Checks piece `i` against the manifest and writes it.
    pub fn write_piece(&mut self, i: u32, bytes: &[u8]) -> Result<(), StoreError> {
        let (start, len) = self.manifest.piece(i);
        let want = self.manifest.pieces.get(i as usize);
        if bytes.len() != len as usize || want != Some(&Digest::of(bytes)) {
            return Err(StoreError::BadPiece { digest: self.digest, piece: i });
        }
        let part = self.dir.join("part");
        self.file.write_all_at(bytes, start).map_err(io("writing", &part))?;
        self.have.set(i);
        // Not synced: a restart checks every piece again, so this file only saves work.
        let have = self.dir.join("have");
        fs::write(&have, self.have.to_hex()).map_err(io("writing", &have))?;
        Ok(())
    }

    /// Piece `i`, if this node holds it (or, `unchecked`, whatever is on disk there).
    pub fn read_piece(&self, i: u32, unchecked: bool) -> Option<Vec<u8>> {
        if !unchecked && !self.have.get(i) {
            return None;
        }
        let (start, len) = self.manifest.piece(i);
        let mut buf = vec![0u8; len as usize];
        self.file.read_exact_at(&mut buf, start).ok()?;
        Some(buf)
    }

    pub fn done_bytes(&self) -> u64 {
        self.have.ones().map(|i| u64::from(self.manifest.piece(i).1)).sum()
    }
}

fn hash_file(path: &Path) -> Result<Digest, StoreError> {
    let mut f = File::open(path).map_err(io("opening", path))?;
    let (mut h, mut buf) = (Hasher::default(), vec![0u8; 1 << 20]);
    loop {
        let n = f.read(&mut buf).map_err(io("reading", path))?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.update(&buf[..n]);
    }
}

/// Bytes under `path` (a sparse `part` counts at its full size: it will be).
fn du(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else { return 0 };
    if !meta.is_dir() {
        return meta.len();
    }
    fs::read_dir(path).map(|rd| rd.flatten().map(|e| du(&e.path())).sum()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("flotilla-store-{name}-{}", std::process::id()));
        let _ = unpack::make_writable(&d);
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn artifact(len: usize, seed: u8) -> (Vec<u8>, Manifest, Digest) {
        let data: Vec<u8> = (0..len as u64).map(|i| ((i.wrapping_mul(2_654_435_761) >> 13) as u8) ^ seed).collect();
        let (m, d) = Manifest::build(&data[..], len as u64).unwrap();
        (data, m, d)
    }

    #[test]
    fn pieces_are_checked_kept_across_a_restart_and_the_whole_is_checked_at_the_end() {
        let root = tmp("resume");
        let store = Store::open(root.clone(), 1 << 30).unwrap();
        let (data, m, d) = artifact(2 * (1 << 20) + 5, 1);
        let mut p = store.begin(d, m.clone()).unwrap();
        let piece = |i: u32| {
            let (s, l) = m.piece(i);
            data[s as usize..(s + u64::from(l)) as usize].to_vec()
        };
        assert!(matches!(p.write_piece(0, &piece(1)), Err(StoreError::BadPiece { piece: 0, .. })));
        p.write_piece(0, &piece(0)).unwrap();
        p.write_piece(2, &piece(2)).unwrap();
        drop(p);
        // Restarted: pieces 0 and 2 are kept; a byte flipped on disk under piece 2 costs only it.
        let part = root.join(d.hex()).join("part");
        let f = fs::OpenOptions::new().write(true).open(&part).unwrap();
        f.write_all_at(&[0xff], 2 * (1 << 20)).unwrap();
        let mut p = store.begin(d, m.clone()).unwrap();
        assert_eq!(p.have.ones().collect::<Vec<_>>(), vec![0]);
        assert_eq!(p.read_piece(0, false).unwrap(), piece(0));
        assert!(p.read_piece(1, false).is_none());
        p.write_piece(1, &piece(1)).unwrap();
        p.write_piece(2, &piece(2)).unwrap();
        assert_eq!(p.done_bytes(), data.len() as u64);
        let blob = store.finish(&p).unwrap();
        assert_eq!(fs::read(&blob).unwrap(), data);
        assert_eq!(store.read_blob_piece(&d, &m, 2).unwrap(), piece(2));
        assert_eq!(store.manifest(&d).unwrap(), m);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn a_wrong_digest_leaves_nothing_and_says_what_it_got() {
        let root = tmp("mismatch");
        let store = Store::open(root.clone(), 1 << 30).unwrap();
        let (data, _, _) = artifact(1000, 2);
        let claimed = Digest::of(b"something else");
        let err = store.put(claimed, &data[..]).unwrap_err().to_string();
        assert!(err.contains(&format!("artifact {claimed} sha256 mismatch (got {})", Digest::of(&data))), "{err}");
        assert!(!root.join(claimed.hex()).exists());
        let real = Digest::of(&data);
        assert_eq!(fs::read(store.put(real, &data[..]).unwrap()).unwrap(), data);
        assert_eq!(store.manifest(&real).unwrap().size, 1000, "a whole fetched from an origin gets its manifest");
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn the_least_recently_used_unpinned_artifact_makes_room() {
        let root = tmp("lru");
        // Each artifact takes its 1000 bytes and a 56-byte manifest.
        let store = Store::open(root.clone(), 3300).unwrap();
        let (a, b, c) = (artifact(1000, 3), artifact(1000, 4), artifact(1000, 5));
        store.put(a.2, &a.0[..]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        store.put(b.2, &b.0[..]).unwrap();
        let err = store.make_room(&c.2, 4000, &HashSet::new()).unwrap_err();
        assert!(err.to_string().contains("above the cache cap of 3300"), "{err}");
        store.make_room(&c.2, 1000, &HashSet::new()).unwrap();
        assert!(store.blob(&a.2).is_some() && store.blob(&b.2).is_some(), "it fits without evicting");
        store.make_room(&c.2, 2000, &HashSet::new()).unwrap();
        assert!(store.blob(&a.2).is_none() && store.blob(&b.2).is_some(), "the older goes");
        let pinned = HashSet::from([b.2]);
        assert!(matches!(store.make_room(&c.2, 2500, &pinned), Err(StoreError::Full { .. })));
        assert!(store.blob(&b.2).is_some(), "an artifact in use stays");
        let _ = fs::remove_dir_all(&root);
    }
}
