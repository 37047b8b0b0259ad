//! `[[unit.ROLE.artifacts]]`: what a member needs fetched before it starts (issue #38).

use serde::{Deserialize, Serialize};

/// `[[unit.ROLE.artifacts]]`: a file the member needs, named by its sha256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactSpec {
    /// `flotilla://sha256:HEX` (pushed with `flotilla artifact push`), `http://…` or `https://…`.
    pub source: String,
    pub sha256: String,
    /// Relative to the member's working directory: a file name, or a directory ending in
    /// `/` (the artifact unpacked there, or kept in it under its own name).
    pub dest: String,
    /// `tar`, `tar.gz`, `tar.zst` or `zip`; unset (or `none`): kept as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpack: Option<String>,
    /// Octal permission bits (`"0755"`); artifacts are read-only, so only the execute
    /// bits take effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// A member's artifacts, at most.
pub const MAX_ARTIFACTS: usize = 16;

impl ArtifactSpec {
    pub(super) fn validate(&self, path: &str, errors: &mut Vec<String>) {
        let digest = flotilla_artifact::Digest::parse(&self.sha256);
        if let Err(e) = &digest {
            errors.push(format!("{path}.sha256: {e}"));
        }
        match flotilla_artifact::Source::parse(&self.source) {
            Err(e) => errors.push(format!("{path}.source: {e}")),
            Ok(flotilla_artifact::Source::Cluster(d)) if digest.as_ref().is_ok_and(|s| *s != d) => {
                errors.push(format!("{path}.source: names {d}, but sha256 is {}", self.sha256))
            }
            Ok(_) if self.source.len() > 2048 => errors.push(format!("{path}.source: longer than 2048 bytes")),
            Ok(_) => {}
        }
        if let Some(problem) = dest_problem(&self.dest) {
            errors.push(format!("{path}.dest: {problem}"));
        }
        if let Some(u) = self.unpack.as_deref().filter(|u| *u != "none")
            && let Err(e) = flotilla_artifact::unpack::Format::parse(u)
        {
            errors.push(format!("{path}.unpack: {e}"));
        }
        if let Some(m) = &self.mode
            && u32::from_str_radix(m, 8).map_or(true, |v| v > 0o777)
        {
            errors.push(format!("{path}.mode: {m:?} is not octal permission bits like \"0755\""));
        }
    }

    /// As a member's workload carries it.
    pub fn wire(&self) -> flotilla_proto::v1::Artifact {
        flotilla_proto::v1::Artifact {
            source: self.source.clone(),
            sha256: self.sha256.to_ascii_lowercase(),
            dest: self.dest.clone(),
            unpack: self.unpack.clone().filter(|u| u != "none").unwrap_or_default(),
            mode: self.mode_bits(),
        }
    }

    /// The permission bits (`0o644` when unset or malformed, which validation refuses).
    pub fn mode_bits(&self) -> u32 {
        self.mode.as_deref().and_then(|m| u32::from_str_radix(m, 8).ok()).unwrap_or(0o644)
    }
}

impl super::AppSpec {
    /// Every artifact its members use, once each by digest and unpacking: what
    /// `flotilla artifact warm` fetches ahead of a scale-up.
    pub fn artifacts(&self) -> Vec<flotilla_proto::v1::Artifact> {
        let mut out: Vec<flotilla_proto::v1::Artifact> = Vec::new();
        for a in self.templates().into_iter().flat_map(|(_, _, t)| &t.artifacts).map(ArtifactSpec::wire) {
            if !out.iter().any(|o| o.sha256 == a.sha256 && o.unpack == a.unpack) {
                out.push(a);
            }
        }
        out
    }
}

/// Why `dest` cannot name a place under a member's working directory.
fn dest_problem(dest: &str) -> Option<String> {
    let trimmed = dest.trim_end_matches('/');
    if trimmed.is_empty() {
        return Some("must name a file or a directory (`model/`)".into());
    }
    if dest.len() > 255 {
        return Some("longer than 255 bytes".into());
    }
    if dest.starts_with('/') {
        return Some(format!("{dest:?} must be relative to the member's working directory"));
    }
    if trimmed.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Some(format!("{dest:?} must not hold `.`, `..` or empty components"));
    }
    if matches!(trimmed.split('/').next(), Some("stdout.log" | "stderr.log" | "stdout.log.1" | "stderr.log.1")) {
        return Some(format!("{dest:?} is where the member's logs go"));
    }
    None
}

#[cfg(test)]
mod tests {
    const BASE: &str = r#"
name = "a"
[units]
min = 1
max = 1
initial = 1
[unit]
workers = 0
[unit.head]
command = "x"
cpu = "100m"
memory = "1Mi"
"#;

    #[test]
    fn every_bad_artifact_is_named_at_once() {
        let h = "a".repeat(64);
        let spec = format!(
            r#"{BASE}
[[unit.head.artifacts]]
source = "ftp://x/y"
sha256 = "abc"
dest = "/etc/passwd"
unpack = "rar"
mode = "0999"
[[unit.head.artifacts]]
source = "flotilla://sha256:{b}"
sha256 = "{h}"
dest = "../up"
[[unit.head.artifacts]]
source = "https://example.com/m.bin"
sha256 = "{h}"
dest = "models/"
[[unit.head.artifacts]]
source = "https://example.com/n.bin"
sha256 = "{h}"
dest = "models"
"#,
            b = "b".repeat(64)
        );
        let err = crate::AppSpec::parse(&spec).unwrap_err().to_string();
        for want in [
            "unit.head.artifacts[0].sha256: a sha256 is 64 hex digits",
            "unit.head.artifacts[0].source: \"ftp://x/y\"",
            "unit.head.artifacts[0].dest: \"/etc/passwd\" must be relative",
            "unit.head.artifacts[0].unpack:",
            "unit.head.artifacts[0].mode: \"0999\"",
            "unit.head.artifacts[1].source: names sha256:bbbb",
            "unit.head.artifacts[1].dest: \"../up\" must not hold",
            "unit.head.artifacts[3].dest: \"models\" is another artifact's dest too",
        ] {
            assert!(err.contains(want), "missing {want:?} in:\n{err}");
        }
        let unknown = format!(
            "{BASE}\n[[unit.head.artifacts]]\nsource = \"https://h/x\"\nsha256 = \"{h}\"\ndest = \"x\"\nsize = 3\n"
        );
        assert!(crate::AppSpec::parse(&unknown).unwrap_err().to_string().contains("unknown field `size`"));
        let good = format!(
            "{BASE}\n[[unit.head.artifacts]]\nsource = \"https://h/x.tgz\"\nsha256 = \"{h}\"\ndest = \"code/\"\nunpack = \"tar.gz\"\nmode = \"0755\"\n"
        );
        let spec = crate::AppSpec::parse(&good).unwrap();
        assert_eq!(spec.unit.head.artifacts[0].mode_bits(), 0o755);
    }
}
