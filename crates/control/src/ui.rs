//! The dashboard: `GET /` is its page, `GET /ui/{path}` its scripts, styles and vendored
//! libraries. Every file is embedded at build time from `crates/control/ui/` (see
//! `build.rs`), so the binary serves the page with nothing else installed and the page
//! loads nothing from outside the machine.

use crate::catalogue as m;
use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::{ControlError, ControlState};

mod files {
    include!(concat!(env!("OUT_DIR"), "/ui_files.rs"));
}

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new().route("/", get(index)).route("/ui/{*path}", get(file))
}

/// Names this build's dashboard files (a hash of them): `snapshot_begin` carries it, and
/// a page loaded from another build reloads itself. Its pages' modules are imported when
/// first shown, so after an upgrade an old page would otherwise import new modules.
pub const BUILD: &str = files::BUILD;

/// The embedded file at `path` (relative to `ui/`).
pub fn embedded(path: &str) -> Option<&'static [u8]> {
    files::FILES.iter().find(|(p, _)| *p == path).map(|(_, b)| *b)
}

/// The content type of a file by its extension; text without one (a `LICENSE`).
pub fn content_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e).filter(|e| !e.contains('/')).unwrap_or("");
    match ext.to_ascii_lowercase().as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "woff2" => "font/woff2",
        "md" => "text/markdown; charset=utf-8",
        "" | "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// What the page may load and who may frame it: its own scripts only (no inline ones),
/// and no other site's frame (clickjacking a drain or scale button).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// An embedded file with its type. `no-cache`: the browser revalidates, so a new build's
/// page is never mixed with an old build's script.
fn serve(path: &str) -> Response {
    match embedded(path) {
        Some(bytes) => {
            metrics::counter!(m::UI_REQUESTS.name).increment(1);
            (
                [
                    (header::CONTENT_TYPE, content_type(path)),
                    (header::CACHE_CONTROL, "no-cache"),
                    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
                    (header::X_FRAME_OPTIONS, "DENY"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    (header::REFERRER_POLICY, "no-referrer"),
                ],
                bytes,
            )
                .into_response()
        }
        None => ControlError::NoSuchEndpoint.into_response(),
    }
}

#[tracing::instrument(name = "ui_index")]
async fn index() -> Response {
    serve("index.html")
}

#[tracing::instrument(name = "ui_file")]
async fn file(Path(path): Path<String>) -> Response {
    serve(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_files_are_embedded_with_their_types() {
        for f in ["index.html", "app.js", "style.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css"] {
            assert!(embedded(f).is_some(), "{f} is embedded");
        }
        assert!(embedded("../Cargo.toml").is_none());
        assert_eq!(content_type("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type("vendor/uPlot.min.css"), "text/css; charset=utf-8");
        assert_eq!(content_type("vendor/LICENSE-uPlot"), "text/plain; charset=utf-8");
        assert_eq!(content_type("a.b/LICENSE"), "text/plain; charset=utf-8");
    }

    /// The modules `file` imports statically (`import … from './….js'`), as paths under `ui/`.
    fn static_imports(file: &str) -> Vec<String> {
        let text = std::str::from_utf8(embedded(file).unwrap()).unwrap();
        let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
        text.lines()
            .filter(|l| l.starts_with("import ") || l.starts_with("export "))
            .filter_map(|l| l.split(" from '").nth(1)?.split('\'').next())
            .map(|m| {
                let m = m.trim_start_matches("./");
                if dir.is_empty() { m.to_owned() } else { format!("{dir}/{m}") }
            })
            .collect()
    }

    /// `modules` and every module they import statically, directly or not.
    fn with_imports(mut modules: Vec<String>) -> Vec<String> {
        let mut i = 0;
        while i < modules.len() {
            assert!(embedded(&modules[i]).is_some(), "{} is imported but not under ui/", modules[i]);
            for m in static_imports(&modules[i]) {
                if !modules.contains(&m) {
                    modules.push(m);
                }
            }
            i += 1;
        }
        modules
    }

    /// The page opens its stream before it asks for anything else (boot.js, before the
    /// styles), and boot.js preloads exactly the modules app.js imports, directly or not:
    /// one it left out would be fetched only when its importer is parsed, a round trip
    /// later; one app.js does not import (another page's, imported when shown) would
    /// hold the first paint back.
    #[test]
    fn the_page_opens_its_stream_first_and_preloads_the_first_pages_modules() {
        let index = std::str::from_utf8(embedded("index.html").unwrap()).unwrap();
        let at = |s: &str| index.find(s).unwrap_or_else(|| panic!("{s} in index.html"));
        assert!(at(r#"<script src="/ui/boot.js">"#) < at(r#"<link rel="stylesheet""#));
        assert_eq!(index.matches("<script").count(), 1, "boot.js loads the other scripts");
        let boot = std::str::from_utf8(embedded("boot.js").unwrap()).unwrap();
        let listed = boot.split("const modules = [").nth(1).and_then(|s| s.split("];").next()).unwrap();
        let mut listed: Vec<String> =
            listed.split(',').map(|m| format!("js/{}.js", m.trim().trim_matches('\''))).collect();
        let app = std::str::from_utf8(embedded("app.js").unwrap()).unwrap();
        let mut reached = with_imports(static_imports("app.js"));
        listed.sort_unstable();
        reached.sort_unstable();
        assert_eq!(listed, reached, "boot.js preloads what app.js imports, and nothing else");
        // Every other module is imported by a page app.js imports when it is shown.
        let pages: Vec<String> =
            app.split("import('./").skip(1).filter_map(|s| s.split('\'').next()).map(str::to_owned).collect();
        assert!(!pages.is_empty(), "app.js imports the other pages when shown");
        let all = with_imports(pages.into_iter().chain(reached).collect());
        for (path, _) in files::FILES.iter().filter(|(p, _)| p.starts_with("js/")) {
            assert!(all.iter().any(|m| m == path), "{path}: neither preloaded nor imported by a page");
        }
    }
}
