//! Work a rewrite would otherwise wait for, done by a thread of the
//! daemon: removing dropped versions' objects, and making the empty files
//! that replace rewritten ones.
//!
//! Dropping a version takes two steps (see `Store::delete_ids`): its row,
//! in an index transaction, which is what decides; then its object, whose
//! removal frees an inode and all its blocks. A mount at its count limit
//! drops a version at every rewrite, and the open that made the new one
//! waited for that removal: as long as the truncate the rewrite does
//! natively, and on ext4 without a journal it also slows the next inode
//! allocations. And every `O_TRUNC` rewrite gives the name a new empty
//! inode (`replace.rs`), which the open made itself.
//!
//! Bounded: at most [`QUEUE`] removals wait (past that the caller removes
//! the object itself) and [`SPARES`] empty files are kept (when none is
//! ready, the caller makes one). Removals still queued when the store
//! closes are done first, and the spare files are removed. A daemon killed
//! first leaves orphans (objects without a row), which the next instance
//! removes (`Store::remove_orphans`), and spare files, which are
//! replacements by name (`Store::remove_replacements`).

use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use rustix::fs::{AtFlags, Mode, OFlags};

/// Removals that may wait at once.
pub const QUEUE: usize = 4096;

/// Empty files kept ready; refilled when fewer than half are left.
pub const SPARES: usize = 16;

#[derive(Debug)]
enum Job {
    Remove(String),
    Refill,
}

/// An empty file in `objects`, open read-write, and its name.
pub type Spare = (File, String);

/// The thread, its queue and its spare files.
#[derive(Debug)]
pub struct Upkeep {
    queue: Option<SyncSender<Job>>,
    thread: Option<JoinHandle<()>>,
    spares: Arc<Mutex<Vec<Spare>>>,
    dir: OwnedFd,
}

impl Upkeep {
    /// Starts the thread, with its own descriptor of `objects`; spare
    /// files are named `prefix` and a number.
    pub fn start(objects: BorrowedFd<'_>, prefix: String) -> std::io::Result<Upkeep> {
        let dir: OwnedFd = rustix::io::fcntl_dupfd_cloexec(objects, 3)?;
        let mine: OwnedFd = rustix::io::fcntl_dupfd_cloexec(objects, 3)?;
        let spares: Arc<Mutex<Vec<Spare>>> = Arc::new(Mutex::new(Vec::with_capacity(SPARES)));
        let (queue, jobs) = sync_channel::<Job>(QUEUE);
        let kept = spares.clone();
        let thread = std::thread::Builder::new()
            .name("versions-upkeep".into())
            .spawn(move || {
                let mut failed = false;
                let mut n = 0u64;
                for job in jobs {
                    match job {
                        Job::Remove(name) => {
                            match rustix::fs::unlinkat(&mine, &name, AtFlags::empty()) {
                                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                                // One line, not one per object: a store that
                                // cannot remove objects fails them all alike.
                                Err(e) if !failed => {
                                    failed = true;
                                    tracing::warn!("versions: cannot remove a dropped version ({name}): {e}; it stays until the next mount");
                                }
                                Err(_) => {}
                            }
                        }
                        Job::Refill => {
                            while kept.lock().len() < SPARES {
                                n += 1;
                                let name = format!("{prefix}s{n}");
                                let Ok(fd) = rustix::fs::openat(
                                    &mine,
                                    &name,
                                    OFlags::RDWR
                                        | OFlags::CREATE
                                        | OFlags::EXCL
                                        | OFlags::NOFOLLOW
                                        | OFlags::CLOEXEC,
                                    Mode::from_raw_mode(0o600),
                                ) else {
                                    // The caller makes its own.
                                    break;
                                };
                                kept.lock().push((File::from(fd), name));
                            }
                        }
                    }
                }
            })?;
        let u = Upkeep {
            queue: Some(queue),
            thread: Some(thread),
            spares,
            dir,
        };
        u.send(Job::Refill);
        Ok(u)
    }

    fn send(&self, job: Job) -> bool {
        self.queue.as_ref().is_some_and(|q| q.try_send(job).is_ok())
    }

    /// Queues the removal of object `name`; false (nothing queued) when
    /// the queue is full.
    pub fn offer_removal(&self, name: String) -> bool {
        self.send(Job::Remove(name))
    }

    /// An empty file made ahead, if one is ready.
    pub fn take_spare(&self) -> Option<Spare> {
        let mut s = self.spares.lock();
        let got = s.pop();
        if s.len() < SPARES / 2 {
            drop(s);
            self.send(Job::Refill);
        }
        got
    }
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has done the rest.
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for (_, name) in self.spares.lock().drain(..) {
            let _ = rustix::fs::unlinkat(&self.dir, &name, AtFlags::empty());
        }
    }
}
