//! The exec provider: instances are managed by user commands, so any cloud CLI or
//! Kubernetes node-group tool can back a pool. `docs/exec-provider.md` is the user-facing
//! version of this protocol; `examples/providers/local-exec.sh` implements it.
//!
//! Each operation runs one configured command (argv, no shell), in its own process
//! group, with the configured extra environment:
//!
//! - **launch** gets `FLOTILLA_INSTANCE_ID`, `FLOTILLA_NODE_TYPE`,
//!   `FLOTILLA_NODE_RESOURCES` (JSON, Flotilla's resource form:
//!   `{"cpu_millis":4000,"memory_bytes":8589934592,"gpu":0,"my_res":2}`),
//!   `FLOTILLA_NODE_LABELS` (JSON object), and for scripts without a JSON parser
//!   `FLOTILLA_NODE_CPU_MILLIS`, `FLOTILLA_NODE_MEMORY_BYTES`, `FLOTILLA_NODE_GPU`,
//!   `FLOTILLA_NODE_RESOURCE_LINES` (the custom resources, one `name=quantity` a line)
//!   and `FLOTILLA_NODE_LABEL_LINES` (one `key=value` a line; control characters in
//!   labels are refused, so a line is a label).
//!   Its stdin is the whole [`LaunchSpec`] as one JSON object
//!   (`{"id","node_type","resources","labels"}`). Exit 0 means the launch was accepted;
//!   the node must register with the instance id as its node id (`--node-id`), and the
//!   instance must be tagged with the id so `list` reports it. Launching an id that
//!   exists must succeed without launching another.
//! - **terminate** gets `FLOTILLA_INSTANCE_ID`; exit 0 means accepted. An unknown id must
//!   succeed (it is already gone).
//! - **list** prints on stdout a JSON array of every instance that exists:
//!   `[{"id": "...", "node_type": "..."}]` (other fields are ignored).
//!
//! A non-zero exit, no exit within the timeout (the whole process group is then
//! killed), more than 1 MiB on stdout, or output that is not that JSON is a
//! [`ProviderError`] naming the command and what was wrong. stderr is kept (its first
//! 4 KiB) for the error message.

use std::collections::BTreeMap;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{BoxFuture, CloudInstance, InstanceProvider, LaunchSpec, ProviderError, check_id, observed};

/// The most a command may print on stdout.
pub const MAX_OUTPUT: usize = 1 << 20;
/// How much of stderr an error message quotes.
const MAX_STDERR: usize = 4096;

#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// argv of the launch command.
    pub launch: Vec<String>,
    /// argv of the terminate command.
    pub terminate: Vec<String>,
    /// argv of the list command.
    pub list: Vec<String>,
    /// How long one command may run before its process group is killed.
    pub timeout: Duration,
    /// Extra environment for every command (credentials stay in the caller's env).
    pub env: BTreeMap<String, String>,
}

pub struct ExecProvider {
    config: ExecConfig,
}

impl ExecProvider {
    /// Refuses a config with an empty command.
    pub fn new(config: ExecConfig) -> Result<Self, ProviderError> {
        for (op, argv) in [("launch", &config.launch), ("terminate", &config.terminate), ("list", &config.list)] {
            if argv.first().is_none_or(|p| p.is_empty()) {
                return Err(ProviderError::Config(format!("the {op} command is empty")));
            }
        }
        if config.timeout.is_zero() {
            return Err(ProviderError::Config("the command timeout is zero".into()));
        }
        Ok(ExecProvider { config })
    }

    /// Runs `argv` with `env` and `stdin`, returning its stdout when it exits 0.
    async fn run(
        &self,
        argv: &[String],
        env: &[(&str, String)],
        stdin: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, ProviderError> {
        let command = argv.join(" ");
        let Some((program, args)) = argv.split_first() else {
            return Err(ProviderError::Config("empty command".into()));
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(&self.config.env)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| ProviderError::Spawn { command: command.clone(), source })?;
        let pgid = child.id().map(|p| p as i32);
        let mut input = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();

        let work = async {
            let write = async {
                if let (Some(w), Some(data)) = (input.as_mut(), stdin.as_ref()) {
                    // A command that does not read its stdin closes the pipe: not an error.
                    let _ = w.write_all(data).await;
                }
                drop(input.take());
            };
            let (_, out, err) = tokio::join!(write, read_capped(stdout, MAX_OUTPUT), read_capped(stderr, MAX_STDERR));
            (out, err)
        };
        let outcome = tokio::time::timeout(self.config.timeout, async {
            let ((out, oversized), (err, _)) = work.await;
            if oversized {
                // Stop now rather than wait for the rest.
                return Ok(Ended::Oversized);
            }
            let status = child.wait().await?;
            Ok::<_, std::io::Error>(Ended::Exited { status, out, err })
        })
        .await;
        let result = match outcome {
            // Still unreaped here, so its pid (the group id) cannot have been reused.
            Err(_) => {
                kill_group(pgid);
                Err(ProviderError::Timeout { command: command.clone(), after: self.config.timeout })
            }
            Ok(Err(source)) => {
                kill_group(pgid);
                Err(ProviderError::Io { what: format!("{command}: waiting for it"), source })
            }
            Ok(Ok(Ended::Oversized)) => {
                kill_group(pgid);
                Err(ProviderError::Oversized { command: command.clone(), limit: MAX_OUTPUT })
            }
            Ok(Ok(Ended::Exited { status, out, .. })) if status.success() => Ok(out),
            Ok(Ok(Ended::Exited { status, err, .. })) => {
                Err(ProviderError::Exit { command: command.clone(), status: describe(status), stderr: tidy(&err) })
            }
        };
        // Reap it, bounded so a stuck reap cannot hang the caller.
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        result
    }
}

enum Ended {
    Oversized,
    Exited { status: ExitStatus, out: Vec<u8>, err: Vec<u8> },
}

fn kill_group(pgid: Option<i32>) {
    if let Some(pid) = pgid.filter(|p| *p > 1) {
        // SAFETY: kill(2) on the command's own process group (process_group(0)).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => status.to_string(),
    }
}

fn tidy(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr).trim().to_string()
}

