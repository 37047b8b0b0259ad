//! Charts with history (issue #36, item 7): an app's desired and running units are
//! sampled every 10 s, served for a window, and kept across a restart of `up`.

use std::time::Duration;

use flotilla_testkit::{Up, http, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

fn history(up: &Up, query: &str) -> (u16, Value) {
    http(&up.addr, "GET", &format!("/v1/apps/echo/history{query}"), None, "")
}

#[test]
fn an_apps_history_is_sampled_served_by_window_and_kept_across_a_restart() {
    let mut up = Up::start("charts", &["--agents", "2", "--shards", "1", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let first = wait_for("a sample with both units running", Duration::from_secs(40), || {
        let (_, v) = history(&up, "");
        v["points"].as_array()?.iter().find(|p| p["v"]["running"] == 2.0).cloned()
    });
    assert_eq!(first["v"]["desired"], 2.0, "{first}");
    assert!(first["v"]["capacity_cores"].as_f64().is_some_and(|c| c > 0.0), "{first}");
    assert_eq!(first["t"].as_u64().unwrap() % 10, 0);
    let (status, v) = history(&up, "?window=24h");
    assert_eq!((status, v["window_s"].as_u64(), v["step_s"].as_u64()), (200, Some(86_400), Some(10)), "{v}");

    assert!(up.restart(), "up stops cleanly");
    let kept = wait_for("the history after the restart", Duration::from_secs(30), || {
        let (status, v) = history(&up, "?window=6h");
        (status == 200).then_some(v)
    });
    assert!(kept["points"].as_array().unwrap().iter().any(|p| p["t"] == first["t"]), "the day survives: {kept}");

    let (status, v) = history(&up, "?window=2d");
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("1h, 6h or 24h"), "{v}");
    let (status, v) = http(&up.addr, "GET", "/v1/apps/nope/history", None, "");
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("no_such_app")), "{v}");
    let (status, _) = http(&up.addr, "GET", "/v1/pools/nope/history", None, "");
    assert_eq!(status, 404);
}
