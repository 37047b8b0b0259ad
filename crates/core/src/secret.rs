//! Comparing secrets (join tokens, bearer tokens) and reading them from an
//! `Authorization` header.

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
    use super::{bearer_token, constant_time_eq};

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
