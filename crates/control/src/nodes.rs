//! `GET /v1/nodes` (paged, filtered, or every node streamed), `GET /v1/nodes/{node}`
//! (one row with the members the apps placed there), `GET /v1/shards`, and the node
//! actions: `POST /v1/nodes/{node}/cordon|drain|uncordon`.

use crate::catalogue as m;
use flotilla_proto::v1::node_admin_service_client::NodeAdminServiceClient;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use flotilla_core::NodeStatus;
use flotilla_view::NodeRecord;
use serde_json::Value;
use tokio_stream::StreamExt;

use crate::answers::{CordonAnswer, DrainWait, DrainWaits, NodeDetail, NodeMember, ShardRow, ViewVersion};
use crate::events::{priority_of, status_of};
use crate::{ControlError, ControlState};

/// Most rows of one page.
pub const MAX_LIMIT: usize = 5_000;
/// Rows per chunk of an unpaged answer.
const STREAM_CHUNK: usize = 1_000;

/// What `GET /v1/nodes` was asked for.
#[derive(Debug, Default, PartialEq)]
pub struct NodeQuery {
    pub offset: usize,
    /// A page of at most this many rows; every matching row without it.
    pub limit: Option<usize>,
    pub domain: Option<String>,
    pub status: Option<NodeStatus>,
    pub priority: Option<String>,
    /// `label=k=v`, every one of them must match.
    pub labels: Vec<(String, String)>,
}

/// `GET /v1/nodes`'s parameters, as the contract shows them (the handler reads the pairs
/// itself, with [`parse_query`], to name a bad one).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code, reason = "read by the OpenAPI derive only")]
pub(crate) struct NodeFilters {
    /// Rows to skip.
    offset: Option<usize>,
    /// A page of at most this many rows (1..=5000); every matching row without it.
    limit: Option<usize>,
    domain: Option<String>,
    /// `alive`, `suspect`, `draining`, `dead` or `unknown`.
    status: Option<String>,
    /// `high` or `low`.
    priority: Option<String>,
    /// `KEY=VALUE`; repeated, every one must match.
    label: Option<String>,
}

/// Reads the query's pairs; a bad or unknown parameter is named in the error.
pub fn parse_query(pairs: &[(String, String)]) -> Result<NodeQuery, String> {
    let mut q = NodeQuery::default();
    for (k, v) in pairs {
        match k.as_str() {
            "offset" => q.offset = v.parse().map_err(|_| format!("offset: {v:?} is not a whole number"))?,
            "limit" => {
                let n: usize = v.parse().map_err(|_| format!("limit: {v:?} is not a whole number"))?;
                if n == 0 || n > MAX_LIMIT {
                    return Err(format!("limit: {n} is not within 1..={MAX_LIMIT}"));
                }
                q.limit = Some(n);
            }
            "domain" => q.domain = Some(v.clone()),
            "status" => {
                let s = serde_json::from_value(Value::String(v.clone()))
                    .map_err(|_| format!("status: {v:?} is not one of alive, suspect, draining, dead, unknown"))?;
                q.status = Some(s);
            }
            "priority" => q.priority = Some(v.clone()),
            "label" => {
                let (lk, lv) = v.split_once('=').ok_or_else(|| format!("label: {v:?} is not KEY=VALUE"))?;
                if lk.is_empty() {
                    return Err(format!("label: {v:?} has an empty key"));
                }
                q.labels.push((lk.to_string(), lv.to_string()));
            }
            _ => {
                return Err(format!("unknown query parameter {k:?} (offset, limit, domain, status, priority, label)"));
            }
        }
    }
    Ok(q)
}

impl NodeQuery {
    fn matches(&self, r: &NodeRecord, connected: bool) -> bool {
        self.domain.as_deref().is_none_or(|d| r.labels.domain() == d)
            && self.status.is_none_or(|s| status_of(r, connected) == s)
            && self.priority.as_deref().is_none_or(|p| priority_of(r) == p)
            && self.labels.iter().all(|(k, v)| r.labels.get(k) == Some(v.as_str()))
    }
}

