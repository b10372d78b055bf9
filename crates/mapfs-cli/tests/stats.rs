//! `mapfs stats` and `mapfs trace` against real mounts: the daemon's
//! counters match a known sequence of operations exactly, the JSON and
//! Prometheus outputs parse, a trace shows the requests of the process it
//! is asked about and no other, and only the owner (or root) may reset the
//! counters or trace.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fuse_or_skip, mapfs_bin, DataMode, MountSession};
use mapfs_testkit::command_as_nobody;
use mapfs_testkit::mount::run_captured;

/// A mount whose attributes and names stay cached for an hour, so what is
/// cached cannot expire while a test runs (on a slow machine too).
fn mount(mode: DataMode) -> MountSession {
    MountSession::builder(mapfs_bin())
        .data(mode)
        .arg("--ttl")
        .arg("3600")
        .mount()
        .unwrap_or_else(|e| panic!("mounting passthrough --data {mode}: {e:#}"))
}

fn mapfs(args: &[&str], mnt: &Path) -> String {
    let out = run_captured(Command::new(mapfs_bin()).args(args).arg(mnt)).unwrap();
    assert!(out.success(), "mapfs {args:?} failed: {}", out.stderr);
    out.stdout
}

/// `mapfs stats --json` (with `--reset` when `reset`), parsed.
fn stats(mnt: &Path, reset: bool) -> serde_json::Value {
    let args: &[&str] = if reset {
        &["stats", "--json", "--reset"]
    } else {
        &["stats", "--json"]
    };
    let text = mapfs(args, mnt);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("stats --json: {e}: {text}"))
}

