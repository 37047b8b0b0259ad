//! The README's examples are tests (issue #34 item 5). A shell block preceded by
//!
//! ```text
//! <!-- runnable: ARGS; expect: COMMAND => TEXT, … -->
//! ```
//!
//! runs here, line by line, against a real `flotilla up ARGS` (no cluster when ARGS is
//! empty): every line must exit 0, and each `COMMAND => TEXT` says that the output of the
//! `flotilla COMMAND…` lines contains TEXT. Lines run from a directory where `.flotilla` is
//! the cluster's data dir and `examples` the repository's, with `cargo run [-q] --release
//! --` and `flotilla` meaning the binary built for the tests, `$FLOTILLA_ADDR` the
//! cluster's API, and a line that starts `up` itself skipped (the harness started it).

use std::path::Path;
use std::process::Command;

use flotilla_testkit::{TempDir, Up, bin};

const DOCS: [&str; 2] = ["README.md", "examples/README.md"];

/// One runnable block: the `up` arguments, what to expect, the lines.
#[derive(Debug)]
struct Block {
    doc: &'static str,
    line: usize,
    up: Vec<String>,
    expect: Vec<(String, String)>,
    commands: Vec<String>,
}

fn blocks() -> Vec<Block> {
    let mut out = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(marker) = l.trim().strip_prefix("<!-- runnable:").and_then(|m| m.strip_suffix("-->")) else {
                continue;
            };
            assert!(
                lines.get(i + 1).is_some_and(|f| f.starts_with("```sh")),
                "{doc}:{}: a runnable block is ```sh",
                i + 1
            );
            let (args, expect) = marker.split_once("; expect:").unwrap_or((marker, ""));
            let expect = expect
                .split(", ")
                .filter(|e| !e.trim().is_empty())
                .map(|e| {
                    let (cmd, text) =
                        e.split_once("=>").unwrap_or_else(|| panic!("{doc}:{}: {e:?} is not CMD => TEXT", i + 1));
                    (cmd.trim().to_string(), text.trim().to_string())
                })
                .collect();
            // A line ending in `\` goes on in the next one.
            let mut commands: Vec<String> = Vec::new();
            let mut continued = false;
            for c in lines[i + 2..].iter().take_while(|c| !c.starts_with("```")) {
                match commands.last_mut() {
                    Some(last) if continued => last.push_str(c.trim_start()),
                    _ => commands.push(c.to_string()),
                }
                continued = c.ends_with('\\');
                if let Some(last) = commands.last_mut().filter(|_| continued) {
                    last.pop();
                    last.push(' ');
                }
            }
            let up = args.split_whitespace().map(String::from).collect();
            out.push(Block { doc, line: i + 1, up, expect, commands });
        }
    }
    out
}

/// A README line as the shell here runs it.
fn command_line(line: &str, addr: &str) -> Option<String> {
    let line = line.replace("cargo run -q --release --", "flotilla").replace("cargo run --release --", "flotilla");
    let line = line.replace("http://127.0.0.1:7700", addr);
    let code = line.split(" #").next().unwrap_or_default().trim().to_string();
    let starts_up = code.starts_with("flotilla up") || code.starts_with("bash .ci/run");
    (!code.is_empty() && !code.starts_with('#') && !starts_up).then_some(code)
}

fn run_block(b: &Block) {
    let where_ = format!("{}:{}", b.doc, b.line);
    let up = (!b.up.is_empty()).then(|| {
        let args: Vec<&str> = b.up.iter().map(String::as_str).skip_while(|a| *a == "up").collect();
        Up::start("readme", &args)
    });
    let cwd = TempDir::new("readme-cwd");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(repo.join("examples"), cwd.path().join("examples")).unwrap();
    if let Some(up) = &up {
        std::os::unix::fs::symlink(&up.data, cwd.path().join(".flotilla")).unwrap();
        // The nodes come up, and an app's units run: the block's first lines look at them.
        let wait = std::time::Duration::from_secs(60);
        // Every agent `up` starts (4 unless `--agents` says; with `--autoscale` the pool
        // starts them, so at least one): a block's lines may name any of them.
        let agents = b.up.windows(2).find(|w| w[0] == "--agents").and_then(|w| w[1].parse().ok());
        let agents = agents.unwrap_or(if b.up.iter().any(|a| a == "--autoscale") { 1 } else { 4 });
        flotilla_testkit::wait_for("every agent alive", wait, || {
            let nodes = up.nodes();
            (nodes.len() >= agents.max(1) && nodes.iter().all(|n| n["status"] == "alive")).then_some(())
        });
        // (Or fetching: an artifact the block's own lines push.)
        let fetching = |u: &serde_json::Value| {
            u["members"].as_array().is_some_and(|ms| ms.iter().any(|m| m["state"] == "fetching"))
        };
        flotilla_testkit::wait_for("every app's units running", wait, || {
            let (_, apps) = flotilla_testkit::http(&up.addr, "GET", "/v1/apps", None, "");
            apps.as_array()?
                .iter()
                .all(|a| {
                    let units = up.units(a["app"].as_str().unwrap_or_default());
                    !units.is_empty() && units.iter().all(|u| u["state"] == "running" || fetching(u))
                })
                .then_some(())
        });
    }
    let addr = up.as_ref().map_or("http://127.0.0.1:1".to_string(), |u| u.addr.clone());
    let path = format!("{}:{}", bin("flotilla").parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    for line in &b.commands {
        let Some(code) = command_line(line, &addr) else { continue };
        let out = Command::new("bash")
            .args(["-c", &code])
            .current_dir(cwd.path())
            .env("PATH", &path)
            .env("FLOTILLA_ADDR", &addr)
            .env("FLOTILLA_DATA", cwd.path().join(".flotilla"))
            .env_remove("FLOTILLA_TOKEN")
            .env_remove("FLOTILLA_CA")
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{where_}: `{code}` failed ({}):\n{stdout}\n{stderr}", out.status);
        let command = code.strip_prefix("flotilla ").unwrap_or_default();
        for (cmd, text) in b.expect.iter().filter(|(cmd, _)| command.starts_with(cmd.as_str())) {
            assert!(stdout.contains(text.as_str()), "{where_}: `{code}` ({cmd}) says {text:?}:\n{stdout}");
        }
    }
}

#[test]
fn every_runnable_readme_block_does_what_it_says() {
    let blocks = blocks();
    assert!(blocks.len() >= 4, "{blocks:?}");
    for b in &blocks {
        eprintln!("{}:{}: {} line(s), up {:?}", b.doc, b.line, b.commands.len(), b.up);
        run_block(b);
    }
}

#[test]
fn readme_lines_become_commands_here() {
    let addr = "http://127.0.0.1:4242";
    assert_eq!(
        command_line("cargo run --release -- nodes            # or: nodes --json", addr).as_deref(),
        Some("flotilla nodes")
    );
    assert_eq!(
        command_line("export FLOTILLA_ADDR=http://127.0.0.1:7700", addr).as_deref(),
        Some("export FLOTILLA_ADDR=http://127.0.0.1:4242")
    );
    assert_eq!(command_line("cargo run --release -- up --agents 6 --app examples/echo.toml", addr), None);
    assert_eq!(command_line("# a comment", addr), None);
    assert_eq!(
        command_line("curl -X PUT \"http://$(cargo run -q --release -- units e --json | jq -r .)/load\"", addr)
            .as_deref(),
        Some("curl -X PUT \"http://$(flotilla units e --json | jq -r .)/load\"")
    );
}
