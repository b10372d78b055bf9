//! A slow file-system call holds back only the names it changes: while an
//! `unlink` in one directory is stopped inside the file system, lookups,
//! creates, stats, renames of files, a listing and a `mkdir` in another
//! directory complete through the same mount.
//!
//! The file system under test is the passthrough file system with a gate in
//! `unlink` of names under `/slow`: the call says it has entered, then waits
//! until the test opens the gate. Nothing here measures speed: the other
//! calls must simply finish while the unlink is provably still inside the
//! file system (the gate is still shut). Every wait is bounded, so a daemon
//! that serialises the calls fails the test instead of hanging it.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use mapfs::{
    Attr, Capabilities, Ctx, DataMap, DirEntry, FileSystem, OpenFlags, Opened, RenameFlags, Result,
    SetAttr, StatFs,
};
use mapfs_fs::passthrough::Passthrough;
use mapfs_fuse::{mount, parse_options, AdapterOptions};

/// How long any one step may take before the test gives up: far above what
/// a loaded machine needs, far below a CI job's limit.
const BOUND: Duration = Duration::from_secs(20);

/// Where the gated unlink stands.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, bool)>, // (an unlink entered, the gate is open)
    changed: Condvar,
}

impl Gate {
    fn enter_and_wait(&self) {
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        self.changed.notify_all();
        // Bounded: a test that fails must not leave the daemon stuck.
        let _ = self
            .changed
            .wait_timeout_while(s, BOUND * 2, |s| !s.1)
            .unwrap();
    }

    fn wait_entered(&self) -> bool {
        let s = self.state.lock().unwrap();
        let (s, _) = self.changed.wait_timeout_while(s, BOUND, |s| !s.0).unwrap();
        s.0
    }

    fn is_open(&self) -> bool {
        self.state.lock().unwrap().1
    }

    fn open(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }
}

/// Passthrough, with `unlink` under `/slow` stopped at the gate.
struct Gated {
    inner: Passthrough,
    gate: Arc<Gate>,
}

impl FileSystem for Gated {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn getattr(&self, c: &Ctx, p: &Path) -> Result<Attr> {
        self.inner.getattr(c, p)
    }
    fn setattr(&self, c: &Ctx, p: &Path, s: &SetAttr) -> Result<Attr> {
        self.inner.setattr(c, p, s)
    }
    fn readdir(&self, c: &Ctx, p: &Path) -> Result<Vec<DirEntry>> {
        self.inner.readdir(c, p)
    }
    fn readlink(&self, c: &Ctx, p: &Path) -> Result<OsString> {
        self.inner.readlink(c, p)
    }
    fn mkdir(&self, c: &Ctx, p: &Path, mode: u32) -> Result<Attr> {
        self.inner.mkdir(c, p, mode)
    }
    fn unlink(&self, c: &Ctx, p: &Path) -> Result<()> {
        if p.starts_with("/slow") {
            self.gate.enter_and_wait();
        }
        self.inner.unlink(c, p)
    }
    fn rmdir(&self, c: &Ctx, p: &Path) -> Result<()> {
        self.inner.rmdir(c, p)
    }
    fn symlink(&self, c: &Ctx, t: &OsStr, p: &Path) -> Result<Attr> {
        self.inner.symlink(c, t, p)
    }
    fn rename(&self, c: &Ctx, f: &Path, t: &Path, fl: RenameFlags) -> Result<()> {
        self.inner.rename(c, f, t, fl)
    }
    fn statfs(&self, c: &Ctx, p: &Path) -> Result<StatFs> {
        self.inner.statfs(c, p)
    }
    fn access(&self, c: &Ctx, p: &Path, mask: i32) -> Result<()> {
        self.inner.access(c, p, mask)
    }
    fn open(&self, c: &Ctx, p: &Path, f: OpenFlags) -> Result<Opened> {
        self.inner.open(c, p, f)
    }
    fn create(&self, c: &Ctx, p: &Path, f: OpenFlags, mode: u32) -> Result<(Attr, Opened)> {
        self.inner.create(c, p, f, mode)
    }
    fn release(&self, c: &Ctx, p: &Path, h: u64, m: &DataMap) -> Result<()> {
        self.inner.release(c, p, h, m)
    }
}

/// Unmounts (lazily, so a stuck request cannot keep it) and waits for the
/// serving thread, also when the test fails.
struct Mounted {
    mountpoint: PathBuf,
    unmounter: Option<mapfs_fuse::Unmounter>,
    serving: Option<std::thread::JoinHandle<()>>,
    gate: Arc<Gate>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.gate.open();
        if let Some(mut u) = self.unmounter.take() {
            if u.unmount().is_err() {
                let _ =
                    rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
            }
        }
        if let Some(t) = self.serving.take() {
            let _ = t.join();
        }
    }
}

