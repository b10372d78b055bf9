//! The C structures `stat`, `statx` and `statfs` report, filled from a file
//! system's [`Attr`] and [`StatFs`].

use std::time::{SystemTime, UNIX_EPOCH};

use mapfs::{Attr, FileKind, StatFs};

/// `S_IFMT` bits of a kind.
pub fn type_bits(k: FileKind) -> u32 {
    match k {
        FileKind::File => libc::S_IFREG,
        FileKind::Dir => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
        FileKind::Fifo => libc::S_IFIFO,
        FileKind::Socket => libc::S_IFSOCK,
        FileKind::CharDev => libc::S_IFCHR,
        FileKind::BlockDev => libc::S_IFBLK,
    }
}

/// Seconds and nanoseconds since the epoch (negative before it).
pub fn split_time(t: SystemTime) -> (i64, i64) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
        Err(e) => {
            let d = e.duration();
            let (mut s, mut n) = (-(d.as_secs() as i64), i64::from(d.subsec_nanos()));
            if n > 0 {
                s -= 1;
                n = 1_000_000_000 - n;
            }
            (s, n)
        }
    }
}

macro_rules! fill_stat_fn {
    ($name:ident, $ty:ty) => {
        /// A `stat` structure for `a` on device `dev`.
        // Field types differ between architectures; the casts are no-ops
        // only on some.
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        pub fn $name(a: &Attr, dev: u64) -> $ty {
            let mut st: $ty = Zeroable::zeroed();
            st.st_dev = dev as _;
            st.st_ino = a.ino as _;
            st.st_nlink = a.nlink as _;
            st.st_mode = (type_bits(a.kind) | u32::from(a.perm)) as _;
            st.st_uid = a.uid;
            st.st_gid = a.gid;
            st.st_rdev = a.rdev as _;
            st.st_size = a.size as _;
            st.st_blksize = a.blksize as _;
            st.st_blocks = a.blocks as _;
            let (s, n) = split_time(a.atime);
            st.st_atime = s as _;
            st.st_atime_nsec = n as _;
            let (s, n) = split_time(a.mtime);
            st.st_mtime = s as _;
            st.st_mtime_nsec = n as _;
            let (s, n) = split_time(a.ctime);
            st.st_ctime = s as _;
            st.st_ctime_nsec = n as _;
            st
        }
    };
}

fill_stat_fn!(stat, libc::stat);
fill_stat_fn!(stat64, libc::stat64);

/// C structures for which all-zero bytes are a valid value.
pub trait Zeroable: Sized {
    /// The all-zero value.
    fn zeroed() -> Self;
}

macro_rules! zeroable {
    ($($ty:ty),*) => {$(
        impl Zeroable for $ty {
            fn zeroed() -> Self {
                // SAFETY: a C structure of integers (and integer arrays),
                // for which all-zero bytes are a valid value.
                unsafe { std::mem::zeroed() }
            }
        }
    )*};
}

zeroable!(
    libc::stat,
    libc::stat64,
    libc::statx,
    libc::statfs,
    libc::statfs64,
    libc::statvfs,
    libc::statvfs64
);

/// A `statx` structure for `a` on device `dev` (basic fields).
pub fn statx(a: &Attr, dev: u64) -> libc::statx {
    let mut x: libc::statx = Zeroable::zeroed();
    x.stx_mask = libc::STATX_BASIC_STATS;
    x.stx_blksize = a.blksize;
    x.stx_nlink = a.nlink;
    x.stx_uid = a.uid;
    x.stx_gid = a.gid;
    x.stx_mode = (type_bits(a.kind) | u32::from(a.perm)) as u16;
    x.stx_ino = a.ino;
    x.stx_size = a.size;
    x.stx_blocks = a.blocks;
    for (dst, t) in [
        (&mut x.stx_atime, a.atime),
        (&mut x.stx_mtime, a.mtime),
        (&mut x.stx_ctime, a.ctime),
    ] {
        let (s, n) = split_time(t);
        dst.tv_sec = s;
        dst.tv_nsec = n as u32;
    }
    x.stx_rdev_major = libc::major(a.rdev);
    x.stx_rdev_minor = libc::minor(a.rdev);
    x.stx_dev_major = libc::major(dev);
    x.stx_dev_minor = libc::minor(dev);
    x
}

/// What `statfs` reports for an embedded file system (type: FUSE's magic,
/// as a mount of it would show).
pub const FS_MAGIC: i64 = 0x6573_5546;

macro_rules! fill_statfs_fn {
    ($name:ident, $ty:ty) => {
        /// A `statfs` structure for `s`.
        #[allow(clippy::unnecessary_cast)]
        pub fn $name(s: &StatFs) -> $ty {
            let mut f: $ty = Zeroable::zeroed();
            f.f_type = FS_MAGIC as _;
            f.f_bsize = s.bsize as _;
            f.f_blocks = s.blocks as _;
            f.f_bfree = s.bfree as _;
            f.f_bavail = s.bavail as _;
            f.f_files = s.files as _;
            f.f_ffree = s.ffree as _;
            f.f_namelen = s.namelen as _;
            f.f_frsize = s.frsize as _;
            f
        }
    };
}

fill_statfs_fn!(statfs, libc::statfs);
fill_statfs_fn!(statfs64, libc::statfs64);

macro_rules! fill_statvfs_fn {
    ($name:ident, $ty:ty) => {
        /// A `statvfs` structure for `s`.
        #[allow(clippy::unnecessary_cast)]
        pub fn $name(s: &StatFs) -> $ty {
            let mut f: $ty = Zeroable::zeroed();
            f.f_bsize = s.bsize as _;
            f.f_frsize = s.frsize as _;
            f.f_blocks = s.blocks as _;
            f.f_bfree = s.bfree as _;
            f.f_bavail = s.bavail as _;
            f.f_files = s.files as _;
            f.f_ffree = s.ffree as _;
            f.f_favail = s.ffree as _;
            f.f_namemax = s.namelen as _;
            f
        }
    };
}

fill_statvfs_fn!(statvfs, libc::statvfs);
fill_statvfs_fn!(statvfs64, libc::statvfs64);
