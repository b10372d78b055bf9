//! Socket-level tests of the control server against a fake registry: no
//! kernel mount involved.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use mapfs::control::{self, Connection, MountStatus, Proof, Request, Response};
use mapfs::engine::DataFile;
use mapfs::mapcache::Generations;
use mapfs::{DataMap, Extent, Growth, Opened};
use parking_lot::Mutex;

use super::proofs::Proofs;
use super::{spawn, spawn_with, Limits};
use crate::registry::{OpenInfo, OpenRegistry};

#[derive(Default)]
struct Fake {
    /// Opens, as the adapter would record them.
    opens: Mutex<Vec<OpenInfo>>,
    invalidated: Mutex<Vec<u64>>,
    released: Mutex<Vec<(u64, DataMap)>>,
    /// The table sent with the first adoption; bumped for each adoption
    /// reported.
    generations: Option<Generations>,
    adopting: Mutex<Vec<u64>>,
    /// (fh, lent) calls, in order.
    lent: Mutex<Vec<(u64, bool)>>,
    proofs: Proofs,
    writeback: bool,
    /// Size pages of writable lendings.
    size_pages: Mutex<Vec<Arc<mapfs::lentsize::LentSize>>>,
    /// (fh, offset, len) of remaps asked for by clients.
    remaps: Mutex<Vec<(u64, u64, u64)>>,
}

impl OpenRegistry for Fake {
    fn open(&self, fh: u64) -> Option<OpenInfo> {
        self.opens.lock().iter().find(|o| o.fh == fh).cloned()
    }
    fn proofs(&self) -> &Proofs {
        &self.proofs
    }
    fn status(&self) -> MountStatus {
        MountStatus {
            pid: 0,
            fs: "fake".into(),
            backing: "/nowhere".into(),
            data: "auto".into(),
            passthrough_active: false,
            writeback_cache: self.writeback,
            started_unix: 0,
            clients: 0,
            connections: 0,
            open_files: self.opens.lock().len() as u64,
        }
    }
    fn invalidate(&self, ino: u64) {
        self.invalidated.lock().push(ino);
    }
    fn client_released(&self, fh: u64, map: DataMap) {
        self.released.lock().push((fh, map));
    }
    fn lend(&self, fh: u64, lent: bool, size: Option<Arc<mapfs::lentsize::LentSize>>) {
        self.lent.lock().push((fh, lent));
        if let Some(s) = size {
            self.size_pages.lock().push(s);
        }
    }
    fn generations(&self) -> Option<&Generations> {
        self.generations.as_ref()
    }
    /// As `versions` does: the write's range becomes writable.
    fn client_remap(
        &self,
        fh: u64,
        map: DataMap,
        offset: u64,
        len: u64,
    ) -> mapfs::Result<Option<OpenInfo>> {
        self.remaps.lock().push((fh, offset, len));
        let mut opens = self.opens.lock();
        let Some(o) = opens.iter_mut().find(|o| o.fh == fh) else {
            return Ok(None);
        };
        let mut map = map;
        map.unguard(offset, offset + len);
        o.map = map;
        Ok(Some(o.clone()))
    }
    fn has_writer(&self, ino: u64) -> bool {
        (self.opens.lock().iter())
            .any(|o| o.ino == ino && o.flags & libc::O_ACCMODE != libc::O_RDONLY)
    }
    fn adopting(&self, open: &OpenInfo) {
        self.adopting.lock().push(open.fh);
        if let Some(g) = &self.generations {
            g.bump(open.ino);
        }
    }
    /// `echo` answers its input; `panic` panics, as a buggy tool would.
    fn tool(&self, _ctx: &mapfs::Ctx, name: &str, input: &[u8]) -> mapfs::Result<Vec<u8>> {
        match name {
            "echo" => Ok(input.to_vec()),
            "panic" => panic!("a tool that panics (test)"),
            _ => Err(mapfs::Error::not_implemented()),
        }
    }
}

fn open_info(ino: u64, fh: u64, flags: i32, map: DataMap, file: File) -> OpenInfo {
    let file = Arc::new(file);
    OpenInfo {
        ino,
        fh,
        flags,
        uid: my_uid(),
        gid: my_gid(),
        data: Arc::new(DataFile::new(Opened {
            map: map.clone(),
            files: vec![Arc::clone(&file)],
            handle: fh,
        })),
        map,
        files: vec![file],
    }
}

fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn my_gid() -> u32 {
    rustix::process::getegid().as_raw()
}

struct Setup {
    _dir: tempfile::TempDir,
    fake: Arc<Fake>,
    server: super::ControlServer,
    backing: std::path::PathBuf,
}

fn setup() -> Setup {
    setup_with(Fake::default(), None)
}

fn setup_with(fake: Fake, limits: Option<Limits>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    std::fs::write(&backing, b"0123456789").unwrap();
    let fake = Arc::new(fake);
    let sock = dir.path().join("run/ctl.sock");
    let server = match limits {
        Some(l) => spawn_with(fake.clone(), &sock, l).unwrap(),
        None => spawn(fake.clone(), &sock).unwrap(),
    };
    Setup {
        _dir: dir,
        fake,
        server,
        backing,
    }
}

impl Setup {
    fn add_open(&self, info: OpenInfo) {
        self.fake.opens.lock().push(info);
    }

    /// What the adapter does when this process makes the proving ioctl on
    /// its descriptor of open `fh` for `conn`.
    fn prove(&self, conn: &Connection, fh: u64) -> Proof {
        self.fake
            .proofs
            .issue(&conn.key, fh, my_uid(), my_gid())
            .expect("a live connection's key")
    }

    fn adopt(
        &self,
        conn: &Connection,
        fh: u64,
        flags: i32,
        engine: bool,
    ) -> (Response, Vec<OwnedFd>) {
        let proof = self.prove(conn, fh);
        ask(
            conn,
            &Request::Adopt {
                proof,
                flags,
                engine,
            },
        )
    }
}

fn ask(conn: &Connection, req: &Request) -> (Response, Vec<OwnedFd>) {
    control::call(conn.sock.as_fd(), req).unwrap()
}

fn errno_of(resp: &Response) -> Option<i32> {
    match resp {
        Response::Refused { errno, .. } => Some(*errno),
        _ => None,
    }
}

/// Polls `cond` (an observable effect, not a delay) for up to 10 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("never happened: {what}");
}

#[test]
fn adopts_a_proven_open_with_a_private_description() {
    let s = setup();
    let daemon_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&s.backing)
        .unwrap();
    s.add_open(open_info(
        5,
        77,
        libc::O_RDWR,
        DataMap::whole_file(),
        daemon_file,
    ));
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, fds) = s.adopt(&conn, 77, libc::O_RDWR, false);
    let Response::Adopted {
        handle,
        map,
        files,
        size_slot: false,
        generations: false,
    } = resp
    else {
        panic!("refused: {resp:?}")
    };
    assert!(map.is_whole_file());
    assert_eq!((files, fds.len()), (1, 1));
    let mut f = File::from(fds.into_iter().next().unwrap());
    // A private description: offset starts at 0 whatever the daemon's is.
    let mut buf = [0u8; 4];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"0123");
    f.seek(SeekFrom::Start(10)).unwrap();
    f.write_all(b"AB").unwrap();
    assert_eq!(std::fs::read(&s.backing).unwrap(), b"0123456789AB");

    // A second adoption of the same (writable) open is refused: it is claimed.
    let (resp, fds) = s.adopt(&conn, 77, libc::O_RDWR, false);
    assert_eq!(errno_of(&resp), Some(libc::EBUSY), "{resp:?}");
    assert!(fds.is_empty());

    let (resp, _) = ask(
        &conn,
        &Request::Closed {
            handle,
            wrote: true,
        },
    );
    assert_eq!(resp, Response::Done);
    assert_eq!(*s.fake.invalidated.lock(), vec![5]);
    // The handle is spent.
    let (resp, _) = ask(
        &conn,
        &Request::Closed {
            handle,
            wrote: true,
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EBADF), "{resp:?}");
    assert_eq!(*s.fake.invalidated.lock(), vec![5]);
}

