//! The file system's housekeeping thread: rounds of
//! [`FileSystem::housekeeping`] between requests, at the interval and with
//! the bell its [`mapfs::Housekeeping`] asks for.

use super::*;

/// How often the file system wants its housekeeping, unless
/// `MAPFS_HOUSEKEEPING_MS` says otherwise (milliseconds; 0: never, for
/// tests of what a crash between two rounds leaves).
pub(super) fn housekeeping_every(caps: &Capabilities) -> Option<std::time::Duration> {
    let every = caps.housekeeping.as_ref()?.every;
    match std::env::var("MAPFS_HOUSEKEEPING_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(0) => None,
        Some(ms) => Some(std::time::Duration::from_millis(ms)),
        None => Some(every),
    }
}

/// The nice value of the housekeeping thread: work between requests yields
/// the processor to requests. On two cores, a batch of moves at the
/// daemon's own priority (about 1.3 ms for 64 files) kept the thread that
/// was to serve the writer's next request waiting for its turn: `pack`
/// wrote small files 14% faster at 19 (five rounds, tmpfs). Still a share
/// of the processor, never none (not `SCHED_IDLE`): a move holds the
/// database's lock for its transaction, which requests then wait for.
pub(super) const HOUSEKEEPING_NICE: i32 = 19;

/// Starts the thread that calls `fs`'s [`FileSystem::housekeeping`]: when
/// the file system rings the bell put in its `slot`
/// ([`mapfs::Housekeeping::bell`]), or else every `every`; until the bell
/// is stopped or the file system dropped. Returns the bell.
pub(super) fn spawn_housekeeping(
    fs: &Arc<dyn FileSystem>,
    every: Duration,
    slot: Option<&OnceLock<Bell>>,
) -> Result<Bell> {
    let bell = Bell::new();
    let rung = slot.is_some_and(|slot| slot.set(bell.clone()).is_ok());
    let fs = Arc::downgrade(fs);
    let waits = bell.clone();
    std::thread::Builder::new()
        .name("mapfs-housekeeping".into())
        .spawn(move || {
            // On Linux a thread id names just that thread here.
            let me = rustix::thread::gettid();
            if let Err(e) = rustix::process::setpriority_process(Some(me), HOUSEKEEPING_NICE) {
                debug!("housekeeping keeps the daemon's priority: {e}");
            }
            housekeeping_loop(&fs, &waits, rung, every);
        })
        .map_err(|e| mapfs::Error::from(e).context("starting the housekeeping thread"))?;
    Ok(bell)
}

/// The housekeeping thread's rounds (see [`spawn_housekeeping`]).
pub(super) fn housekeeping_loop(
    fs: &std::sync::Weak<dyn FileSystem>,
    bell: &Bell,
    rung: bool,
    every: Duration,
) {
    loop {
        if !rung {
            // A file system that rings nothing gets a round every `every`.
            bell.soon();
        }
        if !bell.wait(every) {
            return;
        }
        match fs.upgrade() {
            Some(fs) => fs.housekeeping(),
            None => return,
        }
    }
}
