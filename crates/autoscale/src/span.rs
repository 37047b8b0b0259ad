//! Durations in policy files: whole seconds, written `"10s"`, `"2m"`, `"1h30m"`, `"1d"` or
//! a bare number of seconds, and written back in the short form.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

pub(crate) const DAY: u64 = 86_400;

/// A span of whole seconds, written `"2m"`, `"1h30m"`, `"1d"` or `120`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span(u64);

impl Span {
    pub const fn secs(secs: u64) -> Self {
        Span(secs)
    }
    pub const fn as_secs(self) -> u64 {
        self.0
    }
    pub const fn as_ms(self) -> u64 {
        self.0.saturating_mul(1000)
    }
}

impl FromStr for Span {
    type Err = String;
    /// The one duration grammar (`flotilla_core::duration`), in whole seconds: a policy
    /// counts seconds, so `1500ms` is refused rather than rounded.
    fn from_str(s: &str) -> Result<Self, String> {
        let d = flotilla_core::duration::parse(s)?;
        if d.subsec_nanos() != 0 {
            return Err(format!("{:?}: policies count whole seconds", s.trim()));
        }
        Ok(Span(d.as_secs()))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0s");
        }
        let mut rest = self.0;
        for (unit, name) in [(DAY, "d"), (3600, "h"), (60, "m"), (1, "s")] {
            if rest >= unit {
                write!(f, "{}{name}", rest / unit)?;
                rest %= unit;
            }
        }
        Ok(())
    }
}

impl Serialize for Span {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Span;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"10s\", \"2m\", \"1d\" or whole seconds")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Span, E> {
                Ok(Span(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Span, E> {
                u64::try_from(v).map(Span).map_err(|_| E::custom(format!("invalid duration {v}: negative")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Span, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}
