//! The journal ring: records from a daemon to its supervisor through
//! memory the two share, instead of one socket message each.
//!
//! A daemon must hand the supervisor a record of each change before it
//! answers the request that made it (see [`super::records`]). Over the
//! link's socket that is a `sendmsg` per record, and a `recvmsg` and a
//! `poll` in the supervisor: on a plfs mount under the kernel's writeback
//! cache, where every write-back of a few KiB is a record, that was a
//! quarter of the mount's throughput (N-1 strided 4 KiB writes on tmpfs,
//! 470 MB/s supervised against 650 MB/s with `--no-supervisor`). Here a
//! record is a copy into a memfd both processes map: it is as safe there as
//! in the socket's buffer, since the supervisor's mapping outlives the
//! daemon. The supervisor reads the ring every [`super::supervisor`]
//! coalescing period while records come, and sleeps on an eventfd, which
//! the daemon signals only when the supervisor asked for it, when they stop.
//!
//! Records that carry descriptors still go through the socket: the ring
//! holds a *marker* at their place, and the supervisor, reading the marker,
//! takes the next message from the socket, so that every record is read in
//! the order it was made.
//!
//! The supervisor offers a ring to the daemon it starts by naming the two
//! descriptors in [`RING_FDS_ENV`]; a daemon that takes it says so with
//! [`super::records::ToSupervisor::Ring`] before anything else. A daemon
//! that does not know the variable (an older binary started by `mapfs
//! restart`) never says so, and its records are read from the socket as
//! before; a newer daemon under an older supervisor is offered no ring.
//!
//! Layout, in 64-bit words: `[0]` the supervisor's read position, `[1]` the
//! daemon's write position (both count words since the start and only
//! grow), `[2]` set by a supervisor about to sleep, then [`DATA_WORDS`]
//! words of records. A record is a header word (its length in bytes, or
//! [`MARKER`]) and its bytes in little-endian words.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::fs::MemfdFlags;

use crate::sys::SharedWords;

/// Environment variable naming the ring's memfd and eventfd, as
/// `MEMFD,EVENTFD`.
pub const RING_FDS_ENV: &str = "MAPFS_SUPERVISOR_RING_FDS";

/// Environment variable of `mapfs mount`: `0` offers its daemons no ring
/// (their records then come through the socket).
pub const RING_OFF_ENV: &str = "MAPFS_JOURNAL_RING";

/// Words of record space: 4 MiB, as much as the link's socket buffer held
/// ([`super::link::LINK_BUFFER`]), room for many of the largest records (a
/// socket message's size, [`mapfs::control::MAX_PACKET`]). Memory each
/// mount keeps once its ring has gone round.
pub const DATA_WORDS: usize = 1 << 19;

const HEAD: usize = 0;
const TAIL: usize = 1;
const ASLEEP: usize = 2;
const HEADER_WORDS: usize = 8;
const TOTAL_WORDS: usize = HEADER_WORDS + DATA_WORDS;

/// Header word of a marker: the next record is the next socket message.
pub const MARKER: u64 = u64::MAX;

/// What the supervisor reads from the ring.
#[derive(Debug, PartialEq, Eq)]
pub enum Item<'a> {
    /// An encoded record.
    Record(&'a [u8]),
    /// The next record is the next message on the socket.
    Marker,
}

fn word(shared: &SharedWords, pos: u64) -> &AtomicU64 {
    &shared[HEADER_WORDS + (pos % DATA_WORDS as u64) as usize]
}

/// The supervisor's end: creates the ring, reads it.
#[derive(Debug)]
pub struct RingReader {
    shared: SharedWords,
    memfd: OwnedFd,
    wake: OwnedFd,
    buf: Vec<u8>,
}

impl RingReader {
    /// A new, empty ring.
    pub fn create() -> io::Result<RingReader> {
        let memfd = rustix::fs::memfd_create("mapfs-journal", MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&memfd, (TOTAL_WORDS * 8) as u64)?;
        let shared = SharedWords::map(memfd.as_fd(), TOTAL_WORDS)?;
        let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(RingReader {
            shared,
            memfd,
            wake,
            buf: Vec::new(),
        })
    }

