//! Copying bytes between backing files: a reflink (`FICLONE`, shared
//! extents on xfs, btrfs and others) where the backing file system has it, a
//! plain copy (`copy_file_range`, itself in-kernel) where it has not.

use std::fs::File;
use std::os::unix::fs::FileExt;

use rustix::io::Errno;

/// `dst` becomes a reflink of the whole of `src`. `false` when the backing
/// file system (or this pair of files) cannot share extents; other errors
/// are real failures.
pub fn reflink(src: &File, dst: &File) -> std::io::Result<bool> {
    match rustix::fs::ioctl_ficlone(dst, src) {
        Ok(()) => Ok(true),
        Err(Errno::OPNOTSUPP | Errno::NOTTY | Errno::XDEV | Errno::INVAL | Errno::NOSYS) => {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Copies `len` bytes at `from` of `src` to `to` of `dst`.
pub fn copy_range(src: &File, from: u64, dst: &File, to: u64, len: u64) -> std::io::Result<()> {
    let (mut inp, mut out, mut left) = (from, to, len);
    while left > 0 {
        let chunk = left.min(1 << 30) as usize;
        match rustix::fs::copy_file_range(src, Some(&mut inp), dst, Some(&mut out), chunk) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => left -= n as u64,
            Err(Errno::XDEV | Errno::INVAL | Errno::OPNOTSUPP | Errno::NOSYS) => {
                return copy_by_hand(src, inp, dst, out, left)
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The ranges of `from..from + len` of `src` that hold data
/// (`SEEK_DATA`/`SEEK_HOLE`), as `(offset, len)`; a file system without
/// them reports the whole range as data. A hole must not be copied as
/// data: a 512 MiB sparse file once made a 512 MiB version.
pub fn data_ranges(src: &File, from: u64, len: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use rustix::fs::SeekFrom;
    let end = from.saturating_add(len);
    let mut out = Vec::new();
    let mut at = from;
    while at < end {
        let data = match rustix::fs::seek(src, SeekFrom::Data(at)) {
            Ok(d) => d,
            // No data past `at` (or the file ends before it).
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        if data >= end {
            break;
        }
        let hole = match rustix::fs::seek(src, SeekFrom::Hole(data)) {
            Ok(h) => h.min(end),
            Err(Errno::NXIO) => end,
            Err(e) => return Err(e.into()),
        };
        if hole <= data {
            break;
        }
        out.push((data, hole - data));
        at = hole;
    }
    Ok(out)
}

/// Bytes of `from..from + len` of `src` that hold data: what a copy of
/// that range adds to the store.
pub fn allocated(src: &File, from: u64, len: u64) -> std::io::Result<u64> {
    Ok(data_ranges(src, from, len)?.iter().map(|r| r.1).sum())
}

/// Copies `len` bytes at `from` of `src` to `to` of `dst`, data only: the
/// holes of `src` stay holes in `dst` (which is made at least `to + len`
/// long). With `zero_holes`, `dst` may hold bytes there that must read as
/// zeros, and they are zeroed (punched where the file system can).
/// Returns the bytes copied. Bytes `src` no longer has (cut meanwhile)
/// read as zeros.
pub fn copy_sparse(
    src: &File,
    from: u64,
    dst: &File,
    to: u64,
    len: u64,
    zero_holes: bool,
) -> std::io::Result<u64> {
    let mut copied = 0;
    let mut at = from;
    let end = from + len;
    let zero = |a: u64, b: u64| -> std::io::Result<()> {
        if zero_holes && a < b {
            mapfs::engine::zero_backing(dst, to + (a - from), b - a)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        }
        Ok(())
    };
    for (d, n) in data_ranges(src, from, len)? {
        zero(at, d)?;
        match copy_range(src, d, dst, to + (d - from), n) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
            r => r?,
        }
        copied += n;
        at = d + n;
    }
    zero(at, end)?;
    if dst.metadata()?.len() < to + len {
        dst.set_len(to + len)?;
    }
    Ok(copied)
}

/// While it lives, reads through `file` fill the page cache with exactly
/// the pages they ask for (`POSIX_FADV_RANDOM`), in single pages, with no
/// readahead. The advice belongs to the open file description, which a
/// program under `mapfs run` may share (a lent descriptor): its reads in
/// the meantime only lose readahead. Dropped, the file's advice is back to
/// normal, the only advice mapfs ever gives a backing file.
pub struct NoReadahead<'a>(&'a File);

impl<'a> NoReadahead<'a> {
    /// Gives the advice (a hint: where the kernel ignores it, as on tmpfs,
    /// nothing changes).
    pub fn on(file: &'a File) -> NoReadahead<'a> {
        let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::Random);
        NoReadahead(file)
    }

    /// Starts reading `len` bytes at `offset` in one request to the device
    /// (`POSIX_FADV_WILLNEED`, single pages too): without readahead, a copy
    /// would read them one pipe's worth (64 KiB) at a time, waiting for
    /// each.
    pub fn fetch(&self, offset: u64, len: u64) {
        let _ = rustix::fs::fadvise(
            self.0,
            offset,
            std::num::NonZeroU64::new(len),
            rustix::fs::Advice::WillNeed,
        );
    }
}

impl Drop for NoReadahead<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::fadvise(self.0, 0, None, rustix::fs::Advice::Normal);
    }
}

/// The read/write loop for pairs `copy_file_range` refuses.
fn copy_by_hand(src: &File, from: u64, dst: &File, to: u64, len: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; (len.min(1 << 20)) as usize];
    let mut done = 0;
    while done < len {
        let n = buf.len().min((len - done) as usize);
        src.read_exact_at(&mut buf[..n], from + done)?;
        dst.write_all_at(&buf[..n], to + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Makes `dst` a copy of all `len` bytes of `src`: a reflink if it can, else
/// a copy when `copy_allowed`. Returns whether extents are shared, or `None`
/// when neither was possible/allowed.
pub fn clone_or_copy(
    src: &File,
    dst: &File,
    len: u64,
    copy_allowed: bool,
) -> std::io::Result<Option<bool>> {
    if reflink(src, dst)? {
        return Ok(Some(true));
    }
    if !copy_allowed {
        return Ok(None);
    }
    // A file cut since `len` was read, even during the copy (a writer
    // beside this version's, such as a program writing it natively under
    // `mapfs run`), gives what it still has; the rest reads as zeros.
    let have = len.min(src.metadata()?.len());
    copy_sparse(src, 0, dst, 0, have, false)?;
    dst.set_len(len)?;
    Ok(Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    /// A whole version of a file cut since its size was read holds what
    /// the file still has, then zeros, instead of failing.
    #[test]
    fn a_copy_of_a_file_cut_meanwhile_keeps_what_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let mut src = File::create(dir.path().join("src")).unwrap();
        src.write_all(b"0123456789").unwrap();
        let src = File::open(dir.path().join("src")).unwrap();
        let dst = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("dst"))
            .unwrap();
        assert_eq!(clone_or_copy(&src, &dst, 100, true).unwrap(), Some(false));
        let mut got = vec![0u8; 100];
        dst.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(&got[..10], b"0123456789");
        assert!(got[10..].iter().all(|&b| b == 0));
        assert_eq!(dst.metadata().unwrap().len(), 100);
    }

    /// A copy keeps the source's holes as holes (a 64 MiB file holding
    /// 8 KiB costs about 8 KiB), reads back byte for byte, and over bytes
    /// already there (`zero_holes`) turns the holes into zeros.
    #[test]
    fn a_sparse_copy_keeps_holes_and_zeroes_them_over_old_bytes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let open = |n: &str| {
            File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join(n))
                .unwrap()
        };
        let src = open("src");
        src.set_len(64 << 20).unwrap();
        src.write_all_at(&[7u8; 4096], 1 << 20).unwrap();
        src.write_all_at(&[9u8; 4096], (64 << 20) - 4096).unwrap();
        let dst = open("dst");
        let copied = copy_sparse(&src, 0, &dst, 0, 64 << 20, false).unwrap();
        assert!(copied <= 1 << 20, "copied {copied} bytes");
        assert_eq!(dst.metadata().unwrap().len(), 64 << 20);
        assert!(dst.metadata().unwrap().blocks() * 512 < 1 << 20);
        let mut b = [0u8; 4096];
        dst.read_exact_at(&mut b, 1 << 20).unwrap();
        assert_eq!(b, [7u8; 4096]);
        dst.read_exact_at(&mut b, (64 << 20) - 4096).unwrap();
        assert_eq!(b, [9u8; 4096]);
        dst.read_exact_at(&mut b, 2 << 20).unwrap();
        assert_eq!(b, [0u8; 4096]);
        // Over old bytes: the holes of `src` must read as zeros.
        let over = open("over");
        over.write_all_at(&vec![1u8; 3 << 20], 0).unwrap();
        copy_sparse(&src, 0, &over, 0, 3 << 20, true).unwrap();
        let mut all = vec![0u8; 3 << 20];
        over.read_exact_at(&mut all, 0).unwrap();
        let mut want = vec![0u8; 3 << 20];
        want[1 << 20..(1 << 20) + 4096].fill(7);
        assert!(all == want, "holes copied over old bytes are not zeros");
        assert_eq!(allocated(&src, 0, 64 << 20).unwrap(), copied);
    }
}
