use std::path::PathBuf;
use std::process::{Command, Output};

/// A binary of this workspace, found beside the running executable: a test's
/// (`target/<profile>/deps/<test>` → `target/<profile>/<name>`) or another binary's
/// (`flotilla-loadtest lab`). One way for every package: a crate's integration test can
/// `env!` only its own package's binaries.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let beside = dir.join(name);
    let path = if beside.exists() { beside } else { dir.parent().unwrap().join(name) };
    assert!(path.exists(), "{} not found: build the workspace's binaries first", path.display());
    path
}

/// A command of the `flotilla` binary.
pub fn flotilla() -> Command {
    Command::new(bin("flotilla"))
}

/// Runs `flotilla args` with `env`, and without the CA or token a developer's shell may
/// hold, so that what the test passes is all the command sees.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    flotilla()
        .args(args)
        .env_remove("FLOTILLA_CA")
        .env_remove("FLOTILLA_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Runs `cmd`, which must succeed; its stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}
