//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, module
//! parameter `fuse.enable_uring`).
//!
//! After `INIT` was answered with `FUSE_OVER_IO_URING`, every queue (one per
//! possible CPU, `qid` = CPU number: the kernel puts a request on the queue
//! of the CPU its caller runs on) registers ring entries with
//! `FUSE_IO_URING_CMD_REGISTER`. An entry is two buffers the kernel copies
//! requests into and replies out of: `struct fuse_uring_req_header` (the
//! in/out header, the opcode's fixed header, the payload size and commit id)
//! and a payload buffer of the connection's largest request. A completion
//! of an entry's command is a request in its buffers; the reply is written
//! back into them and one `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` both answers
//! it and hands the entry back for the next request: one system call per
//! request where `/dev/fuse` needs a `read` and a `writev`.
//!
//! When every queue has an entry, the kernel stops sending requests to
//! `/dev/fuse`, except `FORGET`s and `INTERRUPT`s; notifications are still
//! written there. The session keeps its `/dev/fuse` readers for those and
//! for what was sent before the ring was ready.
//!
//! Each queue is served by one thread that owns its ring (single issuer,
//! task work deferred to its waits) and runs the file system's calls
//! itself. A reply may come from any thread (fuser's replies are values a
//! file system may send later): it is copied into the entry's reply buffer
//! and handed to the queue's thread, woken through an eventfd when the reply
//! comes from elsewhere, which writes it into the ring buffers and commits.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll;
use crate::ll::fuse_abi as abi;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `FUSE_URING_IN_OUT_HEADER_SZ`: room for the in/out header.
const IN_OUT_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for the opcode's fixed header.
const OP_IN_SZ: usize = 128;
/// Offset of `struct fuse_uring_ent_in_out` in `struct fuse_uring_req_header`.
const ENT_IN_OUT: usize = IN_OUT_SZ + OP_IN_SZ;
/// `sizeof(struct fuse_uring_req_header)`.
const REQ_HEADER_SZ: usize = ENT_IN_OUT + 32;
/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_MIN_READ_BUFFER`: the kernel's floor for the payload size.
const MIN_PAYLOAD: usize = 8192;
const PAGE: usize = 4096;
/// An entry's memory: the request header page, then a page whose end holds
/// the in-header and the opcode's header, copied there so that they sit
/// right before the payload and a request reads as one contiguous buffer,
/// as from `/dev/fuse`; then the payload.
const PAYLOAD_OFF: usize = 2 * PAGE;
/// The user data of the eventfd's read.
const WAKE_TAG: u64 = u64::MAX;
/// Entries per queue of an online CPU unless configured: a request waits
/// for the queue of its caller's CPU, so a queue needs as many entries as
/// requests may run at once on one CPU (fuser runs them on the queue's
/// thread, one at a time, but a reply may be sent later from another one).
pub(crate) const DEFAULT_DEPTH: u16 = 8;

/// Requests served on each transport, and whether the ring is in use.
#[derive(Debug, Default)]
pub struct TransportCounters {
    /// Requests read from `/dev/fuse`.
    pub dev: AtomicU64,
    /// Requests taken from the io_uring queues.
    pub uring: AtomicU64,
    /// True once every queue registered its entries.
    pub uring_active: AtomicBool,
}

/// What the ring of a connection needs: fixed at `INIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringParams {
    /// The payload buffer size of an entry: at least the connection's
    /// `max_write` and `max_pages` pages (the kernel refuses smaller ones).
    pub payload: usize,
    /// Entries per queue.
    pub depth: u16,
}

impl UringParams {
    /// The payload size the kernel asks for a connection whose `INIT` reply
    /// gave `max_write` and `max_pages`.
    pub fn payload_for(max_write: u32, max_pages: u16) -> usize {
        (max_write as usize)
            .max(max_pages as usize * page_size::get())
            .max(MIN_PAYLOAD)
    }
}

