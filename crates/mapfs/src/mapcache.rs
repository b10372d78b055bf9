//! The map cache of attached preload-shim clients (DeFUSE's "M-Cache") and
//! the validity tokens that keep it honest without a round trip.
//!
//! A client that adopted an open (see [`crate::control`]) may keep the map and
//! backing descriptor it got, keyed by inode, and reuse them at the next open
//! of the same inode instead of asking the daemon again. Whether the cached
//! map is still the inode's map is answered by [`Generations`]: a table of
//! counters in memory shared with the daemon, which bumps an inode's counter
//! whenever what a client may have cached about it can change. The client
//! remembers the counter ("token") it cached under and compares it with the
//! current one at the next open, a single atomic load.
//!
//! # Token contract
//!
//! A client reads [`Generations::token`] after its `open(2)` through the
//! mount returned and *before* it asks the daemon for the map
//! ([`crate::control::Request::Adopt`]), and caches the answer under that
//! token. The daemon guarantees: a token read after a later `open(2)` of the
//! same inode equals the cached one only if the daemon has seen no change of
//! that inode's map (including which backing files it names), size or names
//! since. The daemon bumps after applying a change and before replying to
//! the request that caused it, so the order "open returns, read token, adopt"
//! can only err towards a stale token (a spurious miss), never towards a
//! stale map.
//!
//! Tokens belong to one table, i.e. one daemon instance: a client that
//! reconnects (new table) must drop everything it cached under the old one.
//!
//! Slots are shared: an inode's slot is a hash of its number modulo
//! [`SLOTS`], so a bump of one inode also bumps every inode sharing its slot.
//! That only ever causes a spurious miss, never a stale hit, so it is safe.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Number of token slots (a power of two).
pub const SLOTS: usize = 4096;

/// Size in bytes of the shared table.
pub const TABLE_BYTES: usize = SLOTS * std::mem::size_of::<AtomicU64>();

/// Default capacity of a [`MapCache`] (DeFUSE's).
pub const DEFAULT_CAPACITY: usize = 1024;

/// The shared table of per-inode generation counters. The daemon creates it
/// ([`Generations::create`]) and sends [`Generations::fd`] to clients, which
/// map it read-only ([`Generations::attach`]). See the module docs for the
/// token contract.
///
/// Needs native 64-bit atomic loads (x86_64, aarch64...): clients load from
/// read-only memory, which a compare-and-swap emulation would fault on.
pub struct Generations {
    /// The mapping; `'static` only inside this type, which unmaps it on drop
    /// and never hands out a reference outliving `&self`.
    slots: &'static [AtomicU64],
    /// The descriptor to send (read-only when it could be reopened so);
    /// `None` on a client, which closes it once mapped so that an
    /// application closing descriptors behind a library cannot pull it away
    /// or have its own number closed later.
    fd: Option<OwnedFd>,
    /// Whether this process may bump (the daemon's read-write mapping).
    writable: bool,
}

impl std::fmt::Debug for Generations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generations")
            .field("fd", &self.fd.as_ref().map(|f| f.as_raw_fd()))
            .field("writable", &self.writable)
            .finish_non_exhaustive()
    }
}

/// Maps `TABLE_BYTES` of `fd` shared with `prot`.
fn map_table(fd: BorrowedFd<'_>, prot: ProtFlags) -> io::Result<&'static [AtomicU64]> {
    // SAFETY: a new mapping at an address the kernel chooses, so no existing
    // memory is aliased. It is page-aligned (so aligned for AtomicU64, which
    // has u64's layout) and TABLE_BYTES long, and every process touches it
    // only through atomics. The slice lives in a `Generations`, which unmaps
    // it on drop and lends it out only for the borrow of `&self`. The memfd is
    // sealed against shrinking, so the pages cannot vanish (SIGBUS).
    unsafe {
        let p = rustix::mm::mmap(
            std::ptr::null_mut(),
            TABLE_BYTES,
            prot,
            MapFlags::SHARED,
            fd,
            0,
        )?;
        Ok(std::slice::from_raw_parts(p.cast::<AtomicU64>(), SLOTS))
    }
}

/// The slot of inode `ino`: a splitmix64 finalizer, so that consecutive inode
/// numbers spread over the table.
fn slot_of(ino: u64) -> usize {
    let mut z = ino.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z as usize) & (SLOTS - 1)
}