#[test]
fn nothing_is_handed_out_without_a_valid_proof() {
    let s = setup();
    s.add_open(open_info(
        9,
        1,
        libc::O_RDWR,
        DataMap::whole_file(),
        File::open(&s.backing).unwrap(),
    ));
    s.add_open(open_info(
        10,
        2,
        libc::O_RDONLY,
        DataMap::whole_file(),
        File::open(&s.backing).unwrap(),
    ));
    let conn = control::connect(s.server.path()).unwrap();
    let other = control::connect(s.server.path()).unwrap();
    assert_ne!(conn.key, other.key);
    let adopt = |proof| {
        ask(
            &conn,
            &Request::Adopt {
                proof,
                flags: libc::O_RDWR,
                engine: false,
            },
        )
    };
    for forged in [[0u8; 16], [0xff; 16], rand::random()] {
        let (resp, fds) = adopt(forged);
        assert_eq!(errno_of(&resp), Some(libc::EACCES), "{resp:?}");
        assert!(fds.is_empty());
    }
    // A proof made for another connection, and then by anyone: burnt.
    let theirs = s.prove(&other, 1);
    let (resp, fds) = adopt(theirs);
    assert_eq!(errno_of(&resp), Some(libc::EACCES), "{resp:?}");
    assert!(fds.is_empty());
    let (resp, _) = ask(
        &other,
        &Request::Adopt {
            proof: theirs,
            flags: libc::O_RDWR,
            engine: false,
        },
    );
    assert_eq!(
        errno_of(&resp),
        Some(libc::EACCES),
        "a leaked proof was honoured"
    );
    // Single use.
    let proof = s.prove(&conn, 2);
    let (resp, _) = ask(
        &conn,
        &Request::Adopt {
            proof,
            flags: libc::O_RDONLY,
            engine: false,
        },
    );
    assert!(matches!(resp, Response::Adopted { .. }), "{resp:?}");
    let (resp, fds) = ask(
        &conn,
        &Request::Adopt {
            proof,
            flags: libc::O_RDONLY,
            engine: false,
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EACCES), "{resp:?}");
    assert!(fds.is_empty());
    // More access than the open has.
    let (resp, fds) = s.adopt(&conn, 2, libc::O_RDWR, false);
    assert_eq!(errno_of(&resp), Some(libc::EACCES), "{resp:?}");
    assert!(fds.is_empty());
    // An open that is gone.
    s.fake.opens.lock().retain(|o| o.fh != 1);
    let (resp, _) = s.adopt(&conn, 1, libc::O_RDWR, false);
    assert_eq!(errno_of(&resp), Some(libc::ENOENT), "{resp:?}");
    // Before Hello there is no key to prove with.
    let bare = raw_connect(s.server.path());
    let (resp, _) = control::call(
        bare.as_fd(),
        &Request::Adopt {
            proof: [0; 16],
            flags: libc::O_RDONLY,
            engine: false,
        },
    )
    .unwrap();
    assert_eq!(errno_of(&resp), Some(libc::EPROTO), "{resp:?}");
}

#[test]
fn proofs_and_opens_of_other_users_are_refused() {
    use super::Peer;
    let peer = Peer {
        pid: 0,
        uid: 1000,
        gid: 100,
    };
    let proven = super::proofs::Redeemed {
        fh: 1,
        uid: 1000,
        gid: 100,
    };
    assert!(super::same_user(peer, proven.uid, proven.gid));
    assert!(!super::same_user(peer, 1001, 100), "another uid");
    assert!(!super::same_user(peer, 1000, 0), "another gid");
    let root = Peer {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    assert!(
        super::same_user(root, 1000, 100),
        "root clients adopt any open"
    );
}

#[test]
fn non_whole_file_maps_are_refused_and_release_needs_a_handle() {
    let s = setup();
    let map = DataMap::new(
        vec![Extent {
            logical: 0,
            file: 0,
            offset: 0,
            len: 10,
        }],
        10,
        Growth::ReadOnly,
    )
    .unwrap();
    s.add_open(open_info(
        3,
        4,
        libc::O_RDONLY,
        map.clone(),
        File::open(&s.backing).unwrap(),
    ));
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, fds) = s.adopt(&conn, 4, libc::O_RDONLY, false);
    assert_eq!(errno_of(&resp), Some(libc::EOPNOTSUPP), "{resp:?}");
    assert!(fds.is_empty());
    let (resp, _) = ask(
        &conn,
        &Request::Release {
            handle: 99,
            map: Some(map.clone()),
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EBADF), "{resp:?}");
    // Lent read-only: its map cannot be replaced, whatever it says.
    let (resp, _) = s.adopt(&conn, 4, libc::O_RDONLY, true);
    let Response::Adopted { handle, .. } = resp else {
        panic!("not lent: {resp:?}");
    };
    let forged = DataMap::new(vec![], 1 << 40, Growth::ReadOnly).unwrap();
    let (resp, _) = ask(
        &conn,
        &Request::Release {
            handle,
            map: Some(forged),
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EBADF), "{resp:?}");
    assert!(s.fake.released.lock().is_empty());
}

