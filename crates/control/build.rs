//! Embeds the dashboard (`ui/`): every file under it becomes an entry of a table
//! `(path, bytes)` in `$OUT_DIR/ui_files.rs`, so a file added there is served at
//! `/ui/<path>` with no code change. Cargo re-runs this when anything under `ui/` changes.

use std::path::{Path, PathBuf};

fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // Editors' and the OS's droppings are not part of the page.
        if name.starts_with('.') || name.ends_with('~') {
            continue;
        }
        if path.is_dir() {
            walk(&path, base, out)?;
        } else if let Ok(rel) = path.strip_prefix(base) {
            let rel: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            out.push((rel.join("/"), path.clone()));
        }
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(std::io::Error::other)?);
    let ui = manifest.join("ui");
    println!("cargo:rerun-if-changed=ui");
    let mut files = Vec::new();
    if ui.is_dir() {
        walk(&ui, &ui, &mut files)?;
    }
    files.sort();
    let mut code = String::from(
        "/// The dashboard's files: path under `ui/`, contents.\npub static FILES: &[(&str, &[u8])] = &[\n",
    );
    // FNV-1a over every path and its bytes: a page that sees another value after its
    // stream reconnects was loaded from another build, and reloads.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (rel, path) in &files {
        code.push_str(&format!("    ({rel:?}, include_bytes!({:?})),\n", path.display().to_string()));
        for b in rel.bytes().chain(std::iter::once(0)).chain(std::fs::read(path)?) {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    code.push_str("];\n");
    code.push_str(&format!("/// Names this build's dashboard files.\npub const BUILD: &str = \"{hash:016x}\";\n"));
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(std::io::Error::other)?);
    std::fs::write(out.join("ui_files.rs"), code)
}
