//! Who may change things: the API's own token (`api-token`, the `admin` scope) and the
//! named tokens of the tokens file ([`crate::tokens`]), each with its scopes and apps.

use std::sync::Arc;

use axum::http::HeaderMap;

use crate::answers::{CreatedToken, GrantRow, Revoked, TokenList, Whoami};
use crate::catalogue as m;
use crate::tokens::{Grant, Scope};
use crate::{ControlError, ControlState};

/// Checks the caller's token for a call that needs `scope` (about `app`, when it is
/// about one): 401 without a valid token, 403 naming what it lacks. Returns the
/// token's name, recorded with what it changes (none when the API is open).
pub fn authorize(
    s: &ControlState,
    headers: &HeaderMap,
    scope: Scope,
    app: Option<&str>,
) -> Result<Option<String>, ControlError> {
    let Some(grant) = s.credentials().grant(headers).map_err(crate::limits::unauthenticated)? else { return Ok(None) };
    if let Some(why) = grant.refuses(scope, app) {
        metrics::counter!(m::API_FORBIDDEN.name, "scope" => scope.as_str()).increment(1);
        crate::limits::rejected("forbidden");
        return Err(ControlError::Forbidden(why));
    }
    Ok(Some(grant.name.clone()))
}

/// Reads of what an app's members wrote (its logs, which may hold what it should show
/// no one): any valid token, if it is not limited to other apps. The token's name.
pub fn authorize_app_read(s: &ControlState, headers: &HeaderMap, app: &str) -> Result<Option<String>, ControlError> {
    let Some(grant) = s.credentials().grant(headers).map_err(crate::limits::unauthenticated)? else { return Ok(None) };
    if let Some(why) = grant.app_limit(Some(app), "read the logs of") {
        metrics::counter!(m::API_FORBIDDEN.name, "scope" => Scope::Read.as_str()).increment(1);
        crate::limits::rejected("forbidden");
        return Err(ControlError::Forbidden(why));
    }
    Ok(Some(grant.name.clone()))
}

/// `GET /v1/tokens`, `POST /v1/tokens`, `DELETE /v1/tokens/{name}` (admin) and
/// `GET /v1/whoami` (anyone: what the caller's token may do, for the dashboard).
pub fn routes() -> axum::Router<Arc<ControlState>> {
    use axum::routing::{delete, get};
    axum::Router::new()
        .route("/v1/tokens", get(list_tokens).post(create_token))
        .route("/v1/tokens/{name}", delete(revoke_token))
        .route("/v1/whoami", get(whoami))
}

fn scope_names(scopes: &std::collections::BTreeSet<Scope>) -> Vec<String> {
    scopes.iter().map(|s| s.as_str().to_string()).collect()
}

fn grant_row(g: &Grant) -> GrantRow {
    GrantRow {
        name: g.name.clone(),
        scopes: scope_names(&g.scopes),
        apps: g.apps.as_ref().map(|a| a.iter().cloned().collect()),
    }
}

#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])),
    responses((status = 200, description = "scope admin", body = crate::answers::TokenList), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody)))]
pub(crate) async fn list_tokens(
    axum::extract::State(s): axum::extract::State<Arc<ControlState>>,
    headers: HeaderMap,
) -> Result<axum::Json<TokenList>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/tokens").increment(1);
    authorize(&s, &headers, Scope::Admin, None)?;
    let tokens = s.tokens.book().grants().iter().map(|g| grant_row(g)).collect();
    Ok(axum::Json(TokenList { file: s.tokens.file().map(|f| f.display().to_string()), tokens }))
}

/// `{"name", "scopes": [...], "apps": [...]}`; `apps` left out: every app.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewToken {
    name: String,
    scopes: Vec<String>,
    #[serde(default)]
    apps: Option<Vec<String>>,
}

/// Makes a named token; the answer holds the token, which is never shown again (the
/// file keeps its hash). Who made it is logged and counted.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])), request_body = NewToken,
    responses((status = 200, description = "scope admin; the token is in this answer only", body = crate::answers::CreatedToken), (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
              (status = 409, description = "`no_tokens_file`", body = crate::answers::ErrorBody), (status = 422, description = "an unknown scope or a taken name", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "create_token", skip_all)]
pub(crate) async fn create_token(
    axum::extract::State(s): axum::extract::State<Arc<ControlState>>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<NewToken>, crate::body::BodyRejection>,
) -> Result<axum::Json<CreatedToken>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/tokens").increment(1);
    let by = authorize(&s, &headers, Scope::Admin, None)?;
    let expected = "expected {\"name\": NAME, \"scopes\": [read|operate|deploy|admin, ...], \"apps\": [APP, ...]}";
    let crate::body::JsonBody(t) = body.map_err(|e| e.expecting(expected))?;
    let token = s.tokens.create(&t.name, &t.scopes, t.apps.clone())?;
    metrics::counter!(m::TOKENS_CHANGED.name, "action" => "create").increment(1);
    metrics::gauge!(m::TOKENS.name).set(s.tokens.book().grants().len() as f64);
    tracing::info!(name = %t.name, scopes = ?t.scopes, apps = ?t.apps, by = ?by, "API token created");
    let what = format!(
        "token {} created: {} on {}",
        t.name,
        t.scopes.join(", "),
        t.apps.as_ref().map_or("every app".into(), |a| a.join(", "))
    );
    s.journal.action("token", None, by, what);
    Ok(axum::Json(CreatedToken { name: t.name, scopes: t.scopes, apps: t.apps, token }))
}

#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "tokens", security(("bearer" = [])), params(("name" = String, Path)),
    responses((status = 200, description = "scope admin", body = crate::answers::Revoked), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody), (status = 404, description = "`no_such_token`", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "revoke_token", skip(s, headers))]
pub(crate) async fn revoke_token(
    axum::extract::State(s): axum::extract::State<Arc<ControlState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Result<axum::Json<Revoked>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/tokens/{name}").increment(1);
    let by = authorize(&s, &headers, Scope::Admin, None)?;
    s.tokens.revoke(&name)?;
    metrics::counter!(m::TOKENS_CHANGED.name, "action" => "revoke").increment(1);
    metrics::gauge!(m::TOKENS.name).set(s.tokens.book().grants().len() as f64);
    tracing::info!(%name, by = ?by, "API token revoked");
    s.journal.action("token", None, by, format!("token {name} revoked"));
    Ok(axum::Json(Revoked { name, revoked: true }))
}

/// What the caller's token may do: `{"name","scopes","apps","open"}`. Without a valid
/// token: no name and only `read`; an API with no token at all is `open` (everything).
#[utoipa::path(get, path = "/v1/whoami", tag = "tokens", responses((status = 200, body = crate::answers::Whoami)))]
pub(crate) async fn whoami(
    axum::extract::State(s): axum::extract::State<Arc<ControlState>>,
    headers: HeaderMap,
) -> axum::Json<Whoami> {
    let creds = s.credentials();
    let (grant, open) = match creds.carried(&headers) {
        _ if !creds.configured() => (Grant::admin(""), true),
        Some(g) => ((*g).clone(), false),
        None => (Grant { name: String::new(), scopes: [Scope::Read].into(), apps: None }, false),
    };
    let GrantRow { name, scopes, apps } = grant_row(&grant);
    axum::Json(Whoami { name: (!name.is_empty()).then_some(name), scopes, apps, open })
}
