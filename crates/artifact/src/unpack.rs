//! Unpacking a downloaded artifact. The archive comes from outside (an origin or a peer), and its digest only proves
//! it is the archive the spec named, not that the archive is harmless: so every entry's path and link target is
//! checked before anything of it is written, and a bomb stops at a limit rather than at a full disk. The finished tree
//! is read-only because several members share it and none may change what the others run.

use std::ffi::OsString;
use std::fs::{self, File, Permissions};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// How an artifact is unpacked (`unpack = "tar.gz" | "tar.zst" | "tar" | "zip"` in a spec; none keeps the file as it
/// is). Serde uses the spec's spellings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Format {
    #[serde(rename = "tar")]
    Tar,
    #[serde(rename = "tar.gz", alias = "tgz")]
    TarGz,
    #[serde(rename = "tar.zst", alias = "tzst")]
    TarZst,
    #[serde(rename = "zip")]
    Zip,
}

impl Format {
    /// Parses the spec's spelling: "tar", "tar.gz" (also "tgz"), "tar.zst" (also "tzst"), "zip".
    pub fn parse(s: &str) -> Result<Format, String> {
        match s {
            "tar" => Ok(Format::Tar),
            "tar.gz" | "tgz" => Ok(Format::TarGz),
            "tar.zst" | "tzst" => Ok(Format::TarZst),
            "zip" => Ok(Format::Zip),
            _ => Err(format!("unknown unpack format {s:?}: expected \"tar\", \"tar.gz\", \"tar.zst\" or \"zip\"")),
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Format::Tar => "tar",
            Format::TarGz => "tar.gz",
            Format::TarZst => "tar.zst",
            Format::Zip => "zip",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("entry {path:?} leaves the destination (absolute path)")]
    Absolute { path: PathBuf },
    #[error("entry {path:?} leaves the destination (`..` component)")]
    DotDot { path: PathBuf },
    #[error("entry {path:?} leaves the destination (through a symlink)")]
    ThroughLink { path: PathBuf },
    #[error("entry {path:?}: link target {target:?} leaves the destination")]
    LinkEscapes { path: PathBuf, target: PathBuf },
    #[error("entry {path:?}: unsupported type ({kind})")]
    Unsupported { path: PathBuf, kind: &'static str },
    #[error("archive expands past {limit} bytes")]
    TooBig { limit: u64 },
    #[error("archive holds more than {limit} entries")]
    TooManyEntries { limit: u64 },
    #[error("{0:?} already exists")]
    Exists(PathBuf),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("corrupt archive: {0}")]
    Corrupt(String),
}

/// Bounds on what one archive may expand to, so a small download cannot fill a node's disk or inode table.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_entries: u64,
    pub max_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_entries: 1_000_000, max_bytes: 1 << 40 }
    }
}

/// Unpacks `archive` (a file) of `format` into `into`, which must not exist yet: everything is written to a
/// sibling temporary dir first and renamed into place only when the whole archive was unpacked, so a failure leaves
/// nothing at `into`. Refuses (before writing anything of that entry): absolute paths, `..` components, symlinks or
/// hard links whose target resolves outside the destination (relative symlinks that stay inside are kept), device
/// files, fifos; more than `limits.max_entries` entries or more than `limits.max_bytes` unpacked bytes (a
/// decompression bomb). Regular files keep their mode's execute bits; the finished tree is read-only (files 0o444 or
/// 0o555, directories 0o555) because it is shared by several processes that must not change it. Returns the number of
/// bytes written.
pub fn unpack(archive: &Path, format: Format, into: &Path, limits: Limits) -> Result<u64, UnpackError> {
    if fs::symlink_metadata(into).is_ok() {
        return Err(UnpackError::Exists(into.to_path_buf()));
    }
    let Some(name) = into.file_name() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{into:?} names no directory")).into());
    };
    let mut tmp = name.to_os_string();
    tmp.push(format!(".unpacking-{}-{:016x}", std::process::id(), rand::random::<u64>()));
    let tmp = into.with_file_name(tmp);
    fs::create_dir(&tmp).map_err(ctx(&tmp))?;
    let result = fill(archive, format, &tmp, limits).and_then(|bytes| {
        seal(&tmp, Path::new(""))?;
        // Renaming onto an empty directory would succeed, so look again: a concurrent unpack may have won.
        if fs::symlink_metadata(into).is_ok() {
            return Err(UnpackError::Exists(into.to_path_buf()));
        }
        fs::rename(&tmp, into).map_err(ctx(into))?;
        Ok(bytes)
    });
    if result.is_err()
        && let Err(e) = make_writable(&tmp).and_then(|()| fs::remove_dir_all(&tmp))
    {
        tracing::warn!(dir = %tmp.display(), error = %e, "could not remove a failed unpack");
    }
    result
}

