//! The control API target: one request through the real router and handlers.

use std::sync::Arc;

use crate::API_TOKEN;

/// Control API input: `[selector, body...]`. Selector bits 0-1 pick the call (0 `PUT
/// /v1/apps/echo/scale`, 1 `POST /v1/schedulers`, 2 `PUT /v1/apps/echo/spec`, 3 `POST
/// /v1/nodes/{body}` where the body is `NODE/ACTION`); bits 2-3 the credential (0 the
/// right bearer token, 1 none, 2 a wrong one); bit 4 sends the body as `text/plain`
/// rather than JSON (a body with no content type at all is JSON).
/// With bit 5 set, bit 0 picks a pool call instead (4 `PUT /v1/pools/default/constraints`,
/// 5 `POST /v1/pools/default/report`) and bit 1 names an invalid pool (`bad.pool`).
/// Each input gets a fresh control plane with no apps and no shards, so nothing is
/// forwarded anywhere; the request goes through the real router and handlers. A
/// registration's check calls the URL it names: only loopback addresses are allowed
/// (`scheduler_networks`), and one naming a host (which would need DNS) is skipped.
pub fn control_json(data: &[u8]) {
    use axum::http::{Method, Request, StatusCode, header};
    use tower::ServiceExt;

    thread_local! {
        static RUNTIME: tokio::runtime::Runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        // A registration's check (a GET of the URL, refused on loopback at once).
        static HTTP: reqwest::Client =
            reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("a client");
    }
    let Some((&sel, body)) = data.split_first() else { return };
    let (auth, json, pool_call) = ((sel >> 2) & 3, sel & 0x10 == 0, sel & 0x20 != 0);
    let call = if pool_call { 4 + (sel & 1) } else { sel & 3 };
    let pool = if pool_call && sel & 2 != 0 { "bad.pool" } else { "default" };
    let (method, uri) = match call {
        0 => (Method::PUT, "/v1/apps/echo/scale".to_string()),
        1 => (Method::POST, "/v1/schedulers".to_string()),
        2 => (Method::PUT, "/v1/apps/echo/spec".to_string()),
        3 => match std::str::from_utf8(body) {
            Ok(path) => (Method::POST, format!("/v1/nodes/{path}")),
            Err(_) => return,
        },
        4 => (Method::PUT, format!("/v1/pools/{pool}/constraints")),
        _ => (Method::POST, format!("/v1/pools/{pool}/report")),
    };
    let mut req = Request::builder().method(method).uri(uri);
    req = req.header(header::CONTENT_TYPE, if json { "application/json" } else { "text/plain" });
    match auth {
        0 => req = req.header(header::AUTHORIZATION, format!("Bearer {API_TOKEN}")),
        1 => {}
        _ => req = req.header(header::AUTHORIZATION, "Bearer not-the-token"),
    }
    if call == 1 && !names_an_address(body) {
        return;
    }
    let body = if call == 3 { Vec::new() } else { body.to_vec() };
    let Ok(req) = req.body(axum::body::Body::from(body.clone())) else { return }; // not a valid URI
    let state = Arc::new(flotilla_control::ControlState {
        cluster: flotilla_view::ClusterView::new(1),
        shards: vec![],
        api_token: flotilla_core::SharedToken::new(Some(API_TOKEN.into())),
        tokens: Default::default(),
        journal: Default::default(),
        series: Default::default(),
        apps: Default::default(),
        scheduler_networks: flotilla_control::SchedulerNetworks::new(["127.0.0.0/8", "::1"]).expect("networks"),
        http: HTTP.with(Clone::clone),
        dialer: Default::default(),
        policies: Default::default(),
        pools: Default::default(),
        replicas: None,
        artifacts: None,
    });
    let router = flotilla_control::router(state);
    let (status, content_type, bytes) = RUNTIME.with(|rt| {
        rt.block_on(async move {
            let resp = router.oneshot(req).await.expect("the router is infallible");
            let status = resp.status();
            let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("a response body");
            (status, ct, bytes)
        })
    });
    let text = String::from_utf8_lossy(&bytes);
    assert!(!status.is_server_error(), "{status} for {call}: {text}");
    // No app runs and no shard holds a node: only a registration and the pool calls can
    // succeed.
    if call >= 4 {
        check_pool_call(call, auth == 0 && json && pool == "default", &body, status, &bytes);
    } else if call == 1 {
        assert!(status == StatusCode::NO_CONTENT || status.is_client_error(), "{status}: {text}");
    } else {
        assert!(status.is_client_error(), "{status} for call {call}: {text}");
    }
    // The handlers read the body themselves (a spec's only once it is text), so a wrong
    // credential is refused before anything is parsed.
    if auth != 0 && (call < 2 || call >= 4 || (call == 2 && std::str::from_utf8(&body).is_ok())) {
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
    }
    // Every refusal of ours is `{"error": {"code", "message"}}`.
    if status.is_client_error() && (call < 2 || call >= 4 || content_type.as_deref() == Some("application/json")) {
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {text}"));
        let e = &v["error"];
        assert!(e["code"].is_string() && e["message"].is_string(), "an error without code or message: {text}");
    }
}

/// Whether a registration body's `url` (if it has one) names its host by address: a name
/// would be resolved, which a fuzzer must not do.
fn names_an_address(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return true };
    let Some(url) = v.get("url").and_then(serde_json::Value::as_str) else { return true };
    match reqwest::Url::parse(url) {
        Ok(u) => u.host_str().is_none_or(|h| h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok()),
        Err(_) => true,
    }
}

/// A pool call (4 constraints, 5 report) with the right token, the JSON content type
/// and a valid pool name (`may`) succeeds exactly when its body is valid, and answers
/// with the floor; anything else is refused.
fn check_pool_call(call: u8, may: bool, body: &[u8], status: axum::http::StatusCode, answer: &[u8]) {
    use flotilla_pool::model::Constraints;
    let text = String::from_utf8_lossy(answer);
    let valid = if call == 4 {
        serde_json::from_slice::<Constraints>(body).is_ok_and(|c| c.validate().is_ok())
    } else {
        serde_json::from_slice::<serde_json::Value>(body)
            .is_ok_and(|v| v.is_object() && v.get("instances").is_some_and(serde_json::Value::is_array))
    };
    if !(may && valid) {
        assert!(status.is_client_error(), "{status} for pool call {call}: {text}");
        return;
    }
    assert_eq!(status, axum::http::StatusCode::OK, "{text}");
    let v: serde_json::Value = serde_json::from_slice(answer).unwrap_or_else(|e| panic!("{e}: {text}"));
    if call == 4 {
        // The floor set is the floor answered.
        let sent: Constraints = serde_json::from_slice(body).expect("it was valid");
        let got: Constraints = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(got, sent);
    } else {
        // A fresh control plane has no floor for the pool.
        let got: Constraints =
            serde_json::from_value(v["constraints"].clone()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(got, Constraints::default(), "{text}");
    }
}