/// The CPUs the kernel may run a caller on (`/sys/devices/system/cpu/possible`):
/// the kernel makes a queue for each and uses the ring only once all have
/// an entry.
pub(crate) fn possible_cpus() -> io::Result<(usize, Vec<bool>)> {
    let parse = |path: &str| -> io::Result<Vec<usize>> {
        let text = std::fs::read_to_string(path)?;
        let mut cpus = Vec::new();
        for part in text.trim().split(',').filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let bad = |_| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {text:?}"));
            let (a, b): (usize, usize) = (a.parse().map_err(bad)?, b.parse().map_err(bad)?);
            cpus.extend(a..=b);
        }
        Ok(cpus)
    };
    let possible = parse("/sys/devices/system/cpu/possible")?;
    let online = parse("/sys/devices/system/cpu/online").unwrap_or_else(|_| possible.clone());
    let n = possible.iter().max().map_or(1, |m| m + 1);
    let mut on = vec![false; n];
    for c in online {
        if c < n {
            on[c] = true;
        }
    }
    Ok((n, on))
}

/// An anonymous mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; access to its parts is coordinated by
// the entry protocol (the kernel owns an entry's buffers between a command's
// submission and its completion, the queue thread otherwise).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        // MAP_POPULATE: the kernel copies a request in from the queue's
        // thread; pages present cannot fault while it is being killed.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; the ring that used it is gone
        // (a queue drops its ring before its memory).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring entry.
#[derive(Debug)]
struct Entry {
    /// Start of its memory (see [`PAYLOAD_OFF`]).
    base: *mut u8,
    /// The commit id of the request it holds.
    commit_id: AtomicU64,
    /// The reply, until the queue's thread writes it into the ring.
    reply: Mutex<Vec<u8>>,
}

// SAFETY: `base` points into the queue's mapping, see `Mapping`.
unsafe impl Send for Entry {}
// SAFETY: as above.
unsafe impl Sync for Entry {}

/// A queue's state shared with the replies of its requests.
#[derive(Debug)]
pub(crate) struct Queue {
    qid: u16,
    payload: usize,
    entries: Vec<Entry>,
    /// Entries whose reply is ready.
    ready: Mutex<Vec<u16>>,
    /// Rung by a reply sent from another thread than the queue's.
    wake: OwnedFd,
    thread: Mutex<Option<ThreadId>>,
    _memory: Mapping,
}

impl Queue {
    fn new(qid: u16, params: UringParams, depth: u16) -> io::Result<Self> {
        let stride = (PAYLOAD_OFF + params.payload).next_multiple_of(PAGE);
        let memory = Mapping::new(stride * depth as usize)?;
        let entries = (0..depth as usize)
            .map(|i| Entry {
                // SAFETY: within the mapping (i < depth).
                base: unsafe { memory.ptr.add(i * stride) },
                commit_id: AtomicU64::new(0),
                reply: Mutex::new(Vec::new()),
            })
            .collect();
        // SAFETY: eventfd(2) returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            qid,
            payload: params.payload,
            entries,
            ready: Mutex::new(Vec::new()),
            // SAFETY: a descriptor we own from here on.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            thread: Mutex::new(None),
            _memory: memory,
        })
    }
}

/// Sends the reply to a request taken from a ring entry.
#[derive(Debug, Clone)]
pub(crate) struct UringSender {
    queue: Arc<Queue>,
    entry: u16,
    /// The connection's `/dev/fuse`, for backing files.
    pub(crate) dev: ChannelSender,
}

