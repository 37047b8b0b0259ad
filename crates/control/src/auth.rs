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
