//! How an app's units stand, for `scale --wait` and `apply --wait`.

use serde_json::Value;

use super::http::{Api, Refused};

/// How an app's units stand against its desired count, as one line; done when
/// `running == desired` and nothing is queued, starting or stopping. With
/// `template`, only units of that spec template count as running (`apply --wait`),
/// and none of an older one may be left.
pub async fn app_progress(
    api: &Api,
    app: &str,
    template: Option<&str>,
    want: &(dyn Fn(u64) -> bool + Send + Sync),
) -> anyhow::Result<(bool, String)> {
    let summary = api.get(&format!("/v1/apps/{app}")).await?;
    let units = api.get(&format!("/v1/apps/{app}/units")).await?;
    if let Some(t) = template
        && let Some(why) = rollout_failed(&summary, t)
    {
        // Waiting cannot help: give up at once, as on a 4xx.
        return Err(Refused { status: reqwest::StatusCode::CONFLICT, message: why }.into());
    }
    let desired = summary["desired_units"].as_u64().unwrap_or(0);
    let p = UnitCounts::of(units.as_array().map(Vec::as_slice).unwrap_or_default(), template);
    let done = want(desired) && p.done(desired);
    Ok((done, p.line(app, desired, template.is_some())))
}

/// Why the rollout to `template` cannot finish, from the app's summary: it failed, or
/// the app reverted to another spec.
fn rollout_failed(summary: &Value, template: &str) -> Option<String> {
    let r = &summary["rollout"];
    if r["template"].as_str() == Some(template) && r["state"] == "failed" {
        return Some(format!("the rollout failed: {}", r["reason"].as_str().unwrap_or("")));
    }
    let spec = &summary["spec"];
    if spec["source"] == "revert" && spec["template"].as_str().is_some_and(|t| t != template) {
        return Some(format!("the app reverted to the last spec that ran: {}", spec["reason"].as_str().unwrap_or("")));
    }
    None
}

/// An app's units by what `--wait` reports of them.
#[derive(Debug, Default, PartialEq)]
pub struct UnitCounts {
    pub running: u64,
    /// Placing, allocated, starting or degraded.
    pub starting: u64,
    pub queued: u64,
    /// Draining or stopping, or replaced and about to be.
    pub stopping: u64,
    /// Active but on an older spec template (apply).
    pub old: u64,
    pub failed: u64,
    /// Why a queued unit is not placed, when its scheduler said.
    pub why_queued: Option<String>,
}

impl UnitCounts {
    pub fn of(units: &[Value], template: Option<&str>) -> UnitCounts {
        let mut c = UnitCounts::default();
        for u in units {
            let state = u["state"].as_str().unwrap_or("");
            let replaced = !u["replaced_by"].is_null();
            let current = template.is_none_or(|t| u["template"].as_str() == Some(t));
            match state {
                "terminated" => {}
                "failed" => c.failed += 1,
                "draining" | "stopping" => c.stopping += 1,
                _ if replaced => c.stopping += 1,
                _ if !current => c.old += 1,
                "running" => c.running += 1,
                "queued" => {
                    c.queued += 1;
                    if c.why_queued.is_none() {
                        c.why_queued = u["unplaced_reason"].as_str().map(str::to_string);
                    }
                }
                _ => c.starting += 1,
            }
        }
        c
    }

    pub fn done(&self, desired: u64) -> bool {
        self.running == desired && self.starting == 0 && self.queued == 0 && self.stopping == 0 && self.old == 0
    }

    /// `echo: 3/6 units running, 1 starting, 2 queued`.
    pub fn line(&self, app: &str, desired: u64, rollout: bool) -> String {
        let new = if rollout { " on the new spec" } else { "" };
        let mut s = format!("{app}: {}/{desired} units running{new}", self.running);
        for (n, what) in [
            (self.starting, "starting"),
            (self.queued, "queued"),
            (self.old, "on the old spec"),
            (self.stopping, "stopping"),
            (self.failed, "failed"),
        ] {
            if n > 0 {
                s.push_str(&format!(", {n} {what}"));
            }
        }
        if let Some(why) = &self.why_queued {
            s.push_str(&format!(" (queued: {why})"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unit_counts_decide_when_a_wait_is_over() {
        let u = |state: &str, template: &str| json!({"state": state, "template": template, "replaced_by": null});
        let units = vec![u("running", "b"), u("running", "a"), u("queued", "b"), u("terminated", "a")];
        let c = UnitCounts::of(&units, None);
        assert_eq!((c.running, c.queued), (2, 1));
        assert!(!c.done(2));
        assert_eq!(c.line("echo", 3, false), "echo: 2/3 units running, 1 queued");
        let c = UnitCounts::of(&units, Some("b"));
        assert_eq!((c.running, c.old, c.queued), (1, 1, 1));
        assert!(!c.done(2));
        let mut replaced = u("running", "a");
        replaced["replaced_by"] = json!("echo-9");
        let c = UnitCounts::of(&[u("running", "b"), u("running", "b"), replaced], Some("b"));
        assert_eq!((c.running, c.stopping), (2, 1));
        assert!(!c.done(2));
        assert!(UnitCounts::of(&[u("running", "b"), u("running", "b")], Some("b")).done(2));
    }
}