    /// Copies of the descriptors a daemon needs (memfd, eventfd), without
    /// close-on-exec, for the daemon to inherit (ours keep it; the copies
    /// are closed once it is started), and the value of [`RING_FDS_ENV`]
    /// naming them, which [`RingWriter::from_env`] reads.
    pub fn for_child(&self) -> io::Result<([OwnedFd; 2], String)> {
        let fds = [rustix::io::dup(&self.memfd)?, rustix::io::dup(&self.wake)?];
        let env = format!("{},{}", fds[0].as_raw_fd(), fds[1].as_raw_fd());
        Ok((fds, env))
    }

    /// The eventfd the daemon signals after [`Self::arm`].
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// True when no record is waiting.
    pub fn is_empty(&self) -> bool {
        self.shared[HEAD].load(Ordering::Relaxed) == self.shared[TAIL].load(Ordering::Acquire)
    }

    /// Asks the daemon to signal the eventfd at its next record; false (and
    /// not armed) when a record is already waiting.
    pub fn arm(&self) -> bool {
        self.shared[ASLEEP].store(1, Ordering::SeqCst);
        if self.shared[TAIL].load(Ordering::SeqCst) != self.shared[HEAD].load(Ordering::Relaxed) {
            self.shared[ASLEEP].store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Undoes [`Self::arm`] and consumes a signal, if any.
    pub fn disarm(&self) {
        self.shared[ASLEEP].store(0, Ordering::SeqCst);
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.wake, &mut b);
    }

    /// Hands every waiting item to `f`, in order; returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(Item<'_>)) -> usize {
        let mut n = 0;
        let mut head = self.shared[HEAD].load(Ordering::Relaxed);
        loop {
            let tail = self.shared[TAIL].load(Ordering::Acquire);
            if head == tail {
                return n;
            }
            while head < tail {
                let hdr = word(&self.shared, head).load(Ordering::Relaxed);
                if hdr == MARKER {
                    head += 1;
                    f(Item::Marker);
                } else {
                    let len = hdr as usize;
                    let words = len.div_ceil(8) as u64;
                    self.buf.clear();
                    for i in 0..words {
                        let w = word(&self.shared, head + 1 + i).load(Ordering::Relaxed);
                        self.buf.extend_from_slice(&w.to_le_bytes());
                    }
                    head += 1 + words;
                    f(Item::Record(&self.buf[..len.min(self.buf.len())]));
                }
                n += 1;
                self.shared[HEAD].store(head, Ordering::Release);
            }
        }
    }
}

/// The daemon's end: appends records.
#[derive(Debug)]
pub struct RingWriter {
    shared: SharedWords,
    wake: OwnedFd,
    /// Writers append one at a time; it guards the write position.
    append: Mutex<()>,
}

/// Why a record did not go into the ring.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Longer than the ring can ever hold.
    TooLong,
    /// The ring stayed full and the supervisor is gone.
    SupervisorGone,
}

impl RingWriter {
    /// The ring offered in [`RING_FDS_ENV`], if any (and removes the
    /// variable, so that nothing this process starts sees it).
    pub fn from_env() -> io::Result<Option<RingWriter>> {
        let Some(raw) = std::env::var_os(RING_FDS_ENV) else {
            return Ok(None);
        };
        std::env::remove_var(RING_FDS_ENV);
        let bad = || io::Error::other(format!("bad {RING_FDS_ENV}"));
        let s = raw.to_str().ok_or_else(bad)?;
        let (m, e) = s.split_once(',').ok_or_else(bad)?;
        let m: i32 = m.parse().map_err(|_| bad())?;
        let e: i32 = e.parse().map_err(|_| bad())?;
        let memfd = crate::sys::inherited_memfd(m, (TOTAL_WORDS * 8) as u64)?;
        let wake = crate::sys::inherited_eventfd(e)?;
        let shared = SharedWords::map(memfd.as_fd(), TOTAL_WORDS)?;
        Ok(Some(RingWriter {
            shared,
            wake,
            append: Mutex::new(()),
        }))
    }

    /// Appends one encoded record. When the ring is full it waits for the
    /// supervisor to read, checking with `gone` that it still lives.
    pub fn push(&self, record: &[u8], gone: impl Fn() -> bool) -> Result<(), Refused> {
        let words = record.len().div_ceil(8);
        if 1 + words > DATA_WORDS {
            return Err(Refused::TooLong);
        }
        self.append(record.len() as u64, record, gone)
    }

    /// Appends a marker: the record sent next on the socket belongs here.
    pub fn push_marker(&self, gone: impl Fn() -> bool) -> Result<(), Refused> {
        self.append(MARKER, &[], gone)
    }

