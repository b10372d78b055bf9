//! The process-heavy workloads (`spawn-read`, `build`, `untar`): short-lived
//! processes touching many files, the way shells, builds, package managers
//! and test suites use a file system. They measure what a configuration
//! costs per process and per metadata call (for `preload`, the shim's
//! start-up and any daemon contact), not per byte.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::config::Prepared;
use super::process;

/// Processes `spawn-read` starts.
pub const SPAWN_PROCESSES: usize = 1000;

/// C files in the `build` project (plus `main.c`).
pub const BUILD_UNITS: usize = 40;

/// Directories and files per directory of the `untar` tree.
pub const UNTAR_DIRS: usize = 40;
/// Files per directory of the `untar` tree.
pub const UNTAR_FILES_PER_DIR: usize = 50;

/// One run: how many units of work it did and how long it took.
#[derive(Debug, Clone, Copy)]
pub struct ProcsResult {
    /// Processes started (`spawn-read`) or C files compiled (`build`).
    pub units: u64,
    /// Wall time in seconds.
    pub secs: f64,
}

impl ProcsResult {
    /// Units per second (higher is better, like every other table).
    pub fn rate(&self) -> f64 {
        self.units as f64 / self.secs
    }
}

/// Runs `script` with `sh -c` under the configuration's prefix, timing it.
fn timed_shell(p: &Prepared, script: &str, args: &[&Path], limit: Duration) -> Result<f64> {
    let mut cmd = p.command("sh");
    cmd.arg("-c").arg(script).arg("sh");
    for a in args {
        cmd.arg(a);
    }
    let start = Instant::now();
    let out = process::run(cmd, limit)?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("sh exited with {}: {}", out.status, out.error_line());
    }
    Ok(secs)
}

/// Copies the natively made tree `src` to `dest` in the configuration's
/// directory, untimed, by `cp` under the configuration's prefix: an
/// embedded directory exists only there, not in this process.
fn stage(p: &Prepared, src: &Path, dest: &Path) -> Result<()> {
    let mut cmd = p.command("sh");
    cmd.arg("-c")
        .arg("rm -rf \"$2\" && cp -r \"$1\" \"$2\"")
        .arg("sh")
        .arg(src)
        .arg(dest);
    let out = process::run(cmd, Duration::from_secs(600))?;
    if !out.status.success() {
        bail!("copying the workload's files in: {}", out.error_line());
    }
    Ok(())
}

/// Removes what [`stage`] or a workload made at `dest` (best effort).
fn unstage(p: &Prepared, dest: &Path) {
    let mut rm = p.command("rm");
    rm.arg("-rf").arg(dest);
    let _ = process::run(rm, Duration::from_secs(300));
}

/// `spawn-read`: a shell loop of [`SPAWN_PROCESSES`] `cat`s, each reading
/// one 8 KiB file of the mount.
pub fn spawn_read(p: &Prepared, dir: &Path) -> Result<ProcsResult> {
    let src = tempfile::Builder::new()
        .prefix("mapfs-bench-spawn.")
        .tempdir()
        .context("a directory for the small file")?;
    let line = b"a small file read whole by a short-lived process\n";
    let body: Vec<u8> = line.iter().copied().cycle().take(8192).collect();
    fs::write(src.path().join("small.txt"), &body).context("writing the small file")?;
    let d = dir.join("spawn");
    stage(p, src.path(), &d)?;
    let file = d.join("small.txt");
    let script = format!(
        "i=0; while [ $i -lt {SPAWN_PROCESSES} ]; do cat \"$1\" >/dev/null || exit 1; i=$((i+1)); done"
    );
    let secs = timed_shell(p, &script, &[&file], Duration::from_secs(600));
    unstage(p, &d);
    Ok(ProcsResult {
        units: SPAWN_PROCESSES as u64,
        secs: secs?,
    })
}

/// `build`: `make -j2` of a generated C project of [`BUILD_UNITS`] files
/// (each compiled and linked into one program, which is then run), from a
/// clean tree.
pub fn build(p: &Prepared, dir: &Path) -> Result<ProcsResult> {
    let src = tempfile::Builder::new()
        .prefix("mapfs-bench-build.")
        .tempdir()
        .context("a directory for the project")?;
    generate_project(src.path())?;
    let d = dir.join("build");
    let res = stage(p, src.path(), &d).and_then(|()| {
        timed_shell(
            p,
            "make -s -j2 -C \"$1\" && \"$1/prog\" >/dev/null",
            &[&d],
            Duration::from_secs(900),
        )
    });
    unstage(p, &d);
    Ok(ProcsResult {
        units: BUILD_UNITS as u64 + 1,
        secs: res?,
    })
}

