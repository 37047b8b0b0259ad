//! A shard as the Kubernetes StatefulSet runs it: its secrets a read-only mount
//! (`--secrets`), its data a writable volume (`--data`). It starts, takes an agent, and
//! writes its restart marker to the data dir only. A data dir it cannot write stops it
//! at once with an error naming the path.
//!
//! The read-only mount is real where the test may mount (as root: a private mount
//! namespace with `unshare -m`, a bind mount remounted read-only, gone with the
//! process). Where it may not, the test falls back to checking that the secrets dir is
//! byte-for-byte unchanged with nothing new in it, and says so on stderr.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flotilla_testkit::{Group, TempDir, bin, free_port, signal, wait_for};

use crate::health::{spawn_agent, wait_probes, write_secrets};

/// Every file of `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect()
}

/// The shell words that make `dir` read-only in a new mount namespace, then run "$@".
const RO_MOUNT: &str = r#"mount --bind "$RO" "$RO" && mount -o remount,bind,ro "$RO" && exec "$@""#;

/// `unshare -m sh -c RO_MOUNT sh ARGS...` with RO=`dir`: `args` run with `dir` read-only.
fn read_only(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", RO_MOUNT, "sh"]).args(args).env("RO", dir);
    cmd
}

/// Whether this process may make a dir read-only that way: the probe writes into it
/// and must be refused.
fn can_mount_read_only(dir: &Path) -> bool {
    let probe = dir.join(".probe");
    let out = read_only(dir, &["touch", probe.to_str().unwrap()]).stderr(Stdio::piped()).output();
    let refused = out.as_ref().is_ok_and(|o| String::from_utf8_lossy(&o.stderr).contains("Read-only file system"));
    let _ = std::fs::remove_file(&probe);
    refused
}

/// A process started outside [`Group`] (through `unshare`), killed with its group on drop.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        signal(-(self.0.id() as i32), libc::SIGKILL);
        let _ = self.0.wait();
    }
}

#[test]
fn a_shard_starts_with_read_only_secrets_and_writes_only_to_its_data_dir() {
    let dir = TempDir::new("ro-secrets");
    let secrets = dir.join("secrets");
    write_secrets(&secrets);
    let data = dir.join("data");
    let before = snapshot(&secrets);
    let mounted = can_mount_read_only(&secrets);
    if !mounted {
        eprintln!(
            "cannot mount here: the secrets dir is not made read-only; checking instead that it stays \
             byte-for-byte unchanged with nothing new in it"
        );
    }
    let (shard_addr, metrics) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let flotilla = bin("flotilla");
    let args = [
        flotilla.to_str().unwrap(),
        "aggregator",
        "--listen",
        &shard_addr,
        "--data",
        data.to_str().unwrap(),
        "--secrets",
        secrets.to_str().unwrap(),
        "--metrics",
        &metrics,
    ];
    let mut cmd = if mounted { read_only(&secrets, &args) } else { Command::new(args[0]) };
    if !mounted {
        cmd.args(&args[1..]);
    }
    let log = dir.join("shard.err");
    let shard = Started(
        cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).process_group(0).spawn().unwrap(),
    );
    let shard_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("the shard serves", Duration::from_secs(30), || {
        assert!(flotilla_testkit::alive(shard.0.id() as i32), "the shard exited:\n{}", shard_log());
        flotilla_testkit::get_text(&metrics, "/readyz")
    });
    // An agent registers with it.
    let mut procs = Group::new();
    let agent_metrics = spawn_agent(&mut procs, &shard_addr, &secrets, &dir);
    wait_probes("the agent registered with the shard", &agent_metrics, 200);
    let nodes = flotilla_testkit::metric(&flotilla_testkit::metrics_page(&metrics), "flotilla_nodes", "alive");
    assert!(nodes.is_none_or(|n| n >= 1.0), "{nodes:?}");
    // The marker is in the data dir; the secrets are as they were.
    assert!(data.join("shard-0-of-1.ran").is_file(), "no marker in {}", data.display());
    assert_eq!(snapshot(&secrets), before, "the secrets dir changed");
    drop(procs);
    drop(shard);
}

#[test]
fn a_data_dir_the_shard_cannot_write_stops_it_naming_the_path() {
    let dir = TempDir::new("ro-data");
    let secrets = dir.join("secrets");
    write_secrets(&secrets);
    let run = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{cmd:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let listen = format!("127.0.0.1:{}", free_port());
    let flotilla = bin("flotilla");
    let shard = |data: &Path| {
        vec![
            flotilla.display().to_string(),
            "aggregator".into(),
            "--listen".into(),
            listen.clone(),
            "--data".into(),
            data.display().to_string(),
            "--secrets".into(),
            secrets.display().to_string(),
        ]
    };
    // A data dir below a file cannot even be created.
    std::fs::write(dir.join("file"), "").unwrap();
    let below_file = dir.join("file").join("data");
    let args = shard(&below_file);
    let err = run(Command::new(&args[0]).args(&args[1..]));
    assert!(err.contains(&format!("creating the data dir {}", below_file.display())), "{err}");
    // A read-only data dir (the operator's first manifest: --data on the Secret mount).
    let read_only_data = dir.join("ro");
    std::fs::create_dir_all(&read_only_data).unwrap();
    if can_mount_read_only(&read_only_data) {
        let args = shard(&read_only_data);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = run(&mut read_only(&read_only_data, &args));
        let marker = read_only_data.join("shard-0-of-1.ran");
        assert!(err.contains(&format!("writing {}", marker.display())), "{err}");
        assert!(err.contains("Read-only file system"), "{err}");
    } else {
        eprintln!("cannot mount here: the read-only data dir case is not run");
    }
    // Secrets missing from --secrets are named, with what to do.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut args = shard(&dir.join("data"));
    let last = args.len() - 1;
    args[last] = empty.display().to_string();
    let err = run(Command::new(&args[0]).args(&args[1..]));
    assert!(err.contains(&empty.join("shard-secret").display().to_string()), "{err}");
    assert!(err.contains("tls.key") && err.contains("README"), "{err}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "nothing written to the secrets dir");
}
