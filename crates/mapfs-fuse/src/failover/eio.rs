//! The last resort of a supervisor that gave up restarting its daemon:
//! answer every request with `EIO` until the file system is unmounted, so
//! that programs get an error instead of hanging and `umount` works.
//!
//! Only the request header is read (`struct fuse_in_header`), and only the
//! header of an error reply is written (`struct fuse_out_header`).

use std::io;
use std::os::fd::BorrowedFd;

/// `FUSE_FORGET`, `FUSE_INTERRUPT`, `FUSE_DESTROY`, `FUSE_BATCH_FORGET`.
const FORGET: u32 = 2;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;
/// `FUSE_NOTIFY_RESEND` (Linux 6.9).
const NOTIFY_RESEND: i32 = 7;
/// `sizeof(struct fuse_in_header)`.
const IN_HEADER: usize = 40;

/// Writes a `struct fuse_out_header` (a reply with no body, or with
/// `unique` 0 a notification).
fn write_header(dev: BorrowedFd<'_>, error: i32, unique: u64) -> io::Result<()> {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&16u32.to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    rustix::io::write(dev, &h)?;
    Ok(())
}

/// Asks the kernel to send again every request read from the connection
/// and not answered (by a daemon that died).
pub fn resend(dev: BorrowedFd<'_>) -> io::Result<()> {
    write_header(dev, NOTIFY_RESEND, 0)
}

/// Answers every request with `EIO` until the connection ends.
pub fn fail_all(dev: BorrowedFd<'_>) -> io::Result<()> {
    let _ = resend(dev);
    // The kernel wants room for the largest write request (max_write is
    // 1 MiB on our mounts) plus its headers.
    let mut buf = vec![0u8; 2 << 20];
    loop {
        let n = match rustix::io::read(dev, &mut buf) {
            Ok(n) => n,
            Err(rustix::io::Errno::NODEV) => return Ok(()),
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN | rustix::io::Errno::NOENT) => {
                continue
            }
            Err(e) => return Err(e.into()),
        };
        if n < IN_HEADER {
            continue;
        }
        let opcode = u32::from_ne_bytes(buf[4..8].try_into().expect("4 bytes"));
        let unique = u64::from_ne_bytes(buf[8..16].try_into().expect("8 bytes"));
        match opcode {
            FORGET | BATCH_FORGET | INTERRUPT => {}
            DESTROY => {
                let _ = write_header(dev, 0, unique);
                return Ok(());
            }
            _ => {
                // ENOENT: the request was interrupted meanwhile.
                let _ = write_header(dev, -libc::EIO, unique);
            }
        }
    }
}
