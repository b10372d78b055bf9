//! `copy_file_range` done by hand, for the libraries that serve a file
//! themselves: a mount serves the call for two of its files, while the
//! kernel answers `EXDEV` when one end is a file of the library (the
//! backing file of an adopted open, an engine's placeholder) and the other
//! the mount's. Reads and writes in chunks, through the caller's
//! functions, moving the caller's offsets as the kernel does.

use std::ffi::c_int;

/// Copies up to `n` bytes with `read` and `write` (`Some(offset)` for a
/// position, `None` for the description's offset, which they move), at
/// `*ioff`/`*ooff` where given (moved past what was copied). Returns the
/// bytes copied; an error only if nothing was.
///
/// # Safety
/// `ioff` and `ooff` are NULL or valid for reading and writing an `i64`.
pub unsafe fn by_hand(
    ioff: *mut i64,
    ooff: *mut i64,
    n: usize,
    mut read: impl FnMut(&mut [u8], Option<u64>) -> Result<usize, c_int>,
    mut write: impl FnMut(&[u8], Option<u64>) -> Result<usize, c_int>,
) -> Result<usize, c_int> {
    // SAFETY: per the contract.
    let at = |p: *mut i64| (!p.is_null()).then(|| unsafe { *p });
    let (mut i, mut o) = (at(ioff), at(ooff));
    if i.is_some_and(|x| x < 0) || o.is_some_and(|x| x < 0) {
        return Err(libc::EINVAL);
    }
    let mut buf = vec![0u8; n.min(1 << 20)];
    let mut done = 0usize;
    let mut failed = None;
    'copy: while done < n {
        let want = (n - done).min(buf.len());
        let got = match read(&mut buf[..want], i.map(|x| x as u64)) {
            Ok(0) => break,
            Ok(k) => k,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        i = i.map(|x| x + got as i64);
        let mut put = 0;
        while put < got {
            match write(&buf[put..got], o.map(|x| x as u64)) {
                Ok(k) if k > 0 => {
                    put += k;
                    o = o.map(|x| x + k as i64);
                }
                r => {
                    failed = Some(r.err().unwrap_or(libc::EIO));
                    // What was read and not written is not copied.
                    i = i.map(|x| x - (got - put) as i64);
                    done += put;
                    break 'copy;
                }
            }
        }
        // A short read is not the end (a mount may answer in parts): only
        // a read of nothing is.
        done += got;
    }
    if let (Some(e), 0) = (failed, done) {
        return Err(e);
    }
    if let (false, Some(x)) = (ioff.is_null(), i) {
        // SAFETY: per the contract.
        unsafe { *ioff = x };
    }
    if let (false, Some(x)) = (ooff.is_null(), o) {
        // SAFETY: per the contract.
        unsafe { *ooff = x };
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_moves_the_offsets() {
        let src: Vec<u8> = (0..3_000_000u32).map(|x| x as u8).collect();
        let mut dst = vec![0u8; 10];
        let (mut i, mut o) = (5i64, 2i64);
        // SAFETY: live locals.
        let n = unsafe {
            by_hand(
                &mut i,
                &mut o,
                2_500_000,
                |b, at| {
                    let at = at.unwrap() as usize;
                    let k = b.len().min(src.len() - at).min(700_000);
                    b[..k].copy_from_slice(&src[at..at + k]);
                    Ok(k)
                },
                |d, at| {
                    let at = at.unwrap() as usize;
                    if dst.len() < at + d.len() {
                        dst.resize(at + d.len(), 0);
                    }
                    dst[at..at + d.len()].copy_from_slice(d);
                    Ok(d.len())
                },
            )
        };
        assert_eq!(n, Ok(2_500_000));
        assert_eq!((i, o), (2_500_005, 2_500_002));
        assert!(dst[2..] == src[5..2_500_005]);
    }

    #[test]
    fn an_error_before_any_byte_is_the_answer_and_after_is_a_short_copy() {
        let (mut i, mut o) = (0i64, 0i64);
        // SAFETY: live locals.
        let r = unsafe {
            by_hand(
                &mut i,
                &mut o,
                10,
                |_, _| Err(libc::EBADF),
                |d, _| Ok(d.len()),
            )
        };
        assert_eq!(r, Err(libc::EBADF));
        assert_eq!((i, o), (0, 0));
        let mut writes = 0;
        // SAFETY: live locals.
        let r = unsafe {
            by_hand(
                &mut i,
                &mut o,
                4 << 20,
                |b, _| Ok(b.len()),
                |d, _| {
                    writes += 1;
                    if writes > 1 {
                        Err(libc::ENOSPC)
                    } else {
                        Ok(d.len() / 2)
                    }
                },
            )
        };
        let half = 1 << 19;
        assert_eq!(r, Ok(half));
        assert_eq!(
            (i, o),
            (half as i64, half as i64),
            "offsets past what was copied"
        );
    }
}