/// Every node of the view that `q` matches, sorted by node id.
fn matching(s: &ControlState, q: &NodeQuery) -> Vec<(Arc<NodeRecord>, bool)> {
    let mut rows: Vec<(Arc<NodeRecord>, bool)> = s
        .cluster
        .slots()
        .iter()
        .flat_map(|slot| {
            slot.view.nodes.values().filter(|r| q.matches(r, slot.connected)).map(|r| (r.clone(), slot.connected))
        })
        .collect();
    rows.sort_by(|a, b| a.0.node_id.cmp(&b.0.node_id));
    rows
}

fn row_json(r: &NodeRecord, connected: bool) -> Vec<u8> {
    serde_json::to_vec(&crate::json::row(r, connected)).unwrap_or_else(|_| b"null".to_vec())
}

/// `GET /v1/nodes[?offset=&limit=&domain=&status=&priority=&label=k=v]`: the rows of
/// docs/architecture.md §13 sorted by node id, `x-total-count` saying how many match.
/// Without `limit`, every matching row from `offset` on, as a JSON array streamed in
/// chunks of [`STREAM_CHUNK`] rows (never one 100,000-row serialisation).
#[utoipa::path(get, path = "/v1/nodes", operation_id = "list_nodes", tag = "nodes", params(NodeFilters),
    responses((status = 200, body = [crate::json::NodeRow], headers(("x-total-count" = usize, description = "how many rows match"))),
              (status = 400, description = "a bad or unknown parameter, named", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "list_nodes", skip_all)]
pub async fn list(
    State(s): State<Arc<ControlState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/nodes").increment(1);
    let bad = |m: String| {
        crate::limits::rejected("bad_query");
        ControlError::BadRequest(m)
    };
    let Query(pairs) = query.map_err(|e| bad(e.body_text()))?;
    let q = parse_query(&pairs).map_err(bad)?;
    let rows = matching(&s, &q);
    let total = rows.len();
    let from = q.offset.min(total);
    let to = q.limit.map_or(total, |l| from.saturating_add(l).min(total));
    let page: Vec<(Arc<NodeRecord>, bool)> = rows[from..to].to_vec();
    drop(rows);
    let chunks: Vec<Vec<(Arc<NodeRecord>, bool)>> = page.chunks(STREAM_CHUNK).map(<[_]>::to_vec).collect();
    let rows = tokio_stream::iter(chunks.into_iter().enumerate()).map(|(i, chunk)| {
        let mut out = Vec::with_capacity(chunk.len() * 400);
        for (j, (r, connected)) in chunk.iter().enumerate() {
            if i > 0 || j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&row_json(r, *connected));
        }
        Bytes::from(out)
    });
    let body =
        tokio_stream::once(Bytes::from_static(b"[")).chain(rows).chain(tokio_stream::once(Bytes::from_static(b"]")));
    let mut resp = Body::from_stream(body.map(Ok::<_, Infallible>)).into_response();
    let h = resp.headers_mut();
    h.insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert("x-total-count", HeaderValue::from(total));
    Ok(resp)
}

/// `GET /v1/nodes/{node}`: its row and `members`, the members of every app in this
/// process placed on it (of units not yet terminated). (Standalone schedulers' members are not listed: their units
/// are only fetched from them.)
#[utoipa::path(get, path = "/v1/nodes/{node}", operation_id = "get_node", tag = "nodes", params(("node" = String, Path)),
    responses((status = 200, body = crate::answers::NodeDetail), (status = 404, body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "get_node", skip(s))]
