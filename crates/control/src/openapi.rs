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
        crate::logs::member_logs,
        crate::autoscaling::decisions,
        crate::autoscaling::demand,
        crate::autoscaling::capacity,
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
        openapi_json,
    ),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

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
    fn every_operation_documents_its_errors_and_names_its_token() {
        let doc = serde_json::to_value(document()).unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                assert!(responses.keys().any(|c| c.starts_with('2')), "{method} {path}: no success answer");
                if method != "get" || op.get("security").is_some() {
                    for code in ["401", "403"] {
                        assert!(responses.contains_key(code), "{method} {path}: no {code}");
                    }
                }
            }
        }
    }
}