/// Makes a read-only tree writable again (dirs 0o755, files owner-writable) so it can be deleted; used before removing
/// a cached tree.
pub fn make_writable(root: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(root)?;
    if meta.is_dir() {
        fs::set_permissions(root, Permissions::from_mode(0o755))?;
        for entry in fs::read_dir(root)? {
            make_writable(&entry?.path())?;
        }
    } else if meta.is_file() {
        fs::set_permissions(root, Permissions::from_mode((meta.permissions().mode() & 0o7777) | 0o200))?;
    }
    Ok(())
}

fn ctx(path: &Path) -> impl Fn(io::Error) -> UnpackError + '_ {
    move |e| UnpackError::Io(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn fill(archive: &Path, format: Format, root: &Path, limits: Limits) -> Result<u64, UnpackError> {
    let file = File::open(archive).map_err(ctx(archive))?;
    let mut sink = Sink { root: root.to_path_buf(), limits, entries: 0, bytes: 0 };
    match format {
        Format::Tar => unpack_tar(BufReader::new(file), &mut sink)?,
        Format::TarGz => unpack_tar(flate2::read::GzDecoder::new(file), &mut sink)?,
        Format::TarZst => {
            let zst = ruzstd::decoding::StreamingDecoder::new(BufReader::new(file)).map_err(corrupt)?;
            unpack_tar(zst, &mut sink)?
        }
        Format::Zip => unpack_zip(file, &mut sink)?,
    }
    Ok(sink.bytes)
}

fn corrupt(e: impl std::fmt::Display) -> UnpackError {
    UnpackError::Corrupt(e.to_string())
}

enum Body<'a> {
    Dir,
    File(&'a mut dyn Read, u32),
    Symlink(PathBuf),
    Hardlink(PathBuf),
}

/// Where the entries go, and what has been spent so far.
struct Sink {
    root: PathBuf,
    limits: Limits,
    entries: u64,
    bytes: u64,
}

impl Sink {
    fn entry(&mut self, raw: &Path, body: Body<'_>) -> Result<(), UnpackError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(UnpackError::TooManyEntries { limit: self.limits.max_entries });
        }
        let rel = checked(raw)?;
        let Some(name) = rel.file_name() else {
            return match body {
                Body::Dir => Ok(()), // "./": the root itself
                _ => Err(UnpackError::Corrupt(format!("entry {raw:?} has no name"))),
            };
        };
        let parent = resolve(&self.root, Path::new(""), rel.parent().unwrap_or(Path::new("")), &mut 0)
            .ok_or_else(|| UnpackError::ThroughLink { path: raw.to_path_buf() })?;
        let escapes = |target: &Path| UnpackError::LinkEscapes { path: raw.to_path_buf(), target: target.into() };
        let link_source = match &body {
            Body::Symlink(t) => resolve(&self.root, &parent, t, &mut 0).map(|_| None).ok_or_else(|| escapes(t))?,
            // A hard link names a path in the archive, so it is relative to the root, not to the entry's directory.
            Body::Hardlink(t) => Some(resolve(&self.root, Path::new(""), t, &mut 0).ok_or_else(|| escapes(t))?),
            _ => None,
        };
        let dir = self.root.join(&parent);
        fs::create_dir_all(&dir).map_err(ctx(&dir))?;
        let dest = dir.join(name);
        // A later entry replaces an earlier one, but never writes through it (it may be a symlink).
        match fs::symlink_metadata(&dest) {
            Ok(m) if m.is_dir() => {
                return match body {
                    Body::Dir => Ok(()),
                    _ => Err(UnpackError::Corrupt(format!("entry {raw:?} replaces a directory"))),
                };
            }
            Ok(_) => fs::remove_file(&dest).map_err(ctx(&dest))?,
            Err(_) => {}
        }
        match body {
            Body::Dir => fs::create_dir(&dest).map_err(ctx(&dest))?,
            Body::File(reader, mode) => {
                let mut file = File::create_new(&dest).map_err(ctx(&dest))?;
                self.copy(reader, &mut file, &dest)?;
                let mode = if mode & 0o111 != 0 { 0o555 } else { 0o444 };
                file.set_permissions(Permissions::from_mode(mode)).map_err(ctx(&dest))?;
            }
            Body::Symlink(target) => std::os::unix::fs::symlink(&target, &dest).map_err(ctx(&dest))?,
            Body::Hardlink(_) => {
                let source = self.root.join(link_source.unwrap_or_default());
                fs::hard_link(&source, &dest).map_err(ctx(&dest))?;
            }
        }
        Ok(())
    }

    /// Counts what is actually read, not what the header claims, so a lying header cannot get past the limit.
    fn copy(&mut self, reader: &mut dyn Read, file: &mut File, dest: &Path) -> Result<(), UnpackError> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(corrupt(e)),
            };
            self.bytes += n as u64;
            if self.bytes > self.limits.max_bytes {
                return Err(UnpackError::TooBig { limit: self.limits.max_bytes });
            }
            file.write_all(&buf[..n]).map_err(ctx(dest))?;
        }
    }
}

