//! Charts with history (`GET /v1/apps/{app}/history`, `/v1/pools/{pool}/history`): each
//! app's desired, running and estimated units and serving capacity, and each pool's
//! running instances by node type, every [`STEP_S`] seconds for [`KEEP_S`]. Bounded:
//! at most [`MAX_SERIES`] series of [`KEEP_S`]/[`STEP_S`] points each; kept in a redb
//! file (`DATA/history.redb` for `up`) one row per series and point, so a restart
//! keeps the day, or in memory without one.

use flotilla_core::LockExt;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

/// Seconds between two points.
pub const STEP_S: u64 = 10;
/// Seconds of history kept.
pub const KEEP_S: u64 = 86_400;
/// Most series kept (apps and pools); a new one past it is not recorded.
pub const MAX_SERIES: usize = 512;
/// Most values in one point.
const MAX_VALUES: usize = 64;

const POINTS: TableDefinition<&str, &str> = TableDefinition::new("points");

/// One sample: its time (Unix seconds, a multiple of [`STEP_S`]) and named values.
/// One 10 s sample: the Unix second and each value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Point {
    pub t: u64,
    pub v: BTreeMap<String, f64>,
}

/// The series, by name (`app/echo`, `pool/default`).
pub struct Series {
    points: Mutex<HashMap<String, VecDeque<Point>>>,
    db: Option<Database>,
}

impl Default for Series {
    fn default() -> Self {
        Series { points: Mutex::new(HashMap::new()), db: None }
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A point's key: the series, then the time zero-padded so keys sort by it.
fn key(series: &str, t: u64) -> String {
    format!("{series}@{t:012}")
}

impl Series {
    /// Opens (or creates) the file and loads the last [`KEEP_S`] of every series in it.
    pub fn open(path: &Path) -> Result<Series, String> {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| at(&e))?;
        }
        let db = Database::create(path).map_err(|e| at(&e))?;
        let w = db.begin_write().map_err(|e| at(&e))?;
        w.open_table(POINTS).map_err(|e| at(&e))?;
        w.commit().map_err(|e| at(&e))?;
        let cutoff = (flotilla_core::system_ms() / 1000).saturating_sub(KEEP_S);
        let mut points: HashMap<String, VecDeque<Point>> = HashMap::new();
        let mut stale = Vec::new();
        {
            let r = db.begin_read().map_err(|e| at(&e))?;
            let t = r.open_table(POINTS).map_err(|e| at(&e))?;
            for row in t.iter().map_err(|e| at(&e))? {
                let (k, v) = row.map_err(|e| at(&e))?;
                let Some((series, _)) = k.value().rsplit_once('@') else { continue };
                match serde_json::from_str::<Point>(v.value()) {
                    Ok(p) if p.t >= cutoff && (points.len() < MAX_SERIES || points.contains_key(series)) => {
                        points.entry(series.to_string()).or_default().push_back(p);
                    }
                    _ => stale.push(k.value().to_string()),
                }
            }
        }
        // What is past the day (or unreadable) goes now: the file stays a day's worth.
        let w = db.begin_write().map_err(|e| at(&e))?;
        {
            let mut t = w.open_table(POINTS).map_err(|e| at(&e))?;
            for k in &stale {
                t.remove(k.as_str()).map_err(|e| at(&e))?;
            }
        }
        w.commit().map_err(|e| at(&e))?;
        Ok(Series { points: Mutex::new(points), db: Some(db) })
    }

    /// Adds one point to each series in `samples` (time `t`, seconds), drops what is
    /// older than [`KEEP_S`], and writes both in one transaction.
    pub fn record(&self, t: u64, samples: Vec<(String, BTreeMap<String, f64>)>) -> Result<(), String> {
        let t = t - t % STEP_S;
        let cutoff = t.saturating_sub(KEEP_S);
        let mut g = self.points.lock_or_recover();
        let mut added = Vec::new();
        let mut dropped = Vec::new();
        for (series, mut v) in samples {
            if g.len() >= MAX_SERIES && !g.contains_key(&series) {
                continue;
            }
            v.retain(|_, x| x.is_finite());
            while v.len() > MAX_VALUES {
                v.pop_last();
            }
            let q = g.entry(series.clone()).or_default();
            if q.back().is_some_and(|p| p.t >= t) {
                continue;
            }
            let p = Point { t, v };
            added.push((key(&series, t), serde_json::to_string(&p).map_err(err)?));
            q.push_back(p);
        }
        // Every series ages, sampled or not (an app removed): an emptied one is dropped,
        // and its place under MAX_SERIES freed.
        for (series, q) in g.iter_mut() {
            while q.front().is_some_and(|p| p.t < cutoff) {
                if let Some(old) = q.pop_front() {
                    dropped.push(key(series, old.t));
                }
            }
        }
        g.retain(|_, q| !q.is_empty());
        drop(g);
        let Some(db) = &self.db else { return Ok(()) };
        let w = db.begin_write().map_err(err)?;
        {
            let mut table = w.open_table(POINTS).map_err(err)?;
            for (k, v) in &added {
                table.insert(k.as_str(), v.as_str()).map_err(err)?;
            }
            for k in &dropped {
                table.remove(k.as_str()).map_err(err)?;
            }
        }
        w.commit().map_err(err)
    }

    /// The points of `series` since `since` (Unix seconds), oldest first.
    pub fn read(&self, series: &str, since: u64) -> Option<Vec<Point>> {
        let g = self.points.lock_or_recover();
        let q = g.get(series)?;
        let start = q.partition_point(|p| p.t < since);
        Some(q.range(start..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(series: &str, x: f64) -> (String, BTreeMap<String, f64>) {
        (series.to_string(), BTreeMap::from([("running".to_string(), x), ("bad".to_string(), f64::NAN)]))
    }

    #[test]
    fn points_are_aligned_bounded_by_age_and_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("flotilla-series-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("history.redb");
        let now = flotilla_core::system_ms() / 1000;
        // On a step boundary, so that +3 s and +5 s fall in the same step whatever the clock.
        let start = (now - KEEP_S - 100) / STEP_S * STEP_S;
        {
            let s = Series::open(&path).unwrap();
            // Ten points before the window, the rest inside it.
            for i in 0..40u64 {
                s.record(start + i * STEP_S + 3, vec![sample("app/echo", i as f64)]).unwrap();
            }
            // The same step twice keeps the first.
            s.record(start + 39 * STEP_S + 5, vec![sample("app/echo", 99.0)]).unwrap();
            let got = s.read("app/echo", 0).unwrap();
            assert!(got.iter().all(|p| p.t % STEP_S == 0 && !p.v.contains_key("bad")));
            assert_eq!(got.last().unwrap().v["running"], 39.0);
            assert!(s.read("app/nope", 0).is_none());
        }
        let again = Series::open(&path).unwrap();
        let got = again.read("app/echo", 0).unwrap();
        assert!(got.iter().all(|p| p.t >= now - KEEP_S), "older points are not loaded");
        assert!(got.len() >= 28 && got.len() <= 31, "{}", got.len());
        let since = got[got.len() - 3].t;
        assert_eq!(again.read("app/echo", since).unwrap().len(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn series_past_the_bound_are_not_recorded() {
        let s = Series::default();
        let samples = (0..MAX_SERIES + 5).map(|i| sample(&format!("app/a{i}"), 1.0)).collect();
        s.record(1_000_000, samples).unwrap();
        assert_eq!(s.points.lock_or_recover().len(), MAX_SERIES);
    }
}
