//! The map-cache tokens on a real mount: a client holding the generation
//! table (it comes with the first adoption) sees an inode's token stay put across
//! read-only opens (and adoptions) and change after a write+close, an
//! ftruncate, a punch hole, a copy_file_range into it, a daemon write, a
//! truncate by path, a rename (moved and replaced inode), an unlink and a
//! re-create through the mount.
//!
//! Each check uses its own file, created in the backing directory behind the
//! mount's back, so that no asynchronous `release` of an earlier writable
//! open through the mount can bump it, and the files' token slots are
//! pairwise distinct, so no check sees another's bumps.

mod common;

use std::collections::HashSet;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use common::{fuse_or_skip, mount, DataMode, MountSession};
use mapfs::control::{self, Request, Response};
use mapfs::mapcache::{self, Generations};
use mapfs_testkit::libc_io;
use rustix::fs::FallocateFlags;

/// A client of the mount's control socket holding the generation table.
struct Client {
    conn: control::Connection,
    table: Generations,
    /// Token slots of the files made so far.
    slots: HashSet<usize>,
    test: String,
    socket: PathBuf,
}

impl Client {
    /// Connects once the daemon serves its control socket (it starts it
    /// after `mapfs mount` returned), and adopts a file to get the table.
    fn attach(s: &MountSession, test: &str) -> Client {
        let path = control::socket_path(s.mountpoint());
        let mut last = None;
        let mut conn = None;
        for _ in 0..1000 {
            match control::connect(&path) {
                Ok(c) => {
                    conn = Some(c);
                    break;
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let conn = conn.unwrap_or_else(|| {
            panic!(
                "{test}: control socket {} never answered: {last:?}",
                path.display()
            )
        });
        let probe = s.backing().join("table-probe");
        fs::write(&probe, b"probe").unwrap();
        let f = fs::File::open(s.mountpoint().join("table-probe")).unwrap();
        let proof = control::prove(f.as_fd(), &conn.key).unwrap();
        let req = Request::Adopt {
            proof,
            flags: libc::O_RDONLY,
            engine: false,
        };
        let (resp, mut fds) = control::call(conn.sock.as_fd(), &req).unwrap();
        let Response::Adopted {
            files, generations, ..
        } = resp
        else {
            panic!("{test}: adopting our own open: {resp:?}");
        };
        let table = control::take_generations(&mut fds, files, generations)
            .unwrap_or_else(|| panic!("{test}: the first adoption carried no generation table"));
        let c = Client {
            conn,
            table,
            slots: HashSet::new(),
            test: test.to_string(),
            socket: path,
        };
        drop(f);
        c.wait_released();
        c
    }

    fn token(&self, ino: u64) -> u64 {
        self.table.token(ino)
    }

    /// Creates `name` in the backing directory (not through the mount) with
    /// a token slot no earlier file of this test uses; returns its path in
    /// the mount and its inode.
    fn fresh_file(&mut self, s: &MountSession, name: &str) -> (PathBuf, u64) {
        for attempt in 0..64 {
            let n = format!("{name}-{attempt}");
            let backing = s.backing().join(&n);
            fs::write(&backing, b"0123456789").unwrap();
            let ino = fs::metadata(&backing).unwrap().ino();
            if self.slots.insert(mapcache::slot(ino)) {
                return (s.mountpoint().join(n), ino);
            }
            // Kept: removing it would let the next file reuse its number.
        }
        panic!("{}: no file with a free token slot", self.test);
    }

    /// Asks the daemon for our read-only open `f` (the shim's request).
    fn adopt_ro(&self, f: &fs::File) -> Response {
        let proof = control::prove(f.as_fd(), &self.conn.key).unwrap();
        let req = Request::Adopt {
            proof,
            flags: libc::O_RDONLY,
            engine: false,
        };
        control::call(self.conn.sock.as_fd(), &req).unwrap().0
    }

    /// Opens `path` read-only through the mount, reads it, checks that the
    /// token read after the open survives an adoption, closes, and waits
    /// until the daemon has processed the release (the kernel sends it
    /// after `close` returned), so nothing of this open is still pending.
    /// Returns the token read after the open.
    fn ro_cycle(&self, path: &Path, ino: u64) -> u64 {
        let mut f = fs::File::open(path).unwrap();
        assert_eq!(f.metadata().unwrap().ino(), ino, "{}", self.test);
        let token = self.token(ino);
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).unwrap();
        let resp = self.adopt_ro(&f);
        assert!(
            matches!(resp, Response::Adopted { .. }),
            "{}: adopting our own open: {resp:?}",
            self.test
        );
        assert_eq!(
            self.token(ino),
            token,
            "{}: a read-only open, read and adoption changed the token",
            self.test
        );
        drop(f);
        self.wait_released();
        token
    }

    /// Polls (the observable effect, not a delay) until the daemon holds no
    /// open file (this test's mount has no other user).
    fn wait_released(&self) {
        for _ in 0..2000 {
            match control::status(&self.socket) {
                Ok(st) if st.open_files == 0 => return,
                Ok(_) => {}
                Err(e) => panic!("{}: status: {e}", self.test),
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("{}: the daemon never released the open", self.test);
    }
}

fn tokens_follow_changes(mode: DataMode) {
    let test = format!("generations --data {mode}");
    if !fuse_or_skip(&test) {
        return;
    }
    let s = mount(mode, &[]);
    let mut c = Client::attach(&s, &test);

    // Read-only opens leave the token alone.
    let (a, ino_a) = c.fresh_file(&s, "ro");
    let t0 = c.ro_cycle(&a, ino_a);
    let t1 = c.ro_cycle(&a, ino_a);
    let t2 = c.ro_cycle(&a, ino_a);
    assert_eq!((t1, t2), (t0, t0), "{test}: read-only opens bumped");
    assert_eq!(c.token(ino_a), t0, "{test}: read-only releases bumped");

    // Write + close.
    let (b, ino_b) = c.fresh_file(&s, "write");
    let before = c.ro_cycle(&b, ino_b);
    {
        let mut f = fs::OpenOptions::new().write(true).open(&b).unwrap();
        f.write_all(b"changed").unwrap();
    }
    assert_ne!(c.token(ino_b), before, "{test}: write+close kept the token");

    // Changes through a writable open, each checked while that open is
    // held (its open bumped already; its release would bump again).
    let (w, ino_w) = c.fresh_file(&s, "rw");
    let (src, _) = c.fresh_file(&s, "src");
    let src = fs::File::open(&src).unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&w)
        .unwrap();
    let before = c.token(ino_w);
    f.set_len(4).unwrap();
    assert_ne!(c.token(ino_w), before, "{test}: ftruncate kept the token");
    let before = c.token(ino_w);
    let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    match libc_io::fallocate(&f, punch, 0, 2) {
        Ok(()) => assert_ne!(c.token(ino_w), before, "{test}: punch hole kept the token"),
        Err(e) => eprintln!("{test}: punch hole not checked: fallocate failed with {e}"),
    }
    let before = c.token(ino_w);
    let (mut off_in, mut off_out) = (0u64, 4u64);
    let n = libc_io::copy_file_range(&src, Some(&mut off_in), &f, Some(&mut off_out), 6).unwrap();
    assert_eq!(n, 6, "{test}: short copy_file_range");
    assert_ne!(
        c.token(ino_w),
        before,
        "{test}: copy_file_range into the file kept the token"
    );
    if matches!(mode, DataMode::Daemon | DataMode::DaemonNoWriteback) {
        // Writes reach the daemon (with the writeback cache, at fsync);
        // under passthrough the kernel writes and the open bumped instead.
        let before = c.token(ino_w);
        f.write_all_at(b"w", 0).unwrap();
        f.sync_data().unwrap();
        assert_ne!(
            c.token(ino_w),
            before,
            "{test}: a daemon write kept the token"
        );
    }
    drop(f);
    drop(src);

    // Truncate by path (a setattr without an open).
    let (t, ino_t) = c.fresh_file(&s, "trunc");
    let before = c.ro_cycle(&t, ino_t);
    nix::unistd::truncate(&t, 3).unwrap();
    assert_ne!(c.token(ino_t), before, "{test}: truncate kept the token");
    assert_eq!(fs::metadata(&t).unwrap().len(), 3);

    // Rename, then rename over another file: both inodes change.
    let (r, ino_r) = c.fresh_file(&s, "rename");
    let before = c.ro_cycle(&r, ino_r);
    let r2 = s.mountpoint().join("renamed");
    fs::rename(&r, &r2).unwrap();
    let after_rename = c.token(ino_r);
    assert_ne!(after_rename, before, "{test}: rename kept the token");
    let (v, ino_v) = c.fresh_file(&s, "victim");
    let victim_before = c.ro_cycle(&v, ino_v);
    let r_before = c.ro_cycle(&r2, ino_r);
    assert_eq!(r_before, after_rename, "{test}");
    fs::rename(&r2, &v).unwrap();
    assert_ne!(
        c.token(ino_r),
        r_before,
        "{test}: rename over a file kept the moved inode's token"
    );
    assert_ne!(
        c.token(ino_v),
        victim_before,
        "{test}: rename over a file kept the replaced inode's token"
    );

    // Unlink, then re-create the name through the mount.
    let (u, ino_u) = c.fresh_file(&s, "unlink");
    let before = c.ro_cycle(&u, ino_u);
    fs::remove_file(&u).unwrap();
    let after_unlink = c.token(ino_u);
    assert_ne!(after_unlink, before, "{test}: unlink kept the token");
    fs::write(&u, b"new file").unwrap();
    let ino_new = fs::metadata(&u).unwrap().ino();
    if ino_new == ino_u {
        eprintln!("{test}: the re-created file reused inode {ino_u}");
        assert_ne!(
            c.token(ino_u),
            after_unlink,
            "{test}: a re-created file with a reused inode number kept the token"
        );
    } else if c.slots.insert(mapcache::slot(ino_new)) {
        // A slot nobody bumped before: only the create can have.
        assert_ne!(c.token(ino_new), 0, "{test}: create did not bump");
    } else {
        eprintln!("{test}: the re-created file shares a token slot; create not checked");
    }
}

#[test]
fn tokens_follow_changes_passthrough() {
    tokens_follow_changes(DataMode::Passthrough);
}

#[test]
fn tokens_follow_changes_auto() {
    tokens_follow_changes(DataMode::Auto);
}

/// With the kernel writeback cache nothing is adopted (the kernel would
/// keep stale sizes), so there is no table to follow.
#[test]
fn nothing_is_adopted_under_the_writeback_cache() {
    let test = "generations --data daemon (writeback cache)";
    if !fuse_or_skip(test) {
        return;
    }
    let s = mount(DataMode::Daemon, &[]);
    fs::write(s.backing().join("f"), b"x").unwrap();
    let path = control::socket_path(s.mountpoint());
    let conn = control::connect(&path).unwrap();
    assert!(conn.writeback_cache, "{test}: Hello did not say so");
    let f = fs::File::open(s.mountpoint().join("f")).unwrap();
    let proof = control::prove(f.as_fd(), &conn.key).unwrap();
    let req = Request::Adopt {
        proof,
        flags: libc::O_RDONLY,
        engine: false,
    };
    let (resp, fds) = control::call(conn.sock.as_fd(), &req).unwrap();
    assert!(
        matches!(
            resp,
            Response::Refused {
                errno: libc::EOPNOTSUPP,
                ..
            }
        ),
        "{test}: {resp:?}"
    );
    assert!(fds.is_empty(), "{test}: descriptors came with a refusal");
}

#[test]
fn tokens_follow_changes_daemon_nowb() {
    tokens_follow_changes(DataMode::DaemonNoWriteback);
}