/// The entry's path made relative and plain, or why it may not be written.
fn checked(raw: &Path) -> Result<PathBuf, UnpackError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => return Err(UnpackError::Absolute { path: raw.into() }),
            Component::ParentDir => return Err(UnpackError::DotDot { path: raw.into() }),
            Component::CurDir => {}
            Component::Normal(part) => out.push(part),
        }
    }
    Ok(out)
}

/// Where `target`, seen from `dir` (relative to `root`, free of symlinks), lands, following the symlinks already in
/// the tree as the kernel would: a purely lexical check misses `b -> .` then `c -> b/../x`. `None` when it leaves
/// `root` or loops.
fn resolve(root: &Path, dir: &Path, target: &Path, hops: &mut u32) -> Option<PathBuf> {
    let mut at = dir.to_path_buf();
    for c in target.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !at.pop() {
                    return None;
                }
            }
            Component::Normal(part) => match fs::read_link(root.join(&at).join(part)) {
                Ok(link) => {
                    *hops += 1;
                    if *hops > 40 {
                        return None;
                    }
                    at = resolve(root, &at, &link, hops)?;
                }
                Err(_) => at.push(part),
            },
            Component::Prefix(_) | Component::RootDir => return None,
        }
    }
    Some(at)
}

/// Checks every symlink again now that the whole tree exists (a later link can redirect an earlier one's path),
/// then makes directories read-only, deepest first.
fn seal(root: &Path, rel: &Path) -> Result<(), UnpackError> {
    let dir = root.join(rel);
    for entry in fs::read_dir(&dir).map_err(ctx(&dir))? {
        let entry = entry.map_err(ctx(&dir))?;
        let kind = entry.file_type().map_err(ctx(&entry.path()))?;
        let child = rel.join(entry.file_name());
        if kind.is_symlink() {
            let target = fs::read_link(entry.path()).map_err(ctx(&entry.path()))?;
            if resolve(root, rel, &target, &mut 0).is_none() {
                return Err(UnpackError::LinkEscapes { path: child, target });
            }
        } else if kind.is_dir() {
            seal(root, &child)?;
        }
    }
    fs::set_permissions(&dir, Permissions::from_mode(0o555)).map_err(ctx(&dir))?;
    Ok(())
}