/// Runs `f` on a thread of its own and returns its result, or `None` if it
/// did not finish within [`BOUND`] (the thread is then left behind; the
/// mount's teardown unblocks it).
fn within_bound<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(BOUND).ok()
}

#[test]
fn a_slow_unlink_holds_back_no_other_directory() {
    if !mapfs_testkit::fuse_or_skip("a_slow_unlink_holds_back_no_other_directory") {
        return;
    }
    let backing = tempfile::tempdir().unwrap();
    let mountpoint = tempfile::tempdir().unwrap();
    for d in ["slow", "fast"] {
        std::fs::create_dir(backing.path().join(d)).unwrap();
    }
    std::fs::write(backing.path().join("slow/victim"), b"x").unwrap();
    std::fs::write(backing.path().join("fast/old"), b"old").unwrap();

    let gate = Arc::new(Gate::default());
    let fs = Gated {
        inner: Passthrough::new(backing.path()).unwrap(),
        gate: gate.clone(),
    };
    let opts = parse_options(&[]).unwrap();
    let mut mounted = mount(
        Arc::new(fs),
        "gated",
        backing.path(),
        mountpoint.path(),
        AdapterOptions::default(),
        &opts,
        None,
    )
    .expect("mounting the gated file system");
    let unmounter = mounted.unmounter();
    let serving = std::thread::spawn(move || {
        let _ = mounted.run();
    });
    let guard = Mounted {
        mountpoint: mountpoint.path().to_path_buf(),
        unmounter: Some(unmounter),
        serving: Some(serving),
        gate: gate.clone(),
    };
    let m = mountpoint.path().to_path_buf();

    let victim = m.join("slow/victim");
    let unlinking = std::thread::spawn(move || std::fs::remove_file(victim));
    assert!(
        gate.wait_entered(),
        "the unlink under /slow never reached the file system"
    );

    let fast = m.join("fast");
    let others = within_bound(move || -> std::io::Result<Vec<String>> {
        // A cached name would not ask the daemon: these are all new.
        let missing = std::fs::metadata(fast.join("missing")).unwrap_err();
        assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(std::fs::read(fast.join("old"))?, b"old");
        for i in 0..20 {
            std::fs::write(fast.join(format!("new{i}")), format!("{i}"))?;
        }
        for i in 0..20 {
            let md = std::fs::metadata(fast.join(format!("new{i}")))?;
            assert_eq!(md.len(), format!("{i}").len() as u64);
            assert!(md.ino() != 0);
        }
        std::fs::create_dir(fast.join("sub"))?;
        std::fs::write(fast.join("sub/deep"), b"deep")?;
        // A file's rename holds only its directories.
        std::fs::rename(fast.join("new0"), fast.join("renamed0"))?;
        std::fs::rename(fast.join("sub/deep"), fast.join("sub/deeper"))?;
        let mut names: Vec<String> = std::fs::read_dir(&fast)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        Ok(names)
    });
    // Checked before the gate opens: the unlink is still inside the file
    // system, so nothing above could have waited for it to end.
    let still_blocked = !gate.is_open() && !unlinking.is_finished();
    let names = match others {
        Some(r) => r.expect("calls in /fast failed"),
        None => {
            drop(guard);
            panic!("calls in /fast did not finish while an unlink in /slow was held");
        }
    };
    assert!(still_blocked, "the unlink ended before the other calls did");
    let mut want: Vec<String> = (1..20).map(|i| format!("new{i}")).collect();
    want.extend(["old", "renamed0", "sub"].map(String::from));
    want.sort();
    assert_eq!(names, want, "listing of /fast during the unlink");

    gate.open();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(unlinking.join());
    });
    let res = rx
        .recv_timeout(BOUND)
        .expect("the unlink did not finish once the gate opened")
        .expect("the unlinking thread panicked");
    res.expect("the gated unlink failed");
    assert!(!backing.path().join("slow/victim").exists());
    // A directory's rename holds the whole namespace, and its paths below
    // follow it.
    std::fs::rename(m.join("fast/sub"), m.join("slow/sub")).unwrap();
    assert_eq!(std::fs::read(m.join("slow/sub/deeper")).unwrap(), b"deep");
    assert_eq!(
        std::fs::read(backing.path().join("slow/sub/deeper")).unwrap(),
        b"deep"
    );
    drop(guard);
}