#[test]
fn counters_match_a_known_sequence() {
    if !fuse_or_skip("counters_match_a_known_sequence") {
        return;
    }
    const N: u64 = 40;
    for mode in [DataMode::Daemon, DataMode::Auto] {
        let s = mount(mode);
        let m = s.mountpoint();
        // Files made behind the mount's back: the mount has never seen them.
        for i in 0..N {
            std::fs::write(s.backing().join(format!("seen{i}")), b"x").unwrap();
        }
        // The root's attributes: the kernel has none until it asks once.
        std::fs::metadata(m).unwrap();
        stats(m, true);

        // N first stats of names the kernel does not know: one LOOKUP each,
        // which brings the attributes; the second stat of each is cached.
        for _round in 0..2 {
            for i in 0..N {
                std::fs::metadata(m.join(format!("seen{i}"))).unwrap();
            }
        }
        let c = common::op_counts(&stats(m, true));
        assert_eq!(c.get("LOOKUP"), Some(&(N, 0)), "{mode}: {c:?}");
        assert_eq!(c.get("GETATTR"), None, "{mode}: cached stats asked: {c:?}");

        // A missing name is looked up once: the kernel caches the negative
        // entry (an answer, not an error).
        for _ in 0..3 {
            assert!(std::fs::metadata(m.join("missing")).is_err());
        }
        let c = common::op_counts(&stats(m, true));
        assert_eq!(c.get("LOOKUP"), Some(&(1, 0)), "{mode}: {c:?}");

        // N creates of new names: one negative LOOKUP and one CREATE each.
        for i in 0..N {
            std::fs::File::create(m.join(format!("new{i}"))).unwrap();
        }
        let v = stats(m, false);
        let c = common::op_counts(&v);
        assert_eq!(c.get("CREATE"), Some(&(N, 0)), "{mode}: {c:?}");
        assert_eq!(c.get("LOOKUP"), Some(&(N, 0)), "{mode}: {c:?}");
        // What a stat of a just-created, closed file costs is the kernel's
        // business (the writeback cache drops attributes at close): shown,
        // not asserted.
        for i in 0..N {
            assert_eq!(
                std::fs::metadata(m.join(format!("new{i}"))).unwrap().len(),
                0
            );
        }
        let later = common::op_counts(&stats(m, false));
        eprintln!(
            "{mode}: {N} creates cost {c:?}; then {N} stats of them: GETATTR {:?}",
            later.get("GETATTR").map(|g| g.0).unwrap_or(0)
        );
        // Every request the daemon answered is in the total.
        let total: u64 = c.values().map(|&(n, _)| n).sum();
        assert_eq!(v["requests"].as_u64(), Some(total));
        let shares: f64 = v["ops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["time_share"].as_f64().unwrap())
            .sum();
        assert!(
            (shares - 1.0).abs() < 1e-6,
            "time shares add up to {shares}"
        );
        for o in v["ops"].as_array().unwrap() {
            let (p50, p99) = (o["p50_ns"].as_u64().unwrap(), o["p99_ns"].as_u64().unwrap());
            assert!(0 < p50 && p50 <= p99, "{o}");
        }
        if mode == DataMode::Auto && v["raw"]["passthrough_opens"].as_u64() == Some(0) {
            eprintln!("note: kernel passthrough refused here; every open ran in the daemon");
        }
        let opens = v["raw"]["passthrough_opens"].as_u64().unwrap()
            + v["raw"]["daemon_opens"].as_u64().unwrap();
        assert_eq!(opens, N, "{mode}: every create is an open of one executor");

        // Reset: the next read starts from zero (the reset read itself
        // touches nothing on the mount).
        stats(m, true);
        let after = stats(m, false);
        assert_eq!(after["requests"].as_u64(), Some(0), "{after}");

        // Daemon-executed bytes are counted.
        if mode == DataMode::Daemon {
            let data = vec![7u8; 100_000];
            std::fs::write(m.join("data"), &data).unwrap();
            // Through the mount, not from the page cache the write left.
            let f = std::fs::File::open(m.join("data")).unwrap();
            f.sync_all().unwrap();
            drop(f);
            let v = stats(m, false);
            assert_eq!(
                v["raw"]["daemon_write_bytes"].as_u64(),
                Some(100_000),
                "{v}"
            );
        }
    }
}

/// plfs maps are not whole-file, so a writable open's `close(2)` waits for
/// a FLUSH (the map is persisted there); a read-only open has nothing to
/// persist and closes without one.
#[test]
fn only_writable_opens_of_plfs_flush_at_close() {
    if !fuse_or_skip("only_writable_opens_of_plfs_flush_at_close") {
        return;
    }
    const N: u64 = 20;
    let s = MountSession::builder(mapfs_bin())
        .fs("plfs")
        .data(DataMode::Auto)
        .arg("--ttl")
        .arg("3600")
        .mount()
        .unwrap_or_else(|e| panic!("mounting plfs: {e:#}"));
    let m = s.mountpoint();
    std::fs::write(m.join("f"), b"plfs bytes").unwrap();
    quiet_stats(m);
    for _ in 0..N {
        assert_eq!(std::fs::read(m.join("f")).unwrap(), b"plfs bytes");
    }
    let c = common::op_counts(&quiet_stats(m));
    assert_eq!(c.get("OPEN"), Some(&(N, 0)), "{c:?}");
    assert_eq!(c.get("FLUSH"), None, "read-only closes flushed: {c:?}");
    for _ in 0..N {
        drop(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.join("f"))
                .unwrap(),
        );
    }
    let c = common::op_counts(&quiet_stats(m));
    assert_eq!(c.get("FLUSH"), Some(&(N, 0)), "{c:?}");
}

/// `mapfs stats --json --reset` once the counts stopped moving: a request
/// is counted after its reply is sent, so the last ones of a program may
/// be counted just after it went on (a `close` returns at the FLUSH
/// reply; RELEASE comes later still).
fn quiet_stats(mnt: &Path) -> serde_json::Value {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut last = common::op_counts(&stats(mnt, false));
    while std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(30));
        let now = common::op_counts(&stats(mnt, false));
        if now == last {
            break;
        }
        last = now;
    }
    stats(mnt, true)
}

/// Label pairs of a sample, in order.
type Labels = Vec<(String, String)>;

/// One sample: metric name, labels, value.
type Sample = (String, Labels, f64);

