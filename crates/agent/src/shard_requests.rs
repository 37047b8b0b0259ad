//! Answers the shard's requests over the agent's own QUIC connection, so the agent opens
//! no port for them: the shard opens a bidirectional stream per request and writes one
//! message (agent.proto): a `LogRequest`, answered with `LogChunk` frames, or a
//! `ShardRequest` holding a warm request (`flotilla artifact warm`), answered with one
//! `WarmReply`.
//!
//! History is read off the async runtime; following waits on the member's broadcast
//! and on the shard, so a reader that leaves ends its request at once.

use std::sync::Arc;

use flotilla_artifact::Artifacts;
use flotilla_proto::{MAX_LOG_TAIL as MAX_TAIL, frame, v1};
use prost::Message;
use tokio::sync::{Semaphore, broadcast, mpsc};
use tracing::Instrument;

use crate::catalogue as m;
use crate::logs::{CHUNK_LINES, Line, Logs, Selection};

/// Log requests one agent answers at once; more are refused (`busy`).
pub const MAX_READERS: usize = 32;

/// A log request is small: four names and some numbers.
const MAX_LOG_REQUEST: usize = 4096;
/// The largest request: a warm request's artifacts.
const MAX_REQUEST: usize = flotilla_proto::MAX_WARM_ARTIFACTS * flotilla_proto::MAX_ARTIFACT_BYTES + 4096;

/// What answers the shard's requests.
pub struct Answers {
    pub logs: Arc<Logs>,
    pub node_id: String,
    pub readers: Arc<Semaphore>,
    /// `None` when the cache could not start: warm requests are refused.
    pub artifacts: Option<Arc<Artifacts>>,
}

/// Takes the shard's requests on `conn` until it closes.
pub async fn serve(conn: quinn::Connection, answers: Arc<Answers>) {
    while let Ok((send, recv)) = conn.accept_bi().await {
        let answers = answers.clone();
        let span = tracing::debug_span!("shard_request", unit = tracing::field::Empty, member = tracing::field::Empty);
        tokio::spawn(async move { dispatch(send, recv, &answers).await }.instrument(span));
    }
}

async fn dispatch(mut send: quinn::SendStream, mut recv: quinn::RecvStream, a: &Answers) {
    let bytes = match recv.read_to_end(MAX_REQUEST).await {
        Ok(bytes) => bytes,
        Err(e) => return refuse(&mut send, "invalid", format!("reading the request: {e}")).await,
    };
    if let Ok(v1::ShardRequest { warm: Some(req) }) = v1::ShardRequest::decode(bytes.as_slice()) {
        let reply = crate::artifacts::warm(a.artifacts.as_ref(), &req, &a.node_id);
        let _ = send.write_all(&frame::encode(&reply)).await;
        let _ = send.finish();
        return;
    }
    if bytes.len() > MAX_LOG_REQUEST {
        return refuse(
            &mut send,
            "invalid",
            format!("a log request of {} bytes (at most {MAX_LOG_REQUEST})", bytes.len()),
        )
        .await;
    }
    match v1::LogRequest::decode(bytes.as_slice()) {
        Ok(req) => answer(send, req, a).await,
        Err(e) => refuse(&mut send, "invalid", format!("the request does not decode: {e}")).await,
    }
}

/// Why a request is refused: its stable code and its message.
fn check(req: &v1::LogRequest, node_id: &str) -> Result<(), (&'static str, String)> {
    if req.node_id != node_id {
        return Err(("invalid", format!("this is node {node_id}, not {}", req.node_id)));
    }
    for (what, v) in [("app", &req.app), ("unit", &req.unit), ("member", &req.member)] {
        if v.is_empty() || v.len() > 256 {
            return Err(("invalid", format!("{what}: 1 to 256 bytes")));
        }
    }
    if req.tail_lines > MAX_TAIL {
        return Err(("invalid", format!("tail_lines: at most {MAX_TAIL}")));
    }
    Ok(())
}

/// Refuses a log request with a `LogChunk` holding only the error.
async fn refuse(send: &mut quinn::SendStream, code: &'static str, message: String) {
    metrics::counter!(m::LOG_REQUESTS.name, "result" => code).increment(1);
    let chunk = v1::LogChunk { error: Some(v1::ErrorReply { code: code.into(), message }), ..Default::default() };
    let _ = send.write_all(&frame::encode(&chunk)).await;
    let _ = send.finish();
}

/// Text bytes per frame, far below what the shard reads (`MAX_CONTROL_MESSAGE`).
const FRAME_TEXT: usize = 128 * 1024;

