//! What a daemon tells its supervisor, and what a supervisor hands the next
//! daemon: everything the kernel may still refer to after the daemon died.
//!
//! The kernel keeps, across the death of the process serving a connection,
//! the nodeids it was given (until it sends FORGET), the handles of open
//! files and directories (until RELEASE), and the backing ids of passthrough
//! opens. The daemon reports each change of those before it answers the
//! request that made it, so the supervisor's copy is never behind what the
//! kernel was told. Data is in the backing files, except the acknowledged
//! changes of maps that are not whole-file: where their bytes went is known
//! only to the daemon until the file system is handed the map. Those in an
//! append log are named by place (the supervisor holds the log); others
//! are copied.

use serde::{Deserialize, Serialize};

/// What the INIT handshake settled, which a resumed daemon cannot ask again.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct InitState {
    /// The kernel accepted FUSE passthrough.
    pub passthrough_ok: bool,
    /// The kernel's writeback cache is on.
    pub writeback: bool,
    /// FUSE over io_uring was negotiated: the payload size and depth of the
    /// ring entries (a successor must register entries again, see
    /// `docs/transport.md`).
    pub uring: Option<(u64, u16)>,
}

/// One change of the inode table (see [`crate::inodes`]), replayed by the
/// supervisor on its own copy in the same order, so it assigns the same
/// nodeids and keeps the same lookup counts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum InodeOp {
    /// [`crate::inodes::Inodes::enter`].
    Enter {
        /// Parent nodeid.
        parent: u64,
        /// Name in the parent.
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        /// File system inode number.
        fs_ino: u64,
    },
    /// [`crate::inodes::Inodes::forget`].
    Forget {
        /// Nodeid.
        ino: u64,
        /// References dropped.
        n: u64,
    },
    /// [`crate::inodes::Inodes::unlinked`].
    Unlinked {
        /// Parent nodeid.
        parent: u64,
        /// Name removed.
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
    },
    /// [`crate::inodes::Inodes::renamed`].
    Renamed {
        /// Old parent.
        parent: u64,
        /// Old name.
        #[serde(with = "serde_bytes")]
        name: Vec<u8>,
        /// New parent.
        newparent: u64,
        /// New name.
        #[serde(with = "serde_bytes")]
        newname: Vec<u8>,
        /// `RENAME_EXCHANGE`.
        exchange: bool,
    },
}

/// One node of a saved inode table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeSnap {
    /// Nodeid.
    pub nodeid: u64,
    /// File system inode number.
    pub fs_ino: u64,
    /// `(parent, name)` pairs, the first one giving its path.
    pub names: Vec<(u64, Vec<u8>)>,
    /// Kernel references.
    pub lookups: u64,
}

/// The parts of a saved inode table that are not nodes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TableSnap {
    /// Next fresh nodeid to try.
    pub next_fresh: u64,
    /// File system numbers whose current file has a fresh nodeid.
    pub fresh: Vec<(u64, u64)>,
}

/// What a handle the kernel holds is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum OpenKind {
    /// An open regular file.
    File {
        /// `open(2)` flags as the kernel sent them.
        flags: i32,
        /// Path at open time (what `release` is told).
        #[serde(with = "serde_bytes")]
        path: Vec<u8>,
        /// Kernel passthrough backing id, if the kernel runs its I/O.
        backing: Option<u32>,
        /// Opener's uid.
        uid: u32,
        /// Opener's gid.
        gid: u32,
    },
    /// A shim's placeholder open (no data).
    Placeholder,
    /// An open directory.
    Dir,
}

/// A handle the kernel holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpenRec {
    /// FUSE file handle.
    pub fh: u64,
    /// Nodeid it was opened on.
    pub ino: u64,
    /// What it is.
    pub kind: OpenKind,
    /// The `unique` id of the request that made it (`OPEN`, `CREATE`,
    /// `OPENDIR`), without [`fuser::RESEND_UNIQUE_BIT`]: a daemon that dies
    /// after recording the handle and before answering leaves the kernel
    /// without it, and the kernel sends that request again to the next
    /// daemon, marked, which answers it with this handle instead of making
    /// another (that one would be held by nobody until unmount).
    pub unique: u64,
}

/// Bytes a change left in an open whose map is not whole-file, not yet in
/// a map the file system holds (see [`ToSupervisor::Wrote`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PendingWrite {
    /// The open's handle.
    pub fh: u64,
    /// File offset.
    pub offset: u64,
    /// The bytes there after the change.
    pub bytes: Bytes,
}

