//! The whole metric catalogue of the `flotilla` binary: each crate's families (defined in
//! its `catalogue` module, next to the code that records them) under a section per
//! process, plus the few this binary records itself. `main` installs it before anything
//! records; docs/metrics.md is generated from it (see the tests below).

use flotilla_obs::{Family, Section};

pub const JOIN_TOKENS: Family = Family::gauge(
    "flotilla_join_tokens",
    "Agent join tokens the shards accept now (more than one while a rotation is under way).",
    &[],
);
pub const JOIN_TOKENS_RELOADED: Family = Family::counter(
    "flotilla_join_tokens_reloaded_total",
    "Reads of DATA/join-token (every 10 s and on SIGHUP), by result (changed, unchanged, error).",
    &["result"],
);
pub const GRPC_TOKENS: Family =
    Family::gauge("flotilla_grpc_tokens", "gRPC tokens the shards accept now (more than one while rotating).", &[]);
pub const GRPC_TOKENS_RELOADED: Family = Family::counter(
    "flotilla_grpc_tokens_reloaded_total",
    "Reads of the gRPC token file (DATA/grpc-token, or --grpc-token-file: shards accept its tokens, callers send \
     the first) every 10 s and on SIGHUP, by result (changed, unchanged, error).",
    &["result"],
);
pub const API_TOKEN_RELOADED: Family = Family::counter(
    "flotilla_api_token_reloaded_total",
    "Reads of the API token file (DATA/api-token, or --api-token-file) every 10 s and on SIGHUP, by result \
     (changed, unchanged, error).",
    &["result"],
);
pub const APP_SPECS_REJECTED: Family =
    Family::counter("flotilla_app_specs_rejected_total", "App spec files refused as invalid at startup.", &[]);

pub const APP_START_FAILURES: Family = Family::counter(
    "flotilla_scheduler_app_start_failures_total",
    "Apps of a `scheduler --apps-dir` process whose scheduler could not start (tried again with back-off).",
    &["app"],
);

/// The families the binary's own server code records (token files, spec loading).
pub const FAMILIES: &[Family] = &[
    JOIN_TOKENS,
    JOIN_TOKENS_RELOADED,
    GRPC_TOKENS,
    GRPC_TOKENS_RELOADED,
    API_TOKEN_RELOADED,
    APP_SPECS_REJECTED,
    APP_START_FAILURES,
];

/// Every family any Flotilla process exports, by process. `flotilla up` runs the shards,
/// schedulers and control plane in one process; agents and routers are processes of
/// their own.
pub const SECTIONS: &[Section] = &[
    Section { title: "Every process", families: flotilla_obs::FAMILIES },
    Section {
        title: "Shard (`flotilla aggregator`, crates/aggregator)",
        families: flotilla_aggregator::catalogue::FAMILIES,
    },
    Section {
        title: "Scheduler (`flotilla scheduler`, crates/scheduler)",
        families: flotilla_scheduler::catalogue::FAMILIES,
    },
    Section {
        title: "View follower (schedulers and control plane, crates/view)",
        families: flotilla_view::catalogue::FAMILIES,
    },
    Section {
        title: "Control plane (`flotilla control`, crates/control)",
        families: flotilla_control::catalogue::FAMILIES,
    },
    Section { title: "Server processes (`flotilla up`, `aggregator`, `scheduler`, src)", families: FAMILIES },
    Section {
        title: "Node agent (`flotilla agent`, `flotilla-agent`, crates/agent)",
        families: flotilla_agent::catalogue::FAMILIES,
    },
    Section {
        title: "Node agent's artifacts (its cache and swarm, crates/artifact)",
        families: flotilla_artifact::catalogue::FAMILIES,
    },
    Section { title: "Router (`flotilla route`, crates/router)", families: flotilla_router::catalogue::FAMILIES },
    Section {
        title: "Pool autoscaler (`flotilla autoscaler`, `up --autoscale`, crates/pool)",
        families: flotilla_pool::catalogue::FAMILIES,
    },
];

