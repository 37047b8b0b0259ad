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
/// `AUTH` or `PRIVATE`, or a key holding `SECRET`, `TOKEN`, `PASSWORD`, `PASSWD` or
/// `CREDENTIAL` anywhere (`DB_PASSWORD`, `HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `APIKEY`).
pub fn is_secret_key(key: &str) -> bool {
    let upper = key.to_ascii_uppercase();
    const ANYWHERE: [&str; 6] = ["SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "APIKEY"];
    const PARTS: [&str; 3] = ["KEY", "AUTH", "PRIVATE"];
    ANYWHERE.iter().any(|w| upper.contains(w)) || upper.split(['_', '-', '.']).any(|p| PARTS.contains(&p))
}

/// `spec` with the string value of every secret-looking key of an `env` table
/// replaced by [`REDACTED`]. A spec that does not parse is returned as it is (the
/// scheduler stored it, so it parses; this never hides a value by failing).
pub fn redact(spec: &str) -> String {
    let Ok(doc) = DeTable::parse(spec) else { return spec.to_string() };
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
            DeValue::String(_) if in_env && is_secret_key(key) => spans.push(v.span()),
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
    fn secret_looking_keys() {
        for k in [
            "DB_PASSWORD",
            "HF_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "OPENAI_API_KEY",
            "apikey",
            "Basic-Auth",
            "PRIVATE_PEM",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["PATH", "RAY_ADDRESS", "MONKEY", "AUTHOR", "LOG_LEVEL", "KEYBOARD_LAYOUT"] {
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
"#;
        let out = redact(spec);
        assert!(!out.contains("hunter2") && !out.contains("hf_abc"), "{out}");
        assert_eq!(out.matches(REDACTED).count(), 2, "{out}");
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
        assert_eq!(redact("not = [toml"), "not = [toml");
    }
}
