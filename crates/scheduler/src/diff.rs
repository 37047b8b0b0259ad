//! What changed between two specs, setting by setting (`history` and `apply --plan`
//! show it). Specs are compared as the values they hold, not as text: a key path
//! (`unit.head.cpu`) per setting, so a reordered table or a reformatted file changes
//! nothing, and each change reads as one line.

use std::collections::BTreeMap;

use serde::Serialize;

/// One setting that differs: absent on one side when it was added or removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// Dotted key path (`unit.head.env.MODEL`, `units.max`).
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// The settings that differ between `before` and `after` (TOML texts), in key order.
/// A text that does not parse counts as empty: every setting of the other is a change.
pub fn spec_diff(before: &str, after: &str) -> Vec<Change> {
    let (old, new) = (flatten(before), flatten(after));
    let mut changes: Vec<Change> = old
        .iter()
        .filter(|(k, v)| new.get(*k) != Some(v))
        .map(|(k, v)| Change { path: k.clone(), before: Some(v.clone()), after: new.get(k).cloned() })
        .collect();
    changes.extend(new.iter().filter(|(k, _)| !old.contains_key(*k)).map(|(k, v)| Change {
        path: k.clone(),
        before: None,
        after: Some(v.clone()),
    }));
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    changes
}

/// Every leaf of a TOML document under its dotted path, rendered as TOML. Arrays are
/// leaves (`routing.roles = ["head"]`): an element's position is not a name a reader
/// could follow.
fn flatten(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        walk("", &table, &mut out);
    }
    out
}

fn walk(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) {
    for (k, v) in table {
        let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(t) => walk(&path, t, out),
            v => {
                out.insert(path, v.to_string());
            }
        }
    }
}

/// One line per change: `path: before → after`, `+ path = value`, `- path = value`.
pub fn render(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match (&c.before, &c.after) {
            (Some(b), Some(a)) => format!("{}: {b} → {a}", c.path),
            (None, Some(a)) => format!("+ {} = {a}", c.path),
            (Some(b), None) => format!("- {} = {b}", c.path),
            (None, None) => c.path.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_added_and_removed_settings_are_named_by_path() {
        let before = "name = \"echo\"\n[unit.head]\ncpu = \"100m\"\nenv = { A = \"1\", B = \"2\" }\n";
        let after = "name = \"echo\"\n[unit.head]\ncpu = \"200m\"\nenv = { B = \"2\", C = \"3\" }\n";
        let lines = render(&spec_diff(before, after));
        assert_eq!(
            lines,
            vec!["unit.head.cpu: \"100m\" → \"200m\"", "- unit.head.env.A = \"1\"", "+ unit.head.env.C = \"3\""]
        );
    }

    #[test]
    fn order_and_layout_are_not_changes() {
        let a = "name = \"echo\"\n[units]\nmin = 1\nmax = 2\n";
        let b = "units = { max = 2, min = 1 }\n\n\nname = \"echo\"\n";
        assert!(spec_diff(a, b).is_empty());
    }

    #[test]
    fn arrays_are_one_setting_and_garbage_is_empty() {
        let c = spec_diff("[routing]\nroles = [\"head\"]\n", "[routing]\nroles = [\"head\", \"worker\"]\n");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].path, "routing.roles");
        assert_eq!(
            spec_diff("not toml [", "a = 1"),
            vec![Change { path: "a".into(), before: None, after: Some("1".into()) }]
        );
    }
}
