//! Puts a fetched artifact where a member expects it, without copying: a hard link to
//! the cached file (same data dir, so the same file system), or a symlink to the shared
//! unpacked tree. Both are read-only, so one member cannot change another's copy.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where the artifact goes: `dest` under `cwd`; a `dest` ending in `/` is a directory,
/// holding the file as `name` (or, unpacked, being the tree itself).
pub fn place(
    cwd: &Path,
    dest: &str,
    name: &str,
    blob: &Path,
    tree: Option<&Path>,
    mode: u32,
) -> Result<PathBuf, String> {
    let dir_dest = dest.ends_with('/');
    let rel = dest.trim_end_matches('/');
    if rel.is_empty() || rel.starts_with('/') || rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(format!("dest {dest:?} does not stay in the member's directory"));
    }
    let target = match (tree, dir_dest) {
        (Some(_), _) | (None, false) => cwd.join(rel),
        (None, true) => cwd.join(rel).join(name),
    };
    let parent = target.parent().ok_or_else(|| format!("dest {dest:?} has no parent"))?;
    fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    // A restart finds the link it made before: replace it (never what it points at).
    if let Ok(meta) = fs::symlink_metadata(&target) {
        let gone = if meta.is_dir() { fs::remove_dir_all(&target) } else { fs::remove_file(&target) };
        gone.map_err(|e| format!("replacing {}: {e}", target.display()))?;
    }
    match tree {
        Some(tree) => std::os::unix::fs::symlink(tree, &target),
        None => {
            if mode & 0o111 != 0 {
                // The cached file is shared: execute bits asked for by any member stay on.
                let _ = fs::set_permissions(blob, fs::Permissions::from_mode(0o555));
            }
            fs::hard_link(blob, &target).or_else(|_| std::os::unix::fs::symlink(blob, &target))
        }
    }
    .map_err(|e| format!("placing {} at {}: {e}", blob.display(), target.display()))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_linked_read_only_and_a_restart_replaces_the_link() {
        let root = std::env::temp_dir().join(format!("flotilla-place-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (cwd, cache) = (root.join("member"), root.join("cache"));
        fs::create_dir_all(&cwd).unwrap();
        fs::create_dir_all(cache.join("tree")).unwrap();
        let blob = cache.join("blob");
        fs::write(&blob, b"weights").unwrap();
        fs::set_permissions(&blob, fs::Permissions::from_mode(0o444)).unwrap();

        let at = place(&cwd, "bin/run", "x", &blob, None, 0o755).unwrap();
        assert_eq!(fs::read(&at).unwrap(), b"weights");
        assert_eq!(fs::metadata(&at).unwrap().permissions().mode() & 0o777, 0o555);
        assert_eq!(place(&cwd, "bin/run", "x", &blob, None, 0o644).unwrap(), at, "placed again on a restart");
        assert_eq!(place(&cwd, "models/", "m.bin", &blob, None, 0o644).unwrap(), cwd.join("models/m.bin"));
        let tree = place(&cwd, "model/", "m.tar.gz", &blob, Some(&cache.join("tree")), 0o644).unwrap();
        assert_eq!(fs::read_link(&tree).unwrap(), cache.join("tree"));
        assert!(place(&cwd, "../escape", "x", &blob, None, 0o644).is_err());
        let _ = fs::set_permissions(&blob, fs::Permissions::from_mode(0o644));
        let _ = fs::remove_dir_all(&root);
    }
}
