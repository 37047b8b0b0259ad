//! Who may change things: the API token every mutating call carries.

use axum::http::HeaderMap;

use crate::{ControlError, ControlState};

/// Checks `Authorization: Bearer <token>` for mutating calls (the serving layer checked
/// it already, before reading the body: see [`crate::limits`]).
pub fn authorize(s: &ControlState, headers: &HeaderMap) -> Result<(), ControlError> {
    match s.api_token.get() {
        Some(want) => crate::limits::check_token(&want, headers),
        None => Ok(()),
    }
}

/// The name a change is recorded under (`history` shows it): the API's one token is
/// `api-token`; an API without a token records none.
pub fn caller(s: &ControlState, headers: &HeaderMap) -> Option<String> {
    crate::limits::carries_token(&s.api_token, headers).then(|| "api-token".to_string())
}
