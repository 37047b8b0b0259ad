//! Spec env values that look like secrets, hidden from readers without the API token.
//! Reading a spec needs no token (the dashboard shows it to anyone who reaches the API),
//! but `env = { DB_PASSWORD = "…" }` should not be: the value is replaced by
//! [`REDACTED`] in the text served, everything else (comments, layout) kept. A spec
//! sent back with the placeholder is refused, so a redacted copy cannot overwrite the
//! real value.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// What a hidden value reads as.
pub const REDACTED: &str = "<redacted: read the spec with the API token>";

/// Whether an env key names a secret: a part (split at `_`, `-`, `.`) that is `KEY`,
/// `AUTH`, `PRIVATE`, `PASS` or `PWD`, or a key holding `SECRET`, `TOKEN`, `PASSWORD`,
/// `PASSWD`, `CREDENTIAL` or `APIKEY` anywhere (`DB_PASSWORD`, `HF_TOKEN`,
/// `AWS_SECRET_ACCESS_KEY`, `REDIS_PASS`). `PWD` alone is the working directory.
pub fn is_secret_key(key: &str) -> bool {
    let upper = key.to_ascii_uppercase();
    const ANYWHERE: [&str; 6] = ["SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "APIKEY"];
    const PARTS: [&str; 5] = ["KEY", "AUTH", "PRIVATE", "PASS", "PWD"];
    upper != "PWD"
        && (ANYWHERE.iter().any(|w| upper.contains(w)) || upper.split(['_', '-', '.']).any(|p| PARTS.contains(&p)))
}

/// A spec change (`history`, `apply --plan`) with its values hidden when its setting is
/// an env value [`redact`] would hide (`unit.head.env.DB_PASSWORD`): that it changed
/// stays visible, what it holds does not.
pub fn redact_change(c: &mut flotilla_scheduler::diff::Change) {
    let mut parts = c.path.rsplit('.');
    let (key, table) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if table != "env" {
        return;
    }
    let secret = is_secret_key(key) || [&c.before, &c.after].into_iter().flatten().any(|v| has_url_credentials(v));
    if secret {
        let hidden = format!("\"{REDACTED}\"");
        for v in [&mut c.before, &mut c.after].into_iter().flatten() {
            *v = hidden.clone();
        }
    }
}

/// Whether a value carries credentials in a URL (`postgres://user:pass@host/db`).
fn has_url_credentials(value: &str) -> bool {
    value.split("://").skip(1).any(|rest| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        authority.contains('@')
    })
}

/// `spec` with every string value of an `env` table whose key looks like a secret, or
/// that holds URL credentials, replaced by [`REDACTED`]. Text that does not parse as
/// TOML (a stored spec always does) is not shown at all: what it hides cannot be told.
pub fn redact(spec: &str) -> String {
    let Ok(doc) = DeTable::parse(spec) else {
        return format!("# {REDACTED}: this text is not TOML, so what it holds cannot be hidden\n");
    };
    let mut spans = Vec::new();
    walk(doc.get_ref(), false, &mut spans);
    spans.sort_by_key(|r| std::cmp::Reverse(r.start));
    let mut out = spec.to_string();
    let quoted = format!("\"{REDACTED}\"");
    for r in spans {
        if out.is_char_boundary(r.start) && r.end <= out.len() && out.is_char_boundary(r.end) {
            out.replace_range(r, &quoted);
        }
    }
    out
}

/// Collects the spans of secret values: `in_env` says `table` is an `env` table.
fn walk(table: &DeTable, in_env: bool, spans: &mut Vec<Range<usize>>) {
    for (k, v) in table.iter() {
        let key = k.get_ref().as_ref();
        match v.get_ref() {
            DeValue::String(s) if in_env && (is_secret_key(key) || has_url_credentials(s)) => spans.push(v.span()),
            DeValue::Table(t) => walk(t, key == "env", spans),
            DeValue::Array(items) => {
                for item in items.iter() {
                    if let DeValue::Table(t) = item.get_ref() {
                        walk(t, false, spans);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_secret_shows_that_it_changed_not_what_it_holds() {
        let diff = flotilla_scheduler::diff::spec_diff(
            "[unit.head.env]\nDB_PASSWORD = \"a\"\nURL = \"postgres://u:p@db/x\"\nLEVEL = \"info\"\n",
            "[unit.head.env]\nDB_PASSWORD = \"b\"\nURL = \"postgres://db/x\"\nLEVEL = \"debug\"\n",
        );
        let shown: Vec<String> = diff
            .into_iter()
            .map(|mut c| {
                redact_change(&mut c);
                flotilla_scheduler::diff::render(&[c]).remove(0)
            })
            .collect();
        let hidden = format!("\"{REDACTED}\"");
        assert_eq!(
            shown,
            vec![
                format!("unit.head.env.DB_PASSWORD: {hidden} → {hidden}"),
                "unit.head.env.LEVEL: \"info\" → \"debug\"".to_string(),
                format!("unit.head.env.URL: {hidden} → {hidden}"),
            ]
        );
    }

    #[test]
    fn secret_looking_keys() {
        for k in [
            "DB_PASSWORD",
            "HF_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "OPENAI_API_KEY",
            "apikey",
            "Basic-Auth",
            "PRIVATE_PEM",
            "REDIS_PASS",
            "MYSQL_PWD",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["PATH", "PWD", "RAY_ADDRESS", "MONKEY", "AUTHOR", "LOG_LEVEL", "KEYBOARD_LAYOUT", "PASSAGE"] {
            assert!(!is_secret_key(k), "{k}");
        }
    }

    #[test]
    fn only_secret_env_values_are_replaced_and_the_rest_is_kept_byte_for_byte() {
        let spec = r#"name = "echo" # the app
token = "not an env table, kept"

[unit.head]
command = "python3"
env = { DB_PASSWORD = 'hunter2', LOG_LEVEL = "info" }

[unit.worker.env]
HF_TOKEN = """hf_abc"""   # the model hub
RAY_ADDRESS = "auto"
DATABASE_URL = "postgres://app:s3cret@db:5432/app"
PLAIN_URL = "http://example.com/a@b"
"#;
        let out = redact(spec);
        assert!(!out.contains("hunter2") && !out.contains("hf_abc") && !out.contains("s3cret"), "{out}");
        assert_eq!(out.matches(REDACTED).count(), 3, "{out}");
        assert!(out.contains("PLAIN_URL = \"http://example.com/a@b\""), "an @ in a path is no credential: {out}");
        for kept in [
            r#"token = "not an env table, kept""#,
            r#"LOG_LEVEL = "info""#,
            "RAY_ADDRESS = \"auto\"",
            "# the model hub",
        ] {
            assert!(out.contains(kept), "{kept}: {out}");
        }
        // Still TOML, with the placeholder where the secrets were.
        let back: toml::Table = toml::from_str(&out).unwrap();
        assert_eq!(back["unit"]["worker"]["env"]["HF_TOKEN"].as_str(), Some(REDACTED));
        assert!(!redact("not = [toml, password").contains("password"), "unparsed text is not shown");
    }
}
