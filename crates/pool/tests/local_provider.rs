//! The local provider against real processes: `sh` stands in for `flotilla agent` (it
//! keeps the agent flags on its command line, as the agent would).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flotilla_core::Resources;
use flotilla_pool::provider::local::{LocalConfig, LocalProvider};
use flotilla_pool::provider::{InstanceProvider, LaunchSpec};

type R = Result<(), Box<dyn std::error::Error>>;

/// A temp dir whose agents are killed (and files removed) when the test ends, pass or fail.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("flotilla-pool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::create_dir_all(&p);
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.0) {
            for e in entries.flatten() {
                let path = e.path();
                if path.extension().and_then(|x| x.to_str()) == Some("pid")
                    && let Some(pid) = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<i32>().ok())
                    && let Some(id) = path.file_stem().and_then(|s| s.to_str())
                    && runs_with(pid, id)
                {
                    // SAFETY: kill(2) on the test agent's own process group.
                    unsafe {
                        libc::kill(-pid, libc::SIGKILL);
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn runs_with(pid: i32, arg: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        .unwrap_or(false)
}

fn config(dir: &Path, port_base: u16) -> LocalConfig {
    LocalConfig {
        program: "sh".into(),
        // `sh -c SCRIPT agent --node-id ID ...`: the script sleeps (not as its last
        // command, so sh stays and keeps the flags on its command line).
        args_before: vec!["-c".into(), "sleep 300; :".into(), "agent".into()],
        dir: dir.to_path_buf(),
        port_base,
        tied_to_parent: true,
        stop_grace: Duration::from_secs(2),
        boot_delay: Duration::ZERO,
    }
}

fn spec(id: &str) -> LaunchSpec {
    LaunchSpec {
        id: id.into(),
        node_type: "cpu".into(),
        resources: Resources {
            cpu_millis: 2500,
            memory_bytes: 1 << 30,
            gpu: 1,
            custom: BTreeMap::from([("tpu".into(), 2)]),
        },
        labels: BTreeMap::from([("zone".into(), "z1".into())]),
        cordoned: false,
    }
}

fn pid_of(dir: &Path, id: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("{id}.pid"))).ok()?.trim().parse().ok()
}

fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
        .unwrap_or_default()
}

fn flag(args: &[String], name: &str) -> Vec<String> {
    args.windows(2).filter(|w| w[0] == name).map(|w| w[1].clone()).collect()
}

async fn ids(p: &LocalProvider) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    Ok(p.list().await?.into_iter().map(|c| c.id).collect())
}

