//! Write sessions: the writable opens of one file that overlap, and the
//! versions they make.
//!
//! A close reaches the file system only later (FUSE `release` is
//! asynchronous), so a writer that looks still open may be done. A writer
//! that joins a session whose file changed since its latest version
//! therefore takes a new version of the file as it is then: every change a
//! program makes after its open is preceded by a version of what it found,
//! whatever the timing of earlier closes.

use std::fs::File;
use std::sync::Arc;

use mapfs::Result;

use super::delta::{Ranges, Undo};
use super::store::Store;

/// Size, mtime and ctime (seconds, nanoseconds) of a file.
pub type Stamp = (i64, i64, i64, i64, i64);

/// A stamp no file has: a session stamped so counts as changed until its
/// next version is taken.
pub const CHANGED: Stamp = (-1, -1, -1, -1, -1);

/// The stamp of an open file.
#[allow(clippy::unnecessary_cast)]
pub fn stamp_of(f: &File) -> Result<Stamp> {
    let st = rustix::fs::fstat(f)?;
    Ok((
        st.st_size as i64,
        st.st_mtime as i64,
        st.st_mtime_nsec as i64,
        st.st_ctime as i64,
        st.st_ctime_nsec as i64,
    ))
}

/// How the latest version of a session holds the file.
#[derive(Debug, Clone)]
pub enum Current {
    /// No version (the file was empty).
    Nothing,
    /// A reflink or copy: writers write the file directly.
    Whole,
    /// An undo version: writers with undo maps save what they overwrite.
    Undo(Arc<Undo>),
}

/// The writable opens of one file.
#[derive(Debug)]
pub struct Session {
    /// Writers open.
    pub writers: usize,
    /// Of those, writers with whole-file maps (they write the file directly).
    pub direct: usize,
    /// Versions made, oldest first.
    pub versions: Vec<i64>,
    /// Their objects, each holding the mark that tells other processes the
    /// version is being made ([`Store::mark_in_use`]); dropped with the
    /// session.
    pub marks: Vec<File>,
    /// Undo versions of this session: whatever any undo writer overwrites
    /// is saved into each.
    pub undos: Vec<Arc<Undo>>,
    /// How the latest version holds the file.
    pub current: Current,
    /// What undo writers were made able to write in place (saved first
    /// into the undo versions of the time): a version taken later saves it
    /// at once, since those writers write there without asking again.
    pub writable: Ranges,
    /// The version taken at the latest point a writer found the file
    /// changed (or at the start); dropped at the end if nothing changed
    /// since.
    pub latest: Option<i64>,
    /// The file, opened by the daemon read-write (saving needs to read what
    /// a caller's descriptor may not).
    pub backing: Arc<File>,
    /// The file's stamp right after the latest version was taken.
    pub stamp: Stamp,
}

impl Session {
    /// A session on `backing`, with no version yet.
    pub fn new(backing: Arc<File>) -> Result<Session> {
        Ok(Session {
            writers: 0,
            direct: 0,
            versions: Vec::new(),
            marks: Vec::new(),
            undos: Vec::new(),
            current: Current::Nothing,
            writable: Ranges::default(),
            latest: None,
            stamp: stamp_of(&backing)?,
            backing,
        })
    }

    /// True when the file changed since the latest version was taken.
    pub fn changed(&self) -> Result<bool> {
        Ok(match &self.current {
            Current::Undo(u) => !u.is_empty() || self.backing.metadata()?.len() != u.orig_size,
            _ => stamp_of(&self.backing)? != self.stamp,
        })
    }

    /// Saves `ranges` of the file into every undo version of the session.
    pub fn save_all(&self, store: &Store, ranges: &[(u64, u64)]) -> Result<()> {
        for u in &self.undos {
            u.save(store, &self.backing, ranges)?;
        }
        Ok(())
    }
}