/// Checks `text` against the Prometheus text exposition format (0.0.4):
/// every sample belongs to a metric family declared by `# TYPE` before it,
/// names and labels are well formed, values are numbers, and each
/// histogram's buckets are cumulative, end in `+Inf`, and equal its
/// `_count`. Returns the samples as (name, labels, value).
fn parse_prometheus(text: &str) -> Vec<Sample> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut f = rest.splitn(3, ' ');
            let (kw, name, tail) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            assert!(name_ok(name), "bad metric name in {line:?}");
            if kw == "TYPE" {
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&tail),
                    "bad type in {line:?}"
                );
                assert!(
                    types.insert(name.into(), tail.into()).is_none(),
                    "type twice: {line}"
                );
            } else {
                assert_eq!(kw, "HELP", "{line:?}");
            }
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.trim().is_empty(),
            "{line:?}"
        );
        let (name, rest) = line.split_at(line.find(['{', ' ']).expect("a value"));
        assert!(name_ok(name), "bad metric name in {line:?}");
        let mut labels = Vec::new();
        let value = if let Some(body) = rest.strip_prefix('{') {
            // label="value" pairs, values with \\, \" and \n escapes.
            let mut chars = body.chars().peekable();
            loop {
                let key: String = std::iter::from_fn(|| chars.next_if(|&c| c != '=')).collect();
                assert!(name_ok(&key), "bad label name {key:?} in {line:?}");
                assert_eq!(chars.next(), Some('='), "{line:?}");
                assert_eq!(chars.next(), Some('"'), "{line:?}");
                let mut val = String::new();
                loop {
                    match chars.next().expect("unterminated label value") {
                        '\\' => match chars.next() {
                            Some('\\') => val.push('\\'),
                            Some('"') => val.push('"'),
                            Some('n') => val.push('\n'),
                            other => panic!("bad escape {other:?} in {line:?}"),
                        },
                        '"' => break,
                        c => val.push(c),
                    }
                }
                labels.push((key, val));
                match chars.next() {
                    Some(',') => continue,
                    Some('}') => break,
                    other => panic!("expected , or }} got {other:?} in {line:?}"),
                }
            }
            chars.collect::<String>()
        } else {
            rest.to_string()
        };
        let value = value.strip_prefix(' ').expect("one space before the value");
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v
                .parse()
                .unwrap_or_else(|e| panic!("bad value {v:?} in {line:?}: {e}")),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        assert!(
            types.contains_key(family),
            "sample before its # TYPE: {line:?}"
        );
        samples.push((name.to_string(), labels, v));
    }
    // Histograms: cumulative buckets ending in +Inf = _count.
    let mut series: HashMap<(String, Labels), Vec<(f64, f64)>> = HashMap::new();
    let mut count_of: HashMap<(String, Labels), f64> = HashMap::new();
    for (name, labels, v) in &samples {
        if let Some(f) = name.strip_suffix("_bucket") {
            let le = labels.iter().find(|(k, _)| k == "le").expect("le label");
            let le: f64 = if le.1 == "+Inf" {
                f64::INFINITY
            } else {
                le.1.parse().expect("numeric le")
            };
            let rest: Vec<_> = labels.iter().filter(|(k, _)| k != "le").cloned().collect();
            series
                .entry((f.to_string(), rest))
                .or_default()
                .push((le, *v));
        } else if let Some(f) = name.strip_suffix("_count") {
            count_of.insert((f.to_string(), labels.clone()), *v);
        }
    }
    assert!(!series.is_empty(), "no histogram in:\n{text}");
    for (key, buckets) in &series {
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{key:?}: {buckets:?}"
        );
        let last = buckets.last().unwrap();
        assert!(last.0.is_infinite(), "{key:?} has no +Inf bucket");
        assert_eq!(
            Some(&last.1),
            count_of.get(key),
            "{key:?}: +Inf bucket != _count"
        );
    }
    samples
}