#[test]
fn append_log_maps_are_lent_and_write_only_clients_get_no_other_file() {
    let s = setup();
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("data.0");
    let log = dir.path().join("data.1");
    std::fs::write(&old, b"other writer's bytes").unwrap();
    std::fs::write(&log, b"").unwrap();
    let map = DataMap::new(
        vec![Extent {
            logical: 0,
            file: 0,
            offset: 0,
            len: 20,
        }],
        20,
        Growth::AppendLog { file: 1, end: 0 },
    )
    .unwrap();
    let files = vec![
        Arc::new(File::open(&old).unwrap()),
        Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&log)
                .unwrap(),
        ),
    ];
    let info = |fh, flags, map: &DataMap| OpenInfo {
        ino: 3,
        fh,
        flags,
        uid: my_uid(),
        gid: my_gid(),
        data: Arc::new(DataFile::new(Opened {
            map: map.clone(),
            files: files.clone(),
            handle: 0,
        })),
        map: map.clone(),
        files: files.clone(),
    };
    s.add_open(info(5, libc::O_WRONLY, &map));
    s.add_open(info(6, libc::O_RDWR, &map));
    let conn = control::connect(s.server.path()).unwrap();
    // Without `engine` the client cannot run it: refused.
    let (resp, fds) = s.adopt(&conn, 5, libc::O_WRONLY, false);
    assert_eq!(errno_of(&resp), Some(libc::EOPNOTSUPP), "{resp:?}");
    assert!(fds.is_empty());
    // Write-only: the other writer's log is withheld (an empty stand-in);
    // the size page follows the files.
    let (resp, mut fds) = s.adopt(&conn, 5, libc::O_WRONLY, true);
    let Response::Adopted {
        handle,
        files: 2,
        size_slot: true,
        ..
    } = resp
    else {
        panic!("not lent with a size page: {resp:?}");
    };
    let page = control::take_size_slot(&mut fds, 2, true).expect("a usable size page");
    assert_eq!(fds.len(), 2);
    assert_eq!(page.get(), 20, "the page starts at the map's size");
    page.set(28);
    assert_eq!(
        s.fake.size_pages.lock()[0].get(),
        28,
        "the daemon sees the client's size"
    );
    let mut got = String::new();
    File::from(fds[0].try_clone().unwrap())
        .read_to_string(&mut got)
        .unwrap();
    assert_eq!(got, "", "a write-only client could read another file");
    File::from(fds[1].try_clone().unwrap())
        .write_all(b"appended")
        .unwrap();
    assert_eq!(std::fs::read(&log).unwrap(), b"appended");
    assert_eq!(*s.fake.lent.lock(), vec![(5, true)]);
    // Its map: its own 8 bytes over the old ones is accepted; bytes of the
    // log it never wrote, or another file's bytes at another place, are not.
    let mine = DataMap::new(
        vec![
            Extent {
                logical: 0,
                file: 1,
                offset: 0,
                len: 8,
            },
            Extent {
                logical: 8,
                file: 0,
                offset: 8,
                len: 12,
            },
        ],
        20,
        Growth::AppendLog { file: 1, end: 8 },
    )
    .unwrap();
    let (resp, _) = ask(
        &conn,
        &Request::Release {
            handle,
            map: Some(mine.clone()),
        },
    );
    assert_eq!(resp, Response::Done);
    let past = DataMap::new(
        vec![Extent {
            logical: 0,
            file: 1,
            offset: 0,
            len: 4096,
        }],
        4096,
        Growth::AppendLog { file: 1, end: 4096 },
    )
    .unwrap();
    let (resp, _) = ask(
        &conn,
        &Request::Release {
            handle,
            map: Some(past),
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EINVAL), "{resp:?}");
    assert_eq!(*s.fake.released.lock(), vec![(5, mine)]);
    // Read-write: both real files.
    let (resp, fds) = s.adopt(&conn, 6, libc::O_RDWR, true);
    assert!(
        matches!(resp, Response::Adopted { files: 2, .. }),
        "{resp:?}"
    );
    let mut got = String::new();
    File::from(fds[0].try_clone().unwrap())
        .read_to_string(&mut got)
        .unwrap();
    assert_eq!(got, "other writer's bytes");
    // Closed ends the lending.
    ask(
        &conn,
        &Request::Closed {
            handle,
            wrote: true,
        },
    );
    assert_eq!(*s.fake.lent.lock(), vec![(5, true), (6, true), (5, false)]);
    // An in-place map that is not whole-file (a slot of a shared backing
    // file) is lent to root (this test's peer), a reader with a read-only
    // descriptor of its own, and to nobody else (below).
    let slot = DataMap::new(
        vec![Extent {
            logical: 0,
            file: 0,
            offset: 100,
            len: 20,
        }],
        20,
        Growth::InPlace { limit: Some(64) },
    )
    .unwrap();
    s.add_open(info(7, libc::O_RDONLY, &slot));
    let (resp, fds) = s.adopt(&conn, 7, libc::O_RDONLY, true);
    assert!(
        matches!(
            resp,
            Response::Adopted {
                size_slot: false,
                ..
            }
        ),
        "{resp:?}"
    );
    for fd in &fds {
        let fl = rustix::fs::fcntl_getfl(fd).unwrap();
        assert_eq!(
            fl & rustix::fs::OFlags::RWMODE,
            rustix::fs::OFlags::RDONLY,
            "a reader of a slot got a descriptor that can write"
        );
    }
    let other = super::Peer {
        pid: 0,
        uid: 4242,
        gid: 4242,
    };
    let open = s.fake.open(7).unwrap();
    let root = super::Peer { uid: 0, ..other };
    for (flags, peer) in [
        (libc::O_RDONLY, other),
        (libc::O_RDWR, other),
        (libc::O_WRONLY, other),
    ] {
        match super::lend_files(&open, flags, true, peer) {
            Err(resp) => assert_eq!(errno_of(&resp), Some(libc::EOPNOTSUPP), "{resp:?}"),
            Ok(fds) => panic!(
                "a slot was lent (flags {flags:#o}, uid {}): {} descriptors",
                peer.uid,
                fds.len()
            ),
        }
    }
    for flags in [libc::O_RDONLY, libc::O_RDWR, libc::O_WRONLY] {
        assert!(super::lend_files(&open, flags, true, root).is_ok());
    }
}

