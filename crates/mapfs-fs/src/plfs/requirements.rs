//! What plfs needs of its backing store, checked when a file system is
//! built over it (at mount), so a store that would lose or mix up data is
//! refused with a clear message instead.
//!
//! plfs keeps every file as a directory of append logs and index droppings
//! and coordinates the processes and hosts sharing it through the store
//! alone (no coordinator). It relies on:
//!
//! 1. **Atomic rename over an existing name**: a dropping is replaced by
//!    renaming a complete temporary file over it; a reader opens the old or
//!    the new file, never a mix or nothing.
//! 2. **Rename that refuses an existing target**: two hosts creating one
//!    name cannot both win. `RENAME_NOREPLACE` where the store has it (a
//!    new container is renamed into place with it); where it does not
//!    (GlusterFS's client), containers are made in place by one creator of
//!    a name at a time (`container::Claim`, `Plfs::make_file_in_place`),
//!    because Gluster's distributed rename of a directory can replace
//!    another host's racing one or leave the name without its identity. A
//!    rename with the flag that replaces an existing name is refused.
//! 3. **`flock` that excludes across every process and host** sharing the
//!    store: the container lock (exclusive for dropping writes and
//!    compaction, shared for merges) and the shared lock each live writer
//!    holds on its log, which compaction and crash recovery test before
//!    removing a log. Two open file descriptions of one file must exclude
//!    each other.
//! 4. **Directory listings that are current**: a name created, renamed in or
//!    removed is (not) listed by the next `readdir` of a new descriptor,
//!    from any host (droppings are found by listing).
//! 5. **A directory's ctime changes whenever an entry is added, renamed in
//!    or removed**, at a granularity of at most 1 s, by a clock within 1 s
//!    of this host's (the merged-index cache of each host is valid while the
//!    container's mtime/ctime are unchanged, and is not trusted for a
//!    container changed less than 1 s before it was merged: `store.rs`).
//!
//! Not needed: `O_APPEND` (each log has one writer, which places its bytes
//! with `pwrite` at offsets it tracks itself), hard links, xattrs, byte-range
//! locks. Needed across hosts but not checkable from one: close-to-open of
//! file bytes (bytes written and closed on one host are read by an open on
//! another), clocks within a few milliseconds of each other (records of
//! different hosts are ordered by time), and a lock released when the
//! process holding it dies. See `docs/plfs-hosts.md`.
//!
//! Checks 1–5 run in a hidden scratch directory (`.plfs-new.probe-*`, a
//! reserved name) beneath the backing root, removed afterwards.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use mapfs::backing::BackingRoot;
use mapfs::{Error, Result};
use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, RenameFlags};

use super::container;
use super::format::{self, NEW_PREFIX};

/// Checks that the store beneath `root` provides what plfs relies on (see
/// the module docs); an error names the first property missing.
pub(super) fn check(root: &BackingRoot) -> Result<()> {
    let top = root.fd();
    let name = format!("{NEW_PREFIX}probe-{}", format::new_id());
    rustix::fs::mkdirat(top, name.as_str(), Mode::from_raw_mode(0o700))
        .map_err(|e| refuse(&format!("cannot create a scratch directory: {e}")))?;
    let res = container::open_dir(top, name.as_ref()).and_then(|d| probe(d.as_fd()));
    if let Err(e) = container::remove_tree(top, OsStr::new(&name)) {
        tracing::warn!("plfs: cannot remove the probe directory {name}: {e}");
    }
    res
}

fn refuse(what: &str) -> Error {
    Error::from_errno(libc::EINVAL).context(format!(
        "this backing store cannot hold plfs files: {what} (plfs needs atomic rename, \
         a rename that refuses an existing target, flock that excludes across processes \
         and hosts, current \
         directory listings and directory ctimes that change with every entry; see \
         docs/plfs-hosts.md)"
    ))
}

