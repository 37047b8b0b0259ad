//! The load trace `flotilla sim` replays: a CSV, validated line by line.
//!
//! ```text
//! time_s,cpu_millis,memory_bytes[,utilization]
//! 0,4000,17179869184
//! 600,8000,34359738368,0.7
//! ```
//!
//! * `time_s`: seconds from 0 (the first row is at 0), strictly increasing; a row's demand holds
//!   until the next row, and the last row marks the end of the trace (its values hold for the
//!   gap before it). At most one year, at most 1,000,000 rows.
//! * `cpu_millis`, `memory_bytes`: the app's demand at that time, non-negative numbers.
//! * `utilization` (optional column; a field may be empty): members' used ÷ allocated in [0, 1],
//!   fed to the `utilization` policy instead of the share of demand each running unit serves
//!   (left out or empty on a row: that share).
//!
//! Blank lines and lines starting with `#` are skipped. Every refusal names the line.

use crate::signals::Res;

/// Traces longer than this are refused: a bigger file is almost certainly a mistake, and the
/// whole trace is held in memory.
pub const MAX_ROWS: usize = 1_000_000;
/// The longest trace: bounds the number of simulated steps.
pub const MAX_TRACE_SECONDS: f64 = 366.0 * 86_400.0;
const HEADER: [&str; 4] = ["time_s", "cpu_millis", "memory_bytes", "utilization"];

/// One trace row: the demand from `at_ms` until the next row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    pub at_ms: u64,
    pub demand: Res,
    pub utilization: Option<f64>,
}

/// A parsed trace: rows sorted by time, the first at 0, and the time the trace ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub rows: Vec<Row>,
    pub end_ms: u64,
}

/// A trace line that was refused, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TraceError {
    pub line: usize,
    pub message: String,
}

impl Trace {
    /// Parses the CSV format described in the module documentation.
    pub fn parse_csv(text: &str) -> Result<Trace, TraceError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let err = |line: usize, message: String| TraceError { line, message };
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let expected = "time_s,cpu_millis,memory_bytes[,utilization]";
        let Some((hline, header)) = lines.next() else {
            return Err(err(1, format!("empty trace: expected the header {expected}")));
        };
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let columns = names.len();
        if !(3..=4).contains(&columns) || names[..] != HEADER[..columns] {
            return Err(err(hline, format!("the header must be {expected}, found {header:?}")));
        }
        let mut rows: Vec<Row> = Vec::new();
        let mut last_line = hline;
        for (n, line) in lines {
            last_line = n;
            if rows.len() == MAX_ROWS {
                return Err(err(n, format!("more than {MAX_ROWS} rows")));
            }
            let mut fields = [""; 4];
            let mut count = 0;
            for f in line.split(',') {
                if count < fields.len() {
                    fields[count] = f.trim();
                }
                count += 1;
            }
            // The utilization field may be left out as well as left empty.
            if count != columns && !(columns == 4 && count == 3) {
                return Err(err(
                    n,
                    format!("expected {columns} fields ({}), found {count}", HEADER[..columns].join(",")),
                ));
            }
            let num = |i: usize| -> Result<f64, TraceError> {
                let (name, raw) = (HEADER[i], fields[i]);
                let x: f64 = raw.parse().map_err(|_| err(n, format!("{name}: {raw:?} is not a number")))?;
                if !x.is_finite() {
                    return Err(err(n, format!("{name}: {raw:?} is not a finite number")));
                }
                if x < 0.0 {
                    return Err(err(n, format!("{name}: {raw} is negative")));
                }
                Ok(x)
            };
            let time_s = num(0)?;
            if time_s > MAX_TRACE_SECONDS {
                return Err(err(n, format!("time_s: {time_s} is more than a year ({MAX_TRACE_SECONDS} s)")));
            }
            let at_ms = (time_s * 1000.0).round() as u64;
            match rows.last() {
                None if at_ms != 0 => {
                    return Err(err(n, format!("time_s: the first row must be at 0, found {time_s}")));
                }
                Some(prev) if at_ms <= prev.at_ms => {
                    return Err(err(
                        n,
                        format!(
                            "time_s: {time_s} is not after the previous row's {} (rows must be sorted, one per time)",
                            prev.at_ms as f64 / 1000.0
                        ),
                    ));
                }
                _ => {}
            }
            let cpu = num(1)?;
            let memory = num(2)?;
            let utilization = if count == 4 && !fields[3].is_empty() {
                let u = num(3)?;
                if u > 1.0 {
                    return Err(err(n, format!("utilization: {u} is not within [0, 1]")));
                }
                Some(u)
            } else {
                None
            };
            rows.push(Row {
                at_ms,
                demand: Res::new(cpu.round() as u64, memory.round().min(u64::MAX as f64) as u64),
                utilization,
            });
        }
        if rows.len() < 2 {
            return Err(err(
                last_line,
                format!("{} rows: a trace needs at least two (the last one marks its end)", rows.len()),
            ));
        }
        let end_ms = rows[rows.len() - 1].at_ms;
        Ok(Trace { rows, end_ms })
    }
}
