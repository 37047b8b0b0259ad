//! Members' output on disk, and read back for `flotilla logs`.
//!
//! Each stream (stdout, stderr) of a member is a [`LogFile`]: every line is written to
//! `DIR/stdout.log` as `RFC3339 text` (as the kubelet's CRI log files do, so `--since`
//! needs no guessing), and the file is rotated to `stdout.log.1` past the cap, so a
//! stream never takes more than twice the cap. Readers take the history from the files
//! and new lines from a bounded broadcast; one lock, held only to append, rotate and
//! subscribe, joins the two exactly (no line twice, none missed). A follower too slow
//! for the broadcast loses lines, counted: neither the member (whose pipe is always
//! drained) nor the agent ever waits for a reader.
//!
//! A member's files stay while any member of its unit is assigned to this node (a
//! member that exited and restarts appends to them); when the unit's last member
//! leaves the node, its directory goes.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_core::{LockExt, parse_rfc3339, rfc3339, timestamp::RFC3339_LEN};
use tokio::sync::broadcast;

use crate::catalogue as m;

/// Longer lines are cut into pieces of this many bytes.
pub const MAX_LINE: usize = 16 * 1024;

/// Lines a follower may be behind before it loses the oldest (counted): at most 16 MiB
/// of [`MAX_LINE`] lines held for a member's followers.
pub const FOLLOW_BUFFER: usize = 1024;

/// How long a log file that failed to take a write is left alone before it is tried
/// again (a full disk is not retried per line).
const RETRY: Duration = Duration::from_secs(5);

/// One line of a member's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub unix_ms: u64,
    pub text: String,
}

/// One output stream of one member.
pub struct LogFile {
    path: PathBuf,
    cap: u64,
    state: Mutex<State>,
}

struct State {
    file: Option<File>,
    /// Bytes in the current file, as far as readers may read it.
    len: u64,
    /// `None` once the member is stopped for good: followers end.
    live: Option<broadcast::Sender<Arc<Line>>>,
    /// Its unit left the node and its directory went: nothing is written any more (a
    /// late line of a stopping member must not make the directory again).
    removed: bool,
    /// While the file fails: when to try again, and the bytes dropped since it started.
    failing: Option<(Instant, u64)>,
}

/// What a reader starts from: the files as they were when it subscribed, and the
/// lines written after. Taken under the lock `append` writes and broadcasts under, so
/// every line is in exactly one of the two.
pub struct Snapshot {
    older: Option<File>,
    current: Option<(File, u64)>,
    pub live: Option<broadcast::Receiver<Arc<Line>>>,
}

impl LogFile {
    pub fn new(path: PathBuf, cap: u64) -> Self {
        let state = State {
            file: None,
            len: 0,
            live: Some(broadcast::channel(FOLLOW_BUFFER).0),
            removed: false,
            failing: None,
        };
        LogFile { path, cap, state: Mutex::new(state) }
    }

    fn rotated(&self) -> PathBuf {
        self.path.with_extension("log.1")
    }

    /// Writes `lines` (their time and text) and hands them to followers. A file that
    /// cannot be written costs the lines on disk, never the member; followers still
    /// get them.
    pub fn append(&self, lines: Vec<(u64, String)>) {
        if lines.is_empty() {
            return;
        }
        let mut buf = Vec::with_capacity(lines.iter().map(|(_, t)| t.len() + RFC3339_LEN + 2).sum());
        for (ms, text) in &lines {
            buf.extend_from_slice(rfc3339(*ms).as_bytes());
            buf.push(b' ');
            buf.extend_from_slice(text.as_bytes());
            buf.push(b'\n');
        }
        let mut st = self.state.lock_or_recover();
        self.write(&mut st, &buf);
        if let Some(tx) = &st.live {
            for (unix_ms, text) in lines {
                // No follower is no error.
                let _ = tx.send(Arc::new(Line { unix_ms, text }));
            }
        }
    }

    fn write(&self, st: &mut State, buf: &[u8]) {
        let n = buf.len() as u64;
        if st.removed {
            metrics::counter!(m::LOG_BYTES_DROPPED.name).increment(n);
            return;
        }
        if let Some((retry, dropped)) = st.failing.as_mut()
            && Instant::now() < *retry
        {
            *dropped += n;
            metrics::counter!(m::LOG_BYTES_DROPPED.name).increment(n);
            return;
        }
        let result = (|| {
            if st.file.is_none() || (st.len > 0 && st.len + n > self.cap) {
                if st.file.take().is_some() {
                    // Rotating also frees the space the older file held.
                    std::fs::rename(&self.path, self.rotated())?;
                    st.len = 0;
                }
                if let Some(dir) = self.path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
                st.len = f.metadata()?.len();
                st.file = Some(f);
            }
            match st.file.as_mut() {
                Some(f) => f.write_all(buf),
                None => Ok(()),
            }
        })();
        match result {
            Ok(()) => {
                st.len += n;
                if let Some((_, dropped)) = st.failing.take() {
                    tracing::info!(path = %self.path.display(), dropped_bytes = dropped, "workload output is written again");
                }
            }
            Err(e) => {
                // A short write leaves the file's length unknown: open it afresh next time.
                st.file = None;
                metrics::counter!(m::LOG_BYTES_DROPPED.name).increment(n);
                match st.failing.as_mut() {
                    Some((retry, dropped)) => {
                        *retry = Instant::now() + RETRY;
                        *dropped += n;
                    }
                    None => {
                        tracing::warn!(path = %self.path.display(), error = %e, "workload output cannot be written; dropping it until it can");
                        st.failing = Some((Instant::now() + RETRY, n));
                    }
                }
            }
        }
    }

