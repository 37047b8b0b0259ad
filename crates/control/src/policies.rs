//! Named autoscaling policies (`flotilla policy apply FILE`), as Dataproc keeps them: an
//! app names one (`autoscaling_policy = "NAME"`), and changing it changes every app that
//! uses it at its next evaluation. The control plane holds them (in `DATA/policies/` when
//! it has a data dir); the schedulers it hosts read the same book, and standalone
//! schedulers refresh theirs from `GET /v1/policies`.

use crate::catalogue as m;
use flotilla_core::RwLockExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use flotilla_autoscale::{Policy, policy_file_from_toml};
use flotilla_scheduler::PolicyBook;
use serde_json::Value;

use crate::ControlError;

/// Most named policies one control plane holds.
pub const MAX_POLICIES: usize = 1024;

#[derive(Default)]
pub struct Policies {
    book: PolicyBook,
    /// Each policy's file as applied (TOML), for `GET /v1/policies`.
    texts: RwLock<BTreeMap<String, String>>,
    dir: Option<PathBuf>,
}

/// A policy file (`[autoscaling]` with its `name`, and optionally the `[sim]` model
/// `flotilla sim` reads), validated in full as `flotilla sim` validates it.
fn parse(text: &str) -> Result<(String, Policy), ControlError> {
    let (policy, _model) = policy_file_from_toml(text).map_err(|e| ControlError::InvalidPolicy(e.to_string()))?;
    let name = policy
        .name
        .as_deref()
        .ok_or_else(|| ControlError::InvalidPolicy("autoscaling.name: a named policy needs a name".into()))?
        .to_string();
    Ok((name, policy))
}

impl Policies {
    /// The policies kept in `dir` (created if missing); every file must be valid.
    pub fn open(dir: PathBuf) -> anyhow::Result<Policies> {
        std::fs::create_dir_all(&dir)?;
        let p = Policies { dir: Some(dir.clone()), ..Default::default() };
        let mut entries: Vec<_> = std::fs::read_dir(&dir)?.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for path in entries.into_iter().filter(|p| p.extension().is_some_and(|e| e == "toml")) {
            let text = std::fs::read_to_string(&path)?;
            let (name, policy) = parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            p.insert(name, policy, text);
        }
        Ok(p)
    }

    /// The book the schedulers of this process read.
    pub fn book(&self) -> PolicyBook {
        self.book.clone()
    }

    fn insert(&self, name: String, policy: Policy, text: String) {
        let mut book = BTreeMap::clone(&self.book.load());
        book.insert(name.clone(), policy);
        self.book.store(Arc::new(book));
        self.texts.write_or_recover().insert(name, text);
    }

    /// Validates and stores a policy file, under the name it gives (which must be `name`).
    pub fn apply(&self, name: &str, text: &str) -> Result<(), ControlError> {
        let (named, policy) = parse(text)?;
        if named != name {
            return Err(ControlError::InvalidPolicy(format!(
                "autoscaling.name: the file names {named:?}, not {name:?}"
            )));
        }
        let known = self.texts.read_or_recover().contains_key(name);
        if !known && self.book.load().len() >= MAX_POLICIES {
            return Err(ControlError::InvalidPolicy(format!("at most {MAX_POLICIES} named policies")));
        }
        if let Some(dir) = &self.dir {
            flotilla_obs::fsutil::write_atomic(&dir.join(format!("{name}.toml")), text.as_bytes(), 0o644)
                .map_err(|e| ControlError::Storage(e.to_string()))?;
        }
        tracing::info!(policy = name, "named autoscaling policy applied");
        metrics::counter!(m::POLICIES_APPLIED.name).increment(1);
        self.insert(name.to_string(), policy, text.to_string());
        Ok(())
    }

    /// Replaces every policy with `files` (a standalone scheduler following its control
    /// plane); a file that does not validate is skipped and logged.
    pub fn replace_all(&self, files: &[String]) {
        let mut book = BTreeMap::new();
        let mut texts = BTreeMap::new();
        for text in files {
            match parse(text) {
                Ok((name, policy)) => {
                    book.insert(name.clone(), policy);
                    texts.insert(name, text.clone());
                }
                Err(e) => tracing::warn!(error = %e, "skipping a named policy the control plane sent"),
            }
        }
        if *self.book.load_full() != book {
            self.book.store(Arc::new(book));
        }
        *self.texts.write_or_recover() = texts;
    }

    /// `GET /v1/policies`: each policy's name, algorithm, interval and file.
    pub fn list(&self) -> Value {
        let book = self.book.load();
        let texts = self.texts.read_or_recover();
        let rows: Vec<crate::answers::PolicyRow> = book
            .iter()
            .map(|(name, p)| crate::answers::PolicyRow {
                name: name.clone(),
                policy: p.algorithm.name().to_string(),
                interval_ms: p.interval_ms,
                toml: texts.get(name).cloned(),
            })
            .collect();
        crate::answers::to_json(&rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARED: &str = r#"
[autoscaling]
name = "shared"
policy = "utilization"
[autoscaling.utilization]
scale_in_threshold_percent = 30
max_units = 10

[sim]
startup_seconds = 30
"#;

    #[test]
    fn a_policy_is_kept_on_disk_and_read_back() {
        let dir = std::env::temp_dir().join(format!("flotilla-policies-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = Policies::open(dir.clone()).unwrap();
        p.apply("shared", SHARED).unwrap();
        assert!(p.book().load().contains_key("shared"));
        let again = Policies::open(dir.clone()).unwrap();
        assert_eq!(again.list()[0]["policy"], "utilization");
        assert_eq!(again.list()[0]["toml"], SHARED);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_policy_names_every_problem_and_changes_nothing() {
        let p = Policies::default();
        let bad =
            SHARED.replace("scale_in_threshold_percent = 30", "scale_in_threshold_percent = 300\nscheme = \"median\"");
        let e = p.apply("shared", &bad).unwrap_err().to_string();
        assert!(e.contains("scale_in_threshold_percent") && e.contains("scheme"), "{e}");
        assert!(p.apply("other", SHARED).unwrap_err().to_string().contains("not \"other\""));
        assert!(p.apply("x", "[nope]\n").is_err());
        assert!(p.book().load().is_empty());
    }
}
