//! Standalone schedulers registering their API (`POST /v1/schedulers`, from `flotilla
//! scheduler --control URL`). The control plane will call that URL on every request for
//! the app, so what it accepts is narrow: a plain http(s) base, never a link-local or
//! cloud metadata address, within `--scheduler-networks` when given (names resolved and
//! every address checked), and listing itself as the scheduler of that app before it is
//! used (a control plane's own URL does not: it lists the app unreachable, `forward_loop`,
//! or not at all). One process registers every app it leads in one call.

use flotilla_core::RwLockExt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use crate::answers::{ErrorDetail, RefusedApp, RegistrationAnswer};
use crate::apps::AppEndpoint;
use crate::auth::authorize;
use crate::catalogue as m;
use crate::forward::{answers_as_scheduler, by_app};
use crate::{ControlError, ControlState};
use flotilla_core::ServiceError;

/// How long the URL has to answer the registration's check.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new().route("/v1/schedulers", axum::routing::post(register_scheduler))
}

/// The address ranges a scheduler's API may be in (`--scheduler-networks`); empty: any
/// but link-local ones.
#[derive(Debug, Clone, Default)]
pub struct SchedulerNetworks(Vec<ipnet::IpNet>);

impl SchedulerNetworks {
    /// From CIDRs (`10.0.0.0/8`) or single addresses.
    pub fn new<S: AsRef<str>>(nets: impl IntoIterator<Item = S>) -> Result<Self, String> {
        nets.into_iter()
            .map(|n| {
                let n = n.as_ref().trim();
                n.parse::<ipnet::IpNet>()
                    .or_else(|_| n.parse::<IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| format!("--scheduler-networks {n:?}: not a CIDR (10.0.0.0/8) or an address"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(SchedulerNetworks)
    }

    /// Why `ip` may not be a scheduler's address, if it may not.
    pub fn refuses(&self, ip: IpAddr) -> Option<String> {
        // A cloud's instance metadata service (169.254.169.254, fd00:ec2::254) answers any
        // GET with credentials: never a scheduler, and never to be polled on a caller's word.
        let link_local = match ip {
            IpAddr::V4(ip) => ip.is_link_local(),
            IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
                Some(v4) => v4.is_link_local(),
                None => ip.is_unicast_link_local() || ip.segments()[..2] == [0xfd00, 0x0ec2],
            },
        };
        if link_local {
            return Some(format!("{ip} is a link-local or cloud metadata address, never a scheduler"));
        }
        if !self.0.is_empty() && !self.0.iter().any(|n| n.contains(&ip)) {
            return Some(format!("{ip} is outside --scheduler-networks"));
        }
        None
    }
}

/// The most apps one registration names: as many as one scheduler process hosts.
pub const MAX_REGISTERED_APPS: usize = 10_000;

/// `{"app", "url"}` for one app, or `{"apps": [...], "url"}` for every app a process
/// leads, in one call (`flotilla scheduler --apps-dir` re-registers them all every 5 s).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Registration {
    #[serde(default)]
    app: Option<String>,
    #[serde(default)]
    apps: Vec<String>,
    url: String,
}

impl Registration {
    /// The apps it names (checked as app names, without repeats), and whether it is the
    /// one-app form (answered 204, or with the app's refusal as the error).
    fn apps(&mut self) -> Result<(Vec<String>, bool), String> {
        let one = match (self.app.take(), self.apps.is_empty()) {
            (Some(app), true) => {
                self.apps.push(app);
                true
            }
            (None, false) => false,
            (Some(_), false) => return Err("give \"app\" or \"apps\", not both".into()),
            (None, true) => return Err("no app: give \"app\" or a non-empty \"apps\"".into()),
        };
        if self.apps.len() > MAX_REGISTERED_APPS {
            return Err(format!("{} apps, more than {MAX_REGISTERED_APPS} in one registration", self.apps.len()));
        }
        if let Some(bad) = self.apps.iter().find(|a| !flotilla_core::is_name(a)) {
            return Err(format!(
                "app {bad:?}: 1..=63 of a-z, 0-9 and '-', not starting with '-' (as an app spec's name)"
            ));
        }
        let mut apps = std::mem::take(&mut self.apps);
        apps.sort_unstable();
        apps.dedup();
        Ok((apps, one))
    }
}

#[utoipa::path(post, path = "/v1/schedulers", tag = "apps", security(("bearer" = [])), request_body = Registration,
    responses((status = 204, description = "the one app (`app`) registered (scope admin); a standalone scheduler registers again every 5 s"),
              (status = 200, description = "`apps`: how many registered, and each refused app with its error (`conflict`: it runs in this process; `not_a_scheduler`: the URL does not list it as its scheduler)", body = crate::answers::RegistrationAnswer),
              (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
              (status = 409, description = "`app` runs in this process", body = crate::answers::ErrorBody), (status = 422, description = "`not_a_scheduler`: the URL does not answer as `app`'s scheduler", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "register_scheduler", skip_all)]
pub(crate) async fn register_scheduler(
    State(s): State<Arc<ControlState>>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<Registration>, crate::body::BodyRejection>,
) -> Result<Response, ControlError> {
    authorize(&s, &headers, crate::tokens::Scope::Admin, None)?;
    let crate::body::JsonBody(mut r) = body?;
    let (apps, one) = r.apps().map_err(ControlError::BadRequest)?;
    let url = scheduler_url(&r.url).map_err(|why| ControlError::BadRequest(format!("url {:?}: {why}", r.url)))?;
    let mut refused: Vec<(String, ControlError)> = Vec::new();
    let (mut accepted, mut new) = (Vec::new(), Vec::new());
    {
        let g = s.apps.0.read_or_recover();
        for app in apps {
            match g.get(&app) {
                Some(AppEndpoint::Local(_)) => refused.push((app.clone(), ControlError::AppRunsHere(app))),
                // A scheduler re-registers every few seconds: only a new URL is checked.
                Some(AppEndpoint::Remote { url: u, .. }) if *u == url => accepted.push(app),
                _ => new.push(app),
            }
        }
    }
    if !new.is_empty() {
        let verdicts = check(&s, &new, &url, &headers).await;
        for (app, verdict) in new.into_iter().zip(verdicts) {
            let result = if verdict.is_ok() { "accepted" } else { "refused" };
            metrics::counter!(m::SCHEDULER_REGISTRATIONS.name, "result" => result).increment(1);
            match verdict {
                Ok(()) => accepted.push(app),
                Err(why) => {
                    tracing::warn!(%app, %url, %why, "refused a scheduler registration");
                    refused.push((app.clone(), ControlError::NotAScheduler { app, url: url.clone(), why }));
                }
            }
        }
    }
    if let Some(replicas) = &s.replicas
        && !accepted.is_empty()
    {
        replicas.put_schedulers(&accepted, &url).await?;
    }
    {
        let mut g = s.apps.0.write_or_recover();
        let seen = Instant::now();
        for app in &accepted {
            g.insert(app.clone(), AppEndpoint::Remote { url: url.clone(), seen });
        }
    }
    if one {
        return match refused.pop() {
            Some((_, e)) => Err(e),
            None => Ok(StatusCode::NO_CONTENT.into_response()),
        };
    }
    let refused = refused
        .into_iter()
        .map(|(app, e)| RefusedApp { app, error: ErrorDetail { code: e.code().to_string(), message: e.to_string() } })
        .collect();
    Ok(Json(crate::answers::to_json(&RegistrationAnswer { registered: accepted.len(), refused })).into_response())
}

/// Whether each of `apps` may be served from `url`: every address of `url`'s host is
/// allowed, and one `GET url/v1/apps` lists the app as its scheduler (its summary,
/// naming the app and its scheduler instance). Called with the registering caller's
/// token and the hop header, so a control plane's own URL cannot forward it on (it
/// lists such an app unreachable, `forward_loop`, or not at all).
async fn check(s: &ControlState, apps: &[String], url: &str, headers: &HeaderMap) -> Vec<Result<(), String>> {
    match listing(s, url, headers).await {
        Ok(rows) => by_app(rows, apps)
            .into_iter()
            .zip(apps)
            .map(|(row, app)| match row {
                Some(row) if answers_as_scheduler(&row, app) => Ok(()),
                Some(row) => {
                    let code = row.pointer("/error/code").and_then(Value::as_str).unwrap_or("no scheduler summary");
                    Err(format!("GET /v1/apps lists it without its scheduler ({code})"))
                }
                None => Err("GET /v1/apps does not list it (no_such_app)".to_string()),
            })
            .collect(),
        Err(why) => apps.iter().map(|_| Err(why.clone())).collect(),
    }
}

/// The rows of `GET url/v1/apps`, once the URL's addresses are found allowed.
async fn listing(s: &ControlState, url: &str, headers: &HeaderMap) -> Result<Vec<Value>, String> {
    let u = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    let host = u.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let port = u.port_or_known_default().unwrap_or(80);
    let ips: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| format!("resolving {host} took over {} s", HANDSHAKE_TIMEOUT.as_secs()))?
            .map_err(|e| format!("resolving {host}: {e}"))?
            .map(|a| a.ip())
            .collect(),
    };
    if let Some(why) = ips.iter().find_map(|ip| s.scheduler_networks.refuses(*ip)) {
        return Err(why);
    }
    let mut req = s
        .http
        .get(format!("{}/v1/apps", url.trim_end_matches('/')))
        .header(crate::limits::HOP_HEADER, "1")
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
        req = req.header(axum::http::header::AUTHORIZATION, v.clone());
    }
    let resp = req.send().await.map_err(|e| format!("GET /v1/apps failed: {e}"))?;
    let status = resp.status();
    let v: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let code = v.pointer("/error/code").and_then(Value::as_str).unwrap_or("no JSON error");
        return Err(format!("GET /v1/apps answered {status} ({code})"));
    }
    match v {
        Value::Array(rows) => Ok(rows),
        _ => Err("GET /v1/apps did not answer with a list of apps".to_string()),
    }
}

