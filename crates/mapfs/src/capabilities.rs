//! What a file system promises about itself: one value, asked once when an
//! instance starts serving ([`FileSystem::capabilities`]), from which an
//! executor chooses its caching, its close-time round trips and its
//! housekeeping thread. Nothing here names FUSE: each field says what is
//! true of the file system, and each executor draws its own conclusions.
//!
//! Every default is the cautious answer (nothing promised), so a file
//! system that says nothing is served correctly, only with more round
//! trips than it may need.
//!
//! [`FileSystem::capabilities`]: crate::FileSystem::capabilities

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::housekeeping::Bell;

/// Paths under which names may appear with no call of the file system
/// that makes them (see [`Capabilities::names_appear_by_themselves`]).
pub type AppearingNames = Arc<dyn Fn(&Path) -> bool + Send + Sync>;

/// What a file system promises (see the [module docs](self)). Built from
/// [`Capabilities::default`] and its setters, so that fields added later
/// keep their cautious defaults in existing file systems.
#[derive(Clone)]
#[non_exhaustive]
pub struct Capabilities {
    /// Where a name can come into being with no call to this file system
    /// that makes it (a virtual directory whose entries follow other
    /// changes, as `versions`' `.versions`): an executor must not remember
    /// that such a name was missing. `None` (the default): nowhere, so a
    /// mount may remember missing names for its entry lifetime.
    pub names_appear_by_themselves: Option<AppearingNames>,
    /// The bytes of this file system's files change only through its own
    /// calls and the maps it hands out: nothing else (another host, a
    /// process working in the backing directory) writes its backing files
    /// while it is mounted. A mount then lets the kernel keep a file's
    /// cached pages from one read-only open to the next. Default: false.
    pub only_this_mount_writes: bool,
    /// Files up to this many bytes whose opens got a whole-file map (run by
    /// kernel passthrough or a shim) leave it at their last release, for a
    /// map only the daemon runs (`pack` moves a new file from a file of its
    /// own into a slot). With [`Capabilities::only_this_mount_writes`] a
    /// mount then puts the bytes of such a file in the kernel's cache as
    /// its last writer closes. Default: 0, no file does.
    pub leaves_whole_file_at_close: u64,
    /// Some open may have something to persist when a descriptor of it is
    /// closed: a written map that is not whole-file 1-to-1 over one backing
    /// file, which [`FileSystem::flush`](crate::FileSystem::flush) keeps.
    /// False promises that `flush` never has work: every open's map is
    /// either whole-file 1-to-1 (its bytes are the backing file's own) or
    /// read-only, so an executor may stop asking at `close(2)`. Default:
    /// true.
    pub persists_at_close: bool,
    /// Work the file system does between requests, on a thread of the
    /// executor's own (see [`Housekeeping`]). Default: none.
    pub housekeeping: Option<Housekeeping>,
}

/// How a file system wants its [`FileSystem::housekeeping`] called.
///
/// [`FileSystem::housekeeping`]: crate::FileSystem::housekeeping
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Housekeeping {
    /// How often the thread calls it (with a bell: how long after the bell
    /// rings).
    pub every: Duration,
    /// Where the executor puts the bell of its housekeeping thread, once it
    /// starts one. A file system that rings the bell whenever it leaves
    /// work ([`Bell::soon`]) gets housekeeping only then, so an idle daemon
    /// sleeps; without a slot it gets a round every [`Housekeeping::every`]
    /// whether or not there is work. The slot stays empty where no thread
    /// runs (embedded mode, `MAPFS_HOUSEKEEPING_MS=0`): the file system
    /// then does such work itself.
    pub bell: Option<Arc<OnceLock<Bell>>>,
}

impl Housekeeping {
    /// A round every `every`, rung or not.
    pub fn periodic(every: Duration) -> Self {
        Housekeeping { every, bell: None }
    }

    /// Rounds only when rung: the executor puts its bell in `slot`.
    pub fn rung(every: Duration, slot: Arc<OnceLock<Bell>>) -> Self {
        Housekeeping {
            every,
            bell: Some(slot),
        }
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            names_appear_by_themselves: None,
            only_this_mount_writes: false,
            leaves_whole_file_at_close: 0,
            persists_at_close: true,
            housekeeping: None,
        }
    }
}

impl Capabilities {
    /// Whether a name at `path` may appear by itself (see the field).
    pub fn name_may_appear(&self, path: &Path) -> bool {
        self.names_appear_by_themselves
            .as_ref()
            .is_some_and(|f| f(path))
    }

    /// Names may appear by themselves where `at` says so.
    pub fn with_names_appearing(
        mut self,
        at: impl Fn(&Path) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.names_appear_by_themselves = Some(Arc::new(at));
        self
    }

    /// Only this mount writes the backing files (see the field).
    pub fn with_only_this_mount_writing(mut self, yes: bool) -> Self {
        self.only_this_mount_writes = yes;
        self
    }

    /// Files up to `bytes` leave their whole-file map at close.
    pub fn with_whole_file_left_at_close(mut self, bytes: u64) -> Self {
        self.leaves_whole_file_at_close = bytes;
        self
    }

    /// Every open's map is whole-file 1-to-1 or read-only: nothing to
    /// persist at close (see the field).
    pub fn with_nothing_to_persist_at_close(mut self) -> Self {
        self.persists_at_close = false;
        self
    }

    /// Housekeeping as `h` says.
    pub fn with_housekeeping(mut self, h: Housekeeping) -> Self {
        self.housekeeping = Some(h);
        self
    }
}

impl std::fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capabilities")
            .field(
                "names_appear_by_themselves",
                &self.names_appear_by_themselves.is_some(),
            )
            .field("only_this_mount_writes", &self.only_this_mount_writes)
            .field(
                "leaves_whole_file_at_close",
                &self.leaves_whole_file_at_close,
            )
            .field("persists_at_close", &self.persists_at_close)
            .field("housekeeping", &self.housekeeping)
            .finish()
    }
}
