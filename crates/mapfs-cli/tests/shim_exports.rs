//! What the shim puts in front of every process of a `mapfs run` job
//! (docs/shim-cost.md): it exports only the libc functions it interposes
//! and its two entry points for tests, and it needs no library but libc and
//! the dynamic loader. A Rust symbol leaking into the dynamic symbol table
//! would be one more name in front of libc's for every symbol lookup of
//! every process (and would interpose a name nobody meant to); one more
//! needed library (the unwinder, `libgcc_s.so.1`) is one more library to
//! open, map and relocate in each of them.
//!
//! Reads the built `.so` with `readelf` (binutils); needs the shim built
//! next to `mapfs` (`cargo build --workspace`).

mod preload_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Exported on purpose besides the hooks (see the shim's crate docs).
const TEST_ENTRY_POINTS: [&str; 2] = ["mapfs_preload_fd_status", "mapfs_preload_cache_hits"];

/// `readelf` of `args` on `file`, its standard output.
fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("running readelf (binutils, scripts/deps.sh): {e}"));
    assert!(
        out.status.success(),
        "readelf {args:?} {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("readelf prints text")
}

/// The names `file` defines in its dynamic symbol table (versions cut off).
fn defined_dynamic_symbols(file: &Path) -> BTreeSet<String> {
    let text = readelf(&["--dyn-syms", "-W"], file);
    let mut out = BTreeSet::new();
    for line in text.lines() {
        // Num: Value Size Type Bind Vis Ndx Name
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 8 || !cols[0].ends_with(':') || cols[6] == "UND" || cols[6] == "Ndx" {
            continue;
        }
        let name = cols[7].split('@').next().unwrap_or_default();
        if !name.is_empty() {
            out.insert(name.to_string());
        }
    }
    out
}

/// The C library this test process runs on (the one the shim's hooks stand
/// in front of), from its own memory map.
fn running_libc() -> std::path::PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("reading /proc/self/maps");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(Into::into)
        .expect("this test runs on a dynamically linked libc")
}

#[test]
fn the_shim_exports_only_libc_functions_and_its_test_entry_points() {
    let shim = preload_support::shim();
    let exported = defined_dynamic_symbols(&shim);
    let libc = defined_dynamic_symbols(&running_libc());
    // The parse must see the hooks, or the checks below prove nothing.
    for hook in ["open", "read", "write", "close", "execve", "vfork", "mmap"] {
        assert!(
            exported.contains(hook),
            "{} does not export `{hook}`: the hooks are missing or readelf's output was not understood: {exported:?}",
            shim.display()
        );
    }
    let unexpected: Vec<&String> = exported
        .iter()
        .filter(|s| !libc.contains(*s) && !TEST_ENTRY_POINTS.contains(&s.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{} exports symbols that are neither libc functions it interposes nor its test entry points \
         (each is looked up by every process under `mapfs run`): {unexpected:?}",
        shim.display()
    );
    for name in TEST_ENTRY_POINTS {
        assert!(
            exported.contains(name),
            "{} no longer exports `{name}`: update TEST_ENTRY_POINTS and the shim's crate docs",
            shim.display()
        );
    }
}

#[test]
fn the_shim_needs_only_libc_and_the_loader() {
    let shim = preload_support::shim();
    let dynamic = readelf(&["-d", "-W"], &shim);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(
        needed.iter().any(|n| n.starts_with("libc.so")),
        "readelf -d of {} shows no libc among {needed:?}: its output was not understood",
        shim.display()
    );
    let extra: Vec<&&str> = needed
        .iter()
        .filter(|n| !n.starts_with("libc.so") && !n.starts_with("ld-linux"))
        .collect();
    assert!(
        extra.is_empty(),
        "{} needs {extra:?} besides libc and the loader: every process under `mapfs run` would load \
         them too (libgcc_s.so.1: see crates/mapfs-preload/build.rs)",
        shim.display()
    );
}
