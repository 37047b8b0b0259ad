//! A full disk under `up`'s data dir, for real: a 4 MiB tmpfs mounted over it in a
//! private mount namespace (`unshare -m`, held by a `sleep`; `up` joins it with
//! `nsenter`), filled by the test through `/proc/PID/root`. The mount goes away with
//! the namespace, whatever happens to the test. Where this process may not mount (not
//! root, no `unshare`), the tests say so on stderr and pass without checking anything.
//!
//! Running, a full disk costs logs, never agents, nodes or workloads; a change the
//! store cannot write answers 503 `store_unavailable`, `apps` says the store is failing,
//! and the scheduler recovers by itself once space returns (and what it accepted then
//! survives a restart). A first start on a full disk fails naming the path and leaves
//! no half-written file; the next start, with space, works.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flotilla_testkit::{TempDir, Up, alive, http, metric, metrics_page, signal, wait_for};
use serde_json::Value;

use crate::common::{ECHO, head_of, running};

/// A private mount namespace with a tmpfs of `size` over a dir, held open by a `sleep`
/// until dropped.
struct Tmpfs {
    holder: Child,
    /// The dir as the processes of the namespace see it.
    dir: PathBuf,
}

impl Tmpfs {
    /// `None` (after saying why on stderr) where mounting is not allowed.
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let script = r#"mount -t tmpfs -o "size=$SIZE" tmpfs "$DIR" && echo mounted && exec sleep 600"#;
        let mut holder = Command::new("unshare")
            .args(["-m", "sh", "-c", script])
            .env("DIR", dir)
            .env("SIZE", size)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .ok()?;
        let mut line = String::new();
        let stdout = holder.stdout.take()?;
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        if line.trim() != "mounted" {
            let _ = holder.kill();
            let out = holder.wait_with_output().ok();
            eprintln!(
                "skipped: cannot mount a tmpfs in a private mount namespace here ({}); \
                 the full-disk behaviour is not checked",
                out.map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string()).unwrap_or_default()
            );
            return None;
        }
        Some(Tmpfs { holder, dir: dir.to_path_buf() })
    }

    /// The dir as this process reaches it: through the holder's root.
    fn outside(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.holder.id())).join(self.dir.strip_prefix("/").unwrap())
    }

    /// `flotilla args` inside the namespace, its stdout and stderr in `log`.
    fn flotilla(&self, args: &[&str], log: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.args(["-t", &self.holder.id().to_string(), "-m", "--"])
            .arg(flotilla_testkit::bin("flotilla"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
            .stderr(std::fs::File::create(log).unwrap())
            .process_group(0);
        cmd
    }

    /// Fills the tmpfs to the last byte; the filler's path (outside).
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.outside().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        // Whatever a page does not hold, a byte at a time.
        while f.write_all(&[0]).is_ok() {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        signal(-(self.holder.id() as i32), libc::SIGKILL);
        let _ = self.holder.wait();
    }
}

/// A process started in the namespace, killed with its group on drop.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        signal(-(self.0.id() as i32), libc::SIGKILL);
        let _ = self.0.wait();
    }
}