/// The slot holding the token of inode `ino`: inodes with the same slot
/// share their bumps (spurious misses only).
pub fn slot(ino: u64) -> usize {
    slot_of(ino)
}

impl Generations {
    /// Creates the table (daemon side): a sealed memfd, mapped read-write
    /// here. The seals (no shrink, no grow, no future write, no more seals)
    /// keep every other holder of the descriptor from writing it, by
    /// `write(2)` or by a writable shared mapping, and from truncating it.
    pub fn create() -> io::Result<Self> {
        let memfd = rustix::fs::memfd_create(
            "mapfs-generations",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&memfd, TABLE_BYTES as u64)?;
        // Mapped before sealing: F_SEAL_FUTURE_WRITE refuses new writable
        // mappings, ours included.
        let slots = map_table(memfd.as_fd(), ProtFlags::READ | ProtFlags::WRITE)?;
        // The table owns the mapping from here on (unmapped on drop, also on
        // the error paths below).
        let mut table = Generations {
            slots,
            fd: None,
            writable: true,
        };
        rustix::fs::fcntl_add_seals(
            &memfd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
        )?;
        // Clients get a read-only description; the seals hold anyway (a
        // reopen through /proc would give write access back).
        let proc_path = format!("/proc/self/fd/{}", memfd.as_raw_fd());
        table.fd = Some(
            rustix::fs::open(
                proc_path.as_str(),
                OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap_or(memfd),
        );
        Ok(table)
    }

    /// Attaches to a table received from the daemon (client side): checks its
    /// size and that it cannot shrink, and maps it read-only.
    pub fn attach(fd: OwnedFd) -> io::Result<Self> {
        let st = rustix::fs::fstat(&fd)?;
        if st.st_size != TABLE_BYTES as i64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "generation table has {} bytes, expected {TABLE_BYTES}",
                    st.st_size
                ),
            ));
        }
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "generation table is not sealed against shrinking",
            ));
        }
        let slots = map_table(fd.as_fd(), ProtFlags::READ)?;
        // The mapping stays valid without the descriptor.
        drop(fd);
        Ok(Generations {
            slots,
            fd: None,
            writable: false,
        })
    }

    /// The descriptor to send to clients (`None` on a client's attachment,
    /// which does not keep it).
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Whether this is the daemon's (writable) table.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Invalidates whatever clients cached about `ino` (daemon only; a no-op
    /// on a client's read-only attachment, which would fault).
    pub fn bump(&self, ino: u64) {
        debug_assert!(self.writable, "bump on a read-only generation table");
        if self.writable {
            self.slots[slot_of(ino)].fetch_add(1, Ordering::Release);
        }
    }

    /// The current token of `ino`.
    pub fn token(&self, ino: u64) -> u64 {
        self.slots[slot_of(ino)].load(Ordering::Acquire)
    }
}

impl Drop for Generations {
    fn drop(&mut self) {
        // SAFETY: `slots` is the mapping `map_table` made, TABLE_BYTES long;
        // nothing borrows it any more (borrows are tied to `&self`).
        unsafe {
            let _ = rustix::mm::munmap(self.slots.as_ptr().cast_mut().cast(), TABLE_BYTES);
        }
    }
}

/// What a [`MapCache`] calls with every value it lets go of by itself
/// (replaced, evicted, stale, or left at drop), so descriptors in it get
/// closed.
pub type OnDrop<V> = Box<dyn FnMut(u64, V) + Send>;

const NIL: usize = usize::MAX;

struct Entry<V> {
    ino: u64,
    token: u64,
    value: V,
    /// Towards the most recently used.
    prev: usize,
    /// Towards the least recently used.
    next: usize,
}

