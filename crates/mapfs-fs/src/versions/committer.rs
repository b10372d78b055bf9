//! The queue of versions recorded but not committed (`pending.rs`), and
//! the thread that commits them.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::pending::{self, Record};
use super::retention::Policy;
use super::store::Store;

/// Ids reserved at once for recorded versions: one index transaction per
/// this many versions.
pub const ID_BLOCK: i64 = 256;

/// Records waiting for their rows, in the order they were logged.
#[derive(Debug)]
pub struct Committer {
    log: File,
    /// Logged, and waiting for their rewrite to give the name its new file
    /// ([`Committer::publish`]): never committed before that, so a row
    /// never names a file that is still live.
    unplaced: Mutex<Vec<Record>>,
    queue: Mutex<Vec<Record>>,
    /// `queue.len()`, read without the lock by every use of the index.
    waiting: AtomicUsize,
    wake: Condvar,
    stop: AtomicBool,
    /// Ids reserved and not given yet: `next..end`.
    pub(super) ids: Mutex<(i64, i64)>,
    /// The mount's limits, applied with each batch.
    pub(super) policy: Policy,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Committer {
    /// A committer appending to `log` (opened for appending, empty).
    pub fn new(log: File, policy: Policy) -> Committer {
        Committer {
            log,
            unplaced: Mutex::new(Vec::new()),
            queue: Mutex::new(Vec::new()),
            waiting: AtomicUsize::new(0),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            ids: Mutex::new((0, 0)),
            policy,
            thread: Mutex::new(None),
        }
    }

    /// Starts the thread that commits `me`'s records for `store` (which
    /// holds `me`).
    pub fn start(me: &Arc<Committer>, store: &Arc<Store>) -> std::io::Result<()> {
        let weak: Weak<Store> = Arc::downgrade(store);
        let c = me.clone();
        let t = std::thread::Builder::new()
            .name("versions-commit".into())
            .spawn(move || run(c, weak))?;
        *me.thread.lock() = Some(t);
        Ok(())
    }

    /// Logs `r`, to be committed once [`Committer::publish`]ed. Its object
    /// must exist already.
    pub fn log(&self, r: Record) -> std::io::Result<()> {
        let _q = self.queue.lock();
        pending::append(&self.log, &r)?;
        self.unplaced.lock().push(r);
        Ok(())
    }

    /// The rewrite of logged record `id` gave the name its new file: the
    /// record may be committed.
    pub fn publish(&self, id: i64) {
        let mut q = self.queue.lock();
        let mut u = self.unplaced.lock();
        if let Some(i) = u.iter().position(|r| r.id == id) {
            q.push(u.swap_remove(i));
            self.waiting.store(q.len(), Ordering::Release);
            self.wake.notify_one();
        }
    }

    /// The rewrite of logged record `id` failed before it gave the name a
    /// new file: the record is never committed (its object, which the
    /// caller removes, is missing for a successor reading the log too).
    pub fn forget(&self, id: i64) {
        let _q = self.queue.lock();
        self.unplaced.lock().retain(|r| r.id != id);
    }

    /// Whether records wait for their rows.
    pub fn waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Takes every waiting record (the caller holds the index).
    pub fn take(&self) -> Vec<Record> {
        let mut q = self.queue.lock();
        self.waiting.store(0, Ordering::Release);
        std::mem::take(&mut *q)
    }

    /// Puts back records whose commit failed, before any queued since.
    pub fn put_back(&self, mut rs: Vec<Record>) {
        let mut q = self.queue.lock();
        rs.append(&mut q);
        *q = rs;
        self.waiting.store(q.len(), Ordering::Release);
    }

    /// Empties the log if every record in it has its row (none queued,
    /// none waiting for its rewrite): called after a commit, with the
    /// index held.
    pub fn truncate_if_idle(&self) {
        let q = self.queue.lock();
        if q.is_empty() && self.unplaced.lock().is_empty() {
            if let Err(e) = self.log.set_len(0) {
                tracing::debug!("versions: cannot empty {}: {e}", pending::LOG);
            }
        }
    }

    /// Stops the thread (joined, unless this is it); what still waits is
    /// the caller's to commit (the store's drop does).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        {
            let _q = self.queue.lock();
            self.wake.notify_all();
        }
        let t = self.thread.lock().take();
        if let Some(t) = t {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }

    /// Waits until records wait or the committer stops; false: stop.
    fn wait(&self) -> bool {
        let mut q = self.queue.lock();
        while q.is_empty() && !self.stop.load(Ordering::Acquire) {
            self.wake.wait(&mut q);
        }
        !q.is_empty() || !self.stop.load(Ordering::Acquire)
    }
}

/// The thread: holds the committer, and the store only while committing
/// (the store goes when the file system does, and stops it then).
fn run(c: Arc<Committer>, weak: Weak<Store>) {
    let mut failed = false;
    while c.wait() {
        let Some(store) = weak.upgrade() else { return };
        match store.sync_pending() {
            Ok(()) => failed = false,
            Err(e) => {
                // One line per run of failures, not one per attempt.
                if !failed {
                    tracing::warn!("versions: cannot record versions in the index yet: {e}");
                }
                failed = true;
                drop(store);
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        }
    }
}