    /// The files as they are now and, to follow, the lines written from here on.
    pub fn snapshot(&self, follow: bool) -> Snapshot {
        let st = self.state.lock_or_recover();
        let older = File::open(self.rotated()).ok();
        let current = File::open(&self.path).ok().map(|f| {
            // With no file open (none written yet, or a write failed and it reopens at the
            // next), nothing is writing it: all of it is history.
            let len = if st.file.is_some() { st.len } else { f.metadata().map(|m| m.len()).unwrap_or(0) };
            (f, len)
        });
        let live = follow.then(|| st.live.as_ref().map(broadcast::Sender::subscribe)).flatten();
        Snapshot { older, current, live }
    }

    /// The member stopped for good: followers end (its files stay).
    pub fn close(&self) {
        self.state.lock_or_recover().live = None;
    }

    /// Its unit left the node: followers end, and nothing is written again.
    fn remove(&self) {
        let mut st = self.state.lock_or_recover();
        st.live = None;
        st.removed = true;
        st.file = None;
    }

    /// The member starts again: new followers may wait for its lines.
    fn reopen(&self) {
        let mut st = self.state.lock_or_recover();
        if st.live.is_none() {
            st.live = Some(broadcast::channel(FOLLOW_BUFFER).0);
        }
    }
}

/// Splits one line as [`LogFile::append`] wrote it; a line in another form (a file
/// an older agent wrote) keeps its text with time 0.
fn parse_line(raw: &[u8]) -> (u64, String) {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    if raw.len() > RFC3339_LEN
        && raw[RFC3339_LEN] == b' '
        && let Some(ms) = std::str::from_utf8(&raw[..RFC3339_LEN]).ok().and_then(parse_rfc3339)
    {
        return (ms, String::from_utf8_lossy(&raw[RFC3339_LEN + 1..]).into_owned());
    }
    (0, String::from_utf8_lossy(raw).into_owned())
}

/// Which history lines a reader wants.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection {
    /// Only the last N (0: all).
    pub tail: usize,
    /// Only lines written at or after this time (0: any).
    pub since_unix_ms: u64,
}

/// Lines per chunk handed to `emit`.
pub const CHUNK_LINES: usize = 512;

impl Snapshot {
    /// Reads the history the snapshot holds, in order, and hands it to `emit` in chunks
    /// of at most [`CHUNK_LINES`]; stops early when `emit` returns false (the reader went
    /// away). Blocking: call it off the async runtime.
    pub fn history(&mut self, sel: Selection, mut emit: impl FnMut(Vec<Line>) -> bool) {
        let mut kept: VecDeque<Line> = VecDeque::new();
        let mut chunk = Vec::new();
        let older = self.older.take().map(|f| Box::new(f) as Box<dyn Read>);
        let current = self.current.take().map(|(f, len)| Box::new(f.take(len)) as Box<dyn Read>);
        let mut raw = Vec::new();
        for source in [older, current].into_iter().flatten() {
            let mut r = BufReader::new(source);
            loop {
                raw.clear();
                match r.read_until(b'\n', &mut raw) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                // Only a file written by something else holds a longer line.
                raw.truncate(RFC3339_LEN + 1 + MAX_LINE);
                let (unix_ms, text) = parse_line(&raw);
                if unix_ms < sel.since_unix_ms {
                    continue;
                }
                let line = Line { unix_ms, text };
                if sel.tail > 0 {
                    if kept.len() == sel.tail {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                } else {
                    chunk.push(line);
                    if chunk.len() == CHUNK_LINES && !emit(std::mem::take(&mut chunk)) {
                        return;
                    }
                }
            }
        }
        chunk.extend(kept);
        while !chunk.is_empty() {
            let rest = chunk.split_off(chunk.len().min(CHUNK_LINES));
            if !emit(std::mem::replace(&mut chunk, rest)) {
                return;
            }
        }
    }
}

/// Splits a child's output into lines: complete ones as they come, a partial one when
/// it reaches [`MAX_LINE`] or [`LineSplitter::flush`] is called (the child went quiet).
#[derive(Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    pub fn push(&mut self, bytes: &[u8], unix_ms: u64, out: &mut Vec<(u64, String)>) {
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.pending.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            self.cut(unix_ms, out);
            self.take(unix_ms, out);
        }
        self.pending.extend_from_slice(rest);
        self.cut(unix_ms, out);
    }

    /// Emits pieces of [`MAX_LINE`] bytes while more than that is pending.
    fn cut(&mut self, unix_ms: u64, out: &mut Vec<(u64, String)>) {
        while self.pending.len() > MAX_LINE {
            let tail = self.pending.split_off(MAX_LINE);
            let head = std::mem::replace(&mut self.pending, tail);
            out.push((unix_ms, text_of(&head)));
        }
    }

    pub fn flush(&mut self, unix_ms: u64, out: &mut Vec<(u64, String)>) {
        if !self.pending.is_empty() {
            self.take(unix_ms, out);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    fn take(&mut self, unix_ms: u64, out: &mut Vec<(u64, String)>) {
        out.push((unix_ms, text_of(&self.pending)));
        self.pending.clear();
    }
}

fn text_of(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    String::from_utf8_lossy(bytes).into_owned()
}

/// One member's two streams.
#[derive(Clone)]
pub struct MemberLogs {
    pub generation: u64,
    pub stdout: Arc<LogFile>,
    pub stderr: Arc<LogFile>,
}

/// (app, unit, member)
type Name = (String, String, String);

/// Every member's logs on this node, by name (the newest generation of each).
pub struct Logs {
    root: PathBuf,
    cap: u64,
    members: Mutex<BTreeMap<Name, MemberLogs>>,
}

/// A name fit for one path component: never empty, never `.` or `..`.
pub fn safe_name(s: &str) -> String {
    let name: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).take(100).collect();
    if name.chars().all(|c| c == '.') { format!("_{name}") } else { name }
}