/// A client's least-recently-used cache of per-inode values (maps and
/// backing descriptors), each remembered with the token it was cached under.
///
/// Every value the cache drops by itself goes to the `on_drop` callback given
/// at construction: a value replaced by [`MapCache::insert`], the least
/// recently used one evicted to make room, one found stale by
/// [`MapCache::get`], and all that are left when the cache is cleared or
/// dropped. Only [`MapCache::remove`] hands a value back instead. So a value
/// owning descriptors cannot leak them.
pub struct MapCache<V> {
    capacity: usize,
    index: HashMap<u64, usize>,
    entries: Vec<Option<Entry<V>>>,
    free: Vec<usize>,
    /// Most recently used.
    head: usize,
    /// Least recently used.
    tail: usize,
    on_drop: OnDrop<V>,
}

impl<V> std::fmt::Debug for MapCache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapCache")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl<V> MapCache<V> {
    /// An empty cache of at most `capacity` entries (at least 1).
    pub fn new(capacity: usize, on_drop: impl FnMut(u64, V) + Send + 'static) -> Self {
        let capacity = capacity.max(1);
        MapCache {
            capacity,
            index: HashMap::with_capacity(capacity),
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            on_drop: Box::new(on_drop),
        }
    }

    /// An empty cache of [`DEFAULT_CAPACITY`] entries.
    pub fn with_default_capacity(on_drop: impl FnMut(u64, V) + Send + 'static) -> Self {
        Self::new(DEFAULT_CAPACITY, on_drop)
    }

    /// Most entries held at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn entry(&self, i: usize) -> &Entry<V> {
        self.entries[i].as_ref().expect("linked entry")
    }

    fn entry_mut(&mut self, i: usize) -> &mut Entry<V> {
        self.entries[i].as_mut().expect("linked entry")
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = {
            let e = self.entry(i);
            (e.prev, e.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.entry_mut(p).next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entry_mut(n).prev = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        let old = self.head;
        {
            let e = self.entry_mut(i);
            e.prev = NIL;
            e.next = old;
        }
        match old {
            NIL => self.tail = i,
            h => self.entry_mut(h).prev = i,
        }
        self.head = i;
    }

    /// Unlinks and frees slot `i`, returning its entry.
    fn take(&mut self, i: usize) -> Entry<V> {
        self.unlink(i);
        let e = self.entries[i].take().expect("linked entry");
        self.index.remove(&e.ino);
        self.free.push(i);
        e
    }

    /// The value cached for `ino` if it was cached under `token` (and marks
    /// it most recently used). An entry cached under another token is stale:
    /// it goes to `on_drop` and the lookup is a miss.
    pub fn get(&mut self, ino: u64, token: u64) -> Option<&V> {
        let i = *self.index.get(&ino)?;
        if self.entry(i).token != token {
            let e = self.take(i);
            (self.on_drop)(e.ino, e.value);
            return None;
        }
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
        Some(&self.entry(i).value)
    }

    /// Caches `value` for `ino` under `token`, as the most recently used
    /// entry. A value already cached for `ino` goes to `on_drop`, and so does
    /// the least recently used entry when the cache is full.
    pub fn insert(&mut self, ino: u64, token: u64, value: V) {
        if let Some(&i) = self.index.get(&ino) {
            let old = std::mem::replace(&mut self.entry_mut(i).value, value);
            self.entry_mut(i).token = token;
            if self.head != i {
                self.unlink(i);
                self.push_front(i);
            }
            (self.on_drop)(ino, old);
            return;
        }
        if self.index.len() >= self.capacity {
            let e = self.take(self.tail);
            (self.on_drop)(e.ino, e.value);
        }
        let entry = Entry {
            ino,
            token,
            value,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.entries[i] = Some(entry);
                i
            }
            None => {
                self.entries.push(Some(entry));
                self.entries.len() - 1
            }
        };
        self.index.insert(ino, i);
        self.push_front(i);
    }

    /// Removes and returns the value cached for `ino` (not passed to
    /// `on_drop`: the caller owns it now).
    pub fn remove(&mut self, ino: u64) -> Option<V> {
        let i = *self.index.get(&ino)?;
        Some(self.take(i).value)
    }

    /// Drops every entry (through `on_drop`), e.g. when the daemon's table
    /// changed after a reconnect.
    pub fn clear(&mut self) {
        while self.tail != NIL {
            let e = self.take(self.tail);
            (self.on_drop)(e.ino, e.value);
        }
        self.entries.clear();
        self.free.clear();
    }
}

