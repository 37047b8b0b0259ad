//! Comparing secrets (join tokens, bearer tokens), reading them from an `Authorization`
//! header, and holding one that rotates while the process runs.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

/// A bearer token that a reload may replace while requests read it, so a rotation never
/// needs a restart. Clones share the token; reads take no lock.
#[derive(Clone, Default)]
pub struct SharedToken(Arc<ArcSwapOption<String>>);

impl SharedToken {
    pub fn new(token: Option<String>) -> Self {
        SharedToken(Arc::new(ArcSwapOption::new(token.map(Arc::new))))
    }

    /// The token now (`None`: none is required or sent).
    pub fn get(&self) -> Option<Arc<String>> {
        self.0.load_full()
    }

    pub fn set(&self, token: Option<String>) {
        self.0.store(token.map(Arc::new));
    }
}

impl std::fmt::Debug for SharedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.load().is_some() { "SharedToken(<redacted>)" } else { "SharedToken(None)" })
    }
}

/// Compares without leaking where the first difference is.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is matched without
/// regard to case (RFC 7235: `bearer` and `BEARER` are `Bearer` too), and any run of
/// spaces may separate it from the token; `None` for another scheme or no token.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::{SharedToken, bearer_token, constant_time_eq};

    #[test]
    fn a_shared_token_is_replaced_for_every_clone_and_never_printed() {
        let t = SharedToken::new(Some("old".into()));
        let reader = t.clone();
        t.set(Some("new".into()));
        assert_eq!(reader.get().as_deref().map(String::as_str), Some("new"));
        assert_eq!(format!("{reader:?}"), "SharedToken(<redacted>)");
        t.set(None);
        assert_eq!(reader.get(), None);
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for v in ["Bearer t0k", "bearer t0k", "BEARER t0k", "bEaReR  t0k"] {
            assert_eq!(bearer_token(v), Some("t0k"), "{v}");
        }
        for v in ["Basic t0k", "Bearer", "Bearer ", "Bearert0k", "t0k", ""] {
            assert_eq!(bearer_token(v), None, "{v}");
        }
    }

    #[test]
    fn equal_only_when_every_byte_and_the_length_match() {
        assert!(constant_time_eq(b"token", b"token"));
        assert!(!constant_time_eq(b"token", b"tokem"));
        assert!(!constant_time_eq(b"token", b"token2"));
        assert!(constant_time_eq(b"", b""));
    }
}
