//! Permission checks against the attributes kept in the database: the
//! mount has `default_permissions`, so the kernel checks first; these
//! checks are for callers that reach the file system without the kernel
//! (the preload shim's opens) and for rules the kernel leaves to the file
//! system.

use mapfs::creds::in_group;
use mapfs::{Ctx, Error, Result};

use super::db::Inode;

/// `R_OK`, `W_OK`, `X_OK` as a mask.
pub const R: u32 = 4;
/// Write permission.
pub const W: u32 = 2;
/// Search/execute permission.
pub const X: u32 = 1;

/// True when `ctx` may access `i` with `mask` (a combination of [`R`],
/// [`W`], [`X`]), as `generic_permission` decides without ACLs.
pub fn allowed(ctx: &Ctx, i: &Inode, mask: u32) -> bool {
    if ctx.uid == 0 {
        // Root may do anything but execute a file no one may execute.
        return mask & X == 0 || i.is_dir() || i.mode & 0o111 != 0;
    }
    let bits = if ctx.uid == i.uid {
        i.mode >> 6
    } else if in_group(ctx, i.gid) {
        i.mode >> 3
    } else {
        i.mode
    } & 7;
    bits & mask == mask
}

/// `EACCES` unless [`allowed`].
pub fn check(ctx: &Ctx, i: &Inode, mask: u32) -> Result<()> {
    if allowed(ctx, i, mask) {
        Ok(())
    } else {
        Err(Error::from_errno(libc::EACCES))
    }
}

/// The sticky-directory rule of `unlink`/`rename`: in a sticky `dir`, only
/// the owner of `victim` or of `dir` (or root) may remove it.
pub fn check_sticky(ctx: &Ctx, dir: &Inode, victim: &Inode) -> Result<()> {
    if dir.mode & libc::S_ISVTX != 0 && ctx.uid != 0 && ctx.uid != dir.uid && ctx.uid != victim.uid
    {
        return Err(Error::from_errno(libc::EPERM));
    }
    Ok(())
}

/// Only the owner (or root) may change modes and set explicit times.
pub fn check_owner(ctx: &Ctx, i: &Inode) -> Result<()> {
    if ctx.uid == 0 || ctx.uid == i.uid {
        Ok(())
    } else {
        Err(Error::from_errno(libc::EPERM))
    }
}
