use super::*;

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("flotilla-logs-{}-{}", std::process::id(), rand::random::<u64>()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn lines(from: u64, n: u64) -> Vec<(u64, String)> {
    (from..from + n).map(|i| (1_000 * i, format!("line {i}"))).collect()
}

fn history(f: &LogFile, sel: Selection) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    f.snapshot(false).history(sel, |c| {
        out.extend(c.into_iter().map(|l| (l.unix_ms, l.text)));
        true
    });
    out
}

#[test]
fn lines_are_kept_with_their_time_and_read_back_by_tail_and_since() {
    let d = dir();
    let f = LogFile::new(d.join("stdout.log"), 1 << 20);
    f.append(lines(1, 10));
    let text = std::fs::read_to_string(d.join("stdout.log")).unwrap();
    assert!(text.starts_with("1970-01-01T00:00:01.000Z line 1\n"), "{text}");
    assert_eq!(history(&f, Selection::default()), lines(1, 10));
    assert_eq!(history(&f, Selection { tail: 3, since_unix_ms: 0 }), lines(8, 3));
    assert_eq!(history(&f, Selection { tail: 0, since_unix_ms: 6_000 }), lines(6, 5));
    assert_eq!(history(&f, Selection { tail: 2, since_unix_ms: 6_000 }), lines(9, 2));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn rotation_keeps_one_older_file_and_history_reads_across_both() {
    let d = dir();
    // Each line is 24 + 1 + 7..8 + 1 bytes: about six fit under the cap.
    let f = LogFile::new(d.join("stderr.log"), 200);
    for i in 1..=20 {
        f.append(lines(i, 1));
    }
    let cur = std::fs::metadata(d.join("stderr.log")).unwrap().len();
    let old = std::fs::metadata(d.join("stderr.log.1")).unwrap().len();
    assert!(cur <= 200 && old <= 200, "{cur} {old}");
    let h = history(&f, Selection::default());
    assert_eq!(h.last(), Some(&(20_000, "line 20".to_string())));
    // What the two files hold, in order and without a gap.
    let first = h[0].0 / 1000;
    assert_eq!(h, lines(first, 21 - first));
    assert!(first > 1, "the oldest lines went with the rotation");
    std::fs::remove_dir_all(d).unwrap();
}

#[tokio::test]
async fn a_follower_gets_exactly_the_lines_after_its_history() {
    let d = dir();
    let f = LogFile::new(d.join("stdout.log"), 1 << 20);
    f.append(lines(1, 5));
    let mut snap = f.snapshot(true);
    let mut live = snap.live.take().unwrap();
    f.append(lines(6, 3));
    let mut past = Vec::new();
    snap.history(Selection::default(), |c| {
        past.extend(c.into_iter().map(|l| (l.unix_ms, l.text)));
        true
    });
    assert_eq!(past, lines(1, 5), "the history stops where following starts");
    let mut next = Vec::new();
    for _ in 0..3 {
        let l = live.recv().await.unwrap();
        next.push((l.unix_ms, l.text.clone()));
    }
    assert_eq!(next, lines(6, 3));
    f.close();
    assert!(matches!(live.recv().await, Err(broadcast::error::RecvError::Closed)), "a stopped member ends followers");
    std::fs::remove_dir_all(d).unwrap();
}

#[tokio::test]
async fn a_slow_follower_loses_lines_counted_and_never_holds_the_writer() {
    let d = dir();
    let f = LogFile::new(d.join("stdout.log"), 1 << 30);
    let mut live = f.snapshot(true).live.unwrap();
    let n = FOLLOW_BUFFER as u64 + 100;
    f.append(lines(1, n));
    match live.recv().await {
        Err(broadcast::error::RecvError::Lagged(k)) => assert_eq!(k, 100),
        other => panic!("expected lost lines, got {other:?}"),
    }
    assert_eq!(live.recv().await.unwrap().text, "line 101");
    assert_eq!(history(&f, Selection::default()).len() as u64, n, "the file has every line");
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_file_that_cannot_be_written_costs_lines_not_the_writer() {
    let d = dir();
    // A directory that cannot be made: a file is in its way.
    std::fs::write(d.join("file"), b"").unwrap();
    let f = LogFile::new(d.join("file").join("stdout.log"), 1 << 20);
    let mut live = f.snapshot(true).live.unwrap();
    f.append(lines(1, 2));
    assert_eq!(live.try_recv().unwrap().text, "line 1", "followers still see the lines");
    assert!(history(&f, Selection::default()).is_empty());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn output_is_split_into_lines_partial_ones_on_flush_long_ones_cut() {
    let mut s = LineSplitter::default();
    let mut out = Vec::new();
    s.push(b"one\r\ntw", 1, &mut out);
    assert_eq!(out, vec![(1, "one".to_string())]);
    assert!(!s.is_empty());
    s.push(b"o\nthree", 2, &mut out);
    assert_eq!(out[1], (2, "two".to_string()));
    s.flush(3, &mut out);
    assert_eq!(out[2], (3, "three".to_string()));
    assert!(s.is_empty());
    out.clear();
    s.push(&vec![b'x'; MAX_LINE * 2 + 5], 4, &mut out);
    assert_eq!(out.iter().map(|(_, t)| t.len()).collect::<Vec<_>>(), vec![MAX_LINE, MAX_LINE]);
    s.push(b"\n", 5, &mut out);
    assert_eq!(out[2].1.len(), 5);
    // A line that ends inside a read is cut too, and one of exactly MAX_LINE is one line.
    out.clear();
    s.push(&vec![b'y'; MAX_LINE - 10], 6, &mut out);
    let mut long = vec![b'y'; 8000];
    long.push(b'\n');
    s.push(&long, 6, &mut out);
    assert!(out.iter().all(|(_, t)| t.len() <= MAX_LINE), "{:?}", out.iter().map(|(_, t)| t.len()).collect::<Vec<_>>());
    assert_eq!(out.iter().map(|(_, t)| t.len()).sum::<usize>(), MAX_LINE - 10 + 8000);
    out.clear();
    s.push(&vec![b'z'; MAX_LINE], 7, &mut out);
    s.push(b"\n", 7, &mut out);
    assert_eq!(out.iter().map(|(_, t)| t.len()).collect::<Vec<_>>(), vec![MAX_LINE], "no empty line after it");
    s.push("é".as_bytes(), 6, &mut out);
    s.push(b"\xff\n", 6, &mut out);
    assert_eq!(out.last().unwrap().1, "é\u{fffd}", "bad UTF-8 is replaced, not refused");
}

#[test]
fn foreign_lines_keep_their_text() {
    assert_eq!(parse_line(b"2026-12-04T21:39:02.123Z hello\n"), (1_796_420_342_123, "hello".into()));
    assert_eq!(parse_line(b"just text\n"), (0, "just text".into()));
    assert_eq!(parse_line(b"2026-12-04T21:39:02.123Zno space"), (0, "2026-12-04T21:39:02.123Zno space".into()));
}

#[test]
fn a_unit_keeps_its_logs_while_a_member_is_here_and_they_go_with_it() {
    let d = dir();
    let logs = Logs::new(d.join("workloads"), 1 << 20);
    let head = logs.start("echo", "u1", "head", 1);
    head.stdout.append(lines(1, 1));
    let worker = logs.start("echo", "u1", "worker-0", 1);
    worker.stderr.append(lines(1, 1));
    logs.start("echo", "u2", "head", 1).stdout.append(lines(1, 1));
    // The same generation starting again keeps its files.
    assert!(Arc::ptr_eq(&logs.start("echo", "u1", "head", 1).stdout, &head.stdout));
    // The worker stopped, the head stays: the unit's logs (the worker's too) stay.
    logs.stopped("echo", "u1", "worker-0", 1);
    let assigned = |units: &[&str]| units.iter().map(|u| ("echo".to_string(), u.to_string())).collect();
    logs.keep_only(&assigned(&["u1"]));
    assert!(logs.get("echo", "u1", "worker-0").is_some());
    assert!(logs.member_dir("echo", "u1", "worker-0", 1).join("stderr.log").exists());
    assert!(logs.get("echo", "u2", "head").is_none());
    assert!(!d.join("workloads/echo/u2").exists(), "a unit that left takes its logs");
    logs.keep_only(&assigned(&[]));
    assert!(!d.join("workloads/echo").exists());
    // A late line of a member of a removed unit does not make its directory again.
    head.stdout.append(lines(2, 1));
    assert!(!d.join("workloads/echo").exists());
    // A new generation gets new files, and ends the older one's followers.
    let g1 = logs.start("echo", "u3", "head", 1);
    let mut follower = g1.stdout.snapshot(true).live.unwrap();
    logs.start("echo", "u3", "head", 2);
    assert!(matches!(follower.try_recv(), Err(broadcast::error::TryRecvError::Closed)));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn names_stay_inside_the_logs_directory() {
    assert_eq!(safe_name(".."), "_..");
    assert_eq!(safe_name(""), "_");
    assert_eq!(safe_name("a/b"), "a_b");
    assert_eq!(safe_name("v1.2"), "v1.2");
}

#[test]
fn an_earlier_runs_logs_are_removed_at_start() {
    let d = dir();
    std::fs::create_dir_all(d.join("workloads/old-unit")).unwrap();
    let logs = Logs::new(d.join("workloads"), 1 << 20);
    assert!(!logs.root().exists());
    std::fs::remove_dir_all(d).unwrap();
}
