//! `--wait` on the actions (`scale`, `apply`, `node drain`): poll the control plane
//! until the change is done, as `kubectl rollout status` and `nomad job run` do,
//! showing progress on stderr (so `--json` output on stdout stays one document): one
//! line updated in place on a terminal, else one line per change.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Args;

use super::http::{Refused, parse_duration};

/// How often the control plane is asked while waiting.
const POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Args)]
pub struct WaitArgs {
    /// Wait until the change is done, showing progress; exit non-zero if it is not done
    /// within --timeout.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: how long to wait (`30s`, `5m`).
    #[arg(long, default_value = "5m", value_parser = parse_duration, requires = "wait")]
    pub timeout: Duration,
}

/// Progress lines on stderr: rewritten in place on a terminal, one per change otherwise.
struct Progress {
    tty: bool,
    last: String,
}

impl Progress {
    fn show(&mut self, line: &str) {
        if line == self.last {
            return;
        }
        let mut err = std::io::stderr().lock();
        let _ = if self.tty { write!(err, "\r\x1b[2K{line}") } else { writeln!(err, "{line}") };
        let _ = err.flush();
        self.last = line.to_string();
    }

    /// Ends the progress line: kept (a newline) when things went wrong, cleared on a
    /// terminal when done, as the command then prints its result on stdout.
    fn finish(&mut self, keep: bool) {
        if self.tty && !self.last.is_empty() {
            if keep {
                eprintln!();
            } else {
                eprint!("\r\x1b[2K");
            }
        }
    }
}

/// Calls `check` until it says done (its last line is returned) or `timeout` passes
/// (an error naming the timeout, `what`, and where things stood). A refusal of the
/// control plane other than a server error ends the wait at once; an unreachable
/// control plane is asked again until the timeout.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<(bool, String)>>,
{
    let mut p = Progress { tty: std::io::stderr().is_terminal(), last: String::new() };
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok((true, line)) => {
                p.show(&line);
                p.finish(false);
                return Ok(line);
            }
            Ok((false, line)) => p.show(&line),
            Err(e) if e.downcast_ref::<Refused>().is_some_and(|r| !r.status.is_server_error()) => {
                p.finish(true);
                return Err(e.context(format!("waiting for {what}")));
            }
            Err(e) => p.show(&format!("{e:#} (retrying)")),
        }
        if Instant::now() >= deadline {
            p.finish(true);
            let secs = timeout.as_secs_f64();
            anyhow::bail!("timed out after {secs}s (--timeout) waiting for {what}; last seen: {}", p.last);
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())).max(Duration::from_millis(10)))
            .await;
    }
}