#[test]
fn a_vanished_client_invalidates_what_it_could_have_written() {
    let s = setup();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.backing)
        .unwrap();
    s.add_open(open_info(21, 8, libc::O_WRONLY, DataMap::whole_file(), f));
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, _fds) = s.adopt(&conn, 8, libc::O_WRONLY | libc::O_APPEND, false);
    assert!(matches!(resp, Response::Adopted { .. }), "{resp:?}");
    assert_eq!(s.server.clients(), 1);
    drop(conn);
    eventually("the server notices the client is gone", || {
        s.server.clients() == 0
    });
    assert_eq!(*s.fake.invalidated.lock(), vec![21]);
}

#[test]
fn forged_closes_change_nothing_and_changed_needs_a_writable_proof() {
    let s = setup();
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.backing)
        .unwrap();
    s.add_open(open_info(30, 11, libc::O_WRONLY, DataMap::whole_file(), w));
    s.add_open(open_info(
        31,
        12,
        libc::O_RDONLY,
        DataMap::whole_file(),
        File::open(&s.backing).unwrap(),
    ));
    let conn = control::connect(s.server.path()).unwrap();
    for handle in [0, 1, 11, u64::MAX, rand::random()] {
        let (resp, _) = ask(
            &conn,
            &Request::Closed {
                handle,
                wrote: true,
            },
        );
        assert_eq!(errno_of(&resp), Some(libc::EBADF), "{resp:?}");
    }
    let (resp, _) = ask(&conn, &Request::Changed { proof: [7; 16] });
    assert_eq!(errno_of(&resp), Some(libc::EACCES), "{resp:?}");
    let proof = s.prove(&conn, 12);
    let (resp, _) = ask(&conn, &Request::Changed { proof });
    assert_eq!(errno_of(&resp), Some(libc::EBADF), "{resp:?}");
    assert!(s.fake.invalidated.lock().is_empty());
    let proof = s.prove(&conn, 11);
    let (resp, _) = ask(&conn, &Request::Changed { proof });
    assert_eq!(resp, Response::Done);
    assert_eq!(*s.fake.invalidated.lock(), vec![30]);
}