pub async fn get(State(s): State<Arc<ControlState>>, Path(node): Path<String>) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/nodes/{node}").increment(1);
    let not_found = || ControlError::NoSuchNode(node.clone());
    let id = flotilla_core::NodeId::new(&node).map_err(|_| not_found())?;
    let (r, connected) = s
        .cluster
        .slots()
        .iter()
        .find_map(|slot| slot.view.get(&id).map(|r| (r.clone(), slot.connected)))
        .ok_or_else(not_found)?;
    let mut members = Vec::new();
    let mut waiting = Vec::new();
    for h in s.apps.locals() {
        let status = h.status();
        // A terminated unit's members keep their last node and state: they run nowhere.
        for u in status.units.iter().filter(|u| u.state != flotilla_scheduler::UnitState::Terminated) {
            let here: Vec<_> = u.members.iter().filter(|m| m.node_id.as_deref() == Some(node.as_str())).collect();
            for m in &here {
                let state = m.state.clone().unwrap_or_else(|| "allocated".into());
                members.push(NodeMember {
                    app: h.app.clone(),
                    unit_id: u.unit_id.clone(),
                    member: m.member.clone(),
                    role: m.role.clone(),
                    state,
                    address: m.address.clone(),
                });
            }
            if !here.is_empty()
                && let Some(why) = drain_waits(u, &status.units)
            {
                waiting.push(DrainWait { app: h.app.clone(), unit_id: u.unit_id.clone(), reason: why });
            }
        }
    }
    // A drain that cannot finish says why, unit by unit (never a silent hang).
    let drain = r.drain_requested.then_some(DrainWaits { waiting });
    Ok(axum::Json(NodeDetail { row: crate::json::row(&r, connected), members, drain }).into_response())
}

/// Why a drain of a node holding unit `u` waits on it, if it does: its replacement
/// cannot be placed, or its workers cannot move.
fn drain_waits(u: &flotilla_scheduler::UnitRecord, units: &[Arc<flotilla_scheduler::UnitRecord>]) -> Option<String> {
    if let Some(r) = u.replaced_by.as_deref().and_then(|id| units.iter().find(|r| r.unit_id == id))
        && r.state == flotilla_scheduler::UnitState::Queued
        && let Some(why) = r.unplaced_reason.as_deref()
    {
        return Some(format!("replacement {} cannot be placed: {why}", r.unit_id));
    }
    u.placement_note.as_deref().and_then(|n| n.strip_prefix("drain waits:")).map(|n| n.trim().to_string())
}

