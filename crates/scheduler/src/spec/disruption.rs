//! `[disruption]`: how far the scheduler may disturb a running app to move its units
//! where they should be (`crate::rebalance`). Every move is make before break, so
//! these bound how much is in motion, not how much is down.

use flotilla_autoscale::Span;
use serde::{Deserialize, Serialize};

/// Longest `quiet_period`.
const MAX_QUIET_SECS: u64 = 7 * 86_400;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disruption {
    /// Units moving at once: a replacement coming up, or the unit it replaced draining.
    #[serde(default = "one")]
    pub max_moving: u32,
    /// Nothing moves while fewer of the app's desired units than this run (`"90%"`):
    /// a degraded app is repaired first, not rearranged.
    #[serde(default = "default_min_available")]
    pub min_available: String,
    /// `on` (default) or `off`; off, `flotilla rebalance APP --plan` still shows what
    /// would move.
    #[serde(default)]
    pub rebalance: Switch,
    /// A unit placed (or moved) more recently than this does not move: nothing moves
    /// twice within it, and new placements are given time to settle.
    #[serde(default = "default_quiet_period")]
    pub quiet_period: Span,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    #[default]
    On,
    Off,
}

fn one() -> u32 {
    1
}

fn default_min_available() -> String {
    "90%".into()
}

fn default_quiet_period() -> Span {
    Span::secs(600)
}

impl Default for Disruption {
    fn default() -> Self {
        Disruption {
            max_moving: 1,
            min_available: default_min_available(),
            rebalance: Switch::On,
            quiet_period: default_quiet_period(),
        }
    }
}

impl Disruption {
    /// Left out of the canonical spec when nothing is set, so a spec written before
    /// `[disruption]` existed keeps its fingerprint.
    pub fn is_default(&self) -> bool {
        *self == Disruption::default()
    }

    /// `min_available` as a fraction of 1 (validated: 0..=1).
    pub fn min_available_fraction(&self) -> f64 {
        percent(&self.min_available).unwrap_or(1.0)
    }

    pub(super) fn validate(&self, e: &mut Vec<String>) {
        if self.max_moving == 0 {
            e.push("disruption.max_moving: must be at least 1".into());
        } else if self.max_moving > flotilla_core::MAX_UNITS {
            e.push(format!("disruption.max_moving: {} (at most {})", self.max_moving, flotilla_core::MAX_UNITS));
        }
        if let Err(why) = percent(&self.min_available) {
            e.push(format!("disruption.min_available: {why}"));
        }
        if self.quiet_period.as_secs() > MAX_QUIET_SECS {
            e.push(format!("disruption.quiet_period: {} (at most 7d)", self.quiet_period));
        }
    }
}

/// `"90%"` as 0.9: a percentage from 0 to 100.
pub(super) fn percent(text: &str) -> Result<f64, String> {
    let n =
        text.trim().strip_suffix('%').ok_or_else(|| format!("{text:?} is not a percentage (write it like \"90%\")"))?;
    let v: f64 = n.trim().parse().map_err(|_| format!("{text:?} is not a percentage (write it like \"90%\")"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{text:?} must be from 0% to 100%"));
    }
    Ok(v / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::AppSpec;

    const ECHO: &str = include_str!("../../../../examples/echo.toml");

    #[test]
    fn disruption_has_defaults_round_trips_and_names_every_bad_field_at_once() {
        let s = AppSpec::parse(ECHO).unwrap();
        assert!(s.disruption.is_default());
        assert_eq!((s.disruption.max_moving, s.disruption.min_available_fraction()), (1, 0.9));
        assert_eq!((s.disruption.rebalance, s.disruption.quiet_period.as_secs()), (Switch::On, 600));
        assert!(!toml::to_string(&s).unwrap().contains("disruption"), "left out: old fingerprints hold");
        let set =
            "\n[disruption]\nmax_moving = 2\nmin_available = \"50%\"\nrebalance = \"off\"\nquiet_period = \"90s\"\n";
        let t = AppSpec::parse(&format!("{ECHO}{set}")).unwrap();
        assert_eq!((t.disruption.max_moving, t.disruption.min_available_fraction()), (2, 0.5));
        assert_eq!((t.disruption.rebalance, t.disruption.quiet_period.as_secs()), (Switch::Off, 90));
        assert_eq!(AppSpec::parse(&toml::to_string(&t).unwrap()).unwrap(), t, "round-trips");
        assert_eq!(t.fingerprints().template, s.fingerprints().template, "nothing rolls for it");
        let bad = "\n[disruption]\nmax_moving = 0\nmin_available = \"150%\"\nquiet_period = \"30d\"\n";
        let err = AppSpec::parse(&format!("{ECHO}{bad}")).unwrap_err().to_string();
        for field in ["disruption.max_moving", "disruption.min_available", "disruption.quiet_period"] {
            assert!(err.contains(field), "{field}: {err}");
        }
        let err = AppSpec::parse(&format!("{ECHO}\n[disruption]\nmin_available = \"most\"\n")).unwrap_err();
        assert!(err.to_string().contains("\"most\" is not a percentage"), "{err}");
        let err = AppSpec::parse(&format!("{ECHO}\n[disruption]\nrebalance = \"maybe\"\n")).unwrap_err();
        assert!(err.to_string().contains("rebalance"), "{err}");
    }

    #[test]
    fn percentages_are_checked() {
        assert_eq!(percent("90%"), Ok(0.9));
        assert_eq!(percent(" 100 %"), Ok(1.0));
        assert_eq!(percent("0%"), Ok(0.0));
        for bad in ["90", "150%", "-1%", "x%", "NaN%", ""] {
            assert!(percent(bad).is_err(), "{bad}");
        }
    }
}