impl<V> Drop for MapCache<V> {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn create_bump_token_and_attach_sees_bumps() {
        let g = Generations::create().unwrap();
        assert!(g.is_writable());
        assert_eq!(g.token(42), 0);
        g.bump(42);
        g.bump(42);
        assert_eq!(g.token(42), 2);
        let fd = g.fd().unwrap().try_clone_to_owned().unwrap();
        let client = Generations::attach(fd).unwrap();
        assert!(!client.is_writable());
        assert_eq!(client.token(42), 2);
        g.bump(42);
        assert_eq!(client.token(42), 3);
        // Slots are spread: most neighbours of 42 are untouched.
        let touched = (0..64u64).filter(|i| client.token(*i) != 0).count();
        assert!(
            touched <= 2,
            "{touched} of 64 consecutive inodes share slot"
        );
    }

    #[test]
    fn slots_spread_consecutive_inodes() {
        let used: std::collections::HashSet<usize> = (0..1024u64).map(slot_of).collect();
        // A random function fills ~1024 * (1 - e^-0.25) = 904 of 4096 slots
        // with 1024 keys; a poor hash (e.g. masking) would too, but a
        // clustering one would not.
        assert!(used.len() > 850, "{}", used.len());
        assert!(slot_of(u64::MAX) < SLOTS);
    }

    #[test]
    fn a_client_cannot_write_the_table() {
        let g = Generations::create().unwrap();
        let fd = g.fd().unwrap().try_clone_to_owned().unwrap();
        // The descriptor sent is read-only...
        assert!(rustix::io::write(&fd, &[1u8; 8]).is_err());
        // ...and reopening it for writing does not help: the seals forbid
        // write(2) and writable shared mappings to everyone.
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let rw = rustix::fs::open(path.as_str(), OFlags::RDWR, Mode::empty()).unwrap();
        assert_eq!(
            rustix::io::pwrite(&rw, &[1u8; 8], 0),
            Err(rustix::io::Errno::PERM)
        );
        let writable = map_table(rw.as_fd(), ProtFlags::READ | ProtFlags::WRITE);
        assert_eq!(
            writable.err().and_then(|e| e.raw_os_error()),
            Some(libc::EPERM)
        );
        assert!(rustix::fs::ftruncate(&rw, 0).is_err());
        // F_SEAL_SEAL: no seal can be added (nor any removed, ever).
        assert_eq!(
            rustix::fs::fcntl_add_seals(&rw, SealFlags::WRITE),
            Err(rustix::io::Errno::PERM)
        );
        assert_eq!(g.token(7), 0);
    }

    #[test]
    fn attach_refuses_foreign_descriptors() {
        let plain = tempfile::tempfile().unwrap();
        plain.set_len(TABLE_BYTES as u64).unwrap();
        assert!(Generations::attach(plain.into()).is_err());
        let small = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        assert!(Generations::attach(small).is_err());
    }

