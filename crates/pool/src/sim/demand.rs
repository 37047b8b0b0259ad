//! The demand trace of a pool simulation: how many units each app wants, over time.
//!
//! ```text
//! time_s,app,units,cpu,memory
//! 0,web,3,1,2Gi
//! 1800,web,12,1,2Gi
//! 3600,web,4,1,2Gi
//! 14400,web,4,1,2Gi
//! ```
//!
//! A row sets `app`'s desired units from `time_s` on; `cpu` and `memory` are one unit's, as
//! in a spec (`"500m"`, `2`; `"2Gi"`, bytes) and the same on every row of the app. Times
//! never go back (rows of one time are applied together); the last row's time is the end
//! of the trace. Blank and `#` lines are skipped; every refusal names its line.

use flotilla_core::{Resources, quantity};

/// At most this many rows, apps, units per app and seconds (the simulation steps each
/// second).
pub const MAX_ROWS: usize = 100_000;
pub const MAX_APPS: usize = 64;
pub const MAX_UNITS: u32 = 10_000;
pub const MAX_SECONDS: u64 = 7 * 86_400;

const HEADER: &str = "time_s,app,units,cpu,memory";

#[derive(Debug, Clone, PartialEq)]
pub struct DemandRow {
    pub at_s: u64,
    pub app: String,
    pub units: u32,
    pub unit: Resources,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Demand {
    pub rows: Vec<DemandRow>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {message}")]
pub struct DemandError {
    pub line: usize,
    pub message: String,
}

impl Demand {
    pub fn parse_csv(text: &str) -> Result<Demand, DemandError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let err = |line: usize, message: String| DemandError { line, message };
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let Some((hline, header)) = lines.next() else {
            return Err(err(1, format!("empty demand: expected the header {HEADER}")));
        };
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        if names.join(",") != HEADER {
            return Err(err(hline, format!("the header must be {HEADER}, found {header:?}")));
        }
        let mut rows: Vec<DemandRow> = Vec::new();
        let mut shapes: std::collections::BTreeMap<String, Resources> = Default::default();
        for (n, line) in lines {
            if rows.len() == MAX_ROWS {
                return Err(err(n, format!("more than {MAX_ROWS} rows")));
            }
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let [time, app, units, cpu, memory] = f[..] else {
                return Err(err(n, format!("expected 5 fields ({HEADER}), found {}", f.len())));
            };
            let at_s: u64 = time.parse().map_err(|_| err(n, format!("time_s: {time:?} is not whole seconds")))?;
            if at_s > MAX_SECONDS {
                return Err(err(n, format!("time_s: {at_s} is more than {MAX_SECONDS} (7 days)")));
            }
            if let Some(prev) = rows.last()
                && at_s < prev.at_s
            {
                return Err(err(n, format!("time_s: {at_s} is before the row above ({})", prev.at_s)));
            }
            let name_ok = !app.is_empty()
                && app.len() <= 63
                && app.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !name_ok {
                return Err(err(n, format!("app: {app:?} must be 1 to 63 letters, digits, '-' or '_'")));
            }
            let units: u32 = units.parse().map_err(|_| err(n, format!("units: {units:?} is not a whole number")))?;
            if units > MAX_UNITS {
                return Err(err(n, format!("units: {units} is more than {MAX_UNITS}")));
            }
            let cpu_millis = quantity::cpu_millis(cpu).map_err(|e| err(n, format!("cpu: {e}")))?;
            let memory_bytes = quantity::memory_bytes(memory).map_err(|e| err(n, format!("memory: {e}")))?;
            if cpu_millis == 0 && memory_bytes == 0 {
                return Err(err(n, "cpu and memory: a unit needs some".into()));
            }
            let unit = Resources::new(cpu_millis, memory_bytes, 0);
            match shapes.get(app) {
                Some(s) if *s != unit => {
                    return Err(err(n, format!("{app}: its unit's cpu and memory differ from its first row's")));
                }
                Some(_) => {}
                None if shapes.len() == MAX_APPS => return Err(err(n, format!("more than {MAX_APPS} apps"))),
                None => {
                    shapes.insert(app.to_string(), unit.clone());
                }
            }
            rows.push(DemandRow { at_s, app: app.to_string(), units, unit });
        }
        if rows.is_empty() {
            return Err(err(hline, "no rows".into()));
        }
        Ok(Demand { rows })
    }

    /// The end of the trace (its last row's time).
    pub fn end_s(&self) -> u64 {
        self.rows.last().map_or(0, |r| r.at_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demand_trace_reads_and_bad_lines_are_refused_by_line() {
        let d = Demand::parse_csv(
            "# burst\ntime_s,app,units,cpu,memory\n0,web,3,1,2Gi\n\n60,web,9,1,2Gi\n60,batch,2,500m,1Gi\n",
        )
        .unwrap();
        assert_eq!(d.rows.len(), 3);
        assert_eq!(d.rows[2].unit, Resources::new(500, 1 << 30, 0));
        assert_eq!(d.end_s(), 60);
        let bad = |body: &str| Demand::parse_csv(&format!("time_s,app,units,cpu,memory\n0,web,1,1,1Gi\n{body}"));
        for (body, want) in [
            ("5,web,1,1", "expected 5 fields"),
            ("x,web,1,1,1Gi", "time_s"),
            ("-1,web,1,1,1Gi", "time_s"),
            ("700000,web,1,1,1Gi", "7 days"),
            ("5,w eb,1,1,1Gi", "app"),
            ("5,web,-2,1,1Gi", "units"),
            ("5,web,10001,1,1Gi", "more than 10000"),
            ("5,web,1,lots,1Gi", "cpu"),
            ("5,web,1,1,1Qi", "memory"),
            ("5,web,1,2,1Gi", "differ from its first row"),
            ("5,job,1,0,0", "a unit needs some"),
        ] {
            let e = bad(body).unwrap_err();
            assert_eq!(e.line, 3, "{body}: {e}");
            assert!(e.message.contains(want), "{body}: {e}");
        }
        let e = Demand::parse_csv("time_s,app,units,cpu,memory\n9,web,1,1,1Gi\n5,web,1,1,1Gi\n").unwrap_err();
        assert!(e.to_string().contains("line 3: time_s: 5 is before"), "{e}");
        assert!(Demand::parse_csv("time,app\n").unwrap_err().message.contains("header"));
        assert!(Demand::parse_csv("").is_err());
    }
}