fn unpack_tar(stream: impl Read, sink: &mut Sink) -> Result<(), UnpackError> {
    // The tar reader skips the data of entries it does not hand out (a directory may claim a terabyte), so the
    // decompressed stream is capped too, at the limit plus room for headers and padding; hitting the cap reads as a
    // truncated archive.
    let limits = sink.limits;
    let cap = limits.max_bytes.saturating_add(limits.max_entries.saturating_mul(4096)).saturating_add(1 << 20);
    let mut archive = tar::Archive::new(stream.take(cap));
    let result = tar_entries(&mut archive, sink);
    match archive.into_inner().limit() {
        0 if result.is_err() => Err(UnpackError::TooBig { limit: limits.max_bytes }),
        _ => result,
    }
}

fn tar_entries<R: Read>(archive: &mut tar::Archive<R>, sink: &mut Sink) -> Result<(), UnpackError> {
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let path = entry.path().map_err(corrupt)?.into_owned();
        let link = entry.link_name().map_err(corrupt)?.map(|l| l.into_owned());
        let no_link = || UnpackError::Corrupt(format!("link {path:?} has no target"));
        let unsupported = |kind| UnpackError::Unsupported { path: path.clone(), kind };
        let body = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let mode = entry.header().mode().map_err(corrupt)?;
                Body::File(&mut entry, mode)
            }
            tar::EntryType::Directory => Body::Dir,
            tar::EntryType::Symlink => Body::Symlink(link.ok_or_else(no_link)?),
            tar::EntryType::Link => Body::Hardlink(link.ok_or_else(no_link)?),
            tar::EntryType::XGlobalHeader => continue,
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(unsupported("device/fifo"));
            }
            _ => return Err(unsupported("unknown tar entry type")),
        };
        sink.entry(&path, body)?;
    }
    Ok(())
}