    #[test]
    fn another_process_sees_bumps() {
        let g = Generations::create().unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        // SAFETY: fork in a test; the child only makes system calls
        // (a shared-memory wait and a write) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            drop(r);
            let fd = g.fd().unwrap().try_clone_to_owned().unwrap();
            let client = Generations::attach(fd).unwrap();
            let seen = client.token(9);
            let _ = rustix::io::write(&w, &seen.to_ne_bytes());
            // Wait for the parent's bump through the shared page.
            let mut spins = 0u64;
            while client.token(9) == seen && spins < 2_000_000_000 {
                spins += 1;
                std::hint::spin_loop();
            }
            let _ = rustix::io::write(&w, &client.token(9).to_ne_bytes());
            // SAFETY: leaving the forked child without running the test
            // harness's destructors.
            unsafe { libc::_exit(0) };
        }
        drop(w);
        let mut buf = [0u8; 8];
        rustix::io::read(&r, &mut buf).unwrap();
        assert_eq!(u64::from_ne_bytes(buf), 0);
        g.bump(9);
        let mut buf = [0u8; 8];
        rustix::io::read(&r, &mut buf).unwrap();
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(u64::from_ne_bytes(buf), 1);
    }

    type Dropped = Arc<Mutex<Vec<(u64, u32)>>>;

    fn cache(cap: usize) -> (MapCache<u32>, Dropped) {
        let dropped: Dropped = Arc::default();
        let d = Arc::clone(&dropped);
        (
            MapCache::new(cap, move |ino, v| d.lock().unwrap().push((ino, v))),
            dropped,
        )
    }

    #[test]
    fn lru_evicts_least_recent_and_stale_tokens_miss() {
        let (mut c, dropped) = cache(2);
        c.insert(1, 10, 100);
        c.insert(2, 20, 200);
        assert_eq!(c.get(1, 10), Some(&100));
        c.insert(3, 30, 300); // evicts 2, the least recently used
        assert_eq!(*dropped.lock().unwrap(), vec![(2, 200)]);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(1, 11), None); // stale: dropped
        assert_eq!(*dropped.lock().unwrap(), vec![(2, 200), (1, 100)]);
        assert_eq!(c.len(), 1);
        c.insert(3, 31, 301); // replaces
        assert_eq!(dropped.lock().unwrap().last(), Some(&(3, 300)));
        assert_eq!(c.get(3, 31), Some(&301));
        assert_eq!(c.remove(3), Some(301));
        assert!(c.is_empty());
        c.insert(4, 40, 400);
        drop(c);
        assert_eq!(dropped.lock().unwrap().last(), Some(&(4, 400)));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Get(u64, u64),
        Remove(u64),
        Clear,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0..12u64, 0..3u64).prop_map(|(i, t)| Op::Insert(i, t)),
            6 => (0..12u64, 0..3u64).prop_map(|(i, t)| Op::Get(i, t)),
            2 => (0..12u64).prop_map(Op::Remove),
            1 => Just(Op::Clear),
        ]
    }

    proptest::proptest! {
        #[test]
        fn cache_matches_model(cap in 1usize..6, ops in proptest::collection::vec(op(), 0..200)) {
            let (mut c, dropped) = cache(cap);
            // Model: (ino, token, value), most recently used first.
            let mut model: Vec<(u64, u64, u32)> = Vec::new();
            let mut expect_dropped: Vec<(u64, u32)> = Vec::new();
            let mut removed: Vec<u32> = Vec::new();
            let mut next = 0u32;
            for op in ops {
                match op {
                    Op::Insert(ino, token) => {
                        next += 1;
                        if let Some(p) = model.iter().position(|e| e.0 == ino) {
                            let old = model.remove(p);
                            expect_dropped.push((ino, old.2));
                        } else if model.len() == cap {
                            let lru = model.pop().unwrap();
                            expect_dropped.push((lru.0, lru.2));
                        }
                        model.insert(0, (ino, token, next));
                        c.insert(ino, token, next);
                    }
                    Op::Get(ino, token) => {
                        let want = match model.iter().position(|e| e.0 == ino) {
                            Some(p) if model[p].1 == token => {
                                let e = model.remove(p);
                                model.insert(0, e);
                                Some(e.2)
                            }
                            Some(p) => {
                                let e = model.remove(p);
                                expect_dropped.push((e.0, e.2));
                                None
                            }
                            None => None,
                        };
                        let got = c.get(ino, token).copied();
                        proptest::prop_assert_eq!(got, want);
                    }
                    Op::Remove(ino) => {
                        let want = model
                            .iter()
                            .position(|e| e.0 == ino)
                            .map(|p| model.remove(p).2);
                        let got = c.remove(ino);
                        proptest::prop_assert_eq!(got, want);
                        removed.extend(got);
                    }
                    Op::Clear => {
                        // Least recently used first.
                        expect_dropped.extend(model.drain(..).rev().map(|e| (e.0, e.2)));
                        c.clear();
                    }
                }
                proptest::prop_assert!(c.len() <= cap);
                proptest::prop_assert_eq!(c.len(), model.len());
                proptest::prop_assert_eq!(&*dropped.lock().unwrap(), &expect_dropped);
            }
            drop(c);
            // Nothing leaks: every value was dropped through the callback or
            // handed back by remove, exactly once.
            let mut all: Vec<u32> = dropped.lock().unwrap().iter().map(|d| d.1).collect();
            all.extend(removed);
            all.sort_unstable();
            proptest::prop_assert_eq!(all, (1..=next).collect::<Vec<_>>());
        }
    }
}