#[test]
fn version_mismatch_is_refused_and_drop_removes_the_socket() {
    let s = setup();
    let sock = raw_connect(s.server.path());
    // A packet from a future protocol version.
    rustix::net::send(
        &sock,
        &[control::VERSION + 1, 0],
        rustix::net::SendFlags::empty(),
    )
    .unwrap();
    let (resp, _) = control::recv::<Response>(sock.as_fd()).unwrap().unwrap();
    assert_eq!(errno_of(&resp), Some(libc::EPROTO), "{resp:?}");
    // ...and the connection is closed.
    assert!(control::recv::<Response>(sock.as_fd()).unwrap().is_none());
    let path = s.server.path().to_path_buf();
    let held = control::connect(&path).unwrap();
    drop(s.server);
    assert!(!path.exists());
    // The server closed our connection rather than leave it hanging.
    assert!(control::recv::<Response>(held.sock.as_fd())
        .unwrap()
        .is_none());
}

#[test]
fn the_first_adoption_carries_the_generation_table() {
    let s = setup_with(
        Fake {
            generations: Some(Generations::create().unwrap()),
            ..Fake::default()
        },
        None,
    );
    let daemon = s.fake.generations.as_ref().unwrap();
    daemon.bump(33);
    for fh in [6, 7] {
        s.add_open(open_info(
            33,
            fh,
            libc::O_RDONLY,
            DataMap::whole_file(),
            File::open(&s.backing).unwrap(),
        ));
    }
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, mut fds) = s.adopt(&conn, 6, libc::O_RDONLY, false);
    let Response::Adopted {
        files, generations, ..
    } = resp
    else {
        panic!("refused: {resp:?}");
    };
    assert!(generations);
    let table = control::take_generations(&mut fds, files, generations)
        .expect("the first adoption must carry the table");
    assert_eq!(fds.len(), 1, "the backing file stays");
    assert!(!table.is_writable());
    // An adoption is reported to the registry before the answer, so its
    // bump is visible as soon as the client has the map.
    assert_eq!(*s.fake.adopting.lock(), vec![6]);
    assert_eq!(table.token(33), 2);
    daemon.bump(33);
    assert_eq!(table.token(33), 3);
    // Later adoptions on the connection do not send it again.
    let (resp, fds) = s.adopt(&conn, 7, libc::O_RDONLY, false);
    assert!(
        matches!(
            resp,
            Response::Adopted {
                files: 1,
                generations: false,
                ..
            }
        ),
        "{resp:?}"
    );
    assert_eq!(fds.len(), 1);
}

#[test]
fn hello_status_and_a_writeback_cache_mount() {
    let s = setup_with(
        Fake {
            writeback: true,
            ..Fake::default()
        },
        None,
    );
    s.add_open(open_info(
        40,
        1,
        libc::O_RDONLY,
        DataMap::whole_file(),
        File::open(&s.backing).unwrap(),
    ));
    let conn = control::connect(s.server.path()).unwrap();
    assert!(conn.writeback_cache);
    let (resp, fds) = s.adopt(&conn, 1, libc::O_RDONLY, false);
    assert_eq!(errno_of(&resp), Some(libc::EOPNOTSUPP), "{resp:?}");
    assert!(fds.is_empty());
    let st = control::status(s.server.path()).unwrap();
    assert_eq!(st.pid, std::process::id());
    assert!(st.writeback_cache);
    assert_eq!(st.open_files, 1);
    assert_eq!(st.clients, 2, "this connection and the status one");
    assert_eq!(st.connections, 2);
}

