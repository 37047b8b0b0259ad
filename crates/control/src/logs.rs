//! `GET /v1/apps/{app}/units/{unit}/members/{member}/logs`: a member's output, as its
//! node's agent keeps it, relayed by the shard that owns the node
//! (`NodeAdminService.ReadLogs`) over the agent's own connection.
//!
//! The answer is `text/plain`, one line per line the member wrote (with `timestamps`,
//! each after its RFC 3339 time), chunked; with `follow` it stays open and carries new
//! lines until the member is removed or the client leaves. Lines a slow follower lost
//! show as a `[flotilla] N lines dropped` line. Every hop holds a bounded buffer, so a
//! slow client holds back only its own relay.

use crate::catalogue as m;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use flotilla_core::NodeStatus;
use flotilla_proto::v1;
use serde::Deserialize;
use serde_json::Value;
use tokio_stream::StreamExt;

use crate::auth::authorize_app_read;
use crate::{ControlError, ControlState};

pub fn routes() -> axum::Router<Arc<ControlState>> {
    axum::Router::new().route("/v1/apps/{app}/units/{unit}/members/{member}/logs", axum::routing::get(member_logs))
}

use flotilla_proto::MAX_LOG_TAIL as MAX_TAIL;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogParams {
    /// `stdout` (the default) or `stderr`.
    stream: Option<String>,
    /// Only the last N lines (0..=100000; 0 or none: all kept).
    tail: Option<u32>,
    /// Only lines this recent (`10m`) or since this RFC 3339 time.
    since: Option<String>,
    /// Keep the answer open and send new lines as they are written.
    follow: Option<bool>,
    /// Each line after its RFC 3339 time.
    timestamps: Option<bool>,
}

const ACCEPTED: &str =
    "it takes stream=stdout|stderr, tail=0..100000, since=DURATION|RFC3339, follow=true|false, timestamps=true|false";

/// `since=` as Unix milliseconds: a duration back from now (`10m`) or an instant
/// (`2026-12-04T21:00:00.000Z`).
pub fn parse_since(text: &str, now_ms: u64) -> Result<u64, String> {
    if let Some(ms) = flotilla_core::parse_rfc3339(text) {
        return Ok(ms);
    }
    let d = flotilla_core::duration::parse(text)
        .map_err(|_| format!("since={text:?}: write a duration back from now (90s, 10m, 1h30m, 7d) or an RFC 3339 time (2026-12-04T21:00:00.000Z)"))?;
    Ok(now_ms.saturating_sub(d.as_millis() as u64))
}

fn request(app: &str, unit: &str, member: &str, node: &str, p: &LogParams) -> Result<v1::LogRequest, ControlError> {
    use ControlError::BadRequest;
    let stream = match p.stream.as_deref() {
        None | Some("stdout") => v1::LogStream::Stdout,
        Some("stderr") => v1::LogStream::Stderr,
        Some(other) => return Err(BadRequest(format!("stream={other:?}: stdout or stderr"))),
    };
    let tail_lines = p.tail.unwrap_or(0);
    if tail_lines > MAX_TAIL {
        return Err(BadRequest(format!("tail={tail_lines}: at most {MAX_TAIL}")));
    }
    let since_unix_ms = match &p.since {
        None => 0,
        Some(text) => parse_since(text, flotilla_core::system_ms()).map_err(BadRequest)?,
    };
    Ok(v1::LogRequest {
        node_id: node.to_string(),
        app: app.to_string(),
        unit: unit.to_string(),
        member: member.to_string(),
        stream: stream as i32,
        tail_lines,
        since_unix_ms,
        follow: p.follow.unwrap_or(false),
    })
}

/// The node member `member` of unit `unit` runs on, as the app's scheduler sees it.
pub(crate) fn node_of(units: &Value, app: &str, unit: &str, member: &str) -> Result<String, ControlError> {
    let rows = units.as_array().map(Vec::as_slice).unwrap_or_default();
    let u = rows
        .iter()
        .find(|u| u["unit_id"] == unit)
        .ok_or_else(|| ControlError::NoSuchMember(format!("app {app} has no unit {unit:?}")))?;
    let m = ["members", "surge"]
        .iter()
        .flat_map(|k| u[*k].as_array().into_iter().flatten())
        .find(|m| m["member"] == member)
        .ok_or_else(|| ControlError::NoSuchMember(format!("unit {unit} of app {app} has no member {member:?}")))?;
    m["node_id"].as_str().map(str::to_string).ok_or_else(|| {
        ControlError::NoSuchMember(format!(
            "member {member} of unit {unit} is not placed on a node yet: it has no logs"
        ))
    })
}

