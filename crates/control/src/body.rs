//! JSON request bodies, read one way on every route. A body without a Content-Type is
//! JSON (what a quick `curl -X PUT --data-binary @f.json` sends); `application/json` and
//! any `+json` type are JSON; any other type is refused with a JSON 415 that names the
//! one accepted (curl's `-d` sends `application/x-www-form-urlencoded` unless told).

use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::ControlError;

/// A request body read as JSON into `T`.
pub struct JsonBody<T>(pub T);

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyRejection {
    /// Sent with a Content-Type that is not JSON.
    NotJson(String),
    /// Not the JSON expected, or a body that broke off.
    Unreadable(String),
}

impl BodyRejection {
    /// The API's error, saying what a readable body looks like.
    pub fn expecting(self, what: &str) -> ControlError {
        match self {
            BodyRejection::Unreadable(why) => ControlError::BadRequest(format!("{what}: {why}")),
            other => other.into(),
        }
    }
}

impl From<BodyRejection> for ControlError {
    fn from(r: BodyRejection) -> Self {
        match r {
            BodyRejection::NotJson(got) => ControlError::NotJson { got },
            BodyRejection::Unreadable(why) => ControlError::BadRequest(why),
        }
    }
}

/// A handler that takes `JsonBody<T>` itself (not a `Result`) answers as the API does.
impl axum::response::IntoResponse for BodyRejection {
    fn into_response(self) -> axum::response::Response {
        ControlError::from(self).into_response()
    }
}

/// Whether a Content-Type value names JSON (parameters such as `charset` aside).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = BodyRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(ct) = req.headers().get(CONTENT_TYPE) {
            let ct = String::from_utf8_lossy(ct.as_bytes()).into_owned();
            if !is_json(&ct) {
                return Err(BodyRejection::NotJson(ct));
            }
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| BodyRejection::Unreadable(e.body_text()))?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| BodyRejection::Unreadable(format!("the body is not the JSON expected: {}", json_error(&e))))
    }
}

/// serde's message, except that a number too large for a whole-number field (JSON
/// reads it as a float) is said so, not quoted as the float it became
/// (`18446744073709552000` for 2^64).
fn json_error(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.strip_prefix("invalid type: floating point `").and_then(|r| r.split_once("`, expected ")) {
        Some((_, expected)) => format!("a number out of range or not whole, expected {expected}"),
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_too_large_for_its_field_is_said_so() {
        #[derive(Debug, serde::Deserialize)]
        struct Scale {
            #[allow(dead_code)]
            units: u32,
        }
        let e = serde_json::from_str::<Scale>(r#"{"units": 18446744073709551616}"#).unwrap_err();
        let msg = json_error(&e);
        assert!(msg.starts_with("a number out of range or not whole, expected u32"), "{msg}");
        assert!(!msg.contains("18446744073709552000"), "{msg}");
        let e = serde_json::from_str::<Scale>(r#"{"units": "x"}"#).unwrap_err();
        assert_eq!(json_error(&e), e.to_string(), "other errors as serde says them");
    }

    #[test]
    fn json_types_are_json_whatever_their_parameters() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/merge-patch+json"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("text/json+"));
    }
}
