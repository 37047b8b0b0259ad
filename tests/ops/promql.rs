//! The metric catalogue of `docs/metrics.md`, and the metric names a PromQL expression
//! selects.

use std::collections::BTreeMap;

/// Names that come from Prometheus itself, not from a Flotilla process.
const BUILTIN: &[&str] = &["up", "scrape_duration_seconds", "scrape_samples_scraped"];

/// Every metric family of the catalogue, with its type: the rows of its markdown tables
/// whose first cell is a name in backticks (`| `flotilla_nodes` | gauge | … |`).
pub struct Catalogue(BTreeMap<String, String>);

impl Catalogue {
    pub fn parse(markdown: &str) -> Catalogue {
        let mut families = BTreeMap::new();
        for line in markdown.lines().filter(|l| l.trim_start().starts_with('|')) {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
            let Some(name) = cells.first().and_then(|c| c.strip_prefix('`')).and_then(|c| c.strip_suffix('`')) else {
                continue;
            };
            let kind = cells.get(1).copied().unwrap_or("").to_lowercase();
            families.insert(name.to_string(), kind);
        }
        Catalogue(families)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether a query may select `name`: a catalogued family, a counter's family named
    /// without `_total`, a histogram's `_bucket`, `_sum` or `_count`, or Prometheus' own.
    pub fn has(&self, name: &str) -> bool {
        if BUILTIN.contains(&name) || self.0.contains_key(name) {
            return true;
        }
        if name.strip_suffix("_total").is_some_and(|base| self.0.get(base).is_some_and(|k| k == "counter")) {
            return true;
        }
        ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .and_then(|base| self.0.get(base))
                .is_some_and(|k| k == "histogram" || (k == "summary" && *suffix != "_bucket"))
        })
    }

    /// The names of `names` the catalogue lacks.
    pub fn missing<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        names.into_iter().filter(|n| !self.has(n)).cloned().collect()
    }
}

/// Words that are PromQL's own, not metric names: operators, and aggregations (which
/// may be followed by `by (…)` rather than by their parenthesis).
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// Words followed by a list of label names in parentheses.
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names `expr` selects, in order of appearance. A small tokenizer, enough for
/// the queries of this repository: it skips strings, label matchers `{…}`, ranges
/// `[…]`, numbers and durations, `$variables`, label lists (`by (…)`, `on (…)`, …) and
/// function and aggregation names (a word followed by `(`).
pub fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let skip_to = |from: usize, close: char| -> usize {
        let mut j = from + 1;
        while j < chars.len() && chars[j] != close {
            if chars[j] == '\\' {
                j += 1;
            }
            j += 1;
        }
        j + 1
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_to(i, c),
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '#' => i = skip_to(i, '\n'),
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || "_{}".contains(chars[i])) {
                    i += 1;
                }
            }
            c if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) => {
                // A number (1, 0.5, 1e-9) or a duration (5m, 1h30m).
                i += 1;
                while i < chars.len() {
                    let d = chars[i];
                    let exponent_sign = (d == '-' || d == '+') && matches!(chars[i - 1], 'e' | 'E');
                    if d.is_ascii_alphanumeric() || d == '.' || exponent_sign {
                        i += 1;
                    } else {
                        break;
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let called = chars.get(next) == Some(&'(');
                if called && LABEL_LISTS.contains(&word.as_str()) {
                    i = skip_to(next, ')');
                } else if !called && !KEYWORDS.contains(&word.to_lowercase().as_str()) {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_metric_names_are_found() {
        let expr = r#"histogram_quantile(0.99, sum by (le, shard) (rate(flotilla_view_apply_seconds_bucket{shard=~"$shard", le!="x_y"}[$__rate_interval])))
            / on (shard) group_left (status) clamp_min(sum without (x) (flotilla_nodes offset 5m), 1e-9) > bool 0.5
            and absent(flotilla_reconcile_seconds_count) or max without (a) (up{job=~".*flotilla.*"}) unless min_over_time(x:rec:sum[5m:15s])"#;
        assert_eq!(
            metric_names(expr),
            [
                "flotilla_view_apply_seconds_bucket",
                "flotilla_nodes",
                "flotilla_reconcile_seconds_count",
                "up",
                "x:rec:sum"
            ]
        );
        assert!(metric_names("sum(rate(process_cpu_seconds_total[1m])) by (job)") == ["process_cpu_seconds_total"]);
    }

    #[test]
    fn the_catalogue_knows_histogram_series_and_counter_families() {
        let c = Catalogue::parse(
            "| Name | Type | Labels | Help |\n|---|---|---|---|\n| `flotilla_a_seconds` | histogram | shard | a |\n\
             | `flotilla_b` | counter | | b |\n| `flotilla_c_total` | counter | | c |\n| `flotilla_d` | gauge | | d |\n\
             - `flotilla_e`: buckets 0.1, 1\n",
        );
        assert_eq!(c.len(), 4);
        for ok in
            ["flotilla_a_seconds_bucket", "flotilla_a_seconds_count", "flotilla_b_total", "flotilla_c_total", "up"]
        {
            assert!(c.has(ok), "{ok}");
        }
        for missing in ["flotilla_d_bucket", "flotilla_d_total", "flotilla_e", "flotilla_c"] {
            assert!(!c.has(missing), "{missing}");
        }
    }
}