fn to_json<T: serde::Serialize + ?Sized>(id: &str, v: &T) -> Result<String, ProviderError> {
    serde_json::to_string(v).map_err(|e| ProviderError::BadSpec { id: id.to_string(), detail: e.to_string() })
}

/// Reads up to `cap` bytes; returns them and whether there was more. On overflow it stops
/// reading (the caller kills the writer).
async fn read_capped(r: Option<impl AsyncRead + Unpin>, cap: usize) -> (Vec<u8>, bool) {
    let Some(r) = r else { return (Vec::new(), false) };
    let mut buf = Vec::new();
    let mut limited = r.take(cap as u64 + 1);
    let _ = limited.read_to_end(&mut buf).await;
    if buf.len() > cap {
        buf.truncate(cap);
        (buf, true)
    } else {
        (buf, false)
    }
}

/// `list`'s output: a JSON array of objects with at least `id` and `node_type`.
pub fn parse_list(command: &str, out: &[u8]) -> Result<Vec<CloudInstance>, ProviderError> {
    let bad = |detail: String| ProviderError::BadOutput { command: command.to_string(), detail };
    let items: Vec<CloudInstance> =
        serde_json::from_slice(out).map_err(|e| bad(format!("expected [{{\"id\": ..., \"node_type\": ...}}]: {e}")))?;
    for i in &items {
        check_id(&i.id).map_err(|_| bad(format!("instance id {:?} is not a node id", i.id)))?;
    }
    Ok(items)
}

impl InstanceProvider for ExecProvider {
    fn name(&self) -> &'static str {
        "exec"
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<CloudInstance>, ProviderError>> {
        Box::pin(observed("exec", "list", None, async move {
            let out = self.run(&self.config.list, &[], None).await?;
            parse_list(&self.config.list.join(" "), &out)
        }))
    }

    fn launch<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(observed("exec", "launch", Some(&spec.id), async move {
            check_id(&spec.id)?;
            let lines = |pairs: Vec<(&str, String)>| -> Result<String, ProviderError> {
                let mut out = String::new();
                for (k, v) in pairs {
                    if k.contains('=') || k.chars().chain(v.chars()).any(char::is_control) {
                        return Err(ProviderError::BadSpec {
                            id: spec.id.clone(),
                            detail: format!("{k:?}: '=' in a name or a control character"),
                        });
                    }
                    out.push_str(&format!("{k}={v}\n"));
                }
                Ok(out)
            };
            let resource_lines =
                lines(spec.resources.custom.iter().map(|(k, v)| (k.as_str(), v.to_string())).collect())?;
            let label_lines = lines(spec.labels.iter().map(|(k, v)| (k.as_str(), v.clone())).collect())?;
            let env = [
                ("FLOTILLA_INSTANCE_ID", spec.id.clone()),
                ("FLOTILLA_NODE_TYPE", spec.node_type.clone()),
                ("FLOTILLA_NODE_RESOURCES", to_json(&spec.id, &spec.resources)?),
                ("FLOTILLA_NODE_LABELS", to_json(&spec.id, &spec.labels)?),
                ("FLOTILLA_NODE_CPU_MILLIS", spec.resources.cpu_millis.to_string()),
                ("FLOTILLA_NODE_MEMORY_BYTES", spec.resources.memory_bytes.to_string()),
                ("FLOTILLA_NODE_GPU", spec.resources.gpu.to_string()),
                ("FLOTILLA_NODE_RESOURCE_LINES", resource_lines),
                ("FLOTILLA_NODE_LABEL_LINES", label_lines),
                // "true" for a warm pool's instance: its agent registers `--cordoned`.
                ("FLOTILLA_NODE_CORDONED", spec.cordoned.to_string()),
            ];
            let stdin = to_json(&spec.id, spec)?.into_bytes();
            self.run(&self.config.launch, &env, Some(stdin)).await.map(drop)
        }))
    }

    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(observed("exec", "terminate", Some(id), async move {
            check_id(id)?;
            self.run(&self.config.terminate, &[("FLOTILLA_INSTANCE_ID", id.to_string())], None).await.map(drop)
        }))
    }
}