#[test]
fn prometheus_output_parses() {
    if !fuse_or_skip("prometheus_output_parses") {
        return;
    }
    let s = mount(DataMode::Daemon);
    let m = s.mountpoint();
    for i in 0..5 {
        std::fs::write(m.join(format!("f{i}")), b"hello").unwrap();
        let _ = std::fs::metadata(m.join(format!("missing{i}")));
    }
    let text = mapfs(&["stats", "--prometheus"], m);
    let samples = parse_prometheus(&text);
    let value = |name: &str, op: &str| {
        samples
            .iter()
            .find(|(n, l, _)| n == name && l.iter().any(|(k, v)| k == "op" && v == op))
            .map(|s| s.2)
    };
    assert_eq!(
        value("mapfs_request_duration_seconds_count", "CREATE"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        value("mapfs_request_errors_total", "CREATE"),
        Some(0.0),
        "{text}"
    );
    assert!(
        value("mapfs_request_duration_seconds_count", "LOOKUP") >= Some(5.0),
        "{text}"
    );
    let mp = m.display().to_string();
    assert!(samples
        .iter()
        .all(|(_, l, _)| l.iter().any(|(k, v)| k == "mountpoint" && *v == mp)));
    // The human table names what it measured.
    let table = mapfs(&["stats"], m);
    assert!(table.contains("CREATE") && table.contains("P99"), "{table}");
}

/// Waits for `child` for up to a minute (a hang guard, not a timing
/// assertion), killing it after.
fn wait_or_kill(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn trace_shows_the_requests_of_a_pid() {
    if !fuse_or_skip("trace_shows_the_requests_of_a_pid") {
        return;
    }
    let s = mount(DataMode::Daemon);
    let m = s.mountpoint();
    for i in 0..3 {
        std::fs::write(s.backing().join(format!("x{i}")), b"x").unwrap();
        std::fs::write(s.backing().join(format!("y{i}")), b"y").unwrap();
    }
    // The traced process waits for a line on stdin, then becomes `stat`
    // (same pid: FUSE names the calling thread, so one thread) of 3 names.
    let mut worker = Command::new("/bin/sh")
        .arg("-c")
        .arg("read go && exec stat x0 x1 x2 > /dev/null")
        .current_dir(m)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = worker.id();
    let mut trace = Command::new(mapfs_bin())
        .args(["trace", "--json", "--op", "lookup", "--count", "3", "--pid"])
        .arg(pid.to_string())
        .arg(m)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Tracing has started once it says so.
    let mut err = BufReader::new(trace.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.starts_with("tracing"), "mapfs trace: {line}");
    // Another process's requests, while tracing: not shown.
    for i in 0..3 {
        std::fs::metadata(m.join(format!("y{i}"))).unwrap();
    }
    worker.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(wait_or_kill(&mut worker, "the traced stat").success());
    let st = wait_or_kill(&mut trace, "mapfs trace --count 3");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut trace.stdout.take().unwrap(), &mut out).unwrap();
    assert!(st.success(), "mapfs trace: {out}");
    let events: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events.len(), 3, "{out}");
    let names: Vec<_> = events.iter().map(|e| e["target"].as_str()).collect();
    assert_eq!(names, [Some("/x0"), Some("/x1"), Some("/x2")], "{out}");
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    for e in &events {
        // Wall-clock time, not time since the mount.
        let at = e["at_unix_ns"].as_u64().unwrap();
        assert!(now_ns - at < 60_000_000_000, "not the wall clock: {out}");
        assert_eq!(e["pid"].as_u64(), Some(pid as u64), "{out}");
        assert_eq!(e["op"].as_str(), Some("LOOKUP"), "{out}");
        assert_eq!(e["errno"].as_i64(), Some(0), "{out}");
        // Name lookups are about the root directory here.
        assert_eq!(e["nodeid"].as_u64(), Some(1), "{out}");
        assert_eq!(e["path"].as_str(), Some("/"), "{out}");
    }
}