/// The server's thread sleeps while no client is connected (it swept
/// connections once a second, clients or not), and sweeps while one is.
#[test]
fn an_idle_server_sleeps_until_a_client_comes() {
    let s = setup_with(Fake::default(), None);
    let quiet = std::time::Duration::from_millis(1500);
    std::thread::sleep(quiet);
    assert_eq!(s.server.wakeups(), 0, "woke with no client");
    let c = control::connect(s.server.path()).unwrap();
    eventually("the client counted", || s.server.clients() == 1);
    let connected = s.server.wakeups();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(
        s.server.wakeups() >= connected + 2,
        "no sweep with a client connected: {} wake-ups, {connected} at its connect",
        s.server.wakeups()
    );
    drop(c);
    eventually("the client gone", || s.server.clients() == 0);
    let gone = s.server.wakeups();
    std::thread::sleep(quiet);
    assert_eq!(s.server.wakeups(), gone, "woke after the last client left");
}

#[test]
fn connections_are_capped_per_user_and_idle_ones_closed() {
    let s = setup_with(
        Fake::default(),
        Some(Limits {
            total: 8,
            per_uid: 2,
            idle: std::time::Duration::from_millis(100),
        }),
    );
    s.add_open(open_info(
        50,
        1,
        libc::O_WRONLY,
        DataMap::whole_file(),
        std::fs::OpenOptions::new()
            .write(true)
            .open(&s.backing)
            .unwrap(),
    ));
    let a = control::connect(s.server.path()).unwrap();
    let (resp, _fds) = s.adopt(&a, 1, libc::O_WRONLY, false);
    assert!(matches!(resp, Response::Adopted { .. }), "{resp:?}");
    let b = control::connect(s.server.path()).unwrap();
    let e = control::connect(s.server.path()).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EUSERS), "{e}");
    // The idle connection (nothing adopted) is closed; the one holding an
    // adoption is kept.
    assert!(
        control::recv::<Response>(b.sock.as_fd()).unwrap().is_none(),
        "the idle connection was not closed"
    );
    eventually("room for a new connection", || s.server.clients() == 1);
    let (resp, _) = ask(&a, &Request::Status);
    assert!(matches!(resp, Response::Status(_)), "{resp:?}");
    control::connect(s.server.path()).unwrap();
}

#[test]
fn descriptors_sent_to_the_daemon_are_refused() {
    let s = setup();
    let conn = control::connect(s.server.path()).unwrap();
    let pipe = rustix::pipe::pipe().unwrap();
    let res = control::send(conn.sock.as_fd(), &Request::Status, &[pipe.0.as_fd()]);
    match res {
        // Linux 6.16+: SO_PASSRIGHTS off, the kernel refuses.
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        // Older kernels: the daemon drops the connection.
        Ok(()) => {
            assert!(control::recv::<Response>(conn.sock.as_fd())
                .unwrap()
                .is_none());
        }
    }
    // The server still serves others.
    control::status(s.server.path()).unwrap();
}

/// A connected control socket that has said nothing yet (no Hello).
fn raw_connect(path: &Path) -> OwnedFd {
    let sock = control::socket().unwrap();
    rustix::net::connect(&sock, &rustix::net::SocketAddrUnix::new(path).unwrap()).unwrap();
    sock
}