fn unpack_zip(file: File, sink: &mut Sink) -> Result<(), UnpackError> {
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).map_err(corrupt)?;
    if zip.len() as u64 > sink.limits.max_entries {
        return Err(UnpackError::TooManyEntries { limit: sink.limits.max_entries });
    }
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(corrupt)?;
        let path = PathBuf::from(member.name());
        checked(&path)?;
        if member.enclosed_name().is_none() {
            return Err(UnpackError::Corrupt(format!("entry {path:?} has an unsafe name")));
        }
        let mode = member.unix_mode().unwrap_or(0o644);
        let unsupported = |kind| UnpackError::Unsupported { path: path.clone(), kind };
        let body = match mode & 0o170000 {
            _ if member.is_dir() => Body::Dir,
            0o040000 => Body::Dir,
            0 | 0o100000 => Body::File(&mut member, mode),
            0o120000 => {
                let mut target = Vec::new();
                (&mut member).take(4096).read_to_end(&mut target).map_err(corrupt)?;
                Body::Symlink(PathBuf::from(OsString::from_vec(target)))
            }
            _ => return Err(unsupported("device/fifo/socket")),
        };
        sink.entry(&path, body)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::UnpackError::*;
    use super::*;
    use tar::EntryType::{self, Directory, Link, Regular, Symlink};

    /// A scratch dir, made writable and removed when the test ends.
    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = make_writable(&self.0).and_then(|()| fs::remove_dir_all(&self.0));
        }
    }

    type Raw<'a> = (&'a str, EntryType, &'a str, u32, &'a [u8]);

    /// Headers written byte for byte: the Builder refuses the hostile names these tests need.
    fn tar(entries: &[Raw]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for &(name, kind, link, mode, data) in entries {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn run(bytes: &[u8], format: Format, limits: Limits) -> (Scratch, Result<u64, UnpackError>) {
        let s = Scratch(std::env::temp_dir().join(format!("flotilla-unpack-{:016x}", rand::random::<u64>())));
        fs::create_dir(&s.0).unwrap();
        fs::write(s.0.join("a"), bytes).unwrap();
        let result = unpack(&s.0.join("a"), format, &s.0.join("out"), limits);
        (s, result)
    }

    /// Checks that a refusal leaves nothing behind (no `out`, no temporary dir) and gives the expected error.
    macro_rules! refuses {
        ($bytes:expr, $format:expr, $limits:expr, $pat:pat) => {{
            let (s, result) = run(&$bytes, $format, $limits);
            let left: Vec<_> = fs::read_dir(&s.0).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(left, ["a"]);
            let e = result.unwrap_err();
            assert!(matches!(e, $pat), "{e}");
        }};
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn tar_gz_keeps_content_and_exec_bits_and_is_read_only() {
        let t = tar(&[
            ("bin/run", Regular, "", 0o755, b"#!/bin/sh\n"),
            ("a/b/c.txt", Regular, "", 0o644, b"hello"),
            ("a/", Directory, "", 0o755, b""),
        ]);
        let (s, result) = run(&gz(&t), Format::TarGz, Limits::default());
        assert_eq!(result.unwrap(), 15);
        let out = s.0.join("out");
        assert_eq!(fs::read(out.join("a/b/c.txt")).unwrap(), b"hello");
        assert_eq!((mode(&out.join("bin/run")), mode(&out.join("a/b/c.txt"))), (0o555, 0o444));
        for dir in ["", "a", "a/b", "bin"] {
            assert_eq!(mode(&out.join(dir)), 0o555, "{dir}");
        }
        make_writable(&out).unwrap();
        assert_eq!((mode(&out.join("a")), mode(&out.join("a/b/c.txt"))), (0o755, 0o644));
    }

    #[test]
    fn tar_zst_and_zip_round_trip() {
        let t = tar(&[("x/y.txt", Regular, "", 0o755, b"zstd")]);
        let zst = ruzstd::encoding::compress_to_vec(&t[..], ruzstd::encoding::CompressionLevel::Fastest);
        let (s, result) = run(&zst, Format::TarZst, Limits::default());
        assert_eq!(result.unwrap(), 4);
        assert_eq!(fs::read(s.0.join("out/x/y.txt")).unwrap(), b"zstd");

        let mut z = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        let exec = zip::write::SimpleFileOptions::default().unix_permissions(0o755);
        z.add_directory("empty/", zip::write::SimpleFileOptions::default()).unwrap();
        z.start_file("x/y.txt", exec).unwrap();
        z.write_all(b"zipped").unwrap();
        z.add_symlink("x/link", "y.txt", zip::write::SimpleFileOptions::default()).unwrap();
        let (s, result) = run(&z.finish().unwrap().into_inner(), Format::Zip, Limits::default());
        assert_eq!(result.unwrap(), 6);
        assert_eq!(fs::read(s.0.join("out/x/link")).unwrap(), b"zipped");
        assert_eq!((mode(&s.0.join("out/x/y.txt")), mode(&s.0.join("out/empty"))), (0o555, 0o555));
    }

    #[test]
    fn refuses_paths_leaving_the_destination() {
        let (x, d) = (b"x" as &[u8], Limits::default());
        refuses!(
            tar(&[("ok", Regular, "", 0o644, x), ("/etc/evil", Regular, "", 0o644, x)]),
            Format::Tar,
            d,
            Absolute { .. }
        );
        refuses!(tar(&[("../evil", Regular, "", 0o644, x)]), Format::Tar, d, DotDot { .. });
        refuses!(tar(&[("a/../../evil", Regular, "", 0o644, x)]), Format::Tar, d, DotDot { .. });
        let mut z = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        z.start_file("../evil", zip::write::SimpleFileOptions::default()).unwrap();
        refuses!(z.finish().unwrap().into_inner(), Format::Zip, d, DotDot { .. });
    }

    #[test]
    fn refuses_links_leaving_the_destination() {
        let cases: [&[Raw]; 4] = [
            &[("link", Symlink, "../../etc/passwd", 0o777, b"")],
            &[("d/link", Symlink, "/etc", 0o777, b"")],
            &[("hard", Link, "../outside", 0o644, b"")],
            // Each fine alone; together `c` is `./../etc`, caught once the whole tree is there.
            &[("c", Symlink, "b/../etc", 0o777, b""), ("b", Symlink, ".", 0o777, b"")],
        ];
        for entries in cases {
            refuses!(tar(entries), Format::Tar, Limits::default(), LinkEscapes { .. });
        }
        let through: [Raw; 3] =
            [("c", Symlink, "b/..", 0o777, b""), ("b", Symlink, ".", 0o777, b""), ("c/x", Regular, "", 0o644, b"x")];
        refuses!(tar(&through), Format::Tar, Limits::default(), ThroughLink { .. });
    }

    #[test]
    fn keeps_links_that_stay_inside() {
        let t = tar(&[
            ("data/real.txt", Regular, "", 0o644, b"hi"),
            ("data/link", Symlink, "real.txt", 0o777, b""),
            ("top", Symlink, "data/../data/real.txt", 0o777, b""),
            ("hard", Link, "data/real.txt", 0o644, b""),
            ("dl", Symlink, "data", 0o777, b""),
            ("dl/new.txt", Regular, "", 0o644, b"x"),
        ]);
        let (s, result) = run(&t, Format::Tar, Limits::default());
        assert_eq!(result.unwrap(), 3);
        let out = s.0.join("out");
        assert_eq!(fs::read_link(out.join("data/link")).unwrap(), Path::new("real.txt"));
        assert_eq!(fs::read(out.join("top")).unwrap(), b"hi");
        assert_eq!(fs::read(out.join("hard")).unwrap(), b"hi");
        assert_eq!(fs::read(out.join("data/new.txt")).unwrap(), b"x");
    }

    #[test]
    fn refuses_bombs_and_too_many_entries() {
        let limits = Limits { max_entries: 3, max_bytes: 1000 };
        let big = vec![0u8; 4 << 20];
        refuses!(gz(&tar(&[("big", Regular, "", 0o644, &big)])), Format::TarGz, limits, TooBig { .. });
        // A directory whose header claims megabytes: the tar reader skips them, and the stream cap stops that.
        refuses!(gz(&tar(&[("d/", Directory, "", 0o755, &big)])), Format::TarGz, limits, TooBig { .. });
        let files: Vec<Raw> = ["a", "b", "c", "d"].map(|n| (n, Regular, "", 0o644, b"x" as &[u8])).to_vec();
        refuses!(tar(&files), Format::Tar, limits, TooManyEntries { limit: 3 });
    }

    #[test]
    fn refuses_existing_destination_devices_and_corrupt_archives() {
        let (s, result) = run(&tar(&[("f", Regular, "", 0o644, b"x")]), Format::Tar, Limits::default());
        assert_eq!(result.unwrap(), 1);
        let again = unpack(&s.0.join("a"), Format::Tar, &s.0.join("out"), Limits::default());
        assert!(matches!(again, Err(Exists(_))), "{again:?}");
        let fifo = tar(&[("p", EntryType::Fifo, "", 0o644, b"")]);
        refuses!(fifo, Format::Tar, Limits::default(), Unsupported { .. });
        let mut bad = gz(&tar(&[("f", Regular, "", 0o644, b"hello")]));
        bad.truncate(bad.len() / 2);
        bad[12] ^= 0xff;
        for format in [Format::TarGz, Format::TarZst, Format::Zip] {
            refuses!(bad, format, Limits::default(), Corrupt(_));
        }
    }

    #[test]
    fn format_spellings() {
        for f in [Format::Tar, Format::TarGz, Format::TarZst, Format::Zip] {
            assert_eq!(Format::parse(f.as_str()), Ok(f));
        }
        assert_eq!((Format::parse("tgz"), Format::parse("tzst")), (Ok(Format::TarGz), Ok(Format::TarZst)));
        assert!(Format::parse("rar").unwrap_err().contains("tar.zst"));
    }
}