/// Why a node's members cannot be read any more, if they cannot: it left the cluster.
fn gone(s: &ControlState, node: &str) -> Result<usize, ControlError> {
    let id = flotilla_core::NodeId::new(node).map_err(|_| ControlError::NoSuchNode(node.to_string()))?;
    let found = s.cluster.slots().iter().enumerate().find_map(|(i, slot)| slot.view.get(&id).map(|r| (i, r.clone())));
    match found {
        None => Err(ControlError::NodeGone(format!("node {node} is no longer in the cluster: its logs went with it"))),
        Some((_, r)) if r.status == NodeStatus::Dead => Err(ControlError::NodeGone(format!(
            "node {node} left at {} (dead): its logs went with it",
            crate::json::rfc3339(r.status_since_unix_ms)
        ))),
        Some((shard, _)) => Ok(shard),
    }
}

/// Follows one client address may hold at once: each holds a relay through a shard and
/// one of its agent's readers.
pub const MAX_FOLLOWS_PER_PEER: usize = 16;

/// Open follows by client address.
static FOLLOWS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>> =
    std::sync::LazyLock::new(Default::default);

/// A follow's place; given back when its answer ends (the body that holds it drops).
struct FollowPlace(std::net::IpAddr);

impl FollowPlace {
    fn take(peer: std::net::IpAddr) -> Result<FollowPlace, ControlError> {
        use flotilla_core::LockExt;
        let mut open = FOLLOWS.lock_or_recover();
        let n = open.entry(peer).or_default();
        if *n >= MAX_FOLLOWS_PER_PEER {
            crate::limits::rejected("too_many_follows");
            return Err(ControlError::TooManyFollows { max: MAX_FOLLOWS_PER_PEER });
        }
        *n += 1;
        Ok(FollowPlace(peer))
    }
}

impl Drop for FollowPlace {
    fn drop(&mut self) {
        use flotilla_core::LockExt;
        let mut open = FOLLOWS.lock_or_recover();
        if let Some(n) = open.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.0);
            }
        }
    }
}

fn from_status(shard: usize, st: tonic::Status) -> ControlError {
    match st.code() {
        tonic::Code::NotFound => ControlError::NoSuchMember(st.message().to_string()),
        tonic::Code::InvalidArgument => ControlError::BadRequest(st.message().to_string()),
        tonic::Code::ResourceExhausted => ControlError::Forwarded {
            status: axum::http::StatusCode::TOO_MANY_REQUESTS,
            code: "rate_limited",
            message: st.message().to_string(),
        },
        _ => ControlError::ShardUnreachable { shard, message: st.message().to_string() },
    }
}

/// One chunk as text lines.
fn render(chunk: &v1::LogChunk, timestamps: bool) -> Bytes {
    let mut out = String::new();
    if chunk.dropped_lines > 0 {
        out.push_str(&format!(
            "[flotilla] {} lines dropped: this reader fell behind the member\n",
            chunk.dropped_lines
        ));
    }
    for l in &chunk.lines {
        if timestamps {
            out.push_str(&flotilla_core::rfc3339(l.unix_ms));
            out.push(' ');
        }
        out.push_str(&l.text);
        out.push('\n');
    }
    Bytes::from(out)
}