/// `up --agents 2 --app echo.toml` inside the namespace, once its API's address is
/// written (a stale `control.addr` is removed first).
fn start_up(fs: &Tmpfs, log: &Path) -> (Started, Up) {
    let addr_file = fs.outside().join("control.addr");
    let _ = std::fs::remove_file(&addr_file);
    let data = fs.dir.to_str().unwrap();
    let args = [
        "up",
        "--listen",
        "127.0.0.1:0",
        "--data",
        data,
        "--agents",
        "2",
        "--app",
        ECHO,
        "--restart-agents",
        "--restart-delay",
        "1s",
    ];
    let child = Started(fs.flotilla(&args, log).spawn().unwrap());
    let pid = child.0.id() as i32;
    let addr = wait_for("up's control address", Duration::from_secs(30), || {
        assert!(alive(pid), "up exited:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        std::fs::read_to_string(&addr_file).ok()
    });
    (child, Up::attach(&fs.outside(), &addr))
}

fn apps(up: &Up) -> Value {
    let out = up.cli().args(["apps", "--json"]).output().unwrap();
    serde_json::from_slice::<Value>(&out.stdout).ok().and_then(|v| v.get(0).cloned()).unwrap_or(Value::Null)
}

/// The echo spec with a 60 KB environment variable: a store write that needs pages the
/// full disk cannot give (small writes may still fit in pages the store file holds).
fn big_spec() -> String {
    let spec = std::fs::read_to_string(ECHO).unwrap();
    spec.replacen("[unit.head]\n", &format!("[unit.head]\nenv = {{ BIG = \"{}\" }}\n", "x".repeat(60_000)), 1)
}

#[test]
fn a_full_disk_kills_nothing_and_the_scheduler_recovers_by_itself() {
    let dir = TempDir::new("full-disk");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let Some(fs) = Tmpfs::mount(&data, "4m") else { return };
    let log = dir.join("up.err");
    let (mut first, up) = start_up(&fs, &log);
    wait_for("two echo units running", Duration::from_secs(60), || (running(&up).len() == 2).then_some(()));
    let agents = up.agent_pids();
    assert_eq!(agents.len(), 2);

    let filler = fs.fill();
    // The agents' own logs, their workloads' logs and state files all sit on the full
    // disk now. Everything keeps running (the agents used to panic within 3 s).
    std::thread::sleep(Duration::from_secs(5));
    for pid in &agents {
        assert!(alive(*pid), "agent {pid} died of the full disk:\n{}", std::fs::read_to_string(&log).unwrap());
    }
    assert!(up.nodes().iter().all(|n| n["status"] == "alive"), "{:?}", up.nodes());
    assert_eq!(running(&up).len(), 2, "{:?}", up.units("echo"));
    // A workload that logs (the echo server logs each PUT /load) keeps answering; its
    // agent drops the lines and counts them (past what the log file's last page holds).
    let head = head_of(&running(&up)[0]);
    let (addr, node) = (head["address"].as_str().unwrap().to_string(), head["node_id"].as_str().unwrap().to_string());
    for _ in 0..100 {
        let (status, body) = http(&addr, "PUT", "/load?memory_mib=0", None, "");
        assert_eq!(status, 200, "the workload answers: {body}");
    }
    let agent_metrics = std::fs::read_to_string(up.agent_dir(&node).join("metrics.addr")).unwrap();
    wait_for("the agent counting dropped log bytes", Duration::from_secs(10), || {
        let page = metrics_page(agent_metrics.trim());
        metric(&page, "flotilla_agent_log_bytes_dropped_total", "").filter(|n| *n > 0.0)
    });

    // A change the store cannot write is refused, and says why; so is every change while
    // the store is being reopened (2 s after a failure, a reopen may succeed: small
    // writes fit in pages the file holds, so each check follows a fresh refusal, and
    // is tried again if a reopen came in between).
    let token = up.token();
    let refuse_big_spec = || {
        let auth = format!("Authorization: Bearer {token}\r\n");
        let r = flotilla_testkit::request(&up.addr, "PUT", "/v1/apps/echo/spec", &auth, &big_spec());
        assert_eq!((r.status, &r.json["error"]["code"]), (503, &Value::from("store_unavailable")), "{:?}", r.json);
    };
    let while_failing = |what: &str, check: &dyn Fn() -> bool| {
        let ok = (0..5).any(|_| {
            refuse_big_spec();
            check()
        });
        assert!(ok, "{what}");
    };
    // Scaling to the current count: a refusal changes nothing, an acceptance neither.
    while_failing("scale answers 503 store_unavailable", &|| {
        let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units":2}"#);
        (status, &body["error"]["code"]) == (503, &Value::from("store_unavailable"))
    });
    while_failing("apps --json says the store is failing", &|| {
        let summary = apps(&up);
        assert_eq!(summary["desired_units"], 2, "nothing changed");
        summary["store"]["healthy"] == false
            && summary["store"]["error"].as_str().is_some_and(|e| e.contains("No space left on device"))
    });
    while_failing("apps says the store is failing", &|| {
        String::from_utf8(up.cli().arg("apps").output().unwrap().stdout).unwrap().contains("echo: store failing")
    });
    let page = metrics_page(&up.addr);
    assert!(metric(&page, "flotilla_store_errors_total", "op=\"write\"").is_some_and(|n| n >= 1.0), "{page}");

    // An agent that dies now is restarted although its pid file cannot be written (up
    // used to lose track of it for good); the pid file follows once space returns.
    let lost = agents[1];
    signal(lost, libc::SIGKILL);
    std::thread::sleep(Duration::from_secs(3)); // past --restart-delay, the disk still full

    // Space returns: the scheduler reopens its store by itself and takes changes again.
    std::fs::remove_file(&filler).unwrap();
    let back = wait_for("the killed agent restarted and its pid file written", Duration::from_secs(30), || {
        up.agent_pids().into_iter().find(|p| *p != agents[0] && *p != lost && alive(*p))
    });
    wait_for("both nodes alive", Duration::from_secs(30), || {
        let nodes = up.nodes();
        (nodes.len() == 2 && nodes.iter().all(|n| n["status"] == "alive")).then_some(())
    });
    wait_for("the store healthy again", Duration::from_secs(30), || {
        (apps(&up)["store"]["healthy"] == true).then_some(())
    });
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units":3}"#);
    assert_eq!(status, 200, "{body}");
    wait_for("three echo units running", Duration::from_secs(60), || (running(&up).len() == 3).then_some(()));
    let page = metrics_page(&up.addr);
    assert!(metric(&page, "flotilla_store_reopens_total", "result=\"ok\"").is_some_and(|n| n >= 1.0), "{page}");
    assert_eq!(metric(&page, "flotilla_store_healthy", ""), Some(1.0), "{page}");
    for pid in [agents[0], back] {
        assert!(alive(pid), "agent {pid} died");
    }

    // What was accepted after the recovery is on disk: a restart keeps it.
    signal(first.0.id() as i32, libc::SIGTERM);
    wait_for("up stopped", Duration::from_secs(30), || first.0.try_wait().ok().flatten());
    drop(first);
    let (_second, up) = start_up(&fs, &dir.join("up2.err"));
    wait_for("the scheduler answers", Duration::from_secs(30), || apps(&up).get("desired_units").cloned());
    assert_eq!(apps(&up)["desired_units"], 3, "the scale survived the restart");
    drop(up);
}

#[test]
fn a_first_start_on_a_full_disk_names_the_path_and_leaves_nothing_half_written() {
    let dir = TempDir::new("full-first-start");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let Some(fs) = Tmpfs::mount(&data, "2m") else { return };
    let filler = fs.fill();
    let log = dir.join("up.err");
    let data_arg = fs.dir.to_str().unwrap();
    let args = ["up", "--listen", "127.0.0.1:0", "--data", data_arg, "--agents", "0"];
    let mut failed = Started(fs.flotilla(&args, &log).spawn().unwrap());
    let exit = wait_for("up to give up", Duration::from_secs(30), || failed.0.try_wait().ok().flatten());
    assert!(!exit.success());
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("No space left on device") && err.contains(data_arg), "the error names the path:\n{err}");
    // Nothing half-written: every file there holds something, no temp file is left.
    for e in std::fs::read_dir(fs.outside()).unwrap().flatten() {
        let (name, meta) = (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap());
        assert!(!name.starts_with('.'), "a temp file is left: {name}");
        assert!(!meta.is_file() || meta.len() > 0 || name == "filler", "{name} is empty");
    }

    // Space returns: the next start works (no `tls.key holds no private key`).
    std::fs::remove_file(&filler).unwrap();
    let (mut up_proc, up) = start_up(&fs, &dir.join("up2.err"));
    wait_for("the control API answers", Duration::from_secs(30), || flotilla_testkit::get_text(&up.addr, "/healthz"));
    signal(up_proc.0.id() as i32, libc::SIGTERM);
    wait_for("up stopped", Duration::from_secs(30), || up_proc.0.try_wait().ok().flatten());

    // What an older version left on a full disk: the certificate, an empty key. It is
    // regenerated (nothing can use a certificate without its key) and `up` starts.
    std::fs::write(fs.outside().join("tls.key"), b"").unwrap();
    let log3 = dir.join("up3.err");
    let (_third, up) = start_up(&fs, &log3);
    wait_for("the control API answers again", Duration::from_secs(30), || {
        flotilla_testkit::get_text(&up.addr, "/healthz")
    });
    let err = std::fs::read_to_string(&log3).unwrap();
    assert!(err.contains("the TLS pair is incomplete"), "{err}");
    assert!(std::fs::metadata(fs.outside().join("tls.key")).unwrap().len() > 0);
}