fn write_file(dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> Result<()> {
    let mut f = container::open_file(dir, name, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL)?;
    f.write_all(bytes)?;
    Ok(())
}

fn read_file(dir: BorrowedFd<'_>, name: &str) -> Result<Vec<u8>> {
    let mut f = container::open_file(dir, name, OFlags::RDONLY)?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

fn listed(dir: BorrowedFd<'_>) -> Result<Vec<String>> {
    let fd: OwnedFd = mapfs::backing::openat2_beneath(
        dir,
        OsStr::new("."),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    super::container::each_entry(fd.as_fd(), |n, _, _| {
        out.push(n.to_string_lossy().into_owned());
    })?;
    Ok(out)
}

/// True when the timestamps of `dir` differ from `before` now, or after
/// more entries are added and removed within 1.2 s: the merged-index cache
/// distrusts timestamps younger than 1 s, so a granularity up to that works
/// (most stores change them at once).
fn changes_ctime(dir: BorrowedFd<'_>, before: super::store::Validator, tag: &str) -> Result<bool> {
    let start = std::time::Instant::now();
    let mut n = 0;
    loop {
        if super::store::validator(dir)? != before {
            return Ok(true);
        }
        if start.elapsed() > std::time::Duration::from_millis(1200) {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let name = format!("tmp.{tag}{n}");
        n += 1;
        write_file(dir, &name, b"")?;
        rustix::fs::unlinkat(dir, name.as_str(), AtFlags::empty())?;
    }
}

fn probe(dir: BorrowedFd<'_>) -> Result<()> {
    // 4 and 5: a name renamed in is listed and changes the ctime.
    let before = super::store::validator(dir)?;
    write_file(dir, "tmp.a", b"new")?;
    rustix::fs::renameat(dir, "tmp.a", dir, "index.a")
        .map_err(|e| refuse(&format!("rename fails: {e}")))?;
    if !changes_ctime(dir, before, "in")? {
        return Err(refuse(
            "a directory's mtime/ctime did not change within 1.2 s of files renamed into it",
        ));
    }
    if !listed(dir)?.iter().any(|n| n == "index.a") {
        return Err(refuse("a file renamed into a directory is not listed"));
    }
    // 1: rename over an existing name replaces it whole.
    write_file(dir, "tmp.b", b"newer")?;
    rustix::fs::renameat(dir, "tmp.b", dir, "index.a")
        .map_err(|e| refuse(&format!("rename over an existing file fails: {e}")))?;
    if read_file(dir, "index.a")? != b"newer" {
        return Err(refuse(
            "a file renamed over another does not read as the renamed file",
        ));
    }
    if listed(dir)?.iter().any(|n| n == "tmp.b") {
        return Err(refuse("a renamed file is still listed under its old name"));
    }
    // 2: a rename that must not replace refuses an existing target, and
    // moves a directory to a free name.
    write_file(dir, "tmp.c", b"other")?;
    match rustix::fs::renameat_with(dir, "tmp.c", dir, "index.a", RenameFlags::NOREPLACE) {
        Err(rustix::io::Errno::EXIST | rustix::io::Errno::INVAL) => {}
        Ok(()) => {
            return Err(refuse(
                "rename with RENAME_NOREPLACE replaced an existing file",
            ))
        }
        Err(e) => return Err(refuse(&format!("rename with RENAME_NOREPLACE fails: {e}"))),
    }
    rustix::fs::mkdirat(dir, "d", Mode::from_raw_mode(0o700))?;
    write_file(dir, "d/.plfs", b"")?;
    container::rename_noreplace(dir, "d".as_ref(), dir, "e".as_ref())
        .map_err(|e| refuse(&format!("renaming a directory to a free name fails: {e}")))?;
    match container::rename_noreplace(dir, "e".as_ref(), dir, "index.a".as_ref()) {
        Err(e) if e.errno() == libc::EEXIST => {}
        Ok(()) => {
            return Err(refuse(
                "a directory renamed over an existing file replaced it",
            ))
        }
        Err(e) => {
            return Err(refuse(&format!(
                "renaming a directory over a file fails: {e}"
            )))
        }
    }
    // 3: flock of two open file descriptions excludes.
    let a = container::open_file(dir, "index.a", OFlags::RDONLY)?;
    let b = container::open_file(dir, "index.a", OFlags::RDONLY)?;
    rustix::fs::flock(&a, FlockOperation::LockShared)
        .map_err(|e| refuse(&format!("flock fails: {e}")))?;
    match rustix::fs::flock(&b, FlockOperation::NonBlockingLockExclusive) {
        Err(rustix::io::Errno::WOULDBLOCK) => {}
        Ok(()) => {
            return Err(refuse(
                "an exclusive flock was granted while another open file held a shared one",
            ))
        }
        Err(e) => return Err(refuse(&format!("flock fails: {e}"))),
    }
    drop(a);
    // Released at close, eventually: a FUSE client (Gluster) sends the
    // release after close(2) has returned.
    let mut tries = 0;
    loop {
        match rustix::fs::flock(&b, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => break,
            Err(rustix::io::Errno::WOULDBLOCK) if tries < 300 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => {
                return Err(refuse(&format!(
                    "an flock is not released within 3 s of its file's close: {e}"
                )))
            }
        }
    }
    drop(b);
    // 4: a removed name is no longer listed, and the removal changes ctime.
    let before = super::store::validator(dir)?;
    rustix::fs::unlinkat(dir, "index.a", AtFlags::empty())?;
    if super::store::validator(dir)? == before && !changes_ctime(dir, before, "rm")? {
        return Err(refuse(
            "a directory's mtime/ctime did not change within 1.2 s of files removed from it",
        ));
    }
    if listed(dir)?.iter().any(|n| n == "index.a") {
        return Err(refuse("a removed file is still listed"));
    }
    Ok(())
}
