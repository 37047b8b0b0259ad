//! The dashboard in real headless Chromium: `dashboard.py` (Playwright for Python, driving
//! Debian's Chromium) against a real `flotilla up`. `.ci/run` installs both; the
//! screenshots of each page land in `target/browser/`.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::process::Command;

#[test]
fn the_dashboard_in_headless_chromium() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::path::Path::new(root).join("target").join("browser");
    let flotilla = flotilla_testkit::bin("flotilla");
    let run = Command::new("python3")
        .arg(format!("{root}/tests/browser/dashboard.py"))
        .arg("--flotilla")
        .arg(&flotilla)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "the browser test failed ({}):\n{stdout}\n{stderr}\n(it needs Debian's chromium and `pip install playwright`: .ci/run installs both)",
        run.status
    );
    println!("{stdout}");
}
