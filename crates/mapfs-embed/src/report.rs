//! What the embedded file systems served in this process, and the summary
//! written at exit when `MAPFS_PRELOAD_REPORT=<path>` is set: one JSON
//! object per process image, appended as one line, e.g.
//!
//! ```json
//! {"library":"embed","pid":12,"exe":"/usr/bin/cp","calls":{"openat":{"count":3,"ns":41230},"read":{"count":2,"ns":5120}}}
//! ```
//!
//! `calls` names each hooked libc function that a file system served (a
//! path under a prefix, or a descriptor of a file served by the data
//! engine), with how many times and the wall time spent inside the
//! library, file system included. Calls that went on to the host are not
//! counted; nor are the data calls on the backing descriptors of 1-to-1
//! maps, which are the kernel's own (no hook runs).
//!
//! Off unless the variable is set: then a hook costs one relaxed load more.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mapfs_interpose::sync::Mutex;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Per call name: count and nanoseconds.
static CALLS: Mutex<Vec<(&'static str, u64, u64)>> = Mutex::new(Vec::new());

thread_local! {
    /// The hooked function the application called on this thread.
    static CALL: Cell<&'static str> = const { Cell::new("") };
}

/// Reads the environment once (the constructor).
pub fn init() {
    ENABLED.store(mapfs::preload_report::wanted(), Ordering::Relaxed);
}

/// Entered hook `name` from the application (not from the library's own
/// work, whose libc calls pass through hooks too).
#[inline]
pub fn enter_call(name: &'static str) {
    if ENABLED.load(Ordering::Relaxed) && !crate::inside() {
        CALL.with(|c| c.set(name));
    }
}

/// Times a served call: counted under the hook the application entered
/// when dropped.
pub struct Served(Option<Instant>);

impl Served {
    /// Starts timing (nothing when reporting is off).
    #[inline]
    pub fn start() -> Served {
        Served(ENABLED.load(Ordering::Relaxed).then(Instant::now))
    }

    /// The call went to the host after all: not counted.
    pub fn not_served(mut self) {
        self.0 = None;
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(t) = self.0 {
            record(CALL.with(|c| c.get()), t.elapsed());
        }
    }
}

fn record(name: &'static str, d: Duration) {
    let name = if name.is_empty() { "other" } else { name };
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut calls = CALLS.lock();
    match calls.iter_mut().find(|c| c.0 == name) {
        Some(c) => {
            c.1 += 1;
            c.2 = c.2.saturating_add(ns);
        }
        None => calls.push((name, 1, ns)),
    }
}

/// The JSON line of this process.
pub fn summary() -> String {
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let calls: serde_json::Map<String, serde_json::Value> = CALLS
        .lock()
        .iter()
        .map(|&(name, count, ns)| {
            (
                name.to_string(),
                serde_json::json!({ "count": count, "ns": ns }),
            )
        })
        .collect();
    serde_json::json!({
        "library": "embed",
        "pid": std::process::id(),
        "exe": exe,
        "calls": calls,
    })
    .to_string()
}

/// Before `exec` replaces the image (no destructor runs): its line is
/// written now, and the counts start again should the `exec` fail.
pub fn before_exec() {
    if !ENABLED.load(Ordering::Relaxed) || crate::inside() {
        return;
    }
    if let Some(_g) = crate::Guard::enter() {
        write_at_exit();
        CALLS.lock().clear();
    }
}

/// [`write_at_exit`] for `_exit`, which runs no destructor.
pub fn write_at_quick_exit() {
    if ENABLED.load(Ordering::Relaxed) && !crate::inside() {
        if let Some(_g) = crate::Guard::enter() {
            write_at_exit();
        }
    }
}

/// Appends this process's line to the report file (at exit).
pub fn write_at_exit() {
    if ENABLED.load(Ordering::Relaxed) {
        mapfs::preload_report::append(&summary());
    }
}