/// Installs the catalogue in this process's recorder (first thing in `main`).
pub fn install() {
    flotilla_obs::install(SECTIONS);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn catalogued() -> BTreeSet<&'static str> {
        SECTIONS.iter().flat_map(|s| s.families.iter().map(|f| f.name)).collect()
    }

    #[test]
    fn the_catalogue_follows_prometheus_naming() {
        assert_eq!(flotilla_obs::catalogue::problems(SECTIONS), Vec::<String>::new());
    }

    /// docs/metrics.md is the catalogue rendered; `UPDATE_METRICS_DOC=1` writes it anew.
    #[test]
    fn metrics_doc_is_generated_from_the_catalogue() {
        let path = root().join("docs/metrics.md");
        let want = flotilla_obs::catalogue::markdown(SECTIONS);
        if std::env::var_os("UPDATE_METRICS_DOC").is_some() {
            std::fs::write(&path, &want).expect("writing docs/metrics.md");
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/metrics.md is stale: run `UPDATE_METRICS_DOC=1 cargo nextest run -p flotilla --bin flotilla metrics_doc`"
        );
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The sources of every process: the binaries and the crates they link (not the test
    /// kit, the load tests or the fuzzers, which record nothing).
    fn process_sources() -> Vec<PathBuf> {
        let mut files = Vec::new();
        rust_files(&root().join("src"), &mut files);
        rust_files(&root().join("agent/src"), &mut files);
        for e in std::fs::read_dir(root().join("crates")).expect("crates/").flatten() {
            if e.file_name() != "testkit" {
                rust_files(&e.path().join("src"), &mut files);
            }
        }
        files
    }

    /// Every `"flotilla_…"` string in the sources is a catalogued family (the catalogue
    /// modules define the names; call sites use them or, in tests, quote them), and every
    /// metric macro names its family through the catalogue or a catalogued literal.
    #[test]
    fn every_metric_name_in_the_sources_is_catalogued() {
        let known = catalogued();
        let mut unknown = Vec::new();
        let files = process_sources();
        assert!(files.len() > 50, "found the sources: {}", files.len());
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let at = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
            // The catalogue machinery and this test: they quote made-up and old names.
            if at == "crates/obs/src/catalogue.rs" || at == "src/catalogue.rs" {
                continue;
            }
            let literals = text.as_str();
            for (i, _) in literals.match_indices("\"flotilla_") {
                let name: String =
                    text[i + 1..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                // A prefix such as "flotilla_route_" in a test filter is not a name.
                let closed = text[i + 1 + name.len()..].starts_with('"');
                if closed && !name.is_empty() && !known.contains(name.as_str()) {
                    unknown.push(format!("{at}: {name}"));
                }
            }
            for mac in ["counter!(", "gauge!(", "histogram!("] {
                for (i, _) in text.match_indices(mac) {
                    let arg = text[i + mac.len()..].split([',', ')']).next().unwrap_or("").trim();
                    let via_catalogue =
                        arg.ends_with(".name") || (arg.starts_with('"') && known.contains(arg.trim_matches('"')));
                    if !via_catalogue {
                        unknown.push(format!("{at}: {mac}{arg}"));
                    }
                }
            }
        }
        assert!(unknown.is_empty(), "metric names outside the catalogue:\n{}", unknown.join("\n"));
    }

    #[test]
    fn the_renamed_families_are_gone() {
        let known = catalogued();
        for old in ["flotilla_commit_seconds", "flotilla_commit_latency_seconds", "flotilla_conflict_fraction"] {
            assert!(!known.contains(old), "{old}");
        }
        for new in
            ["flotilla_shard_commit_seconds", "flotilla_scheduler_commit_seconds", "flotilla_scheduler_conflict_ratio"]
        {
            assert!(known.contains(new), "{new}");
        }
        let weight = flotilla_router::catalogue::ENDPOINT_WEIGHT;
        assert_eq!((weight.name, weight.labels), ("flotilla_route_endpoint_weight", &["app", "node"][..]));
        let no_endpoint = SECTIONS.iter().flat_map(|s| s.families).all(|f| !f.labels.contains(&"endpoint"));
        assert!(no_endpoint, "no family is labelled by endpoint address");
    }
}
