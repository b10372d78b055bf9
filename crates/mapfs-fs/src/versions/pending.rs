//! Versions recorded before their index rows: the rewrite's open does not
//! wait for SQLite.
//!
//! An `O_TRUNC` rewrite keeps the file's old inode as its version (a hard
//! link into the store, `replace.rs`). Its index row cost a write
//! transaction and its commit in the open itself, and a mount at its
//! count limit also dropped the path's oldest version there: the largest
//! part of the open's time after the link and the rename.
//!
//! Now, for those versions, the daemon appends a [`Record`] (everything
//! the row will hold) to `pending.log` in the store with one `write`,
//! after the object is linked and before the file's name changes, and a
//! thread commits the records in batches, each with the count limit of
//! its paths, in one transaction. Any other use of the index commits what
//! is pending first (`Store::db`), so the daemon never reads the index
//! without them; the writer's `close` (`FLUSH`) does too, so a version is
//! in the index, for `mapfs versions` in another process, by the time
//! the program that rewrote the file has closed it. A daemon killed with
//! records not committed leaves them in the log: the next instance
//! inserts their rows before it removes objects without one
//! (`Store::adopt_pending`).
//!
//! Frames: length (u32, little-endian), CRC-32 of the payload, payload
//! (postcard). A frame cut short or damaged ends the log.

use std::fs::File;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

/// The log's name in the store directory.
pub const LOG: &str = "pending.log";

/// Largest payload a frame may claim (a path is at most 4 KiB).
const MAX_FRAME: usize = 64 * 1024;

/// A version whose object exists and whose row is not committed yet: a
/// whole version that is the file's own inode, linked into the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Its id, reserved in the index (`Store::next_id`), and its object's
    /// name.
    pub id: i64,
    /// The path whose history it is in.
    pub path: Vec<u8>,
    /// When it was taken (microseconds); the row's stamp is later if the
    /// path already has one as late (stamps are unique per path).
    pub ts: i64,
    /// Size, owner, group and permission bits of the file then.
    pub size: u64,
    /// See `size`.
    pub uid: u32,
    /// See `size`.
    pub gid: u32,
    /// See `size`.
    pub mode: u32,
    /// What made it (`write`, `unlink`, ...).
    pub reason: String,
    /// The file's life ended with it.
    pub terminal: bool,
}

/// `r` as one frame of the log.
pub fn frame(r: &Record) -> Vec<u8> {
    let payload = postcard::to_stdvec(r).expect("a record always encodes");
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The records of a log's bytes, up to the first frame that is cut short
/// or damaged.
pub fn parse(mut bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    while bytes.len() >= 8 {
        let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        if len > MAX_FRAME || bytes.len() < 8 + len {
            break;
        }
        let payload = &bytes[8..8 + len];
        if crc32fast::hash(payload) != crc {
            break;
        }
        match postcard::from_bytes::<Record>(payload) {
            Ok(r) => out.push(r),
            Err(_) => break,
        }
        bytes = &bytes[8 + len..];
    }
    out
}

/// Every record of the log `f` (read from its start).
pub fn read_all(f: &mut File) -> std::io::Result<Vec<Record>> {
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(0))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(parse(&bytes))
}

/// Appends `r` to the log `f` (opened with `O_APPEND`) in one `write`.
pub fn append(mut f: &File, r: &Record) -> std::io::Result<()> {
    f.write_all(&frame(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: i64, path: &[u8]) -> Record {
        Record {
            id,
            path: path.to_vec(),
            ts: 1_700_000_000_000_000 + id,
            size: 4096 * id as u64,
            uid: 1000,
            gid: 100,
            mode: 0o644,
            reason: "write".into(),
            terminal: id % 2 == 0,
        }
    }

    #[test]
    fn frames_read_back_and_a_cut_or_damaged_tail_ends_the_log() {
        let rs: Vec<Record> = (1..=5)
            .map(|i| rec(i, format!("/d/f{i}").as_bytes()))
            .collect();
        let mut bytes: Vec<u8> = rs.iter().flat_map(frame).collect();
        assert_eq!(parse(&bytes), rs);
        // Every cut inside the last frame loses that frame only.
        let last = frame(&rs[4]).len();
        for cut in 1..last {
            assert_eq!(parse(&bytes[..bytes.len() - cut]), rs[..4]);
        }
        // A flipped byte in the third frame's payload ends the log there.
        let at = frame(&rs[0]).len() + frame(&rs[1]).len() + 10;
        bytes[at] ^= 0x40;
        assert_eq!(parse(&bytes), rs[..2]);
        assert!(parse(&[]).is_empty());
        // A length past the limit is not believed.
        let mut huge = vec![0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0];
        huge.extend_from_slice(&frame(&rs[0]));
        assert!(parse(&huge).is_empty());
    }
}
