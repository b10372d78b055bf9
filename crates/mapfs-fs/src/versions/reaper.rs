//! Removal of dropped versions' objects, off the request that dropped them.
//!
//! Dropping a version takes two steps (see `Store::delete_ids`): its row,
//! in an index transaction, which is what decides; then its object, whose
//! removal frees an inode and all its blocks. A mount at its count limit
//! drops a version at every rewrite, and the open that made the new one
//! waited for that removal: as long as the truncate the rewrite does
//! natively, and on ext4 without a journal it also slows the next inode
//! allocations. The reaper removes those objects in a thread of its own.
//!
//! Bounded: at most [`QUEUE`] removals wait; past that the caller removes
//! the object itself. Removals still queued at unmount are done before the
//! store closes. A daemon killed first leaves them as orphans (objects
//! without a row), which the next instance removes
//! (`Store::remove_orphans`).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::thread::JoinHandle;

use rustix::fs::AtFlags;

/// Removals that may wait at once.
pub const QUEUE: usize = 4096;

/// A thread removing objects from the store's `objects` directory.
#[derive(Debug)]
pub struct Reaper {
    queue: Option<SyncSender<String>>,
    thread: Option<JoinHandle<()>>,
}

impl Reaper {
    /// Starts the thread, with its own descriptor of `objects`.
    pub fn start(objects: BorrowedFd<'_>) -> std::io::Result<Reaper> {
        let dir: OwnedFd = rustix::io::fcntl_dupfd_cloexec(objects, 3)?;
        let (queue, names) = sync_channel::<String>(QUEUE);
        let thread = std::thread::Builder::new()
            .name("versions-reaper".into())
            .spawn(move || {
                let mut failed = false;
                for name in names {
                    match rustix::fs::unlinkat(&dir, &name, AtFlags::empty()) {
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
            })?;
        Ok(Reaper {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Queues the removal of object `name`; false (nothing queued) when
    /// the queue is full or the thread is gone.
    pub fn offer(&self, name: String) -> bool {
        match self.queue.as_ref().map(|q| q.try_send(name)) {
            Some(Ok(())) => true,
            Some(Err(TrySendError::Full(_) | TrySendError::Disconnected(_))) | None => false,
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has removed the rest.
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
