//! `mapfs-attack`: a hostile client of a mount's control socket, for the
//! security regression tests
//! (`crates/mapfs-cli/tests/control_security.rs`).
//!
//! Every subcommand speaks the real protocol ([`mapfs::control`]) and prints
//! one JSON line per phase on stdout: every answer it got, and every
//! descriptor the daemon sent it with the `fstat` identity (`dev`, `ino`)
//! and `/proc/self/fd` link of each, so a test can tell whether a victim's
//! file leaked. The exit status is non-zero only when the attacker's own
//! set-up failed (no socket, a file it was told to open does not open);
//! refusals are results, not errors.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use mapfs::control::{self, ConnKey, Proof, Request, Response};
use mapfs::{DataMap, Growth};
use serde_json::{json, Value};

/// A hostile control-socket client (see the module docs).
#[derive(Parser, Debug)]
#[command(name = "mapfs-attack")]
struct Args {
    /// Mountpoint whose control socket is attacked
    /// (`mapfs::control::socket_path`).
    #[arg(long)]
    mount: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Adopt with forged proofs (zero, random, all-0xff); with `--file`,
    /// also misuse proofs of the attacker's own open of that file: on
    /// another connection, twice, made with another connection's key, made
    /// with a key no connection has.
    Adopt {
        /// A file on the mount the attacker may read.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Opens N connections as fast as it can (Hello on each), prints how
    /// many were accepted and refused, then holds them until stdin closes
    /// or `--hold` seconds pass.
    Conns {
        /// Connections to try.
        n: usize,
        /// Longest hold, in seconds.
        #[arg(long, default_value_t = 30)]
        hold: u64,
    },
    /// Closed / Release with handles it was never given (random and small
    /// ones that other connections may hold), Release of a 1 TiB map,
    /// Changed with forged proofs; `--rounds` times.
    ForgeClosed {
        /// Rounds of forged messages.
        #[arg(long, default_value_t = 1)]
        rounds: u64,
        /// A file on the mount the attacker may read: adopts it (read-only)
        /// and pushes a 1 TiB map for that handle too.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Tries to send descriptors (a pipe, a lingering TCP socket with unsent
    /// data) with its messages; prints each `sendmsg` result, then holds the
    /// lingering socket until stdin closes or `--hold` seconds pass.
    SendFds {
        /// Longest hold, in seconds.
        #[arg(long, default_value_t = 30)]
        hold: u64,
    },
    /// N cycles of connect, one garbage packet, wait for the answer, close.
    Flood {
        /// Cycles.
        n: u64,
    },
    /// Asks for the file system's online tool NAME (a pack compaction,
    /// stats, check), which only the mount's owner or root may run; prints
    /// the answer.
    Tool {
        /// The tool.
        name: String,
    },
    /// Opens K connections from short-lived children (each child connects a
    /// socket the parent keeps, so the connection's peer pid is the dead
    /// child's), prints the children's pids, waits for a line on stdin,
    /// then tries to adopt through every one of them.
    Stale {
        /// Connections (children).
        k: usize,
    },
    /// Opens FILE (a file of a mount whose writers are lent, such as
    /// plfs) for writing, adopts that open on N connections and sends
    /// each the most map parts the daemon takes (parts of at most
    /// `MAP_INLINE` bytes, up to `MAX_MAP_BYTES` per connection); prints
    /// per connection the bytes taken and the refusal, then holds them
    /// (the daemon keeps the parts) until stdin closes or `--hold` seconds
    /// pass.
    Parts {
        /// The file.
        #[arg(long)]
        file: PathBuf,
        /// Connections.
        #[arg(long, default_value_t = 6)]
        n: usize,
        /// Longest hold, in seconds.
        #[arg(long, default_value_t = 60)]
        hold: u64,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let sock = control::socket_path(&args.mount);
    let r = match args.cmd {
        Cmd::Adopt { file } => adopt(&sock, file.as_deref()),
        Cmd::Conns { n, hold } => conns(&sock, n, hold),
        Cmd::ForgeClosed { rounds, file } => forge_closed(&sock, rounds, file.as_deref()),
        Cmd::SendFds { hold } => send_fds(&sock, hold),
        Cmd::Flood { n } => flood(&sock, n),
        Cmd::Stale { k } => stale(&sock, k),
        Cmd::Tool { name } => tool(&sock, &name),
        Cmd::Parts { file, n, hold } => parts(&sock, &file, n, hold),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mapfs-attack: set-up failed: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Prints one result line and flushes it (the test may read it while the
/// attacker still holds its connections).
fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// What a received descriptor is: `fstat` identity and its link.
fn identify(fd: BorrowedFd<'_>) -> Value {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("?{e}"));
    match rustix::fs::fstat(fd) {
        Ok(st) => json!({
            "dev": st.st_dev,
            "ino": st.st_ino,
            "mode": st.st_mode,
            "path": link,
        }),
        Err(e) => json!({"error": e.to_string(), "path": link}),
    }
}

/// One answer (or transport error) as JSON, with the descriptors it carried.
fn answer(what: &str, got: std::io::Result<(Response, Vec<OwnedFd>)>) -> Value {
    match got {
        Ok((resp, fds)) => {
            let fds: Vec<Value> = fds.iter().map(|f| identify(f.as_fd())).collect();
            let mut v = match resp {
                Response::Refused { errno, reason } => {
                    json!({"answer": "Refused", "errno": errno, "reason": reason})
                }
                // `..`: fields the protocol may gain do not matter here;
                // the descriptors are what the tests look at.
                Response::Adopted {
                    handle,
                    files,
                    generations,
                    map,
                    ..
                } => json!({
                    "answer": "Adopted", "handle": handle, "files": files,
                    "generations": generations, "size": map.size(),
                }),
                Response::Done => json!({"answer": "Done"}),
                Response::Hello { .. } => json!({"answer": "Hello"}),
                Response::Status(_) => json!({"answer": "Status"}),
                Response::Stats(_) => json!({"answer": "Stats"}),
                Response::Trace { .. } => json!({"answer": "Trace"}),
                Response::Tool { output } => json!({"answer": "Tool", "bytes": output.len()}),
                Response::Remapped { files, .. } => json!({"answer": "Remapped", "files": files}),
                Response::Copied { bytes, generations } => json!({
                    "answer": "Copied", "bytes": bytes.len(), "generations": generations,
                }),
            };
            v["what"] = json!(what);
            v["fds"] = json!(fds);
            v
        }
        Err(e) => json!({
            "what": what, "answer": "Error", "errno": e.raw_os_error().unwrap_or(0),
            "error": e.to_string(), "fds": [],
        }),
    }
}

/// The short label of an answer, for tallies (`Refused:13`, `Done`...).
fn label(v: &Value) -> String {
    match v["answer"].as_str().unwrap_or("?") {
        a @ ("Refused" | "Error") => format!("{a}:{}", v["errno"]),
        a => a.to_string(),
    }
}

/// Every descriptor listed in `attempts`.
fn all_fds(attempts: &[Value]) -> Vec<Value> {
    attempts
        .iter()
        .flat_map(|a| {
            a["fds"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|mut f| {
                    f["attempt"] = a["what"].clone();
                    f
                })
        })
        .collect()
}

/// A connected control socket with timeouts, without Hello.
fn raw_connect(path: &Path) -> std::io::Result<OwnedFd> {
    let sock = control::socket()?;
    for which in [
        rustix::net::sockopt::Timeout::Recv,
        rustix::net::sockopt::Timeout::Send,
    ] {
        // Set before connect: a full listen backlog makes connect wait
        // for SO_SNDTIMEO rather than forever.
        rustix::net::sockopt::set_socket_timeout(&sock, which, Some(Duration::from_secs(10)))?;
    }
    rustix::net::connect(&sock, &rustix::net::SocketAddrUnix::new(path)?)?;
    Ok(sock)
}

/// Hello on `sock`: the key, or why not.
fn hello(sock: BorrowedFd<'_>) -> std::io::Result<ConnKey> {
    match control::call(
        sock,
        &Request::Hello {
            version: control::VERSION,
        },
    )? {
        (Response::Hello { key, .. }, _) => Ok(key),
        (Response::Refused { errno, .. }, _) => Err(std::io::Error::from_raw_os_error(errno)),
        _ => Err(std::io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

fn adopt_req(proof: Proof, flags: i32) -> Request {
    Request::Adopt {
        proof,
        flags,
        engine: true,
    }
}

fn forged_proofs() -> [(&'static str, Proof); 3] {
    [
        ("zero", [0; 16]),
        ("random", rand::random()),
        ("ones", [0xff; 16]),
    ]
}

fn adopt(path: &Path, file: Option<&Path>) -> Result<()> {
    let a = control::connect(path).context("connecting")?;
    let mut attempts = Vec::new();
    for (name, proof) in forged_proofs() {
        for (mode, flags) in [("ro", libc::O_RDONLY), ("rw", libc::O_RDWR)] {
            let what = format!("adopt {name} proof {mode}");
            attempts.push(answer(
                &what,
                control::call(a.sock.as_fd(), &adopt_req(proof, flags)),
            ));
        }
    }
    let mut ioctls = BTreeMap::new();
    if let Some(file) = file {
        let own =
            std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let b = control::connect(path).context("second connection")?;
        let ro = libc::O_RDONLY;
        let prove = |key: &ConnKey| control::prove(own.as_fd(), key);
        // Own proof (key A) presented on connection B, then on A (burnt).
        let p = prove(&a.key).context("proof of own open")?;
        attempts.push(answer(
            "own proof on another connection",
            control::call(b.sock.as_fd(), &adopt_req(p, ro)),
        ));
        attempts.push(answer(
            "own proof after it leaked",
            control::call(a.sock.as_fd(), &adopt_req(p, ro)),
        ));
        // A fresh proof redeemed twice: the first is the attacker's own
        // legitimate adoption, the second must be refused.
        let p = prove(&a.key).context("second proof of own open")?;
        attempts.push(answer(
            "own proof, first use",
            control::call(a.sock.as_fd(), &adopt_req(p, ro)),
        ));
        attempts.push(answer(
            "own proof, reused",
            control::call(a.sock.as_fd(), &adopt_req(p, ro)),
        ));
        // Made with B's key, presented on A.
        let p = prove(&b.key).context("proof with the other key")?;
        attempts.push(answer(
            "proof made with another connection's key",
            control::call(a.sock.as_fd(), &adopt_req(p, ro)),
        ));
        // Writable access with a read-only open's proof.
        let p = prove(&a.key).context("third proof of own open")?;
        attempts.push(answer(
            "own read-only proof, asking O_RDWR",
            control::call(a.sock.as_fd(), &adopt_req(p, libc::O_RDWR)),
        ));
        // The ioctl with a key no connection has, and on a file that is not
        // on the mount.
        let errno = |r: std::io::Result<Proof>| match r {
            Ok(_) => json!("ok"),
            Err(e) => json!(e.raw_os_error().unwrap_or(0)),
        };
        ioctls.insert("unknown key", errno(prove(&rand::random())));
        let null = std::fs::File::open("/dev/null").context("opening /dev/null")?;
        ioctls.insert(
            "non-mapfs file",
            errno(control::prove(null.as_fd(), &a.key)),
        );
    }
    let fds = all_fds(&attempts);
    emit(json!({
        "cmd": "adopt",
        "pid": std::process::id(),
        "uid": rustix::process::getuid().as_raw(),
        "fds_received": fds.len(),
        "fds": fds,
        "ioctls": ioctls,
        "attempts": attempts,
    }));
    Ok(())
}

/// Raises the soft descriptor limit to the hard one (the attacker wants
/// thousands of sockets).
fn raise_nofile() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
}

/// Waits until stdin reaches end of file (or a line arrives), at most
/// `secs` seconds. Returns why the wait ended (`deadline`, `line`, `eof`,
/// or what `poll` said), which the tests print when a hold ends too soon.
fn hold(secs: u64) -> String {
    let stdin = std::io::stdin();
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return "deadline".into();
        }
        let mut pfd = [rustix::event::PollFd::new(
            &stdin,
            rustix::event::PollFlags::IN,
        )];
        let t = rustix::event::Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        // A signal ends the wait early; only stdin or the deadline may.
        match rustix::event::poll(&mut pfd, Some(&t)) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return format!("poll error {e}"),
            Ok(0) => continue,
            Ok(_) => {}
        }
        let revents = pfd[0].revents();
        if !revents.contains(rustix::event::PollFlags::IN) {
            return format!("poll revents {revents:?}");
        }
        let mut line = String::new();
        return match stdin.read_line(&mut line) {
            Ok(0) => "eof".into(),
            Ok(_) => format!("line {:?}", line.trim_end()),
            Err(e) => format!("read error {e}"),
        };
    }
}

fn conns(path: &Path, n: usize, hold_secs: u64) -> Result<()> {
    raise_nofile();
    let start = Instant::now();
    let mut held = Vec::new();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..n {
        let sock = match raw_connect(path) {
            Ok(s) => s,
            Err(e) => {
                *outcomes
                    .entry(format!("connect:{}", e.raw_os_error().unwrap_or(0)))
                    .or_default() += 1;
                continue;
            }
        };
        let key = match control::send(
            sock.as_fd(),
            &Request::Hello {
                version: control::VERSION,
            },
            &[],
        ) {
            // A refused client may find the daemon's end closed already:
            // its answer is still queued for reading.
            Ok(()) | Err(_) => match control::recv::<Response>(sock.as_fd()) {
                Ok(Some((Response::Hello { .. }, _))) => "accepted".to_string(),
                Ok(Some((Response::Refused { errno, .. }, _))) => format!("refused:{errno}"),
                Ok(Some(_)) => "other answer".to_string(),
                Ok(None) => "closed".to_string(),
                Err(e) => format!("error:{}", e.raw_os_error().unwrap_or(0)),
            },
        };
        if key == "accepted" {
            held.push(sock);
        }
        *outcomes.entry(key).or_default() += 1;
    }
    emit(json!({
        "cmd": "conns",
        "pid": std::process::id(),
        "requested": n,
        "accepted": outcomes.get("accepted").copied().unwrap_or(0),
        "refused_eusers": outcomes.get(&format!("refused:{}", libc::EUSERS)).copied().unwrap_or(0),
        "outcomes": outcomes,
        "elapsed_ms": start.elapsed().as_millis() as u64,
    }));
    let since = Instant::now();
    let ended = hold(hold_secs);
    let held_ms = since.elapsed().as_millis() as u64;
    // Still connected after the hold? (The daemon closes idle connections.)
    let alive = held
        .iter()
        .filter(|s| {
            let mut b = [0u8; 1];
            !matches!(
                rustix::net::recv(s, &mut b, rustix::net::RecvFlags::DONTWAIT),
                Ok((0, _))
            )
        })
        .count();
    emit(json!({
        "cmd": "conns",
        "released": held.len(),
        "alive_at_release": alive,
        "held_ms": held_ms,
        "hold_ended": ended,
    }));
    Ok(())
}

fn forge_closed(path: &Path, rounds: u64, file: Option<&Path>) -> Result<()> {
    let a = control::connect(path).context("connecting")?;
    let tib = 1u64 << 40;
    let maps = [
        DataMap::new(vec![], tib, Growth::ReadOnly).context("1 TiB read-only map")?,
        DataMap::new(vec![], tib, Growth::AppendLog { file: 0, end: tib })
            .context("1 TiB log map")?,
    ];
    let mut tally = Tally::new();
    let mut attempts = Vec::new();
    let sock = a.sock.as_fd();
    if let Some(file) = file {
        // The attacker's own read-only adoption: a handle it was given, but
        // for an open that is neither writable nor lent.
        let own =
            std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let p = control::prove(own.as_fd(), &a.key).context("proof of own open")?;
        let v = answer(
            "own adoption",
            control::call(sock, &adopt_req(p, libc::O_RDONLY)),
        );
        let handle = v["handle"].as_u64();
        attempts.push(v);
        if let Some(h) = handle {
            for map in &maps {
                let v = answer(
                    "release own read-only handle, 1 TiB",
                    control::call(
                        sock,
                        &Request::Release {
                            handle: h,
                            map: Some(map.clone()),
                        },
                    ),
                );
                record(&mut tally, &mut attempts, "release own read-only 1TiB", v);
            }
            let v = answer(
                "closed own read-only handle",
                control::call(
                    sock,
                    &Request::Closed {
                        handle: h,
                        wrote: true,
                    },
                ),
            );
            record(&mut tally, &mut attempts, "closed own read-only", v);
        }
    }
    for round in 0..rounds {
        // Small handles: the daemon numbers adoptions from 1, so these are
        // other connections' handles.
        let small = 1 + round % 64;
        for handle in [small, rand::random::<u64>()] {
            let v = answer(
                "closed",
                control::call(
                    sock,
                    &Request::Closed {
                        handle,
                        wrote: true,
                    },
                ),
            );
            record(&mut tally, &mut attempts, "closed", v);
        }
        let v = answer(
            "release",
            control::call(
                sock,
                &Request::Release {
                    handle: small,
                    map: Some(maps[(round % 2) as usize].clone()),
                },
            ),
        );
        record(&mut tally, &mut attempts, "release 1TiB", v);
        let v = answer(
            "changed",
            control::call(
                sock,
                &Request::Changed {
                    proof: rand::random(),
                },
            ),
        );
        record(&mut tally, &mut attempts, "changed", v);
    }
    let fds = all_fds(&attempts);
    emit(json!({
        "cmd": "forge-closed",
        "pid": std::process::id(),
        "rounds": rounds,
        "answers": tally,
        "fds_received": fds.len(),
        "fds": fds,
        "notable": attempts,
    }));
    Ok(())
}

/// Counts an answer under `kind`; keeps it in full when it was not a plain
/// refusal or carried descriptors.
type Tally = BTreeMap<String, BTreeMap<String, u64>>;
fn record(tally: &mut Tally, attempts: &mut Vec<Value>, kind: &str, v: Value) {
    *tally
        .entry(kind.to_string())
        .or_default()
        .entry(label(&v))
        .or_default() += 1;
    if v["fds"].as_array().is_some_and(|f| !f.is_empty()) || v["answer"] != "Refused" {
        attempts.push(v);
    }
}

/// `setsockopt(SO_LINGER)`.
fn set_linger(fd: BorrowedFd<'_>, secs: i32) -> std::io::Result<()> {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: secs,
    };
    // SAFETY: `fd` is a live socket; the option value is a `struct linger`
    // the kernel reads during the call, passed with its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A TCP socket whose close would block for a minute: `SO_LINGER` 60 s and
/// a send queue its peer (never accepted, never read) does not drain.
fn lingering_socket() -> Result<(std::net::TcpStream, std::net::TcpListener)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("tcp listener")?;
    let s = std::net::TcpStream::connect(listener.local_addr()?).context("tcp connect")?;
    s.set_nonblocking(true)?;
    let chunk = vec![0x5au8; 64 * 1024];
    let mut queued = 0usize;
    loop {
        match std::io::Write::write(&mut &s, &chunk) {
            Ok(n) => queued += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e).context("filling the send queue"),
        }
        if queued > 64 << 20 {
            break;
        }
    }
    set_linger(s.as_fd(), 60).context("SO_LINGER")?;
    Ok((s, listener))
}

fn send_fds(path: &Path, hold_secs: u64) -> Result<()> {
    let a = control::connect(path).context("connecting")?;
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().context("pipe")?;
    let (tcp, _listener) = lingering_socket()?;
    let mut results = BTreeMap::new();
    let mut alive = BTreeMap::new();
    let mut conns = vec![a.sock];
    for (name, fd) in [("pipe", pipe_r.as_fd()), ("lingering tcp", tcp.as_fd())] {
        // Each try on a fresh connection, in case the daemon drops one that
        // sent descriptors.
        let sock = control::connect(path).context("connecting")?.sock;
        let r = control::send(sock.as_fd(), &Request::Status, &[fd]);
        results.insert(
            name,
            match &r {
                Ok(()) => json!("sent"),
                Err(e) => json!(e.raw_os_error().unwrap_or(0)),
            },
        );
        if r.is_ok() {
            // Drain whatever the daemon answered to the message that went
            // through (it should drop the connection instead).
            let _ = control::recv::<Response>(sock.as_fd());
        }
        let still = control::call(sock.as_fd(), &Request::Status);
        alive.insert(name, label(&answer("status", still)));
        conns.push(sock);
    }
    // A connection that never said Hello.
    let raw = raw_connect(path).context("raw connect")?;
    let r = control::send(raw.as_fd(), &Request::Status, &[pipe_r.as_fd()]);
    results.insert(
        "pipe before hello",
        match &r {
            Ok(()) => json!("sent"),
            Err(e) => json!(e.raw_os_error().unwrap_or(0)),
        },
    );
    conns.push(raw);
    emit(json!({
        "cmd": "send-fds",
        "pid": std::process::id(),
        "sendmsg": results,
        "status_after": alive,
        "fds_received": 0,
    }));
    let _ = hold(hold_secs);
    // Our own copy of the lingering socket closes at once (RST) so the
    // attacker itself does not linger at exit.
    let _ = set_linger(tcp.as_fd(), 0);
    drop(conns);
    Ok(())
}

/// One tool request on a fresh connection (no Hello: none is needed).
fn tool(path: &Path, name: &str) -> Result<()> {
    let sock = raw_connect(path).context("connecting")?;
    let req = Request::Tool {
        name: name.to_string(),
        input: Vec::new(),
    };
    emit(answer(name, control::call(sock.as_fd(), &req)));
    Ok(())
}

fn flood(path: &Path, n: u64) -> Result<()> {
    let start = Instant::now();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..n {
        let sock = match raw_connect(path) {
            Ok(s) => s,
            Err(e) => {
                *outcomes
                    .entry(format!("connect:{}", e.raw_os_error().unwrap_or(0)))
                    .or_default() += 1;
                continue;
            }
        };
        // Garbage: a wrong version byte, or the right one and no message.
        let packet: Vec<u8> = if i % 2 == 0 {
            vec![0xEE, 1, 2, 3]
        } else {
            vec![control::VERSION, 0xff, 0xff, 0xff]
        };
        let key = match rustix::net::send(&sock, &packet, rustix::net::SendFlags::NOSIGNAL) {
            Err(e) => format!("send:{}", e.raw_os_error()),
            Ok(_) => match control::recv::<Response>(sock.as_fd()) {
                Ok(Some((Response::Refused { errno, .. }, _))) => format!("refused:{errno}"),
                Ok(Some(_)) => "other answer".into(),
                Ok(None) => "closed".into(),
                Err(e) => format!("error:{}", e.raw_os_error().unwrap_or(0)),
            },
        };
        *outcomes.entry(key).or_default() += 1;
    }
    emit(json!({
        "cmd": "flood",
        "pid": std::process::id(),
        "cycles": n,
        "outcomes": outcomes,
        "elapsed_ms": start.elapsed().as_millis() as u64,
    }));
    Ok(())
}

fn stale(path: &Path, k: usize) -> Result<()> {
    raise_nofile();
    let addr = rustix::net::SocketAddrUnix::new(path).context("socket address")?;
    let mut socks = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..k {
        let sock = control::socket().context("socket")?;
        for which in [
            rustix::net::sockopt::Timeout::Recv,
            rustix::net::sockopt::Timeout::Send,
        ] {
            rustix::net::sockopt::set_socket_timeout(&sock, which, Some(Duration::from_secs(10)))?;
        }
        // SAFETY: fork(2) wrapper. This program is single-threaded, so the
        // child may run ordinary code; it leaves through _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("fork");
        }
        if pid == 0 {
            // The child connects the parent's socket: the daemon records
            // the child as the peer, and the parent keeps the connection.
            let ok = rustix::net::connect(&sock, &addr).is_ok() && hello(sock.as_fd()).is_ok();
            // SAFETY: ends the child without running the parent's
            // destructors or atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        while unsafe { libc::waitpid(pid, &mut status, 0) } != pid {}
        if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
            pids.push(pid);
            socks.push(sock);
        }
    }
    emit(json!({"cmd": "stale", "phase": "connected", "pid": std::process::id(), "pids": pids}));
    // Wait for the go-ahead (a victim now has one of those pids).
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let mut attempts = Vec::new();
    for (sock, pid) in socks.iter().zip(&pids) {
        // Hello again returns the same key; then forged proofs, and the
        // handles other connections are likely to hold.
        let _ = hello(sock.as_fd());
        for (name, proof) in forged_proofs() {
            for flags in [libc::O_RDONLY, libc::O_RDWR] {
                let what = format!("conn of dead pid {pid}: adopt {name} proof flags {flags}");
                attempts.push(answer(
                    &what,
                    control::call(sock.as_fd(), &adopt_req(proof, flags)),
                ));
            }
        }
        for handle in 1..=8u64 {
            let v = answer(
                "closed",
                control::call(
                    sock.as_fd(),
                    &Request::Closed {
                        handle,
                        wrote: true,
                    },
                ),
            );
            attempts.push(v);
        }
    }
    let mut tally: BTreeMap<String, u64> = BTreeMap::new();
    for a in &attempts {
        *tally.entry(label(a)).or_default() += 1;
    }
    let fds = all_fds(&attempts);
    emit(json!({
        "cmd": "stale",
        "phase": "attacked",
        "pid": std::process::id(),
        "answers": tally,
        "fds_received": fds.len(),
        "fds": fds,
    }));
    Ok(())
}

/// See [`Cmd::Parts`].
fn parts(path: &Path, file: &Path, n: usize, hold_secs: u64) -> Result<()> {
    let own = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .with_context(|| format!("opening {}", file.display()))?;
    let mut held = Vec::new();
    let chunk = vec![0u8; control::MAP_INLINE];
    for i in 0..n {
        let c = control::connect(path).context("connecting")?;
        let p = control::prove(own.as_fd(), &c.key).context("proof of own open")?;
        let v = answer(
            "own writable adoption",
            control::call(c.sock.as_fd(), &adopt_req(p, libc::O_RDWR)),
        );
        let Some(handle) = v["handle"].as_u64() else {
            emit(json!({ "conn": i, "adoption": v }));
            continue;
        };
        let mut taken = 0usize;
        let mut refused = Value::Null;
        while taken < control::MAX_MAP_BYTES {
            let len = chunk.len().min(control::MAX_MAP_BYTES - taken);
            let got = control::call(
                c.sock.as_fd(),
                &Request::MapPart {
                    handle,
                    bytes: chunk[..len].to_vec(),
                },
            );
            match got {
                Ok((Response::Done, _)) => taken += len,
                other => {
                    refused = answer("map part", other);
                    break;
                }
            }
        }
        emit(json!({ "conn": i, "taken": taken, "refused": refused }));
        held.push(c);
    }
    emit(json!({ "holding": held.len() }));
    emit(json!({ "released": hold(hold_secs) }));
    Ok(())
}