/// A standalone scheduler's base URL as the control plane will use it: http or https,
/// with a host, no credentials, query or fragment, and a plain path (no `.` or `..`
/// segment, no escapes or backslashes) so that what is appended to it stays under it.
fn scheduler_url(url: &str) -> Result<String, &'static str> {
    if url.len() > 256 {
        return Err("longer than 256 bytes");
    }
    if url.contains(['%', '\\', '?', '#', '@']) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("escapes, backslashes, credentials, a query or a fragment are not accepted");
    }
    let u = reqwest::Url::parse(url).map_err(|_| "not a URL")?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err("not an http or https URL");
    }
    let host = u.host_str().unwrap_or_default();
    if host.is_empty() {
        return Err("no host");
    }
    let ip = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok();
    if ip.is_some_and(|ip| SchedulerNetworks::default().refuses(ip).is_some())
        || host.eq_ignore_ascii_case("metadata.google.internal")
    {
        return Err("a link-local or cloud metadata address is never a scheduler");
    }
    let path = url.split_once("://").map_or("", |(_, rest)| rest.split_once('/').map_or("", |(_, p)| p));
    if path.split('/').any(|seg| seg == "." || seg == "..") {
        return Err("a '.' or '..' path segment");
    }
    Ok(u.as_str().trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduler_url_is_a_plain_http_base() {
        assert_eq!(scheduler_url("http://127.0.0.1:7899"), Ok("http://127.0.0.1:7899".into()));
        assert_eq!(scheduler_url("https://sched.example:443/"), Ok("https://sched.example".into()));
        assert_eq!(scheduler_url("http://10.0.0.5:8080/prefix"), Ok("http://10.0.0.5:8080/prefix".into()));
        for bad in [
            "ftp://h",
            "http://",
            "127.0.0.1:7899",
            "http://h/../x",
            "http://h/a/./b",
            "http://h/%2e%2e/x",
            "http://h\\..\\x",
            "http://u:p@h",
            "http://h/?x=1",
            "http://h/#f",
            "http://h /x",
            "http://169.254.169.254/latest",
            "http://[fe80::1]:80",
            "http://[fd00:ec2::254]",
            "http://metadata.google.internal",
        ] {
            assert!(scheduler_url(bad).is_err(), "{bad}");
        }
        assert!(scheduler_url(&format!("http://{}", "a".repeat(260))).is_err());
    }

    #[test]
    fn scheduler_networks_bound_the_addresses_a_scheduler_may_have() {
        let any = SchedulerNetworks::default();
        assert!(any.refuses("10.1.2.3".parse().unwrap()).is_none());
        assert!(any.refuses("169.254.169.254".parse().unwrap()).is_some());
        let some = SchedulerNetworks::new(["10.0.0.0/8", "192.168.1.7", "fd12::/16"]).unwrap();
        for ok in ["10.200.0.1", "192.168.1.7", "fd12::5"] {
            assert!(some.refuses(ok.parse().unwrap()).is_none(), "{ok}");
        }
        assert!(any.refuses("::ffff:169.254.169.254".parse().unwrap()).is_some(), "mapped IPv4");
        for bad in ["11.0.0.1", "192.168.1.8", "127.0.0.1", "169.254.1.1"] {
            assert!(some.refuses(bad.parse().unwrap()).is_some(), "{bad}");
        }
        assert!(SchedulerNetworks::new(["10.0.0.0/33"]).is_err());
        assert!(SchedulerNetworks::new(["a.example"]).is_err());
    }
}
