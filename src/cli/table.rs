//! The one table writer of the list commands: every column as wide as its widest cell,
//! so a node named `ip-10-0-12-34.us-west-2.compute.internal` keeps the columns after
//! it aligned (kubectl's and Nomad's tables do the same).

/// How a column's cells line up.
#[derive(Clone, Copy, PartialEq)]
pub enum Align {
    Left,
    Right,
}

/// Rows of cells under a header, printed with two spaces between columns.
pub struct Table {
    header: Vec<&'static str>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns named in `header`; a name starting with `>` is right-aligned (numbers).
    pub fn new(header: &[&'static str]) -> Table {
        let align = header.iter().map(|h| if h.starts_with('>') { Align::Right } else { Align::Left }).collect();
        Table { header: header.iter().map(|h| h.trim_start_matches('>')).collect(), align, rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, each line indented by `indent` and without trailing spaces.
    pub fn render(&self, indent: &str) -> String {
        let cols = self.header.len();
        let mut width: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut out = String::from(indent);
            for (i, c) in cells.enumerate().take(cols) {
                if i > 0 {
                    out.push_str("  ");
                }
                let pad = width[i].saturating_sub(c.chars().count());
                match (self.align[i], i + 1 == cols) {
                    (Align::Right, _) => {
                        out.extend(std::iter::repeat_n(' ', pad));
                        out.push_str(c);
                    }
                    (Align::Left, true) => out.push_str(c),
                    (Align::Left, false) => {
                        out.push_str(c);
                        out.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
            out
        };
        let mut out = line(&mut self.header.iter().copied());
        for r in &self.rows {
            out.push_str(&line(&mut r.iter().map(String::as_str)));
        }
        out
    }

    /// Prints the table to stdout.
    pub fn print(&self) {
        print!("{}", self.render(""));
    }
}

/// How far `at_ms` (Unix ms) is from now, in its largest whole unit: `42s ago`, `3m ago`,
/// `in 2h`.
pub fn ago(at_ms: u64) -> String {
    let now = flotilla_core::now_ms();
    let span = |ms: u64| {
        let s = ms / 1000;
        match s {
            0..60 => format!("{s}s"),
            60..3_600 => format!("{}m", s / 60),
            3_600..86_400 => format!("{}h", s / 3_600),
            _ => format!("{}d", s / 86_400),
        }
    };
    if at_ms > now { format!("in {}", span(at_ms - now)) } else { format!("{} ago", span(now - at_ms)) }
}

/// `at_ms` (Unix ms) as the local wall-clock time (`2026-12-04 09:50:12`) and how far
/// from now it is, for tables; JSON keeps the milliseconds.
pub fn when(at_ms: u64) -> String {
    format!("{} ({})", local_time(at_ms), ago(at_ms))
}

fn local_time(at_ms: u64) -> String {
    let Ok(secs) = libc::time_t::try_from(at_ms / 1000) else { return format!("{at_ms} ms") };
    // SAFETY: `tm` is plain data that `localtime_r` fills; both pointers live for the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return format!("{at_ms} ms");
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut t = Table::new(&["NODE", "STATUS", ">CPU"]);
        t.row(vec!["n1".into(), "alive".into(), "500m".into()]);
        t.row(vec!["ip-10-0-12-34.us-west-2.compute.internal".into(), "alive,cordoned".into(), "0m".into()]);
        let text = t.render("");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        // Every STATUS cell starts in the same column, and every CPU cell ends in one.
        let col = lines[2].find("alive,cordoned").unwrap();
        assert_eq!(lines[0].find("STATUS"), Some(col));
        assert_eq!(lines[1].find("alive"), Some(col));
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{text}");
        assert!(lines[1].ends_with(" 500m") && lines[2].ends_with("   0m"), "{text}");
    }

    #[test]
    fn times_read_as_wall_clock_and_age() {
        let now = flotilla_core::now_ms();
        assert_eq!(ago(now - 90_000), "1m ago");
        assert_eq!(ago(now + 7_200_500), "in 2h");
        let w = when(now - 5_000);
        assert!(w.ends_with("(5s ago)") && w.len() == "2026-12-04 09:50:12 (5s ago)".len(), "{w}");
    }
}