async fn wait_listed(p: &LocalProvider, want: &[&str]) -> R {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = ids(p).await?;
        if got == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("listed {got:?}, want {want:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn launch_list_terminate() -> R {
    let dir = Dir::new("local-cycle");
    let p = LocalProvider::new(config(&dir.0, 31_000));
    p.launch(&spec("pool-cpu-00000001")).await?;
    assert_eq!(p.list().await?[0].node_type, "cpu");
    wait_listed(&p, &["pool-cpu-00000001"]).await?;

    let pid = pid_of(&dir.0, "pool-cpu-00000001").ok_or("no pid file")?;
    let args = cmdline(pid);
    assert_eq!(flag(&args, "--node-id"), ["pool-cpu-00000001"]);
    assert_eq!(flag(&args, "--cores"), ["2.500"]);
    assert_eq!(flag(&args, "--memory"), [(1u64 << 30).to_string()]);
    assert_eq!(flag(&args, "--gpus"), ["1"]);
    assert_eq!(flag(&args, "--resource"), ["tpu=2"]);
    assert_eq!(flag(&args, "--label"), ["zone=z1"]);
    assert_eq!(flag(&args, "--port-range"), ["31000-31049"]);
    assert_eq!(flag(&args, "--data"), [dir.0.join("pool-cpu-00000001").display().to_string()]);

    // The id is the idempotency key: a second launch starts nothing.
    p.launch(&spec("pool-cpu-00000001")).await?;
    assert_eq!(pid_of(&dir.0, "pool-cpu-00000001"), Some(pid));

    p.terminate("pool-cpu-00000001").await?;
    wait_listed(&p, &[]).await?;
    assert!(!runs_with(pid, "pool-cpu-00000001"), "the process is gone");
    assert!(!dir.0.join("pool-cpu-00000001.json").exists(), "its slot is freed");
    // Terminating what is gone is fine.
    p.terminate("pool-cpu-00000001").await?;
    Ok(())
}

/// `boot_delay` plays a VM's boot: the instance is listed from its launch (a booting
/// VM is), its agent runs only after the delay, as the same process, flagged
/// `--cordoned` for a warm pool.
#[tokio::test]
async fn a_boot_delay_lists_the_instance_at_once_and_starts_its_agent_later() -> R {
    let dir = Dir::new("local-boot");
    let p = LocalProvider::new(LocalConfig { boot_delay: Duration::from_millis(1500), ..config(&dir.0, 31_300) });
    let warm = LaunchSpec { cordoned: true, ..spec("pool-cpu-0000b007") };
    p.launch(&warm).await?;
    wait_listed(&p, &["pool-cpu-0000b007"]).await?;
    let pid = pid_of(&dir.0, "pool-cpu-0000b007").ok_or("no pid file")?;
    assert!(cmdline(pid).iter().any(|a| a == "sleep \"$0\" && exec \"$@\""), "booting: {:?}", cmdline(pid));
    let started = Instant::now();
    // Booted: `sh -c SCRIPT 1.500 sh -c 'sleep 300; :' agent …` became `sh -c 'sleep 300; :' agent …`.
    while cmdline(pid).get(2).map(String::as_str) != Some("sleep 300; :") {
        assert!(started.elapsed() < Duration::from_secs(10), "never booted: {:?}", cmdline(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(flag(&cmdline(pid), "--node-id"), ["pool-cpu-0000b007"], "the same process became the agent");
    assert!(cmdline(pid).iter().any(|a| a == "--cordoned"));
    assert_eq!(ids(&p).await?, ["pool-cpu-0000b007"]);
    p.terminate("pool-cpu-0000b007").await?;
    wait_listed(&p, &[]).await?;
    Ok(())
}

#[tokio::test]
async fn a_restarted_provider_finds_its_agents() -> R {
    let dir = Dir::new("local-restart");
    {
        let first = LocalProvider::new(config(&dir.0, 32_000));
        first.launch(&spec("pool-cpu-0000000a")).await?;
    }
    let second = LocalProvider::new(config(&dir.0, 32_000));
    wait_listed(&second, &["pool-cpu-0000000a"]).await?;
    second.terminate("pool-cpu-0000000a").await?;
    wait_listed(&second, &[]).await?;
    Ok(())
}

#[tokio::test]
async fn an_agent_whose_pid_file_was_never_written_is_found_by_its_id() -> R {
    // An autoscaler killed between starting an agent and writing its pid file.
    let dir = Dir::new("local-no-pid");
    let p = LocalProvider::new(config(&dir.0, 34_000));
    p.launch(&spec("pool-cpu-0000000c")).await?;
    let pid = std::fs::read_to_string(dir.0.join("pool-cpu-0000000c.pid"))?;
    std::fs::remove_file(dir.0.join("pool-cpu-0000000c.pid"))?;
    let restarted = LocalProvider::new(config(&dir.0, 34_000));
    wait_listed(&restarted, &["pool-cpu-0000000c"]).await?;
    assert_eq!(std::fs::read_to_string(dir.0.join("pool-cpu-0000000c.pid"))?, pid, "the pid is recorded again");
    // Launching it again is a no-op, not a second agent.
    restarted.launch(&spec("pool-cpu-0000000c")).await?;
    assert_eq!(std::fs::read_to_string(dir.0.join("pool-cpu-0000000c.pid"))?, pid);
    restarted.terminate("pool-cpu-0000000c").await?;
    wait_listed(&restarted, &[]).await?;
    Ok(())
}

#[tokio::test]
async fn a_reused_pid_is_not_an_agent() -> R {
    let dir = Dir::new("local-pid-reuse");
    // A record whose pid is alive but is some other process (this test).
    std::fs::write(dir.0.join("pool-cpu-0000dead.json"), r#"{"id":"pool-cpu-0000dead","node_type":"cpu","slot":0}"#)?;
    std::fs::write(dir.0.join("pool-cpu-0000dead.pid"), std::process::id().to_string())?;
    // And garbage, which is skipped.
    std::fs::write(dir.0.join("junk.json"), "{")?;
    let p = LocalProvider::new(config(&dir.0, 33_000));
    assert!(ids(&p).await?.is_empty());
    assert!(!dir.0.join("pool-cpu-0000dead.pid").exists(), "the stale record is forgotten");
    // Terminating it must not signal this process.
    p.terminate("pool-cpu-0000dead").await?;
    Ok(())
}

#[tokio::test]
async fn port_slots_are_distinct_and_reused() -> R {
    let dir = Dir::new("local-slots");
    let p = LocalProvider::new(config(&dir.0, 34_000));
    for id in ["pool-cpu-00000001", "pool-cpu-00000002"] {
        p.launch(&spec(id)).await?;
    }
    let range = |id: &str| pid_of(&dir.0, id).map(|pid| flag(&cmdline(pid), "--port-range")).unwrap_or_default();
    assert_eq!(range("pool-cpu-00000001"), ["34000-34049"]);
    assert_eq!(range("pool-cpu-00000002"), ["34050-34099"]);
    p.terminate("pool-cpu-00000001").await?;
    wait_listed(&p, &["pool-cpu-00000002"]).await?;
    p.launch(&spec("pool-cpu-00000003")).await?;
    assert_eq!(range("pool-cpu-00000003"), ["34000-34049"], "the freed slot is reused");
    for id in ["pool-cpu-00000002", "pool-cpu-00000003"] {
        p.terminate(id).await?;
    }
    wait_listed(&p, &[]).await?;
    Ok(())
}

#[tokio::test]
async fn a_stubborn_agent_is_killed_after_the_grace() -> R {
    let dir = Dir::new("local-stubborn");
    let mut c = config(&dir.0, 35_000);
    c.args_before = vec!["-c".into(), "trap '' TERM; echo ready; while :; do sleep 1; done".into(), "agent".into()];
    c.stop_grace = Duration::from_millis(500);
    let p = LocalProvider::new(c);
    p.launch(&spec("pool-cpu-0000000b")).await?;
    wait_listed(&p, &["pool-cpu-0000000b"]).await?;
    // Its trap is set once it says so in its log.
    let log = dir.0.join("pool-cpu-0000000b.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("ready") {
        if Instant::now() > deadline {
            return Err("the stubborn agent never got ready".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = Instant::now();
    p.terminate("pool-cpu-0000000b").await?;
    assert!(t.elapsed() < Duration::from_millis(400), "terminate does not wait for the grace");
    wait_listed(&p, &[]).await?;
    assert!(t.elapsed() >= Duration::from_millis(450), "it ignored SIGTERM until the SIGKILL: {:?}", t.elapsed());
    Ok(())
}

#[tokio::test]
async fn bad_specs_are_refused() -> R {
    let dir = Dir::new("local-bad");
    let p = LocalProvider::new(config(&dir.0, 36_000));
    assert!(p.launch(&spec("../escape")).await.is_err());
    let mut s = spec("pool-cpu-0000000c");
    s.resources.cpu_millis = 0;
    assert!(p.launch(&s).await.is_err());
    let mut c = config(&dir.0, 65_500);
    c.program = "/nonexistent/flotilla".into();
    let p = LocalProvider::new(c);
    assert!(p.launch(&spec("pool-cpu-0000000d")).await.is_err(), "ports past 65535");
    let mut c = config(&dir.0, 36_000);
    c.program = "/nonexistent/flotilla".into();
    let p = LocalProvider::new(c);
    assert!(p.launch(&spec("pool-cpu-0000000e")).await.is_err(), "no such program");
    assert!(ids(&p).await?.is_empty());
    Ok(())
}