/// `untar`: `tar xf` of an archive of [`UNTAR_DIRS`] directories of
/// [`UNTAR_FILES_PER_DIR`] small files (0.5-8 KiB each), made natively
/// outside the configuration beforehand; files extracted per second.
pub fn untar(p: &Prepared, dir: &Path) -> Result<ProcsResult> {
    let src = tempfile::Builder::new()
        .prefix("mapfs-bench-untar.")
        .tempdir()
        .context("a directory for the archive")?;
    let tree = src.path().join("tree");
    let mut files = 0u64;
    for d in 0..UNTAR_DIRS {
        let sub = tree.join(format!("d{d:02}"));
        fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        for f in 0..UNTAR_FILES_PER_DIR {
            let len = 512 + (d * 131 + f * 977) % 7680;
            let body: Vec<u8> = (0..len).map(|i| (i * 31 + d + f) as u8).collect();
            fs::write(sub.join(format!("f{f:03}.txt")), body)?;
            files += 1;
        }
    }
    let tarball = src.path().join("tree.tar");
    let st = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(src.path())
        .arg("tree")
        .status()
        .context("running tar")?;
    if !st.success() {
        bail!("tar -cf failed: {st}");
    }
    // Made and removed by the timed shell and by `rm` under the
    // configuration's prefix, not by this process: an embedded directory
    // exists only there.
    let out = dir.join("untar");
    let secs = timed_shell(
        p,
        "rm -rf \"$2\" && mkdir \"$2\" && tar -xf \"$1\" -C \"$2\"",
        &[&tarball, &out],
        Duration::from_secs(900),
    );
    let mut rm = p.command("rm");
    rm.arg("-rf").arg(&out);
    let _ = super::process::run(rm, Duration::from_secs(300));
    Ok(ProcsResult {
        units: files,
        secs: secs?,
    })
}

/// Writes the project: `uN.c` with a function and a header each, `main.c`
/// calling them all, and a Makefile with one object per source.
fn generate_project(d: &Path) -> Result<()> {
    let write = |name: &str, text: String| -> Result<()> {
        fs::write(d.join(name), text).with_context(|| format!("writing {name}"))
    };
    let mut main = String::from("#include <stdio.h>\n");
    for i in 0..BUILD_UNITS {
        main.push_str(&format!("#include \"u{i}.h\"\n"));
        write(&format!("u{i}.h"), format!("long u{i}(long x);\n"))?;
        write(
            &format!("u{i}.c"),
            format!(
                "#include \"u{i}.h\"\n\
                 long u{i}(long x) {{\n  long s = 0;\n  for (long k = 0; k < x; k++) s += (k ^ {i}) % 7;\n  return s;\n}}\n"
            ),
        )?;
    }
    main.push_str("int main(void) {\n  long t = 0;\n");
    for i in 0..BUILD_UNITS {
        main.push_str(&format!("  t += u{i}({});\n", 100 + i));
    }
    main.push_str("  printf(\"%ld\\n\", t);\n  return 0;\n}\n");
    write("main.c", main)?;
    let objs: Vec<String> = (0..BUILD_UNITS)
        .map(|i| format!("u{i}.o"))
        .chain(std::iter::once("main.o".to_string()))
        .collect();
    write(
        "Makefile",
        format!(
            "CFLAGS = -O1\nprog: {objs}\n\t$(CC) -o $@ $^\n%.o: %.c\n\t$(CC) $(CFLAGS) -c -o $@ $<\n",
            objs = objs.join(" ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_project_builds_and_runs() {
        if which("make").is_none() || which("cc").is_none() {
            eprintln!("SKIPPED: make or cc is not installed (scripts/deps.sh installs them)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        generate_project(d.path()).unwrap();
        let st = std::process::Command::new("make")
            .args(["-s", "-j2", "-C"])
            .arg(d.path())
            .status()
            .unwrap();
        assert!(st.success());
        let out = std::process::Command::new(d.path().join("prog"))
            .output()
            .unwrap();
        assert!(out.status.success());
        let n: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(n > 0);
    }

    fn which(prog: &str) -> Option<std::path::PathBuf> {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(prog))
                .find(|f| f.is_file())
        })
    }
}