/// `POST /v1/nodes/{node}/cordon|drain|uncordon`. A drain also asks every app's scheduler
/// to replace the members the node runs elsewhere before they are stopped.
#[utoipa::path(post, path = "/v1/nodes/{node}/{action}", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path), ("action" = String, Path, description = "`cordon`, `drain` or `uncordon` (scope operate)")),
    responses((status = 200, body = crate::answers::CordonAnswer), (status = 401, body = crate::answers::ErrorBody), (status = 403, body = crate::answers::ErrorBody),
              (status = 404, description = "no such node or action", body = crate::answers::ErrorBody), (status = 502, description = "its shard did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn node_action(
    State(s): State<Arc<ControlState>>,
    axum::extract::Path((node, action)): axum::extract::Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<Json<CordonAnswer>, ControlError> {
    let what = match action.as_str() {
        "cordon" => NodeAction::Cordon,
        "drain" => NodeAction::Drain,
        "uncordon" => NodeAction::Uncordon,
        _ => return Err(ControlError::NoSuchAction(action)),
    };
    set_cordon(&s, &node, &headers, what).await
}

#[derive(Clone, Copy, PartialEq)]
enum NodeAction {
    Cordon,
    Drain,
    Uncordon,
}

/// A client of shard `shard`'s node administration: its active process or, with `a|b`,
/// the first of its standbys that answers.
pub(crate) async fn admin_client(
    s: &ControlState,
    shard: usize,
) -> Result<NodeAdminServiceClient<flotilla_proto::dial::GrpcChannel>, ControlError> {
    let unreachable = |message: String| ControlError::ShardUnreachable { shard, message };
    let addr = s.shards.get(shard).ok_or_else(|| unreachable("no address is configured for it".into()))?;
    let mut channel = Err(String::from("no address"));
    for alt in flotilla_core::shard_alternates(addr) {
        channel = s.dialer.connect(alt, Some(std::time::Duration::from_secs(10))).await.map_err(|e| e.to_string());
        if channel.is_ok() {
            break;
        }
    }
    Ok(NodeAdminServiceClient::new(channel.map_err(unreachable)?))
}

/// Asks the shard that owns `node` to (un)cordon or drain it; the change shows in the
/// next view.
async fn set_cordon(
    s: &ControlState,
    node: &str,
    headers: &axum::http::HeaderMap,
    what: NodeAction,
) -> Result<Json<CordonAnswer>, ControlError> {
    let (cordoned, drain) = (what != NodeAction::Uncordon, what == NodeAction::Drain);
    let by = crate::auth::authorize(s, headers, crate::tokens::Scope::Operate, None)?;
    let not_found = || ControlError::NoSuchNode(node.to_string());
    let id = flotilla_core::NodeId::new(node).map_err(|_| not_found())?;
    let shard = s.cluster.slots().iter().position(|slot| slot.view.get(&id).is_some()).ok_or_else(not_found)?;
    let unreachable = |message: String| ControlError::ShardUnreachable { shard, message };
    let mut client = admin_client(s, shard).await?;
    let r = client
        .set_cordon(flotilla_proto::v1::CordonRequest { node_id: node.to_string(), cordoned, drain })
        .await
        .map_err(|e| unreachable(e.message().to_string()))?
        .into_inner();
    if !r.found {
        return Err(not_found());
    }
    tracing::info!(node, cordoned, drain, "node cordon changed");
    let verb = if drain {
        "drain requested"
    } else if cordoned {
        "cordoned"
    } else {
        "uncordoned"
    };
    s.journal.record(vec![crate::journal::NewEvent::new("node_action", format!("{node}: {verb}")).node(node).by(by)]);
    Ok(Json(CordonAnswer { node_id: node.to_string(), cordoned, drain_requested: drain }))
}

#[utoipa::path(get, path = "/v1/shards", tag = "nodes", responses((status = 200, body = [crate::answers::ShardRow])))]
pub(crate) async fn list_shards(State(s): State<Arc<ControlState>>) -> Json<Vec<ShardRow>> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/shards").increment(1);
    let rows: Vec<_> = s
        .cluster
        .slots()
        .iter()
        .enumerate()
        .map(|(i, slot)| ShardRow {
            shard: i,
            address: s.shards.get(i).cloned(),
            connected: slot.connected,
            version: ViewVersion { epoch: slot.view.version.epoch, seq: slot.view.version.seq },
            nodes: slot.view.len(),
        })
        .collect();
    Json(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Result<NodeQuery, String> {
        let pairs: Vec<(String, String)> = pairs_of(s);
        parse_query(&pairs)
    }

    fn pairs_of(s: &str) -> Vec<(String, String)> {
        s.split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    #[test]
    fn queries_are_read_and_bad_ones_named() {
        let got = q("offset=10&limit=500&domain=a&status=suspect&priority=low&label=zone=z1&label=gpu=a100").unwrap();
        assert_eq!(got.offset, 10);
        assert_eq!(got.limit, Some(500));
        assert_eq!(got.status, Some(NodeStatus::Suspect));
        assert_eq!(got.labels, vec![("zone".into(), "z1".into()), ("gpu".into(), "a100".into())]);
        assert!(q("limit=0").unwrap_err().starts_with("limit"));
        assert!(q("limit=5001").unwrap_err().starts_with("limit"));
        assert!(q("limit=x").unwrap_err().starts_with("limit"));
        assert!(q("offset=-1").unwrap_err().starts_with("offset"));
        assert!(q("status=sleepy").unwrap_err().starts_with("status"));
        assert!(q("label=novalue").unwrap_err().starts_with("label"));
        assert!(q("colour=red").unwrap_err().contains("colour"));
        assert_eq!(q("").unwrap(), NodeQuery::default());
    }
}
