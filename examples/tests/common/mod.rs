//! Shared helpers of the example tests: finding an example's binary and
//! comparing a mounted tree with a plain directory.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The example binary `name`, built by `cargo test` (it builds every
/// example) in `target/<profile>/examples/`, beside this test's `deps/`.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = profile_dir.join("examples").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --workspace --all-targets` \
         (`cargo test` builds example programs, not example libraries)",
        bin.display()
    );
    bin
}

/// A world-readable temp dir (the daemon runs the caller's credentials).
pub fn temp_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("mapfs-example-")
        .tempdir()
        .expect("temp dir");
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// One entry of a tree: a file's bytes, a symlink's target, or a directory.
#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    /// Regular file contents.
    File(Vec<u8>),
    /// Symbolic link target.
    Link(PathBuf),
    /// Directory.
    Dir,
}

/// Every entry below `root`, by relative path.
pub fn tree(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    let mut entries: Vec<_> = fs::read_dir(root.join(rel))
        .unwrap_or_else(|e| panic!("listing {}: {e}", root.join(rel).display()))
        .map(|e| e.unwrap().file_name())
        .collect();
    entries.sort();
    for name in entries {
        let rel = rel.join(&name);
        let path = root.join(&rel);
        let meta = fs::symlink_metadata(&path).unwrap();
        let node = if meta.is_dir() {
            walk(root, &rel, out);
            Node::Dir
        } else if meta.file_type().is_symlink() {
            Node::Link(fs::read_link(&path).unwrap())
        } else {
            Node::File(fs::read(&path).unwrap())
        };
        out.insert(rel, node);
    }
}

/// Asserts two trees hold the same names, kinds and bytes, naming the
/// first difference rather than dumping both.
pub fn assert_same_tree(what: &str, got: &Path, want: &Path) {
    let (g, w) = (tree(got), tree(want));
    for (p, n) in &w {
        match g.get(p) {
            None => panic!("{what}: {} missing (native has {n:?})", p.display()),
            Some(m) if m != n => panic!(
                "{what}: {} differs: {} bytes/kind {:?} vs native {:?}",
                p.display(),
                match m {
                    Node::File(b) => b.len(),
                    _ => 0,
                },
                short(m),
                short(n)
            ),
            _ => {}
        }
    }
    let extra: Vec<_> = g.keys().filter(|p| !w.contains_key(*p)).collect();
    assert!(extra.is_empty(), "{what}: extra entries {extra:?}");
}

fn short(n: &Node) -> String {
    match n {
        Node::File(b) => format!("file {} bytes, starts {:?}", b.len(), &b[..b.len().min(16)]),
        other => format!("{other:?}"),
    }
}

/// `len` bytes of a pattern that differs per `seed` and per offset.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}
