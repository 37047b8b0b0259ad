//! The exec provider against small shell scripts.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use flotilla_core::Resources;
use flotilla_pool::provider::exec::{ExecConfig, ExecProvider};
use flotilla_pool::provider::{InstanceProvider, LaunchSpec, ProviderError};

type R = Result<(), Box<dyn std::error::Error>>;

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("flotilla-pool-exec-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::create_dir_all(&p);
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn provider(
    dir: &Dir,
    launch: &str,
    terminate: &str,
    list: &str,
    timeout: Duration,
) -> Result<ExecProvider, ProviderError> {
    ExecProvider::new(ExecConfig {
        launch: sh(launch),
        terminate: sh(terminate),
        list: sh(list),
        timeout,
        env: BTreeMap::from([("POOL".to_string(), dir.0.display().to_string())]),
    })
}

fn spec() -> LaunchSpec {
    LaunchSpec {
        id: "pool-gpu-12345678".into(),
        node_type: "gpu".into(),
        resources: Resources {
            cpu_millis: 4000,
            memory_bytes: 8 << 30,
            gpu: 2,
            custom: BTreeMap::from([("tpu".into(), 4), ("fpga".into(), 1)]),
        },
        labels: BTreeMap::from([("zone".into(), "z1".into()), ("team".into(), "ml infra".into())]),
        cordoned: false,
    }
}

#[tokio::test]
async fn the_protocol_round_trip() -> R {
    let dir = Dir::new("ok");
    // A toy cloud: one file per instance, named by id, holding its type.
    let p = provider(
        &dir,
        r#"cat > "$POOL/$FLOTILLA_INSTANCE_ID.stdin"
           printf '%s\n' "$FLOTILLA_NODE_TYPE" "$FLOTILLA_NODE_RESOURCES" "$FLOTILLA_NODE_LABELS" "$FLOTILLA_NODE_CPU_MILLIS" "$FLOTILLA_NODE_MEMORY_BYTES" "$FLOTILLA_NODE_GPU" "$FLOTILLA_NODE_RESOURCE_LINES" "$FLOTILLA_NODE_LABEL_LINES" > "$POOL/$FLOTILLA_INSTANCE_ID.env"
           echo "$FLOTILLA_NODE_TYPE" > "$POOL/$FLOTILLA_INSTANCE_ID.inst""#,
        r#"rm -f "$POOL/$FLOTILLA_INSTANCE_ID.inst""#,
        r#"printf '['; sep=''; for f in "$POOL"/*.inst; do [ -e "$f" ] || continue; id=$(basename "$f" .inst); printf '%s{"id":"%s","node_type":"%s","zone":"ignored"}' "$sep" "$id" "$(cat "$f")"; sep=,; done; printf ']'"#,
        Duration::from_secs(10),
    )?;
    assert!(p.list().await?.is_empty());
    p.launch(&spec()).await?;
    let listed = p.list().await?;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id.as_str(), listed[0].node_type.as_str()), ("pool-gpu-12345678", "gpu"));

    let stdin: LaunchSpec = serde_json::from_slice(&std::fs::read(dir.0.join("pool-gpu-12345678.stdin"))?)?;
    assert_eq!(stdin, spec());
    let env = std::fs::read_to_string(dir.0.join("pool-gpu-12345678.env"))?;
    let lines: Vec<&str> = env.lines().collect();
    assert_eq!(lines[0], "gpu");
    let resources: Resources = serde_json::from_str(lines[1])?;
    assert_eq!(resources, spec().resources);
    assert_eq!(serde_json::from_str::<BTreeMap<String, String>>(lines[2])?, spec().labels);
    assert_eq!(
        lines[3..],
        ["4000", &(8u64 << 30).to_string(), "2", "fpga=1", "tpu=4", "", "team=ml infra", "zone=z1", ""]
    );

    p.terminate("pool-gpu-12345678").await?;
    assert!(p.list().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_failing_command_is_an_error_naming_it() -> R {
    let dir = Dir::new("fail");
    let p = provider(&dir, "echo 'quota exceeded' >&2; exit 3", "exit 0", "echo '[]'", Duration::from_secs(10))?;
    let err = p.launch(&spec()).await.err().ok_or("launch should fail")?;
    let msg = err.to_string();
    assert!(matches!(err, ProviderError::Exit { .. }), "{err:?}");
    assert!(msg.contains("exit code 3") && msg.contains("quota exceeded") && msg.contains("sh -c"), "{msg}");
    Ok(())
}

#[tokio::test]
async fn a_hung_command_is_killed_at_the_timeout() -> R {
    let dir = Dir::new("timeout");
    let pidfile = dir.0.join("sleeper.pid");
    let p = provider(
        &dir,
        "exit 0",
        "exit 0",
        &format!("sleep 30 & echo $! > '{}'; wait", pidfile.display()),
        Duration::from_secs(1),
    )?;
    let t = Instant::now();
    let err = p.list().await.err().ok_or("list should time out")?;
    assert!(matches!(err, ProviderError::Timeout { .. }), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    // The whole group is gone: even the grandchild `sleep`.
    let pid = std::fs::read_to_string(&pidfile)?.trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Gone, or a zombie waiting for init (an empty cmdline): not running either way.
        let running = std::fs::read(format!("/proc/{pid}/cmdline")).map(|c| !c.is_empty()).unwrap_or(false);
        if !running {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("sleep {pid} still runs").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test]
async fn garbage_output_is_an_error() -> R {
    let dir = Dir::new("garbage");
    for out in ["not json", r#"{"id":"x"}"#, r#"[{"id":"x"}]"#, r#"[{"id":"../x","node_type":"cpu"}]"#, ""] {
        let p = provider(&dir, "exit 0", "exit 0", &format!("printf '%s' '{out}'"), Duration::from_secs(10))?;
        let err = p.list().await.err().ok_or("list should fail")?;
        assert!(matches!(err, ProviderError::BadOutput { .. }), "{out}: {err:?}");
    }
    Ok(())
}

#[tokio::test]
async fn oversized_output_is_an_error() -> R {
    let dir = Dir::new("big");
    // Endless output: refused as soon as it passes 1 MiB, not at the timeout.
    let p = provider(&dir, "exit 0", "exit 0", "yes '[1,2,3]'", Duration::from_secs(20))?;
    let t = Instant::now();
    let err = p.list().await.err().ok_or("list should fail")?;
    assert!(matches!(err, ProviderError::Oversized { .. }), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(10));
    Ok(())
}

#[tokio::test]
async fn bad_configs_and_programs() -> R {
    let dir = Dir::new("config");
    let empty = ExecProvider::new(ExecConfig {
        launch: vec![],
        terminate: sh("exit 0"),
        list: sh("exit 0"),
        timeout: Duration::from_secs(1),
        env: BTreeMap::new(),
    });
    assert!(matches!(empty, Err(ProviderError::Config(_))));
    let p = ExecProvider::new(ExecConfig {
        launch: vec!["/nonexistent/cloud-cli".into()],
        terminate: sh("exit 0"),
        list: sh("echo '[]'"),
        timeout: Duration::from_secs(1),
        env: BTreeMap::new(),
    })?;
    assert!(matches!(p.launch(&spec()).await, Err(ProviderError::Spawn { .. })));
    let mut bad = spec();
    bad.id = "a b".into();
    assert!(matches!(p.launch(&bad).await, Err(ProviderError::BadSpec { .. })));
    let mut bad = spec();
    bad.labels.insert("zone".into(), "z1\nevil=1".into());
    assert!(matches!(p.launch(&bad).await, Err(ProviderError::BadSpec { .. })));
    drop(dir);
    Ok(())
}

/// `examples/providers/local-exec.sh` through the exec provider, with a fake agent
/// binary (a shell script that keeps its arguments on its command line).
#[tokio::test]
async fn the_example_local_exec_script() -> R {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/providers/local-exec.sh");
    let have = |p: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have("bash") || !have("setsid") {
        eprintln!("skipped: needs bash and setsid");
        return Ok(());
    }
    let dir = Dir::new("example");
    let fake = dir.0.join("fake-agent");
    std::fs::write(&fake, "#!/bin/sh\ntrap 'exit 0' TERM\nsleep 300 &\nwait\n")?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let pool = dir.0.join("pool");
    let cmd = |op: &str| vec![script.display().to_string(), op.to_string()];
    let p = ExecProvider::new(ExecConfig {
        launch: cmd("launch"),
        terminate: cmd("terminate"),
        list: cmd("list"),
        timeout: Duration::from_secs(20),
        env: BTreeMap::from([
            ("FLOTILLA_POOL_DIR".to_string(), pool.display().to_string()),
            ("FLOTILLA_BIN".to_string(), fake.display().to_string()),
            ("FLOTILLA_AGGREGATORS".to_string(), "127.0.0.1:1".to_string()),
            ("FLOTILLA_PORT_BASE".to_string(), "37000".to_string()),
            ("FLOTILLA_STOP_GRACE".to_string(), "1".to_string()),
        ]),
    })?;
    let result = async {
        assert!(p.list().await?.is_empty());
        p.launch(&spec()).await?;
        p.launch(&spec()).await?; // idempotent
        let mut other = spec();
        other.id = "pool-gpu-87654321".into();
        p.launch(&other).await?;
        let listed = p.list().await?;
        assert_eq!(
            listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["pool-gpu-12345678", "pool-gpu-87654321"]
        );
        assert!(listed.iter().all(|c| c.node_type == "gpu"));

        let pid = std::fs::read_to_string(pool.join("pool-gpu-12345678.pid"))?.trim().to_string();
        let args: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))?
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        for want in [
            ["--node-id", "pool-gpu-12345678"],
            ["--cores", "4.000"],
            ["--gpus", "2"],
            ["--resource", "fpga=1"],
            ["--resource", "tpu=4"],
            ["--label", "team=ml infra"],
            ["--port-range", "37000-37049"],
        ] {
            assert!(args.windows(2).any(|w| w == want), "{want:?} in {args:?}");
        }

        for id in ["pool-gpu-12345678", "pool-gpu-87654321"] {
            p.terminate(id).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !p.list().await?.is_empty() {
            if Instant::now() > deadline {
                return Err::<(), Box<dyn std::error::Error>>("still listed after terminate".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
    .await;
    // Whatever happened, kill what the script started.
    if let Ok(entries) = std::fs::read_dir(&pool) {
        for e in entries.flatten() {
            if e.path().extension().and_then(|x| x.to_str()) == Some("pid")
                && let Some(pid) = std::fs::read_to_string(e.path()).ok().and_then(|s| s.trim().parse::<i32>().ok())
                && pid > 1
            {
                // SAFETY: kill(2) on the fake agent's own session/process group.
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                }
            }
        }
    }
    result
}
