//! Socket-level tests of the control server against a fake registry: no
//! kernel mount involved.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use mapfs::control::{self, Request, Response};
use mapfs::engine::DataFile;
use mapfs::mapcache::Generations;
use mapfs::{DataMap, Extent, Growth, Opened};
use parking_lot::Mutex;

use super::spawn;
use crate::registry::{OpenInfo, OpenRegistry};

#[derive(Default)]
struct Fake {
    /// (pid, info) pairs, as the adapter would record opens.
    opens: Mutex<Vec<(u32, OpenInfo)>>,
    invalidated: Mutex<Vec<u64>>,
    released: Mutex<Vec<(u64, DataMap)>>,
    /// The table sent with Hello; bumped for each adoption reported.
    generations: Option<Generations>,
    adopting: Mutex<Vec<u64>>,
    /// (fh, lent) calls, in order.
    lent: Mutex<Vec<(u64, bool)>>,
}

impl OpenRegistry for Fake {
    fn opens_by(&self, pid: u32, ino: u64) -> Vec<OpenInfo> {
        self.opens
            .lock()
            .iter()
            .rev()
            .filter(|(p, o)| *p == pid && o.ino == ino)
            .map(|(_, o)| o.clone())
            .collect()
    }
    fn invalidate(&self, ino: u64) {
        self.invalidated.lock().push(ino);
    }
    fn client_released(&self, fh: u64, map: DataMap) {
        self.released.lock().push((fh, map));
    }
    fn lend(&self, fh: u64, lent: bool) {
        self.lent.lock().push((fh, lent));
    }
    fn generations(&self) -> Option<&Generations> {
        self.generations.as_ref()
    }
    fn adopting(&self, open: &OpenInfo) {
        self.adopting.lock().push(open.fh);
        if let Some(g) = &self.generations {
            g.bump(open.ino);
        }
    }
}

fn open_info(ino: u64, fh: u64, flags: i32, map: DataMap, file: File) -> OpenInfo {
    let file = Arc::new(file);
    OpenInfo {
        ino,
        fh,
        flags,
        data: Arc::new(DataFile::new(Opened {
            map: map.clone(),
            files: vec![Arc::clone(&file)],
            handle: fh,
        })),
        map,
        files: vec![file],
    }
}

fn me() -> u32 {
    std::process::id()
}

struct Setup {
    _dir: tempfile::TempDir,
    fake: Arc<Fake>,
    server: super::ControlServer,
    backing: std::path::PathBuf,
}

fn setup() -> Setup {
    setup_with(None)
}

fn setup_with(generations: Option<Generations>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    std::fs::write(&backing, b"0123456789").unwrap();
    let fake = Arc::new(Fake {
        generations,
        ..Fake::default()
    });
    let sock = dir.path().join("run/ctl.sock");
    let server = spawn(fake.clone(), &sock).unwrap();
    Setup {
        _dir: dir,
        fake,
        server,
        backing,
    }
}

#[test]
fn adopts_own_open_with_a_private_description() {
    let s = setup();
    let daemon_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&s.backing)
        .unwrap();
    s.fake.opens.lock().push((
        me(),
        open_info(5, 77, libc::O_RDWR, DataMap::whole_file(), daemon_file),
    ));
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, fds) = control::call(
        conn.as_fd(),
        &Request::Adopt {
            ino: 5,
            tid: me(),
            flags: libc::O_RDWR,
            engine: false,
        },
    )
    .unwrap();
    let Response::Adopted { handle, map, files } = resp else {
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
    let (resp, fds) = control::call(
        conn.as_fd(),
        &Request::Adopt {
            ino: 5,
            tid: me(),
            flags: libc::O_RDWR,
            engine: false,
        },
    )
    .unwrap();
    assert!(
        matches!(
            resp,
            Response::Refused {
                errno: libc::ENOENT,
                ..
            }
        ),
        "{resp:?}"
    );
    assert!(fds.is_empty());

    let (resp, _) = control::call(
        conn.as_fd(),
        &Request::Closed {
            handle,
            ino: 5,
            wrote: true,
        },
    )
    .unwrap();
    assert_eq!(resp, Response::Done);
    assert_eq!(*s.fake.invalidated.lock(), vec![5]);
}