/// `lines` as frames of at most [`FRAME_TEXT`] bytes of text; the first says how many
/// lines were dropped before them.
fn frames(lines: &[Line], dropped_lines: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = v1::LogChunk { dropped_lines, ..Default::default() };
    let mut size = 0;
    for l in lines {
        if size + l.text.len() > FRAME_TEXT && !chunk.lines.is_empty() {
            out.extend(frame::encode(&chunk));
            chunk = v1::LogChunk::default();
            size = 0;
        }
        size += l.text.len();
        chunk.lines.push(v1::LogLine { unix_ms: l.unix_ms, text: l.text.clone() });
    }
    if !chunk.lines.is_empty() || chunk.dropped_lines > 0 {
        out.extend(frame::encode(&chunk));
    }
    out
}

async fn answer(mut send: quinn::SendStream, req: v1::LogRequest, a: &Answers) {
    let (logs, node_id, readers) = (&a.logs, a.node_id.as_str(), &a.readers);
    if let Err((code, message)) = check(&req, node_id) {
        return refuse(&mut send, code, message).await;
    }
    let Ok(_permit) = readers.clone().try_acquire_owned() else {
        return refuse(&mut send, "busy", format!("this agent answers {MAX_READERS} log requests at once; retry"))
            .await;
    };
    let Some(member) = logs.get(&req.app, &req.unit, &req.member) else {
        let message = format!("no member {} of unit {} of app {} on node {node_id}", req.member, req.unit, req.app);
        return refuse(&mut send, "no_member", message).await;
    };
    tracing::Span::current().record("unit", req.unit.as_str()).record("member", req.member.as_str());
    metrics::counter!(m::LOG_REQUESTS.name, "result" => "ok").increment(1);
    // Taken: the shard waits for this empty chunk (or a refusal) before it answers.
    if send.write_all(&frame::encode(&v1::LogChunk::default())).await.is_err() {
        return;
    }
    let gauge = metrics::gauge!(m::LOG_READERS.name);
    gauge.increment(1.0);
    let file = if req.stream == v1::LogStream::Stderr as i32 { member.stderr } else { member.stdout };
    let (following, sel) = (req.follow, Selection { tail: req.tail_lines as usize, since_unix_ms: req.since_unix_ms });
    let (tx, mut rx) = mpsc::channel::<Vec<Line>>(2);
    // Off the async runtime: the snapshot takes the file's lock (which a write to a slow
    // disk holds) and opens files, and the history reads them.
    let reading = tokio::task::spawn_blocking(move || {
        let mut snap = file.snapshot(following);
        let live = snap.live.take();
        snap.history(sel, |lines| tx.blocking_send(lines).is_ok());
        live
    });
    let mut ok = true;
    while let Some(lines) = rx.recv().await {
        if send.write_all(&frames(&lines, 0)).await.is_err() {
            ok = false;
            break;
        }
    }
    // Dropping the receiver stops the history reader at its next chunk.
    drop(rx);
    if let Ok(Some(live)) = reading.await
        && ok
    {
        follow(&mut send, live).await;
    }
    let _ = send.finish();
    gauge.decrement(1.0);
}

/// Sends the lines written after the snapshot as they come, until the member stops for
/// good or the shard stops reading.
async fn follow(send: &mut quinn::SendStream, mut live: broadcast::Receiver<Arc<Line>>) {
    let dropped_total = metrics::counter!(m::LOG_LINES_DROPPED.name);
    let mut dropped = 0u64;
    loop {
        let first = tokio::select! {
            r = live.recv() => r,
            _ = send.stopped() => return,
        };
        let mut lines = Vec::new();
        let mut take = |r: Result<Arc<Line>, broadcast::error::RecvError>, lines: &mut Vec<Line>| match r {
            Ok(l) => {
                lines.push((*l).clone());
                true
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                dropped += n;
                dropped_total.increment(n);
                true
            }
            Err(broadcast::error::RecvError::Closed) => false,
        };
        let mut open = take(first, &mut lines);
        while open && lines.len() < CHUNK_LINES {
            match live.try_recv() {
                Ok(l) => open = take(Ok(l), &mut lines),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    open = take(Err(broadcast::error::RecvError::Lagged(n)), &mut lines)
                }
                Err(broadcast::error::TryRecvError::Closed) => open = false,
                Err(broadcast::error::TryRecvError::Empty) => break,
            }
        }
        if !lines.is_empty() || dropped > 0 {
            if send.write_all(&frames(&lines, dropped)).await.is_err() {
                return;
            }
            dropped = 0;
        }
        if !open {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_for_another_node_or_without_names_are_refused() {
        let ok = v1::LogRequest {
            node_id: "n1".into(),
            app: "echo".into(),
            unit: "u1".into(),
            member: "head".into(),
            ..Default::default()
        };
        assert!(check(&ok, "n1").is_ok());
        assert_eq!(check(&ok, "n2").unwrap_err().0, "invalid");
        let no_member = v1::LogRequest { member: String::new(), ..ok.clone() };
        assert!(check(&no_member, "n1").unwrap_err().1.contains("member"));
        let long = v1::LogRequest { tail_lines: MAX_TAIL + 1, ..ok };
        assert!(check(&long, "n1").unwrap_err().1.contains("tail_lines"));
    }
}
