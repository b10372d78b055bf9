//! The on-disk format of a container: entry names, the index dropping
//! encoding, and the sequence numbers that order droppings' records.
//!
//! A dropping is `MAGIC` followed by the postcard encoding of [`Dropping`].
//! Postcard is compact and has no self-description, so the magic carries the
//! format version: a future change bumps it, and readers skip droppings they
//! do not understand (with a warning) rather than misread them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use mapfs::{Error, Result};
use serde::{Deserialize, Serialize};

/// The empty regular file that is a file's identity (mode, owner, times).
pub(super) const IDENTITY: &str = ".plfs";
/// Prefix of data logs (`data.<id>`).
pub(super) const LOG_PREFIX: &str = "data.";
/// Prefix of index droppings (`index.<id>`).
pub(super) const INDEX_PREFIX: &str = "index.";
/// Prefix of droppings being written (renamed to `index.<id>` when complete).
pub(super) const TMP_PREFIX: &str = "tmp.";
/// Prefix of a container being created, in the parent directory (renamed to
/// the file's name once its identity exists). Hidden from listings.
pub(super) const NEW_PREFIX: &str = ".plfs-new.";
/// Prefix of a container being removed, in the parent directory. Hidden.
pub(super) const GONE_PREFIX: &str = ".plfs-gone.";

/// First bytes of every dropping: format name and version.
const MAGIC: &[u8; 8] = b"PLFSIDX1";

/// One index dropping: what one open changed, or a compacted base.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Dropping {
    /// Names of the logs (`data.<id>`) that `Op::Data` records index.
    pub logs: Vec<String>,
    /// The changes, each with its own sequence number.
    pub records: Vec<Record>,
}

/// One change of a file, ordered among all droppings by `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    /// Global order: records apply in increasing `seq` (ties: dropping name,
    /// then position in the dropping).
    pub seq: u64,
    /// What changed.
    pub op: Op,
}

/// A change of a file's bytes or size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Op {
    /// Logical `logical..logical+len` holds the bytes at `offset` of log
    /// `logs[log]`.
    Data {
        /// First logical byte.
        logical: u64,
        /// Length (> 0).
        len: u64,
        /// Index into [`Dropping::logs`].
        log: u32,
        /// Offset in the log.
        offset: u64,
    },
    /// Logical `logical..logical+len` reads as zeros.
    Hole {
        /// First logical byte.
        logical: u64,
        /// Length (> 0).
        len: u64,
    },
    /// The size becomes exactly this (a truncate, shrinking or growing).
    SetSize(u64),
    /// The size becomes at least this (a write or extension past the end).
    GrowTo(u64),
}

/// The bytes of a dropping file.
pub(super) fn encode(d: &Dropping) -> Result<Vec<u8>> {
    let mut out = MAGIC.to_vec();
    let body = postcard::to_stdvec(d)
        .map_err(|e| Error::io().context(format!("encoding a plfs dropping: {e}")))?;
    out.extend_from_slice(&body);
    Ok(out)
}

/// Parses a dropping file; `EIO` when it is not one of ours.
pub(super) fn decode(bytes: &[u8]) -> Result<Dropping> {
    let body = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| Error::io().context("not a plfs dropping (bad magic)"))?;
    postcard::from_bytes(body).map_err(|e| Error::io().context(format!("corrupt dropping: {e}")))
}

/// A name part unique among every writer of every process: time, pid and a
/// per-process counter (hex, so names stay short).
pub(super) fn new_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}.{:x}.{:x}", now_ns(), std::process::id(), n)
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A sequence number above `floor` and above every number this process
/// handed out before. Based on the clock, so independent processes on one
/// node (the daemon, embedded shims) order their records by real time; the
/// floor (the highest number already seen in the container) keeps a slow
/// clock from ordering a new record before an old one.
pub(super) fn next_seq(floor: u64) -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let mut cur = LAST.load(Ordering::Relaxed);
    loop {
        let next = now_ns().max(cur + 1).max(floor + 1);
        match LAST.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => cur = seen,
        }
    }
}

/// True for names a user file or directory may not have in a directory
/// (they are the hidden names of containers being created or removed).
pub(super) fn reserved_name(name: &[u8]) -> bool {
    name.starts_with(NEW_PREFIX.as_bytes()) || name.starts_with(GONE_PREFIX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_bad_magic() {
        let d = Dropping {
            logs: vec!["data.1".into()],
            records: vec![
                Record {
                    seq: 5,
                    op: Op::Data {
                        logical: 3,
                        len: 4,
                        log: 0,
                        offset: 9,
                    },
                },
                Record {
                    seq: 6,
                    op: Op::SetSize(2),
                },
            ],
        };
        let b = encode(&d).unwrap();
        assert_eq!(decode(&b).unwrap(), d);
        assert!(decode(&b[1..]).is_err());
        assert!(decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn seqs_increase_and_respect_floor() {
        let a = next_seq(0);
        let b = next_seq(0);
        assert!(b > a);
        let c = next_seq(u64::MAX / 2);
        assert!(c > u64::MAX / 2);
        assert!(next_seq(0) > c);
        assert_ne!(new_id(), new_id());
    }
}