#[test]
fn refuses_other_pids_access_modes_and_foreign_threads() {
    let s = setup();
    let f = File::open(&s.backing).unwrap();
    // Someone else's open.
    s.fake
        .opens
        .lock()
        .push((1, open_info(9, 1, libc::O_RDONLY, DataMap::whole_file(), f)));
    let f = File::open(&s.backing).unwrap();
    s.fake.opens.lock().push((
        me(),
        open_info(10, 2, libc::O_RDONLY, DataMap::whole_file(), f),
    ));
    let conn = control::connect(s.server.path()).unwrap();
    let ask = |ino, tid, flags| {
        control::call(
            conn.as_fd(),
            &Request::Adopt {
                ino,
                tid,
                flags,
                engine: false,
            },
        )
        .unwrap()
        .0
    };
    assert!(matches!(
        ask(9, me(), libc::O_RDONLY),
        Response::Refused {
            errno: libc::ENOENT,
            ..
        }
    ));
    // Claiming pid 1 (not a thread of ours) finds nothing of pid 1's.
    assert!(matches!(
        ask(9, 1, libc::O_RDONLY),
        Response::Refused {
            errno: libc::ENOENT,
            ..
        }
    ));
    // Asking for more access than the open has is refused.
    assert!(matches!(
        ask(10, me(), libc::O_RDWR),
        Response::Refused {
            errno: libc::ENOENT,
            ..
        }
    ));
    assert!(matches!(
        ask(10, me(), libc::O_RDONLY),
        Response::Adopted { .. }
    ));
    // A thread of ours may ask for its open (recorded under the tid).
    let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    let f = File::open(&s.backing).unwrap();
    s.fake.opens.lock().push((
        tid,
        open_info(11, 3, libc::O_RDONLY, DataMap::whole_file(), f),
    ));
    assert!(matches!(
        ask(11, tid, libc::O_RDONLY),
        Response::Adopted { .. }
    ));
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
    let f = File::open(&s.backing).unwrap();
    s.fake
        .opens
        .lock()
        .push((me(), open_info(3, 4, libc::O_RDONLY, map.clone(), f)));
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, fds) = control::call(
        conn.as_fd(),
        &Request::Adopt {
            ino: 3,
            tid: me(),
            flags: libc::O_RDONLY,
            engine: false,
        },
    )
    .unwrap();
    assert!(
        matches!(
            resp,
            Response::Refused {
                errno: libc::EOPNOTSUPP,
                ..
            }
        ),
        "{resp:?}"
    );
    assert!(fds.is_empty());
    let (resp, _) = control::call(conn.as_fd(), &Request::Release { handle: 99, map }).unwrap();
    assert!(matches!(
        resp,
        Response::Refused {
            errno: libc::EBADF,
            ..
        }
    ));
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
    let info = |flags| OpenInfo {
        ino: 3,
        fh: if flags == libc::O_WRONLY { 5 } else { 6 },
        flags,
        data: Arc::new(DataFile::new(Opened {
            map: map.clone(),
            files: files.clone(),
            handle: 0,
        })),
        map: map.clone(),
        files: files.clone(),
    };
    s.fake.opens.lock().push((me(), info(libc::O_WRONLY)));
    s.fake.opens.lock().push((me(), info(libc::O_RDWR)));
    let conn = control::connect(s.server.path()).unwrap();
    let adopt = |flags, engine| {
        control::call(
            conn.as_fd(),
            &Request::Adopt {
                ino: 3,
                tid: me(),
                flags,
                engine,
            },
        )
        .unwrap()
    };
    // Without `engine` the client cannot run it: refused.
    let (resp, fds) = adopt(libc::O_WRONLY, false);
    assert!(
        matches!(
            resp,
            Response::Refused {
                errno: libc::EOPNOTSUPP,
                ..
            }
        ),
        "{resp:?}"
    );
    assert!(fds.is_empty());
    // Write-only: the other writer's log is withheld (an empty stand-in).
    let (resp, fds) = adopt(libc::O_WRONLY, true);
    let Response::Adopted {
        handle, files: 2, ..
    } = resp
    else {
        panic!("not lent: {resp:?}");
    };
    assert_eq!(fds.len(), 2);
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
    // Read-write: both real files.
    let (resp, fds) = adopt(libc::O_RDWR, true);
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
    control::call(
        conn.as_fd(),
        &Request::Closed {
            handle,
            ino: 3,
            wrote: true,
        },
    )
    .unwrap();
    assert_eq!(*s.fake.lent.lock(), vec![(5, true), (6, true), (5, false)]);
    // In-place maps that are not whole-file are never lent.
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
    let mut o = info(libc::O_RDONLY);
    o.fh = 7;
    o.map = slot;
    s.fake.opens.lock().push((me(), o));
    let (resp, _) = adopt(libc::O_RDONLY, true);
    assert!(
        matches!(
            resp,
            Response::Refused {
                errno: libc::EOPNOTSUPP,
                ..
            }
        ),
        "{resp:?}"
    );
}