/// The text trace names what a name operation was about (not only its
/// parent directory) and shows the wall-clock time.
#[test]
fn trace_text_shows_names_and_the_time_of_day() {
    if !fuse_or_skip("trace_text_shows_names_and_the_time_of_day") {
        return;
    }
    let s = mount(DataMode::Auto);
    let m = s.mountpoint();
    let mut trace = Command::new(mapfs_bin())
        .arg("trace")
        .arg(m)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(trace.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.starts_with("tracing"), "mapfs trace: {line}");
    let before = std::time::SystemTime::now();
    let st = Command::new("/bin/sh")
        .arg("-c")
        .arg("mkdir d && : > d/f && mv d/f d/g && rm d/g && rmdir d")
        .current_dir(m)
        .status()
        .unwrap();
    assert!(st.success());
    // The trace reads the daemon's queue every 100 ms.
    std::thread::sleep(Duration::from_millis(500));
    trace.kill().unwrap();
    trace.wait().unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut trace.stdout.take().unwrap(), &mut out).unwrap();
    let has = |op: &str, what: &str| {
        out.lines()
            .any(|l| l.split_whitespace().nth(2) == Some(op) && l.contains(what))
    };
    for (op, what) in [
        ("MKDIR", " /d "),
        ("CREATE", " /d/f "),
        ("RENAME", " /d/f -> /d/g "),
        ("UNLINK", " /d/g "),
        ("RMDIR", " /d "),
    ] {
        assert!(has(op, what), "no {op} of {what:?} in:\n{out}");
    }
    // The first column is the time of day (HH:MM:SS.uuuuuu), within the
    // seconds this took.
    let secs_of_day = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() % 86400
    };
    let first = out.lines().next().unwrap();
    let hms: Vec<u64> = first[..8].split(':').map(|p| p.parse().unwrap()).collect();
    assert_eq!(hms.len(), 3, "{first}");
    // Local time: compare modulo whole hours (time zones), to the minute.
    let shown = hms[1] * 60 + hms[2];
    let want = secs_of_day(before) % 3600;
    let diff = (shown + 3600 - want) % 3600;
    assert!(
        !(60..=3600 - 5).contains(&diff),
        "time {first:?}, expected about {want} s past the hour"
    );
}

#[test]
fn only_the_owner_or_root_resets_or_traces() {
    if !fuse_or_skip("only_the_owner_or_root_resets_or_traces") {
        return;
    }
    let s = mount(DataMode::Daemon);
    let m = s.mountpoint();
    std::fs::write(m.join("f"), b"x").unwrap();
    let before = common::op_counts(&stats(m, false));
    assert!(before.contains_key("CREATE"), "{before:?}");

    let as_nobody = |args: &[&str]| {
        let mut cmd = command_as_nobody(mapfs_bin());
        cmd.args(args).arg(m).env("HOME", "/");
        run_captured(&mut cmd).unwrap()
    };
    // Anyone may read the counts.
    let read = as_nobody(&["stats", "--json"]);
    assert!(read.success(), "nobody reading stats: {}", read.stderr);
    serde_json::from_str::<serde_json::Value>(&read.stdout).unwrap();
    // Not reset them.
    let reset = as_nobody(&["stats", "--reset"]);
    assert!(
        !reset.success(),
        "nobody reset the counters: {}",
        reset.stdout
    );
    assert!(reset.stderr.contains("only the owner"), "{}", reset.stderr);
    let after = common::op_counts(&stats(m, false));
    assert_eq!(
        after.get("CREATE"),
        before.get("CREATE"),
        "counters changed"
    );
    // Nor trace.
    let trace = as_nobody(&["trace", "--count", "1"]);
    assert!(!trace.success(), "nobody traced: {}", trace.stdout);
    assert!(trace.stderr.contains("only the owner"), "{}", trace.stderr);
    // The owner (root here) may.
    let reset = run_captured(Command::new(mapfs_bin()).args(["stats", "--reset"]).arg(m)).unwrap();
    assert!(reset.success(), "{}", reset.stderr);
    assert_eq!(stats(m, false)["requests"].as_u64(), Some(0));
}
