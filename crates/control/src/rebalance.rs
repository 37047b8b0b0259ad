//! `GET /v1/apps/{app}/rebalance`: what moving the app's units to better places would do
//! now (`flotilla rebalance APP --plan`), as its scheduler last looked. Apps whose
//! scheduler runs elsewhere are asked there.

use crate::catalogue as m;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;

use crate::apps::not_found;
use crate::forward::remote;
use crate::{ControlError, ControlState};

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new().route("/v1/apps/{app}/rebalance", get(rebalance_plan))
}

#[utoipa::path(get, path = "/v1/apps/{app}/rebalance", tag = "apps", params(("app" = String, Path)),
    responses((status = 200, description = "the units that would move, where to, and the score of each place before and after; why nothing may move now (the disruption budget)", body = Object), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn rebalance_plan(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/rebalance").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => Ok(Json(serde_json::to_value(h.rebalance().as_ref()).unwrap_or_default())),
        Some(Err(url)) => Ok(Json(remote(&s.http, &url, &format!("/v1/apps/{app}/rebalance")).await?)),
        None => Err(not_found(&app)),
    }
}
