//! Counters of what the shim served, and the summary it writes at exit when
//! `MAPFS_PRELOAD_REPORT=<path>` is set: one JSON object per process,
//! appended as one line, e.g.
//!
//! ```json
//! {"pid":12,"exe":"/usr/bin/cat","tracked":1,"adopted":1,"cache_hits":0,"native_calls":3,"mount_calls":0,"fallbacks":{}}
//! ```
//!
//! `native_calls` counts hooked data calls on adopted descriptors (they ran
//! on the backing file), `mount_calls` those on descriptors served through
//! the mount, `cache_hits` the adoptions served by the map cache without
//! asking the daemon ([`crate::mcache`]). Calls glibc makes internally
//! (stdio) are not hooked and not counted, though on adopted descriptors
//! they are native too.

use std::sync::atomic::{AtomicU64, Ordering};

use mapfs_interpose::sync::Mutex;

/// Sharded so that threads doing I/O in parallel do not fight over one
/// cache line.
struct Sharded([Padded; 16]);

#[repr(align(64))]
struct Padded(AtomicU64);

impl Sharded {
    const fn new() -> Self {
        Sharded([const { Padded(AtomicU64::new(0)) }; 16])
    }
    #[inline]
    fn add(&self) {
        let shard = THREAD_SHARD.with(|s| s.get());
        self.0[shard % 16].0.fetch_add(1, Ordering::Relaxed);
    }
    fn sum(&self) -> u64 {
        self.0.iter().map(|p| p.0.load(Ordering::Relaxed)).sum()
    }
}

thread_local! {
    static THREAD_SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

static NEXT_SHARD: AtomicU64 = AtomicU64::new(0);

fn shard_init() {
    THREAD_SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) as usize);
        }
    });
}

static NATIVE: Sharded = Sharded::new();
static MOUNT: Sharded = Sharded::new();
static TRACKED: AtomicU64 = AtomicU64::new(0);
static ADOPTED: AtomicU64 = AtomicU64::new(0);
static CACHE_HITS: AtomicU64 = AtomicU64::new(0);
static FALLBACKS: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// A data call ran natively on an adopted descriptor.
#[inline]
pub fn count_native() {
    shard_init();
    NATIVE.add();
}

/// A data call went through the mount.
#[inline]
pub fn count_mount() {
    shard_init();
    MOUNT.add();
}

/// A mapfs file was opened.
pub fn count_tracked() {
    TRACKED.fetch_add(1, Ordering::Relaxed);
}

/// An open was adopted.
pub fn count_adopted() {
    ADOPTED.fetch_add(1, Ordering::Relaxed);
}

/// An adoption was served from the map cache (no daemon round trip).
pub fn count_cache_hit() {
    CACHE_HITS.fetch_add(1, Ordering::Relaxed);
}

/// Adoptions served from the map cache so far.
pub fn cache_hits() -> u64 {
    CACHE_HITS.load(Ordering::Relaxed)
}

/// An open could not be adopted, for `reason`.
pub fn count_fallback(reason: &str) {
    // Reasons carry errno text; the first words group them.
    let key: String = reason.split(':').next().unwrap_or(reason).to_string();
    let mut f = FALLBACKS.lock();
    match f.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => *n += 1,
        None => f.push((key, 1)),
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The summary line.
pub fn summary() -> String {
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let fallbacks: Vec<String> = FALLBACKS
        .lock()
        .iter()
        .map(|(k, n)| format!("{}:{n}", json_string(k)))
        .collect();
    format!(
        "{{\"pid\":{},\"exe\":{},\"tracked\":{},\"adopted\":{},\"cache_hits\":{},\"native_calls\":{},\"mount_calls\":{},\"fallbacks\":{{{}}}}}",
        crate::sys::getpid(),
        json_string(&exe),
        TRACKED.load(Ordering::Relaxed),
        ADOPTED.load(Ordering::Relaxed),
        CACHE_HITS.load(Ordering::Relaxed),
        NATIVE.sum(),
        MOUNT.sum(),
        fallbacks.join(",")
    )
}

/// Appends the summary to `$MAPFS_PRELOAD_REPORT`, if set.
pub fn write_at_exit() {
    // Asked of libc's `getenv` first: every process runs this at exit, and
    // std's `var_os` takes the environment lock and copies (measured: 2-3
    // page faults of each process that wants no report).
    // SAFETY: getenv with a NUL-terminated name; its answer is only
    // compared with null.
    let set = unsafe { !libc::getenv(c"MAPFS_PRELOAD_REPORT".as_ptr()).is_null() };
    if set && mapfs::preload_report::wanted() {
        mapfs::preload_report::append(&summary());
    }
}
