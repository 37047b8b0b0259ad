//! `GET /openapi.json`: the API's OpenAPI 3.1 contract, derived by `utoipa` from the
//! handlers' annotations and the types they read and answer with. Routes, parameters,
//! bodies and errors come from each handler's `#[utoipa::path]`; answers from the types in
//! [`crate::answers`] the handlers build them from (serialised to JSON where a standalone
//! scheduler's answer, from the same code, may pass through instead). A unit test holds the
//! document to the router's routes, and `tests/api/conformance.py` every documented
//! operation's real answers to the document.

use std::sync::Arc;

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::ControlState;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The refusals that come from the layers in front of every handler (`limits.rs`, the
/// body reader, the store), added to each operation once rather than to each handler.
struct CommonRefusals;

impl Modify for CommonRefusals {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let refusal = |why: &str| {
            ResponseBuilder::new()
                .description(why)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build()
        };
        let every = [
            ("400", "`host_not_allowed`: a Host the API does not answer to, without the API token"),
            ("408", "`body_timeout`: the body did not arrive in time"),
            ("413", "`too_large`: a body past the cap"),
            ("414", "`uri_too_long`: a path and query past the cap"),
            ("429", "`rate_limited` (with Retry-After): too many requests from this address"),
        ];
        let writes = [
            ("415", "`unsupported_media_type`: a body that is not JSON where JSON is read"),
            ("500", "`storage_failed`: this process could not keep the change"),
            (
                "503",
                "`store_unavailable`: the store refuses writes (a full disk, etcd without a quorum) or this instance is a standby; nothing changed",
            ),
        ];
        for item in doc.paths.paths.values_mut() {
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete];
            for (write, op) in ops.into_iter().enumerate().filter_map(|(i, o)| o.as_mut().map(|o| (i > 0, o))) {
                let extra = every.iter().chain(if write { writes.iter() } else { [].iter() });
                for (code, why) in extra {
                    op.responses.responses.entry(code.to_string()).or_insert_with(|| refusal(why).into());
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Flotilla control plane",
        description = "Nodes, apps and their units, versions, logs, events, tokens and pools. Reads need no token unless noted; changes need `Authorization: Bearer TOKEN` with the scope each names. Every refusal is `{\"error\": {\"code\", \"message\"}}`."
    ),
    paths(
        crate::nodes::list,
        crate::nodes::get,
        crate::nodes::list_shards,
        crate::nodes::node_action,
        crate::events::events,
        crate::apps::list_apps,
        crate::apps::get_app,
        crate::apps::list_units,
        crate::apps::list_routes,
        crate::apps::scale,
        crate::apps::apply,
        crate::apps::get_spec,
        crate::versions::list_versions,
        crate::versions::get_version,
        crate::versions::rollback,
        crate::versions::plan,
        crate::rollouts::rollout_status,
        crate::rollouts::promote,
        crate::rollouts::abort,
        crate::logs::member_logs,
        crate::autoscaling::decisions,
        crate::autoscaling::demand,
        crate::autoscaling::capacity,
        crate::rebalance::rebalance_plan,
        crate::autoscaling::list_policies,
        crate::autoscaling::apply_policy,
        crate::charts::app_history,
        crate::charts::pool_history,
        crate::journal::history,
        crate::auth::list_tokens,
        crate::auth::create_token,
        crate::auth::revoke_token,
        crate::auth::whoami,
        crate::schedulers::register_scheduler,
        crate::pools::list,
        crate::pools::get_pool,
        crate::pools::get_constraints,
        crate::pools::put_constraints,
        crate::pools::put_bounds,
        crate::pools::report,
        crate::artifacts::push,
        crate::artifacts::read,
        crate::artifacts::manifest,
        crate::artifacts::announce,
        crate::warm::warm,
        openapi_json,
        healthz,
        readyz,
        metrics,
    ),
    modifiers(&BearerAuth, &CommonRefusals)
)]
pub struct ApiDoc;

/// `GET /healthz` (every Flotilla process serves it, from `flotilla_obs`).
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, description = "`ok`: the process runs", content_type = "text/plain", body = String)))]
#[allow(dead_code, reason = "documents a route flotilla_obs serves")]
fn healthz() {}

