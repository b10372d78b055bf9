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
    match copy_range(src, 0, dst, 0, have) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        r => r?,
    }
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
}
