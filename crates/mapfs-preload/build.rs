// Link options of the shim, chosen by measuring what loading it costs a
// short-lived process (see `docs/shim-cost.md`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    // The unwinder linked in statically and kept private: std would
    // otherwise make every process under the shim load libgcc_s.so.1 as
    // well (an extra library to open, map and relocate: measured ~50 µs and
    // 8 page faults per process). Rust panics never cross the shim's
    // `extern "C"` hooks (they abort there), so the application's own
    // unwinder and this one never meet.
    if let Some(dir) = libgcc_eh_dir() {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static:+verbatim=libgcc_eh.a");
    }
    // Measured and left at the defaults (`-z now`, plain RELA): lazy
    // binding and packed relative relocations (`-z pack-relative-relocs`)
    // changed nothing measurable (637-648 µs of CPU per `cat` process,
    // within the noise), as the shim has 69 imports and ~1,000 relocations.
}

/// The directory of the C compiler's `libgcc_eh.a`, if it has one.
fn libgcc_eh_dir() -> Option<PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    // Without the file, the compiler echoes the bare name back.
    if !out.status.success() || !path.is_absolute() || !path.is_file() {
        return None;
    }
    Some(path.parent()?.to_path_buf())
}