/// `GET /readyz`.
#[utoipa::path(get, path = "/readyz", tag = "meta", responses((status = 200, description = "`{\"ready\": true}`", body = Object), (status = 503, description = "`{\"ready\": false, \"reason\"}`: a gate is not open (a scheduler's view or store)", body = Object)))]
#[allow(dead_code, reason = "documents a route flotilla_obs serves")]
fn readyz() {}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", tag = "meta", responses((status = 200, description = "Prometheus text exposition (docs/metrics.md lists the families)", content_type = "text/plain", body = String)))]
#[allow(dead_code, reason = "documents a route flotilla_obs serves")]
fn metrics() {}

/// `GET /openapi.json`.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", responses((status = 200, description = "this document", content_type = "application/json")))]
pub(crate) async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

/// The document, with this build's version.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

pub fn routes() -> axum::Router<Arc<ControlState>> {
    axum::Router::new().route("/openapi.json", axum::routing::get(openapi_json))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.route("PATH", …)` of the API's source, with its methods.
    fn routes_in_source() -> Vec<(String, Vec<String>)> {
        let mut found = Vec::new();
        let mut files = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for piece in text.split(".route(\"").skip(1) {
                let (path, rest) = piece.split_once('"').unwrap();
                // One route a line: its methods are on it.
                let call = rest.lines().next().unwrap_or_default();
                let methods = ["get", "put", "post", "delete"]
                    .iter()
                    .filter(|m| call.contains(&format!("{m}(")))
                    .map(|m| m.to_string())
                    .collect();
                found.push((path.to_string(), methods));
            }
        }
        found
    }

    #[test]
    fn every_route_of_the_api_is_in_the_document() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        let routes = routes_in_source();
        assert!(routes.len() > 30, "{routes:?}");
        for (path, methods) in routes {
            // The dashboard's page and files are not API (and this test's own text is no route).
            if path == "/" || path.starts_with("/ui/") || !path.starts_with('/') {
                continue;
            }
            let Some(item) = paths.get(&path) else { panic!("{path} is not in /openapi.json") };
            for m in methods {
                assert!(item.get(&m).is_some(), "{m} {path} is not in /openapi.json");
            }
        }
    }

    #[test]
    fn every_documented_path_is_a_route() {
        let routes: Vec<String> = routes_in_source().into_iter().map(|(p, _)| p).collect();
        let doc = serde_json::to_value(document()).unwrap();
        for path in doc["paths"].as_object().unwrap().keys() {
            // flotilla_obs serves these three on every process.
            let served_elsewhere = ["/healthz", "/readyz", "/metrics"].contains(&path.as_str());
            assert!(served_elsewhere || routes.contains(path), "{path} is documented but no route serves it");
        }
    }

    #[test]
    fn every_operation_documents_its_errors_and_names_its_token() {
        let doc = serde_json::to_value(document()).unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                assert!(responses.keys().any(|c| c.starts_with('2')), "{method} {path}: no success answer");
                if method != "get" {
                    assert!(op.get("security").is_some(), "{method} {path}: a change that names no token");
                }
                // The tracker's announce takes an agent's join-token proof, not an API
                // token: there is no scope to lack, so no 403.
                let scoped = !path.ends_with("/announce");
                if method != "get" || op.get("security").is_some() {
                    for code in ["401", "403"].into_iter().filter(|c| scoped || *c == "401") {
                        assert!(responses.contains_key(code), "{method} {path}: no {code}");
                    }
                }
                for code in ["413", "429"] {
                    assert!(responses.contains_key(code), "{method} {path}: no {code} (the common refusals)");
                }
            }
        }
    }
}