    fn append(&self, hdr: u64, bytes: &[u8], gone: impl Fn() -> bool) -> Result<(), Refused> {
        let need = 1 + bytes.len().div_ceil(8) as u64;
        {
            let _one = self.append.lock().unwrap_or_else(|p| p.into_inner());
            let tail = self.shared[TAIL].load(Ordering::Relaxed);
            let mut waited = 0u32;
            while tail + need - self.shared[HEAD].load(Ordering::Acquire) > DATA_WORDS as u64 {
                // Full: the supervisor reads every few milliseconds; make
                // sure it is awake, and that it still lives.
                self.signal();
                std::thread::sleep(Duration::from_micros(200));
                waited += 1;
                if waited.is_multiple_of(50) && gone() {
                    return Err(Refused::SupervisorGone);
                }
            }
            word(&self.shared, tail).store(hdr, Ordering::Relaxed);
            for (i, chunk) in bytes.chunks(8).enumerate() {
                let mut w = [0u8; 8];
                w[..chunk.len()].copy_from_slice(chunk);
                word(&self.shared, tail + 1 + i as u64)
                    .store(u64::from_le_bytes(w), Ordering::Relaxed);
            }
            self.shared[TAIL].store(tail + need, Ordering::SeqCst);
        }
        if self.shared[ASLEEP].load(Ordering::SeqCst) != 0
            && self.shared[ASLEEP].swap(0, Ordering::SeqCst) != 0
        {
            self.signal();
        }
        Ok(())
    }

    fn signal(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

/// Whether the peer of the link socket `sock` closed it.
pub fn peer_gone(sock: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&sock, PollFlags::empty())];
    matches!(
        rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())),
        Ok(n) if n > 0 && fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer_of(r: &RingReader) -> RingWriter {
        RingWriter {
            shared: SharedWords::map(r.memfd.as_fd(), TOTAL_WORDS).unwrap(),
            wake: r.wake.try_clone().unwrap(),
            append: Mutex::new(()),
        }
    }

    fn drained(r: &mut RingReader) -> Vec<Option<Vec<u8>>> {
        let mut out = Vec::new();
        r.drain(|i| {
            out.push(match i {
                Item::Record(b) => Some(b.to_vec()),
                Item::Marker => None,
            })
        });
        out
    }

    #[test]
    fn records_and_markers_come_out_in_order_across_the_wrap() {
        let mut r = RingReader::create().unwrap();
        let w = writer_of(&r);
        let never = || false;
        // Records of 1..=3000 bytes with markers between: several laps of
        // the ring, drained now and then.
        let mut expect = Vec::new();
        let mut got = Vec::new();
        for i in 0..20_000usize {
            let len = 1 + (i * 7919) % 3000;
            let rec: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
            w.push(&rec, never).unwrap();
            expect.push(Some(rec));
            if i % 5 == 0 {
                w.push_marker(never).unwrap();
                expect.push(None);
            }
            if i % 1000 == 999 {
                got.extend(drained(&mut r));
            }
        }
        got.extend(drained(&mut r));
        assert_eq!(got.len(), expect.len());
        assert!(got == expect, "records differ");
        assert!(r.is_empty());
    }

    #[test]
    fn a_full_ring_waits_for_the_reader_and_an_armed_reader_is_woken() {
        let mut r = RingReader::create().unwrap();
        let w = std::sync::Arc::new(writer_of(&r));
        let big = vec![7u8; 1 << 20];
        // 12 MiB through a 4 MiB ring: the writer must wait for reads.
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            for _ in 0..12 {
                w2.push(&big, || false).unwrap();
            }
        });
        let mut n = 0;
        while n < 12 {
            if r.arm() {
                let mut fds = [PollFd::new(&r.wake, PollFlags::IN)];
                rustix::event::poll(&mut fds, None).unwrap();
                r.disarm();
            }
            n += drained(&mut r).len();
        }
        t.join().unwrap();
        assert_eq!(n, 12);
        assert_eq!(
            w.push(&vec![0u8; DATA_WORDS * 8], || true),
            Err(Refused::TooLong)
        );
    }

    #[test]
    fn a_full_ring_without_a_reader_gives_up() {
        let r = RingReader::create().unwrap();
        let w = writer_of(&r);
        let rec = vec![1u8; 1 << 20];
        let mut refused = None;
        for _ in 0..10 {
            if let Err(e) = w.push(&rec, || true) {
                refused = Some(e);
                break;
            }
        }
        assert_eq!(refused, Some(Refused::SupervisorGone));
    }
}