#[utoipa::path(get, path = "/v1/apps/{app}/units/{unit}/members/{member}/logs", tag = "apps", security(("bearer" = [])),
    params(("app" = String, Path), ("unit" = String, Path), ("member" = String, Path), LogParams),
    responses((status = 200, description = "the member's lines, chunked (a token not limited to other apps)", content_type = "text/plain", body = String,
               headers(("x-flotilla-node" = String, description = "the node the member runs on"))),
              (status = 400, description = "a bad parameter, with what is accepted", body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
              (status = 404, description = "`no_such_app` or `no_such_member`, naming what is unknown", body = crate::answers::ErrorBody),
              (status = 410, description = "`node_gone`: the member's node left (with when)", body = crate::answers::ErrorBody),
              (status = 429, description = "`too_many_follows` (16 per client address), or the member's agent answers as many log requests as it will", body = crate::answers::ErrorBody),
              (status = 502, description = "the node's agent is not connected, or its shard did not answer", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "member_logs", skip(s, headers, params))]
pub(crate) async fn member_logs(
    State(s): State<Arc<ControlState>>,
    Path((app, unit, member)): Path<(String, String, String)>,
    params: Result<Query<LogParams>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/units/{unit}/members/{member}/logs")
        .increment(1);
    let Query(p) = params.map_err(|e| ControlError::BadRequest(format!("{}; {ACCEPTED}", e.body_text())))?;
    authorize_app_read(&s, &headers, &app)?;
    let units = match s.apps.get(&app) {
        Some(Ok(h)) => crate::apps::unit_rows(&h.status()),
        Some(Err(url)) => crate::forward::remote(&s.http, &url, &format!("/v1/apps/{app}/units")).await?,
        None => return Err(ControlError::NoSuchApp(app)),
    };
    let node = node_of(&units, &app, &unit, &member)?;
    let req = request(&app, &unit, &member, &node, &p)?;
    let peer = extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
    let place = match peer {
        Some(ip) if req.follow => Some(FollowPlace::take(ip)?),
        _ => None,
    };
    let shard = gone(&s, &node)?;
    let mut client = crate::nodes::admin_client(&s, shard).await?;
    let stream = client.read_logs(req).await.map_err(|e| from_status(shard, e))?.into_inner();
    let timestamps = p.timestamps.unwrap_or(false);
    let body = stream.map(move |c| {
        // The follow's place lives as long as the body: it is given back when the client
        // leaves and the body drops.
        let _place = &place;
        match c {
            Ok(c) => Ok::<_, Infallible>(render(&c, timestamps)),
            Err(e) => {
                // The status line is sent: say so in the body, where the reader looks.
                tracing::debug!(error = %e, "log relay ended");
                Ok(Bytes::from(format!("[flotilla] the log stream broke: {}\n", e.message())))
            }
        }
    });
    let mut resp = Body::from_stream(body).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp.headers_mut().insert("x-flotilla-node", HeaderValue::from_str(&node).unwrap_or(HeaderValue::from_static("-")));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_member_is_found_by_unit_and_name_and_a_missing_one_is_named() {
        let units = json!([{"unit_id": "u1", "members": [{"member": "head", "node_id": "n1"}, {"member": "worker-0", "node_id": null}],
                            "surge": [{"member": "worker-1", "node_id": "n2"}]}]);
        assert_eq!(node_of(&units, "echo", "u1", "head").unwrap(), "n1");
        assert_eq!(node_of(&units, "echo", "u1", "worker-1").unwrap(), "n2");
        let e = node_of(&units, "echo", "u9", "head").unwrap_err().to_string();
        assert!(e.contains("no unit \"u9\""), "{e}");
        let e = node_of(&units, "echo", "u1", "ghost").unwrap_err().to_string();
        assert!(e.contains("no member \"ghost\""), "{e}");
        let e = node_of(&units, "echo", "u1", "worker-0").unwrap_err().to_string();
        assert!(e.contains("not placed"), "{e}");
    }

    #[test]
    fn since_takes_a_duration_or_an_instant_and_names_both_when_wrong() {
        assert_eq!(parse_since("10m", 1_000_000), Ok(400_000));
        assert_eq!(parse_since("2000-02-29T00:00:00.123Z", 0), Ok(951_782_400_123));
        let e = parse_since("yesterday", 0).unwrap_err();
        assert!(e.contains("10m") && e.contains("RFC 3339"), "{e}");
    }

    #[test]
    fn bad_parameters_are_refused_with_what_is_accepted() {
        let p = |stream: Option<&str>, tail| LogParams {
            stream: stream.map(str::to_string),
            tail,
            since: None,
            follow: None,
            timestamps: None,
        };
        assert!(request("a", "u", "m", "n", &p(None, Some(10))).is_ok());
        assert!(
            request("a", "u", "m", "n", &p(Some("stdin"), None)).unwrap_err().to_string().contains("stdout or stderr")
        );
        assert!(request("a", "u", "m", "n", &p(None, Some(MAX_TAIL + 1))).unwrap_err().to_string().contains("at most"));
    }

    #[test]
    fn one_address_holds_a_bounded_number_of_follows_and_gets_them_back() {
        let peer: std::net::IpAddr = [192, 0, 2, 77].into();
        let places: Vec<FollowPlace> = (0..MAX_FOLLOWS_PER_PEER).map(|_| FollowPlace::take(peer).unwrap()).collect();
        let refused = FollowPlace::take(peer).err().unwrap();
        assert!(refused.to_string().contains("log follows are open already"), "{refused}");
        let other: std::net::IpAddr = [192, 0, 2, 78].into();
        assert!(FollowPlace::take(other).is_ok(), "another address is not held back");
        drop(places);
        assert!(FollowPlace::take(peer).is_ok(), "places come back when the answers end");
    }

    #[test]
    fn chunks_render_as_lines_with_dropped_ones_said() {
        let c =
            v1::LogChunk { lines: vec![v1::LogLine { unix_ms: 0, text: "hi".into() }], dropped_lines: 3, error: None };
        assert_eq!(render(&c, false), "[flotilla] 3 lines dropped: this reader fell behind the member\nhi\n");
        assert!(render(&c, true).ends_with(b"1970-01-01T00:00:00.000Z hi\n"));
    }
}