impl Logs {
    /// Logs under `root` (`DATA/workloads`). What an earlier run of the agent left there
    /// is removed: a restarted agent is a new node, whose members start afresh.
    pub fn new(root: PathBuf, cap: u64) -> Self {
        if root.exists()
            && let Err(e) = std::fs::remove_dir_all(&root)
        {
            tracing::warn!(dir = %root.display(), error = %e, "cannot remove an earlier run's workload logs");
        }
        Logs { root, cap, members: Mutex::new(BTreeMap::new()) }
    }

    fn unit_dir(&self, app: &str, unit: &str) -> PathBuf {
        self.root.join(safe_name(app)).join(safe_name(unit))
    }

    /// The directory a member generation runs in and logs to.
    pub fn member_dir(&self, app: &str, unit: &str, member: &str, generation: u64) -> PathBuf {
        self.unit_dir(app, unit).join(format!("{}-g{generation}", safe_name(member)))
    }

    /// The logs of a member that starts (again): the same files across its restarts; a
    /// newer generation gets new ones (and followers of the older one end).
    pub fn start(&self, app: &str, unit: &str, member: &str, generation: u64) -> MemberLogs {
        let mut g = self.members.lock_or_recover();
        let name = (app.to_string(), unit.to_string(), member.to_string());
        if let Some(l) = g.get(&name)
            && l.generation == generation
        {
            l.stdout.reopen();
            l.stderr.reopen();
            return l.clone();
        }
        let dir = self.member_dir(app, unit, member, generation);
        let file = |name: &str| Arc::new(LogFile::new(dir.join(name), self.cap));
        let l = MemberLogs { generation, stdout: file("stdout.log"), stderr: file("stderr.log") };
        if let Some(old) = g.insert(name, l.clone()) {
            old.stdout.close();
            old.stderr.close();
        }
        l
    }

    pub fn get(&self, app: &str, unit: &str, member: &str) -> Option<MemberLogs> {
        self.members.lock_or_recover().get(&(app.to_string(), unit.to_string(), member.to_string())).cloned()
    }

    /// The member stopped for good: its followers end; its files stay with its unit.
    pub fn stopped(&self, app: &str, unit: &str, member: &str, generation: u64) {
        if let Some(l) = self.get(app, unit, member).filter(|l| l.generation == generation) {
            l.stdout.close();
            l.stderr.close();
        }
    }

    /// Removes the logs of every unit none of whose members `assigned` holds any more.
    pub fn keep_only(&self, assigned: &std::collections::BTreeSet<(String, String)>) {
        let mut gone = Vec::new();
        self.members.lock_or_recover().retain(|(app, unit, _), l| {
            let keep = assigned.contains(&(app.clone(), unit.clone()));
            if !keep {
                l.stdout.remove();
                l.stderr.remove();
                gone.push((app.clone(), unit.clone()));
            }
            keep
        });
        gone.dedup();
        for (app, unit) in gone {
            let dir = self.unit_dir(&app, &unit);
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a removed unit's logs");
            }
            // The app's directory goes with its last unit (not empty: it stays).
            let _ = std::fs::remove_dir(self.root.join(safe_name(&app)));
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests;