impl UringSender {
    pub(crate) fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let entry = &self.queue.entries[self.entry as usize];
        {
            let mut reply = entry.reply.lock();
            reply.clear();
            for b in bufs {
                reply.extend_from_slice(b);
            }
        }
        self.queue.ready.lock().push(self.entry);
        if *self.queue.thread.lock() != Some(std::thread::current().id()) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to our eventfd.
            let n =
                unsafe { libc::write(self.queue.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// `struct fuse_uring_cmd_req` in the 80-byte command area.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// Sets the SQE's `len` (the number of iovecs of a REGISTER), which the
/// `io-uring` crate's `UringCmd80` leaves at zero.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    /// Offset of `len` in `struct io_uring_sqe`.
    const LEN_OFF: usize = 24;
    // SAFETY: `Entry128` is `repr(C)`: a `repr(C)` `struct io_uring_sqe`
    // followed by 64 bytes, so 128 plain bytes; `len` is the `u32` at offset
    // 24 of the SQE (uapi `<linux/io_uring.h>`).
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(sqe);
        raw[LEN_OFF..LEN_OFF + 4].copy_from_slice(&len.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within
    // it for cpu < CPU_SETSIZE, checked; sched_setaffinity reads it.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("queue {cpu}: not pinned: {}", io::Error::last_os_error());
        }
    }
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

fn new_ring(entries: u32) -> io::Result<Ring> {
    // Only the queue's thread enters the ring; the kernel then runs the
    // delivery of a request (task work) when that thread waits.
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
        .or_else(|_| IoUring::builder().build(entries))
}

/// Serves queue `qid` until all its entries are ended by the kernel
/// (connection ended). `registered` is called once its entries are
/// registered.
pub(crate) fn serve_queue<FS: Filesystem>(
    se: &SessionEventLoop<FS>,
    dev: BorrowedFd<'_>,
    qid: u16,
    online: bool,
    params: UringParams,
    counters: &TransportCounters,
    registered: impl FnOnce(io::Result<()>),
) -> io::Result<()> {
    if online {
        pin_to(qid as usize);
    }
    // A queue whose CPU is offline gets no requests, but the kernel waits
    // for an entry on every queue before it uses the ring.
    let depth = if online { params.depth.max(1) } else { 1 };
    let setup = (|| {
        let queue = Arc::new(Queue::new(qid, params, depth)?);
        *queue.thread.lock() = Some(std::thread::current().id());
        let ring = new_ring((depth as u32 + 1).next_power_of_two())?;
        Ok::<_, io::Error>((queue, ring))
    })();
    // A queue that cannot start leaves the ring unready, and the kernel
    // then keeps sending to /dev/fuse: the session goes on without it.
    let (queue, mut ring) = match setup {
        Ok(x) => x,
        Err(e) => {
            registered(Err(io::Error::new(e.kind(), format!("queue {qid}: {e}"))));
            return Ok(());
        }
    };
    let fd = types::Fd(dev.as_raw_fd());
    // The eventfd's counter is read into the queue's memory, which lives
    // as long as any reply may ring it (a read the kernel completes after
    // the ring is closed finds the memory unmapped and fails harmlessly).
    // SAFETY: within the first entry's header page, past the header.
    let wake_buf = unsafe { queue.entries[0].base.add(1024) };
    // The iovecs must stay valid while the kernel imports them (during the
    // submission), kept here for the queue's life all the same.
    let iovecs: Vec<[libc::iovec; 2]> = queue
        .entries
        .iter()
        .map(|e| {
            [
                libc::iovec {
                    iov_base: e.base.cast(),
                    iov_len: REQ_HEADER_SZ,
                },
                libc::iovec {
                    // SAFETY: within the entry's memory.
                    iov_base: unsafe { e.base.add(PAYLOAD_OFF) }.cast(),
                    iov_len: queue.payload,
                },
            ]
        })
        .collect();
    let wake_read = opcode::Read::new(types::Fd(queue.wake.as_raw_fd()), wake_buf, 8)
        .build()
        .user_data(WAKE_TAG)
        .into();
    let mut delivered: Vec<u16> = Vec::with_capacity(depth as usize);
    let mut register = || -> io::Result<()> {
        // SAFETY: the buffer is in the queue's memory (see above).
        unsafe { ring.submission().push(&wake_read) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        for (i, iov) in iovecs.iter().enumerate() {
            let sqe = with_len(
                opcode::UringCmd80::new(fd, CMD_REGISTER)
                    .cmd(cmd_req(0, qid))
                    .addr(Some(iov.as_ptr() as u64))
                    .build()
                    .user_data(i as u64),
                2,
            );
            // SAFETY: the iovecs and the buffers they name live as long as
            // the queue, which outlives the ring.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
        loop {
            match ring.submit() {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
        // A register the kernel refused completes at once; one that took a
        // request at once completes with 0.
        let mut refused = None;
        for cqe in ring.completion() {
            match cqe.result() {
                0 => delivered.push(cqe.user_data() as u16),
                e if e < 0 => refused = Some(io::Error::from_raw_os_error(-e)),
                _ => {}
            }
        }
        refused.map_or(Ok(()), Err)
    };
    if let Err(e) = register() {
        let ended = matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV)
        );
        if ended {
            // Unmounted before the queues were up: nothing to serve.
            debug!("queue {qid}: connection ended before registration");
        } else {
            registered(Err(io::Error::new(
                e.kind(),
                format!("registering the entries of queue {qid}: {e}"),
            )));
        }
        return Ok(());
    }
    registered(Ok(()));
    let mut live = depth as usize;
    while live > 0 {
        for i in delivered.drain(..) {
            counters.uring.fetch_add(1, Ordering::Relaxed);
            dispatch(se, &queue, i);
        }
        commit_ready(&mut ring, &queue, fd)?;
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        let mut rearm = false;
        for cqe in ring.completion() {
            if cqe.user_data() == WAKE_TAG {
                rearm = true;
                continue;
            }
            let i = cqe.user_data() as u16;
            if cqe.result() == 0 {
                delivered.push(i);
            } else {
                let e = -cqe.result();
                if e != libc::ENOTCONN && e != libc::ECONNABORTED && e != libc::ECANCELED {
                    warn!("queue {qid} entry {i}: {}", io::Error::from_raw_os_error(e));
                }
                live -= 1;
            }
        }
        if rearm {
            // SAFETY: as for the first read of the eventfd.
            unsafe { ring.submission().push(&wake_read) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
    }
    debug!("queue {qid}: connection ended");
    drop(ring);
    Ok(())
}

/// Queues the commits of the entries whose reply is ready (submitted with
/// the next wait).
fn commit_ready(ring: &mut Ring, queue: &Queue, fd: types::Fd) -> io::Result<()> {
    let ready: Vec<u16> = std::mem::take(&mut *queue.ready.lock());
    for i in ready {
        let commit_id = commit(queue, i);
        let sqe = opcode::UringCmd80::new(fd, CMD_COMMIT_AND_FETCH)
            .cmd(cmd_req(commit_id, queue.qid))
            .build()
            .user_data(i as u64);
        // SAFETY: the entry's buffers live as long as the queue, which
        // outlives the ring.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))?;
    }
    Ok(())
}

/// Runs the request in entry `i` through the file system.
fn dispatch<FS: Filesystem>(se: &SessionEventLoop<FS>, queue: &Arc<Queue>, i: u16) {
    let entry = &queue.entries[i as usize];
    let hdr_size = size_of::<abi::fuse_in_header>();
    // SAFETY: the kernel completed the entry's command: its buffers are ours
    // until we commit, and the reads stay within the header page.
    let (in_header, payload_sz, commit_id) = unsafe {
        let mut h = [0u8; 40];
        std::ptr::copy_nonoverlapping(entry.base, h.as_mut_ptr(), hdr_size);
        let ent = entry.base.add(ENT_IN_OUT);
        let commit_id = std::ptr::read_unaligned(ent.add(8).cast::<u64>());
        let payload_sz = std::ptr::read_unaligned(ent.add(16).cast::<u32>());
        (h, payload_sz as usize, commit_id)
    };
    entry.commit_id.store(commit_id, Ordering::Relaxed);
    let len = u32::from_ne_bytes(in_header[0..4].try_into().unwrap()) as usize;
    let unique = u64::from_ne_bytes(in_header[8..16].try_into().unwrap());
    let op_len = len.checked_sub(hdr_size + payload_sz);
    let Some(op_len) = op_len.filter(|&n| n <= OP_IN_SZ && payload_sz <= queue.payload) else {
        warn!(
            "queue {}: malformed request (len {len}, payload {payload_sz})",
            queue.qid
        );
        answer_error(queue, i, unique, libc::EIO);
        return;
    };
    let start = PAYLOAD_OFF - hdr_size - op_len;
    // The one copy fuser's parser needs: header and the opcode's header
    // right before the payload, so that the request is contiguous.
    let mut unaligned: Vec<u64>;
    // SAFETY: the entry is ours (see above); [start, PAYLOAD_OFF) lies in the
    // page before the payload, and the request slice ends within the
    // payload, which the kernel wrote `payload_sz` bytes of.
    let data: &[u8] = unsafe {
        let dst = entry.base.add(start);
        std::ptr::copy_nonoverlapping(in_header.as_ptr(), dst, hdr_size);
        std::ptr::copy_nonoverlapping(entry.base.add(IN_OUT_SZ), dst.add(hdr_size), op_len);
        let data = std::slice::from_raw_parts(dst, len);
        if start % align_of::<abi::fuse_in_header>() == 0 {
            data
        } else {
            unaligned = vec![0u64; len.div_ceil(8)];
            let p = unaligned.as_mut_ptr().cast::<u8>();
            std::ptr::copy_nonoverlapping(data.as_ptr(), p, len);
            std::slice::from_raw_parts(p, len)
        }
    };
    let sender = UringSender {
        queue: queue.clone(),
        entry: i,
        dev: se.ch.sender(),
    };
    match RequestWithSender::new_uring(sender, data) {
        Some(req) => {
            let noreply = matches!(
                req.request.operation(),
                Ok(ll::Operation::Forget(_) | ll::Operation::BatchForget(_))
            );
            if let Ok(ll::Operation::Destroy(_)) = req.request.operation() {
                req.reply::<crate::ReplyEmpty>().ok();
            } else {
                req.dispatch(se);
            }
            if noreply {
                // The kernel sends these to /dev/fuse; should one come here,
                // the entry still needs a commit to take the next request.
                answer_error(queue, i, unique, libc::ENOSYS);
            }
        }
        None => answer_error(queue, i, unique, libc::EIO),
    }
}

/// Queues an error reply for the request in entry `i`.
fn answer_error(queue: &Queue, i: u16, unique: u64, errno: i32) {
    let mut reply = queue.entries[i as usize].reply.lock();
    reply.clear();
    reply.extend_from_slice(&16u32.to_ne_bytes());
    reply.extend_from_slice(&(-errno).to_ne_bytes());
    reply.extend_from_slice(&unique.to_ne_bytes());
    drop(reply);
    queue.ready.lock().push(i);
}

/// Writes the reply of entry `i` into its ring buffers; its commit id.
fn commit(queue: &Queue, i: u16) -> u64 {
    let entry = &queue.entries[i as usize];
    let mut reply = entry.reply.lock();
    let out_sz = size_of::<abi::fuse_out_header>();
    if reply.len() < out_sz {
        warn!("queue {}: short reply ({} bytes)", queue.qid, reply.len());
        reply.resize(out_sz, 0);
    }
    let mut payload = reply.len() - out_sz;
    if payload > queue.payload {
        // Cannot happen for replies fuser makes (none is larger than the
        // largest request); the kernel would refuse it anyway.
        warn!("queue {}: reply of {payload} bytes too large", queue.qid);
        payload = 0;
        reply[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    }
    reply[0..4].copy_from_slice(&((out_sz + payload) as u32).to_ne_bytes());
    // SAFETY: the request was delivered and not yet committed: the buffers
    // are ours; the copies stay within the header and the payload buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(reply.as_ptr(), entry.base, out_sz);
        std::ptr::copy_nonoverlapping(
            reply.as_ptr().add(out_sz),
            entry.base.add(PAYLOAD_OFF),
            payload,
        );
        let ent = entry.base.add(ENT_IN_OUT);
        std::ptr::write_unaligned(ent.add(16).cast::<u32>(), payload as u32);
    }
    reply.clear();
    entry.commit_id.load(Ordering::Relaxed)
}
