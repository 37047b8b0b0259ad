//! Files in a data dir, written whole or not at all.
//!
//! Every file Flotilla keeps in a data dir (secrets, TLS material, state files, markers)
//! goes through [`write_atomic`]: a temp file in the same dir, written, fsynced, renamed
//! over the target, then the dir fsynced. A crash or a full disk leaves the old file (or
//! none), never a truncated one: a half-written `tls.key` once made every later start
//! fail. Errors name the path and the operation (`writing /x/tls.key: No space left on
//! device (os error 28)`) and keep the `io::ErrorKind`, so callers can still tell a full
//! disk from a missing dir.
//!
//! It lives here because every crate that writes to a data dir already depends on
//! `flotilla-obs` for its process plumbing (logs, metrics, health), and `flotilla-core`
//! stays free of I/O.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// `io::Error` whose message names what was done to which path; the kind is kept.
pub fn context(op: &str, path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

/// A file written and synced under a temp name next to its target, not yet in place.
/// Dropped without [`Staged::commit`], it is removed.
#[derive(Debug)]
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    done: bool,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The temp name: hidden, in the same dir (so the rename is atomic), unique per process
/// and call (two writers of one file never share a temp file).
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{seq}.tmp", std::process::id()))
}

/// Writes `bytes` to a temp file next to `path` with permissions `mode` and syncs it;
/// [`Staged::commit`] puts it in place. Lets several files be written before any is
/// replaced (a certificate and its key).
pub fn stage(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<Staged> {
    let tmp = temp_path(path);
    let staged = Staged { tmp: tmp.clone(), path: path.to_path_buf(), done: false };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| context("writing", path, e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| context("writing", path, e))?;
    Ok(staged)
}

impl Staged {
    /// Renames the temp file over the target and syncs the dir, so the rename survives
    /// a crash.
    pub fn commit(mut self) -> std::io::Result<()> {
        std::fs::rename(&self.tmp, &self.path).map_err(|e| context("replacing", &self.path, e))?;
        self.done = true;
        sync_dir(&self.path)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Syncs the dir holding `path` (a rename is durable only once its dir is).
fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        // Some file systems cannot sync a dir (EINVAL); the rename is done all the same.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        r => r.map_err(|e| context("syncing the dir of", path, e)),
    }
}

/// Replaces `path` with `bytes` atomically (permissions `mode`, e.g. 0o600 for a
/// secret, 0o644 otherwise): readers and a later start see the old file or the new one,
/// whole. On failure the old file is left as it was and no temp file remains.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    stage(path, bytes, mode)?.commit()
}

/// Replaces several files: all are written and synced before any is renamed, so a full
/// disk changes none of them.
pub fn write_atomic_all(files: &[(&Path, &[u8], u32)]) -> std::io::Result<()> {
    let staged = files.iter().map(|(p, b, m)| stage(p, b, *m)).collect::<std::io::Result<Vec<_>>>()?;
    staged.into_iter().try_for_each(Staged::commit)
}

/// `create_dir_all` whose error names the dir.
pub fn create_dir_all(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| context("creating", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("flotilla-fsutil-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn writes_replace_whole_files_with_their_mode_and_leave_no_temp_file() {
        let d = dir("replace");
        let p = d.join("tls.key");
        write_atomic(&p, b"first", 0o600).unwrap();
        write_atomic(&p, b"second", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(entries(&d), vec!["tls.key"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_intact_and_names_the_path() {
        let d = dir("fail");
        let p = d.join("state.json");
        write_atomic(&p, b"old", 0o644).unwrap();
        // A real write failure: files may not grow past 4 bytes (EFBIG instead of
        // SIGXFSZ), as a full disk refuses a write midway. nextest runs each test in its
        // own process; the limit is lifted at once anyway.
        // SAFETY: plain setrlimit/signal calls on this process.
        let e = unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::getrlimit(libc::RLIMIT_FSIZE, &mut old);
            libc::setrlimit(libc::RLIMIT_FSIZE, &libc::rlimit { rlim_cur: 4, rlim_max: old.rlim_max });
            let r = write_atomic(&p, b"new and longer", 0o644);
            libc::setrlimit(libc::RLIMIT_FSIZE, &old);
            r.unwrap_err()
        };
        assert!(e.to_string().starts_with(&format!("writing {}: ", p.display())), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"old", "the old file is intact");
        assert_eq!(entries(&d), vec!["state.json"], "no temp file left");
        // A target that cannot be replaced (a dir is in its place): the temp file is
        // written, the rename fails, the temp file is gone and the error says so.
        let blocked = d.join("blocked");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("keep"), b"x").unwrap();
        let e = write_atomic(&blocked, b"new", 0o644).unwrap_err();
        assert!(e.to_string().starts_with(&format!("replacing {}: ", blocked.display())), "{e}");
        assert_eq!(entries(&d), vec!["blocked", "state.json"], "no temp file left");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_pair_is_replaced_only_when_both_could_be_written() {
        let d = dir("pair");
        let (a, b) = (d.join("tls.crt"), d.join("tls.key"));
        write_atomic_all(&[(&a, b"crt1", 0o644), (&b, b"key1", 0o600)]).unwrap();
        // The second file's dir does not exist: staging it fails before anything is renamed.
        let missing = d.join("nodir").join("tls.key");
        let e = write_atomic_all(&[(&a, b"crt2", 0o644), (&missing, b"key2", 0o600)]).unwrap_err();
        assert!(e.to_string().contains(&missing.display().to_string()), "{e}");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "the kind is kept");
        assert_eq!(std::fs::read(&a).unwrap(), b"crt1");
        assert_eq!(entries(&d), vec!["tls.crt", "tls.key"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