#[test]
fn a_vanished_client_invalidates_what_it_could_have_written() {
    let s = setup();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.backing)
        .unwrap();
    s.fake.opens.lock().push((
        me(),
        open_info(21, 8, libc::O_WRONLY, DataMap::whole_file(), f),
    ));
    let conn = control::connect(s.server.path()).unwrap();
    let (resp, _fds) = control::call(
        conn.as_fd(),
        &Request::Adopt {
            ino: 21,
            tid: me(),
            flags: libc::O_WRONLY | libc::O_APPEND,
            engine: false,
        },
    )
    .unwrap();
    assert!(matches!(resp, Response::Adopted { .. }));
    assert_eq!(s.server.clients(), 1);
    drop(conn);
    // The connection thread invalidates, then leaves; wait for that without
    // a timing assumption by polling the observable effect.
    for _ in 0..1000 {
        if s.server.clients() == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(s.server.clients(), 0);
    assert_eq!(*s.fake.invalidated.lock(), vec![21]);
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
    assert!(matches!(
        resp,
        Response::Refused {
            errno: libc::EPROTO,
            ..
        }
    ));
    let path = s.server.path().to_path_buf();
    let held = control::connect(&path).unwrap();
    drop(s.server);
    assert!(!path.exists());
    // The server closed our connection rather than leave it hanging.
    assert!(control::recv::<Response>(held.as_fd()).unwrap().is_none());
}

#[test]
fn hello_carries_the_generation_table() {
    let s = setup_with(Some(Generations::create().unwrap()));
    let daemon = s.fake.generations.as_ref().unwrap();
    daemon.bump(33);
    let (conn, table) = control::connect_with_generations(s.server.path()).unwrap();
    let table = table.expect("the daemon has a table, Hello must carry it");
    assert!(!table.is_writable());
    assert_eq!(table.token(33), 1);
    daemon.bump(33);
    assert_eq!(table.token(33), 2);
    // An adoption is reported to the registry before the answer, so its bump
    // is visible as soon as the client has the map.
    let f = File::open(&s.backing).unwrap();
    s.fake.opens.lock().push((
        me(),
        open_info(33, 6, libc::O_RDONLY, DataMap::whole_file(), f),
    ));
    let (resp, _fds) = control::call(
        conn.as_fd(),
        &Request::Adopt {
            ino: 33,
            tid: me(),
            flags: libc::O_RDONLY,
            engine: false,
        },
    )
    .unwrap();
    assert!(matches!(resp, Response::Adopted { .. }), "{resp:?}");
    assert_eq!(*s.fake.adopting.lock(), vec![6]);
    assert_eq!(table.token(33), 3);
    // Plain connect still works (and closes the table it was sent).
    control::connect(s.server.path()).unwrap();
}

#[test]
fn hello_without_a_table_says_so() {
    let s = setup();
    let sock = raw_connect(s.server.path());
    let (resp, fds) = control::call(
        sock.as_fd(),
        &Request::Hello {
            version: control::VERSION,
        },
    )
    .unwrap();
    assert_eq!(
        resp,
        Response::Hello {
            version: control::VERSION,
            generations: false
        }
    );
    assert!(fds.is_empty());
    let (_conn, table) = control::connect_with_generations(s.server.path()).unwrap();
    assert!(table.is_none());
}

/// A connected control socket that has said nothing yet (no Hello).
fn raw_connect(path: &Path) -> OwnedFd {
    let sock = control::socket().unwrap();
    rustix::net::connect(&sock, &rustix::net::SocketAddrUnix::new(path).unwrap()).unwrap();
    sock
}
