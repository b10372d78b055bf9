//! Proofs of possession: what turns "this process holds that open" into
//! something a control connection can present (protocol in
//! [`mapfs::control`], "Proof of possession").
//!
//! The FUSE adapter issues a proof when a process makes the
//! [`mapfs::control::PROVE_IOCTL`] on its descriptor of a mount file: the
//! kernel names the open (its FUSE handle) and the caller's uid and gid, so
//! nothing in a proof comes from the client's word. The control server
//! redeems it once, on the connection whose key the ioctl carried.
//!
//! Bounds: keys exist only for live connections (the server registers and
//! drops them), each key has at most [`MAX_PER_KEY`] proofs outstanding (the
//! oldest is evicted), and proofs expire after
//! [`mapfs::control::PROOF_TTL`], so the table's size follows the number of
//! connections, which the server caps.

use std::collections::HashMap;
use std::time::Instant;

use mapfs::control::{ConnKey, Proof, PROOF_TTL};
use parking_lot::Mutex;

/// Most proofs one connection may have waiting to be redeemed.
pub const MAX_PER_KEY: usize = 16;

/// The proofs issued and not yet redeemed, and the live connection keys.
#[derive(Debug, Default)]
pub struct Proofs {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Live keys, with their outstanding proofs (oldest first).
    keys: HashMap<ConnKey, Vec<Proof>>,
    issued: HashMap<Proof, Issued>,
}

#[derive(Debug, Clone, Copy)]
struct Issued {
    key: ConnKey,
    redeemed: Redeemed,
    at: Instant,
}

/// What a redeemed proof vouches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redeemed {
    /// The FUSE handle of the open the ioctl was made on.
    pub fh: u64,
    /// The ioctl caller's fsuid.
    pub uid: u32,
    /// The ioctl caller's fsgid.
    pub gid: u32,
}

impl Proofs {
    /// A new random key for a connection, live until [`Proofs::drop_key`].
    pub fn new_key(&self) -> ConnKey {
        let mut inner = self.inner.lock();
        loop {
            let key: ConnKey = rand::random();
            if let std::collections::hash_map::Entry::Vacant(e) = inner.keys.entry(key) {
                e.insert(Vec::new());
                return key;
            }
        }
    }

    /// Forgets a connection's key and every proof issued for it.
    pub fn drop_key(&self, key: &ConnKey) {
        let mut inner = self.inner.lock();
        if let Some(proofs) = inner.keys.remove(key) {
            for p in proofs {
                inner.issued.remove(&p);
            }
        }
    }

    /// Issues a proof that the caller (`uid`, `gid`) holds the open `fh`,
    /// for the connection with `key`. `None` when no live connection has
    /// that key.
    pub fn issue(&self, key: &ConnKey, fh: u64, uid: u32, gid: u32) -> Option<Proof> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let pending = inner.keys.get_mut(key)?;
        let now = Instant::now();
        pending.retain(|p| {
            let live = inner
                .issued
                .get(p)
                .is_some_and(|i| now.duration_since(i.at) < PROOF_TTL);
            if !live {
                inner.issued.remove(p);
            }
            live
        });
        if pending.len() >= MAX_PER_KEY {
            let oldest = pending.remove(0);
            inner.issued.remove(&oldest);
        }
        let proof = loop {
            let p: Proof = rand::random();
            if !inner.issued.contains_key(&p) {
                break p;
            }
        };
        pending.push(proof);
        inner.issued.insert(
            proof,
            Issued {
                key: *key,
                redeemed: Redeemed { fh, uid, gid },
                at: now,
            },
        );
        Some(proof)
    }

    /// Redeems `proof` for the connection with `key`: once, within
    /// [`PROOF_TTL`] of its issue. A proof presented with another key is
    /// consumed too (it has leaked), and not honoured.
    pub fn redeem(&self, key: &ConnKey, proof: &Proof) -> Option<Redeemed> {
        let mut inner = self.inner.lock();
        let issued = inner.issued.remove(proof)?;
        if let Some(pending) = inner.keys.get_mut(&issued.key) {
            pending.retain(|p| p != proof);
        }
        (issued.key == *key && issued.at.elapsed() < PROOF_TTL).then_some(issued.redeemed)
    }

    /// Proofs outstanding (for tests).
    pub fn outstanding(&self) -> usize {
        self.inner.lock().issued.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_is_redeemed_once_and_only_with_its_key() {
        let p = Proofs::default();
        let a = p.new_key();
        let b = p.new_key();
        assert_ne!(a, b);
        let proof = p.issue(&a, 7, 1000, 100).unwrap();
        assert_eq!(
            p.redeem(&a, &proof),
            Some(Redeemed {
                fh: 7,
                uid: 1000,
                gid: 100
            })
        );
        assert_eq!(p.redeem(&a, &proof), None, "single use");
        let leaked = p.issue(&a, 8, 0, 0).unwrap();
        assert_eq!(p.redeem(&b, &leaked), None, "another connection's proof");
        assert_eq!(p.redeem(&a, &leaked), None, "a leaked proof is burnt");
        assert_eq!(p.redeem(&a, &[0; 16]), None, "forged");
    }

    #[test]
    fn unknown_or_dropped_keys_get_nothing() {
        let p = Proofs::default();
        assert_eq!(p.issue(&[1; 16], 7, 0, 0), None);
        let k = p.new_key();
        let proof = p.issue(&k, 7, 0, 0).unwrap();
        p.drop_key(&k);
        assert_eq!(p.redeem(&k, &proof), None);
        assert_eq!(p.issue(&k, 7, 0, 0), None);
        assert_eq!(p.outstanding(), 0);
    }

    #[test]
    fn outstanding_proofs_are_bounded_per_key() {
        let p = Proofs::default();
        let k = p.new_key();
        let all: Vec<Proof> = (0..100).map(|fh| p.issue(&k, fh, 0, 0).unwrap()).collect();
        assert_eq!(p.outstanding(), MAX_PER_KEY);
        assert_eq!(p.redeem(&k, &all[0]), None, "oldest evicted");
        assert_eq!(p.redeem(&k, &all[99]).map(|r| r.fh), Some(99));
    }
}