/// Where the bytes of a [`PendingWrite`] are.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Bytes {
    /// A copy.
    Copied(#[serde(with = "serde_bytes")] Vec<u8>),
    /// `len` bytes at `at` of the open's append log `file` (its index in
    /// the open's backing files), whose descriptor the supervisor holds
    /// ([`ToSupervisor::Log`]): a log's bytes are never overwritten, so
    /// they need no copy.
    InLog {
        /// Backing file index of the log.
        file: u32,
        /// Offset in the log.
        at: u64,
        /// Length.
        len: u64,
    },
    /// `len` bytes that read as zeros: a hole the change made (an
    /// allocation past the end, a punched range) or left. Kept without a
    /// copy: an allocation of a GiB once sent a GiB of zeros.
    Hole {
        /// Length.
        len: u64,
    },
}

impl Bytes {
    /// Number of bytes.
    pub fn len(&self) -> u64 {
        match self {
            Bytes::Copied(b) => b.len() as u64,
            Bytes::InLog { len, .. } | Bytes::Hole { len } => *len,
        }
    }

    /// No bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Daemon to supervisor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum ToSupervisor {
    /// The first daemon mounted and finished INIT; the `/dev/fuse`
    /// descriptor comes with this message.
    Mounted(InitState),
    /// The daemon serves requests (the first one, or a resumed one).
    Serving,
    /// The inode table changed.
    Inode(InodeOp),
    /// A handle was given to the kernel.
    Opened(OpenRec),
    /// A change through an open whose map is not whole-file (plfs), sent
    /// before it is acknowledged: where the change put the bytes is known
    /// only to the daemon until the file system is handed the map, so the
    /// supervisor keeps the bytes for the next daemon to write again.
    Wrote(PendingWrite),
    /// The append log `file` of open `fh`, which later [`Bytes::InLog`]
    /// changes of it name; its descriptor comes with this message (holding
    /// it also keeps the log's writer lock, so that no one reclaims it as a
    /// dead writer's). Kept until the open is flushed or released.
    Log {
        /// The open's handle.
        fh: u64,
        /// The log's index in the open's backing files.
        file: u32,
    },
    /// The file system now holds the map of `fh`: the bytes kept for it
    /// are no longer needed.
    Flushed {
        /// The handle.
        fh: u64,
    },
    /// A handle was released.
    Released {
        /// The handle.
        fh: u64,
    },
    /// The daemon is leaving on purpose (`mapfs restart`): start the next
    /// one at once, without counting a failure.
    Restarting,
    /// The daemon took the journal ring it was offered (see
    /// [`super::ring`]): its later records are in the ring, and the socket
    /// carries only those a ring marker points to. Sent first, and only to
    /// a supervisor that offered a ring (last of the variants, so that the
    /// others keep their encoding).
    Ring,
}

/// Supervisor to daemon, first thing after it starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum ToDaemon {
    /// Mount afresh.
    Fresh,
    /// Take over a live connection; the `/dev/fuse` descriptor comes with
    /// this message, and the saved state follows in `Nodes` and `Opens`
    /// batches until `End`.
    Resume(InitState, TableSnap),
    /// A batch of nodes.
    Nodes(Vec<NodeSnap>),
    /// A batch of open handles.
    Opens(Vec<OpenRec>),
    /// The append log `file` of open `fh` that [`Bytes::InLog`] changes
    /// name; its descriptor comes with this message.
    Log {
        /// The open's handle.
        fh: u64,
        /// The log's index in the open's backing files.
        file: u32,
    },
    /// Changes to write again through restored opens, in order.
    Writes(Vec<PendingWrite>),
    /// The saved state is complete.
    End,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Bytes` as it was encoded before its bytes were `serde_bytes`: a
    /// sequence of `u8`, element by element.
    #[derive(Serialize)]
    enum PlainBytes {
        Copied(Vec<u8>),
    }

    #[test]
    fn copied_bytes_keep_their_wire_format_and_round_trip() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let msg = ToSupervisor::Wrote(PendingWrite {
            fh: 9,
            offset: 4096,
            bytes: Bytes::Copied(data.clone()),
        });
        let packet = mapfs::control::encode(&msg).unwrap();
        // The bytes travel as one run, so the packet ends with them, after
        // the same header an element-by-element sequence has.
        assert!(packet.ends_with(&data));
        let plain = postcard::to_stdvec(&PlainBytes::Copied(data.clone())).unwrap();
        let ours = postcard::to_stdvec(&Bytes::Copied(data.clone())).unwrap();
        assert_eq!(plain, ours);
        let back: ToSupervisor = mapfs::control::decode(&packet).unwrap();
        assert_eq!(back, msg);
    }
}
