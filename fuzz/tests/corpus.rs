//! Replays every committed seed (and any crash input saved under `artifacts/`) through
//! its target without libFuzzer: `cargo test --manifest-path fuzz/Cargo.toml`.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in [root.join("corpus").join(target), root.join("artifacts").join(target)] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            eprintln!("{}", path.display());
            run(&data);
            n += 1;
        }
    }
    assert!(n > 0, "no seeds for {target}");
}

#[test]
fn heartbeat() {
    replay("heartbeat", flotilla_fuzz::heartbeat);
}

#[test]
fn registration() {
    replay("registration", flotilla_fuzz::registration);
}

#[test]
fn commit_request() {
    replay("commit_request", flotilla_fuzz::commit_request);
}

#[test]
fn app_spec() {
    replay("app_spec", flotilla_fuzz::app_spec);
}

#[test]
fn control_json() {
    replay("control_json", flotilla_fuzz::control_json);
}

#[test]
fn autoscaling() {
    replay("autoscaling", flotilla_fuzz::autoscaling);
}

#[test]
fn pool() {
    replay("pool", flotilla_fuzz::pool);
}

#[test]
fn artifact_wire() {
    replay("artifact_wire", flotilla_fuzz::artifact_wire);
}