/// A guarded map (copy on write in place) is remapped for the client that
/// runs it: the daemon checks the map it sends as for a push, and refuses
/// a map that made a read-only range writable by itself, a map of another
/// kind, and a handle it did not give.
#[test]
fn guarded_maps_are_remapped_for_their_client_and_forged_ones_refused() {
    let s = setup();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&s.backing)
        .unwrap();
    let read_only = |len| Extent {
        logical: 0,
        file: 1,
        offset: 0,
        len,
    };
    let map = DataMap::new(vec![read_only(10)], 10, Growth::Guarded { file: 0 }).unwrap();
    let file = Arc::new(file);
    let files = vec![file.clone(), file.clone()];
    s.add_open(OpenInfo {
        ino: 4,
        fh: 9,
        flags: libc::O_RDWR,
        uid: my_uid(),
        gid: my_gid(),
        data: Arc::new(DataFile::new(Opened {
            map: map.clone(),
            files: files.clone(),
            handle: 0,
        })),
        map: map.clone(),
        files,
    });
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, _fds) = s.adopt(&conn, 9, libc::O_RDWR, true);
    let Response::Adopted {
        handle, files: 2, ..
    } = resp
    else {
        panic!("a guarded map is lent: {resp:?}");
    };
    // Forged: bytes 0..4 made writable by the client itself.
    let mut forged = map.clone();
    forged.unguard(0, 4);
    let (resp, fds) = ask(
        &conn,
        &Request::Remap {
            handle,
            map: Some(forged),
            offset: 6,
            len: 2,
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EINVAL), "{resp:?}");
    assert!(fds.is_empty());
    // Another connection's handle.
    let other = control::connect(s.server.path()).unwrap();
    let (resp, _) = ask(
        &other,
        &Request::Remap {
            handle,
            map: Some(map.clone()),
            offset: 6,
            len: 2,
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EBADF), "{resp:?}");
    assert!(
        s.fake.remaps.lock().is_empty(),
        "refused remaps reached the file system"
    );
    // The real one: remapped, no new descriptors (the files are the same).
    let (resp, fds) = ask(
        &conn,
        &Request::Remap {
            handle,
            map: Some(map.clone()),
            offset: 6,
            len: 2,
        },
    );
    let Response::Remapped { map: new, files: 0 } = resp else {
        panic!("not remapped: {resp:?}");
    };
    assert!(fds.is_empty());
    assert_eq!(*s.fake.remaps.lock(), vec![(9, 6, 2)]);
    assert_eq!(
        new.place_write(6, 2),
        mapfs::Placement::Fits(vec![mapfs::Segment::Data {
            file: 0,
            offset: 6,
            len: 2
        }])
    );
    // A map of another kind is handed back to the mount, never remapped.
    let log = DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap();
    s.add_open(open_info(
        5,
        10,
        libc::O_RDWR,
        log,
        File::open(&s.backing).unwrap(),
    ));
    let (resp, _fds) = s.adopt(&conn, 10, libc::O_RDWR, true);
    let Response::Adopted { handle: h2, .. } = resp else {
        panic!("an append log is lent: {resp:?}");
    };
    let pushed = DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap();
    let (resp, _) = ask(
        &conn,
        &Request::Remap {
            handle: h2,
            map: Some(pushed),
            offset: 0,
            len: 1,
        },
    );
    assert_eq!(errno_of(&resp), Some(libc::EOPNOTSUPP), "{resp:?}");
    assert_eq!(s.fake.remaps.lock().len(), 1);
    // A write-only guarded writer gets its own write-only descriptor for
    // the read-only ranges too (the same file, still unreadable), not an
    // empty stand-in that a carry-over to a successor would copy from.
    let wo = Arc::new(
        std::fs::OpenOptions::new()
            .write(true)
            .open(&s.backing)
            .unwrap(),
    );
    s.add_open(OpenInfo {
        ino: 6,
        fh: 11,
        flags: libc::O_WRONLY,
        uid: my_uid(),
        gid: my_gid(),
        data: Arc::new(DataFile::new(Opened {
            map: map.clone(),
            files: vec![wo.clone(), wo.clone()],
            handle: 0,
        })),
        map: map.clone(),
        files: vec![wo.clone(), wo],
    });
    let (resp, fds) = s.adopt(&conn, 11, libc::O_WRONLY, true);
    let Response::Adopted { files: 2, .. } = resp else {
        panic!("a write-only guarded map is lent: {resp:?}");
    };
    let backing_ino = std::fs::metadata(&s.backing).unwrap().ino();
    for fd in &fds[..2] {
        let f = File::from(fd.try_clone().unwrap());
        assert_eq!(
            f.metadata().unwrap().ino(),
            backing_ino,
            "a stand-in was lent"
        );
        let mut b = [0u8; 1];
        assert!((&f).read(&mut b).is_err(), "a write-only client could read");
    }
}

/// A tool that panics ends its connection without an answer, and the next
/// tool runs (the mount's one-tool claim is given back as the tool's thread
/// unwinds, not left taken for the rest of the mount's life).
#[test]
fn a_tool_that_panics_does_not_block_the_next() {
    let s = setup();
    let sock = s._dir.path().join("run/ctl.sock");
    assert!(control::tool(&sock, "panic", Vec::new()).is_err());
    let mut answered = None;
    for _ in 0..200 {
        match control::tool(&sock, "echo", b"again".to_vec()) {
            Ok(out) => {
                answered = Some(out);
                break;
            }
            // The panicking thread may still be unwinding.
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    || e.kind() == std::io::ErrorKind::ResourceBusy =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(e) => panic!("echo after a panicking tool: {e}"),
        }
    }
    assert_eq!(
        answered.as_deref(),
        Some(&b"again"[..]),
        "the claim stayed taken"
    );
}
