//! The metric catalogue: every family a Flotilla process exports, described where it is
//! defined. Each crate that emits metrics lists its families in its own `metrics` module
//! as [`Family`] constants and uses their names at the call sites; every binary installs
//! the whole catalogue ([`crate::install`]) before anything records, so `/metrics`
//! carries `# HELP` for each family and each histogram gets buckets fitting its unit.
//! `docs/metrics.md` is generated from the same lists ([`markdown`]).

/// The Prometheus type of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The word Prometheus uses in `# TYPE` lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family: its name, type, help text (one sentence with the unit), label
/// names and, for a histogram, its bucket upper bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub labels: &'static [&'static str],
    /// Upper bounds of the histogram's buckets (empty for counters and gauges).
    pub buckets: &'static [f64],
}

impl Family {
    pub const fn counter(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Family {
        Family { name, kind: Kind::Counter, help, labels, buckets: &[] }
    }

    pub const fn gauge(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Family {
        Family { name, kind: Kind::Gauge, help, labels, buckets: &[] }
    }

    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Family {
        Family { name, kind: Kind::Histogram, help, labels, buckets }
    }

    /// Writes the family's `# HELP` and `# TYPE` lines (for families rendered at scrape
    /// time rather than through the recorder).
    pub fn write_header(&self, out: &mut String) {
        out.push_str("# HELP ");
        out.push_str(self.name);
        out.push(' ');
        out.push_str(&self.help.replace('\\', "\\\\").replace('\n', "\\n"));
        out.push_str("\n# TYPE ");
        out.push_str(self.name);
        out.push(' ');
        out.push_str(self.kind.as_str());
        out.push('\n');
    }

    /// Writes one sample line of this family with `labels` (name, value) in order.
    pub fn write_sample(&self, out: &mut String, labels: &[(&str, &str)], value: f64) {
        out.push_str(self.name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push_str("=\"");
                out.push_str(&v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"));
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        match value {
            v if v.is_nan() => out.push_str("NaN"),
            v if v == f64::INFINITY => out.push_str("+Inf"),
            v if v == f64::NEG_INFINITY => out.push_str("-Inf"),
            v => out.push_str(&v.to_string()),
        }
        out.push('\n');
    }
}

/// Bucket sets, one per unit. A histogram's buckets must span the values it really sees:
/// a bytes histogram on seconds buckets lands wholly in `+Inf`.
pub mod buckets {
    /// Durations from 100 µs (a heartbeat apply) to a minute (a cloud provider call).
    pub const SECONDS: &[f64] = &[
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        60.0,
    ];
    /// Sizes from 256 B to 1 GiB, by factors of 4.
    pub const BYTES: &[f64] = &[
        256.0,
        1024.0,
        4096.0,
        16384.0,
        65536.0,
        262144.0,
        1048576.0,
        4194304.0,
        16777216.0,
        67108864.0,
        268435456.0,
        1073741824.0,
    ];
    /// Counts of things (nodes in a delta, say) from 1 to 100,000, by 1-2-5 steps.
    pub const COUNT: &[f64] = &[
        1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 50000.0,
        100000.0,
    ];
    /// Datagrams received in one system call (the shard reads at most 32 at a time).
    pub const DATAGRAMS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 32.0];
}

/// A titled part of the catalogue: the families one process or crate exports.
#[derive(Debug, Clone, Copy)]
pub struct Section {
    pub title: &'static str,
    pub families: &'static [Family],
}

/// Every way a catalogue can be wrong: a bad name, a counter without `_total`, a
/// histogram without buckets, a family listed twice, help that breaks the table.
pub fn problems(sections: &[Section]) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for s in sections {
        for f in s.families {
            let n = f.name;
            if !(n.starts_with("flotilla_") || n.starts_with("process_"))
                || !n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                out.push(format!("{n}: not a flotilla_ or process_ snake_case name"));
            }
            match f.kind {
                Kind::Counter if !n.ends_with("_total") => out.push(format!("{n}: a counter must end in _total")),
                Kind::Gauge | Kind::Histogram if n.ends_with("_total") => {
                    out.push(format!("{n}: only counters end in _total"))
                }
                _ => {}
            }
            if ["_count", "_sum", "_bucket"].iter().any(|s| n.ends_with(s)) {
                out.push(format!("{n}: _count, _sum and _bucket are a histogram's own series"));
            }
            let sorted = f.buckets.windows(2).all(|w| w[0] < w[1]);
            match f.kind {
                Kind::Histogram if f.buckets.is_empty() || !sorted => {
                    out.push(format!("{n}: a histogram needs increasing buckets"))
                }
                Kind::Counter | Kind::Gauge if !f.buckets.is_empty() => {
                    out.push(format!("{n}: only histograms have buckets"))
                }
                _ => {}
            }
            if f.help.is_empty() || f.help.contains(['|', '\n']) || !f.help.ends_with('.') {
                out.push(format!("{n}: help must be one sentence ending in '.', without '|'"));
            }
            if f.labels.iter().any(|l| *l == "le" || *l == "quantile" || l.is_empty()) {
                out.push(format!("{n}: a reserved or empty label name"));
            }
            // Two processes may export one family (schedulers and routers count route
            // weight changes): then both list the same definition.
            if let Some(other) = seen.insert(n, f)
                && other != f
            {
                out.push(format!("{n}: listed twice with different definitions"));
            }
        }
    }
    out
}

/// `docs/metrics.md`: one table per section (`| Name | Type | Labels | Help |`, the name
/// in backticks), then the buckets of every histogram. Other tools parse the tables:
/// keep the layout.
pub fn markdown(sections: &[Section]) -> String {
    let mut out = String::from(
        "# Metrics\n\n\
         <!-- Generated from the metric catalogue (the `catalogue` module of each crate, listed in\n\
         src/catalogue.rs). Do not edit by hand: run\n\
         `UPDATE_METRICS_DOC=1 cargo nextest run -p flotilla --bin flotilla metrics_doc` to regenerate;\n\
         that test fails while this file is stale. -->\n\n\
         Every Flotilla process serves Prometheus metrics on `/metrics` (the control plane on its API\n\
         port, agents at the address in `DATA/agents/NODE/metrics.addr`, shards, schedulers and\n\
         routers on `--metrics`). Each family below carries `# HELP`; label values are bounded\n\
         (shard indexes, node ids, app, pool and node type names, and fixed enumerations: never\n\
         churning addresses or request ids; only `flotilla route --backends`, which has no nodes,\n\
         names each backend of its fixed list as the `node`). A process exports only the\n\
         families it uses.\n\n\
         Changelog: the issue #16 renames (`flotilla_commit_seconds` to\n\
         `flotilla_shard_commit_seconds`, `flotilla_commit_latency_seconds` to\n\
         `flotilla_scheduler_commit_seconds`, `flotilla_conflict_fraction` to\n\
         `flotilla_scheduler_conflict_ratio`, and the router's `endpoint` label replaced by `app`\n\
         and `node`) keep no aliases: the old names are gone. Also new then:\n\
         `flotilla_shard_recovering` has a `shard` label, the router's\n\
         `flotilla_route_weight_changes_total` an `app` label, and `flotilla_route_endpoint_weight`\n\
         is read from the router's table at scrape time (the series of a node whose endpoints all\n\
         left the table disappears, rather than staying at 0).\n",
    );
    for s in sections {
        out.push_str(&format!("\n## {}\n\n| Name | Type | Labels | Help |\n|---|---|---|---|\n", s.title));
        for f in s.families {
            out.push_str(&format!("| `{}` | {} | {} | {} |\n", f.name, f.kind.as_str(), f.labels.join(", "), f.help));
        }
    }
    out.push_str("\n## Histogram buckets\n\n");
    for s in sections {
        for f in s.families.iter().filter(|f| f.kind == Kind::Histogram) {
            let b: Vec<String> = f.buckets.iter().map(|b| b.to_string()).collect();
            out.push_str(&format!("- `{}`: {}\n", f.name, b.join(", ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &[Family] = &[
        Family::counter("flotilla_things_total", "Things done.", &["app"]),
        Family::histogram("flotilla_thing_seconds", "How long a thing takes, in seconds.", &[], buckets::SECONDS),
    ];

    #[test]
    fn a_sound_catalogue_has_no_problems_and_renders_one_row_per_family() {
        let sections = [Section { title: "Test", families: GOOD }];
        assert_eq!(problems(&sections), Vec::<String>::new());
        let md = markdown(&sections);
        assert!(md.contains("| `flotilla_things_total` | counter | app | Things done. |\n"), "{md}");
        assert!(md.contains("| `flotilla_thing_seconds` | histogram |  | How long"), "{md}");
    }

    #[test]
    fn lint_mistakes_are_named() {
        const BAD: &[Family] = &[
            Family::counter("flotilla_things", "Things.", &[]),
            Family::gauge("flotilla_level_total", "A level.", &[]),
            Family::histogram("flotilla_x_seconds", "No buckets.", &[], &[]),
            Family::gauge("flotilla_things_count", "A | pipe.", &["le"]),
            Family::counter("flotilla_things_total", "Twice.", &[]),
        ];
        let p = problems(&[Section { title: "A", families: GOOD }, Section { title: "B", families: BAD }]);
        for needle in
            ["must end in _total", "only counters", "increasing buckets", "histogram's own", "'|'", "reserved"]
        {
            assert!(p.iter().any(|x| x.contains(needle)), "{needle} in {p:?}");
        }
        assert!(p.iter().any(|x| x.contains("listed twice")), "{p:?}");
        let twice = [Section { title: "A", families: GOOD }, Section { title: "B", families: &GOOD[..1] }];
        assert_eq!(problems(&twice), Vec::<String>::new(), "the same family in two processes");
    }

    /// (Here rather than in lib.rs: the source scan of src/catalogue.rs skips this file's
    /// made-up family names.)
    #[test]
    fn install_describes_every_family_and_buckets_each_histogram_by_its_unit() {
        const F: &[Family] = &[
            Family::histogram("flotilla_test_copied_bytes", "Bytes copied, in bytes.", &[], buckets::BYTES),
            Family::counter("flotilla_test_things_total", "Things done.", &["app"]),
        ];
        crate::install(&[Section { title: "Test", families: F }]);
        metrics::histogram!(F[0].name).record(5000.0);
        metrics::counter!(F[1].name, "app" => "a").increment(2);
        crate::add_collector(|out| {
            let f = Family::gauge("flotilla_test_level", "A level read at scrape time.", &["node"]);
            f.write_header(out);
            f.write_sample(out, &[("node", "n\"1")], f64::INFINITY);
        });
        let page = crate::render();
        for line in [
            "# HELP flotilla_test_copied_bytes Bytes copied, in bytes.\n",
            "flotilla_test_copied_bytes_bucket{le=\"4096\"} 0\n",
            "flotilla_test_copied_bytes_bucket{le=\"16384\"} 1\n",
            "# HELP flotilla_test_things_total Things done.\n",
            "flotilla_test_things_total{app=\"a\"} 2\n",
            &format!("flotilla_build_info{{version=\"{}\"}} 1\n", env!("CARGO_PKG_VERSION")),
            "# TYPE flotilla_test_level gauge\nflotilla_test_level{node=\"n\\\"1\"} +Inf\n",
        ] {
            assert!(page.contains(line), "{line:?} in:\n{page}");
        }
        #[cfg(target_os = "linux")]
        assert!(page.contains("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total "), "{page}");
    }

    #[test]
    fn bucket_sets_increase() {
        for b in [buckets::SECONDS, buckets::BYTES, buckets::COUNT, buckets::DATAGRAMS] {
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        }
    }
}
