//! `mapfs bench --hosts A,B`: checkpoint writes from two "hosts", two
//! mounts of one shared store (a GlusterFS volume mounted twice:
//! `scripts/gluster.sh start` prints them), the PLFS question: does N-1
//! through plfs write as fast as N-N?
//!
//! Workloads: `n1-strided` (every writer writes blocks `i*N + rank` of one
//! shared file) and `nn` (each writer its own file). Configurations:
//! `direct` (the store itself), `plfs` (a plfs mount per host, host ids
//! `a` and `b`) and `plfs-run` (the same, the writers under `mapfs run`).
//! `--threads` writers, ranks alternating between the hosts, each writing
//! `--size` bytes in blocks of each `--bs`, fsynced at the end (fio,
//! psync); MB/s is all writers' bytes over the wall time of the slowest.
//! Each N-1 file's size is checked through the other host.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::config::MountGuard;

/// The configurations, in table order.
const CONFIGS: [&str; 3] = ["direct", "plfs", "plfs-run"];
/// The workloads, in table order.
const WORKLOADS: [&str; 2] = ["n1-strided", "nn"];

/// What one `--hosts` run measures.
pub struct Params {
    /// The two mounts of the shared store.
    pub hosts: [PathBuf; 2],
    /// Writers in all.
    pub writers: u64,
    /// Bytes per writer.
    pub size: u64,
    /// Block sizes.
    pub bs: Vec<u64>,
    /// Runs per figure (the median is shown).
    pub runs: usize,
    /// The mapfs executable.
    pub mapfs: PathBuf,
}

/// The file system type of the mount holding `p` (`fuse.glusterfs`...).
fn fs_type(p: &Path) -> String {
    let canon = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let table = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && canon.starts_with(f[1])).then(|| (f[1].len(), f[2].to_string()))
        })
        .max()
        .map_or_else(|| "unknown".into(), |(_, t)| t)
}

/// fio arguments of writer `rank` of `n` writing `file` (`nn`: `file.rank`).
fn job(rank: u64, n: u64, file: &Path, workload: &str, bs: u64, size: u64) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![format!("--name=r{rank}").into()];
    if workload == "nn" {
        let mut f = OsString::from("--filename=");
        f.push(file);
        f.push(format!(".{rank}"));
        v.push(f);
        v.push("--rw=write".into());
        v.push(format!("--size={size}").into());
    } else {
        let mut f = OsString::from("--filename=");
        f.push(file);
        v.push(f);
        v.push(format!("--rw=write:{}", (n - 1) * bs).into());
        v.push(format!("--offset={}", rank * bs).into());
        v.push(format!("--size={}", n * size).into());
        v.push(format!("--io_size={size}").into());
    }
    v
}

/// One run: MB/s, or an error saying what failed.
fn one(
    p: &Params,
    roots: &[PathBuf; 2],
    prefix: &[Vec<OsString>; 2],
    workload: &str,
    bs: u64,
) -> Result<f64> {
    let name = format!("ckpt-{}", std::process::id());
    let start = Instant::now();
    let mut kids: Vec<Child> = Vec::new();
    for h in 0..2usize {
        let mut cmd = match prefix[h].split_first() {
            None => Command::new("fio"),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg("fio");
                c
            }
        };
        cmd.args([
            "--ioengine=psync",
            &format!("--bs={bs}"),
            "--end_fsync=1",
            "--output=/dev/null",
            // Without it fio's setup unlinks a file it is to write and
            // creates it again: a host starting a moment later removed the
            // shared file the other had begun, and the two wrote two files
            // (the size check saw it only when rank 0's file survived).
            "--create_on_open=1",
        ]);
        for rank in (0..p.writers).filter(|r| (*r % 2) as usize == h) {
            cmd.args(job(
                rank,
                p.writers,
                &roots[h].join(&name),
                workload,
                bs,
                p.size,
            ));
        }
        kids.push(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting fio")?,
        );
    }
    let mut failed = Vec::new();
    for k in kids {
        let out = k.wait_with_output()?;
        if !out.status.success() {
            failed.push(
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
                    .to_string(),
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let res = if !failed.is_empty() {
        Err(anyhow::anyhow!("a writer failed: {}", failed.join("; ")))
    } else if workload == "n1-strided" {
        // Every writer's bytes, seen through the other host.
        let want = p.writers * p.size;
        let got = std::fs::metadata(roots[1].join(&name))
            .map(|m| m.len())
            .unwrap_or(0);
        if got < want {
            Err(anyhow::anyhow!(
                "the shared file has {got} bytes through host B, want {want}"
            ))
        } else {
            every_rank_wrote(p, &roots[1].join(&name), bs)
        }
    } else {
        Ok(())
    };
    for r in 0..p.writers {
        let _ = std::fs::remove_file(roots[0].join(format!("{name}.{r}")));
    }
    let _ = std::fs::remove_file(roots[0].join(&name));
    res.map(|()| (p.writers * p.size) as f64 / 1e6 / secs)
}

/// Checks that each writer's first and last blocks of the shared file hold
/// bytes (fio writes random ones): the size alone misses a writer whose
/// bytes went to another file.
fn every_rank_wrote(p: &Params, file: &Path, bs: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let per_rank = (p.size / bs).max(1);
    let mut buf = vec![0u8; bs as usize];
    for rank in 0..p.writers {
        for i in [0, per_rank - 1] {
            let off = (i * p.writers + rank) * bs;
            f.read_exact_at(&mut buf, off)
                .with_context(|| format!("reading {} at {off}", file.display()))?;
            if buf.iter().all(|&b| b == 0) {
                bail!(
                    "writer {rank}'s block at offset {off} of the shared file is zeros through \
                     host B: its bytes are not in the file"
                );
            }
        }
    }
    Ok(())
}

/// Mounts plfs over `dir` inside each host's store (host ids `a`, `b`).
fn mount_plfs(
    p: &Params,
    work: &str,
    mnt_parent: &Path,
) -> Result<([PathBuf; 2], Vec<MountGuard>)> {
    let mut roots = Vec::new();
    let mut guards = Vec::new();
    for (h, id) in ["a", "b"].iter().enumerate() {
        let backing = p.hosts[h].join(work);
        let mnt = mnt_parent.join(format!("plfs-{id}"));
        std::fs::create_dir_all(&mnt)?;
        let r = super::process::run(
            {
                let mut c = Command::new(&p.mapfs);
                c.arg("mount").arg("plfs").arg(&backing).arg(&mnt).args([
                    "--data",
                    "auto",
                    "--ttl",
                    "0",
                    "-o",
                    &format!("hostid={id}"),
                ]);
                c
            },
            std::time::Duration::from_secs(60),
        )?;
        if !r.status.success() {
            bail!(
                "mounting plfs over {} failed: {}",
                backing.display(),
                r.error_line()
            );
        }
        guards.push(MountGuard::new(&mnt, &p.mapfs));
        roots.push(mnt);
    }
    let [a, b]: [PathBuf; 2] = roots.try_into().expect("two hosts");
    Ok(([a, b], guards))
}

/// Runs the suite and prints its table (markdown) on stdout.
pub fn run(p: &Params) -> Result<()> {
    for h in &p.hosts {
        if !h.is_dir() {
            bail!("--hosts: {} is not a directory", h.display());
        }
    }
    if p.writers < 2 {
        bail!("--hosts needs at least 2 writers (--threads), one per host");
    }
    super::fio::check_installed()?;
    let work = format!("mapfs-bench-hosts.{}", std::process::id());
    std::fs::create_dir(p.hosts[0].join(&work))
        .with_context(|| format!("creating {} in {}", work, p.hosts[0].display()))?;
    // The other host must see it: the two directories are one store.
    let seen = (0..50).any(|_| {
        let ok = p.hosts[1].join(&work).is_dir();
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ok
    });
    if !seen {
        let _ = std::fs::remove_dir(p.hosts[0].join(&work));
        bail!(
            "--hosts: {} and {} are not two mounts of one store (a directory made in the first \
             did not appear in the second)",
            p.hosts[0].display(),
            p.hosts[1].display()
        );
    }
    let mnt_parent = tempfile::Builder::new()
        .prefix("mapfs-bench-hosts.")
        .tempdir()?;
    let result = (|| -> Result<()> {
        let direct = [p.hosts[0].join(&work), p.hosts[1].join(&work)];
        std::fs::create_dir(direct[0].join("direct"))?;
        let direct = [direct[0].join("direct"), direct[1].join("direct")];
        std::fs::create_dir(p.hosts[0].join(&work).join("plfs"))?;
        let (plfs_roots, _guards) = mount_plfs(p, &format!("{work}/plfs"), mnt_parent.path())?;
        let none: [Vec<OsString>; 2] = [Vec::new(), Vec::new()];
        let run_prefix = |root: &Path| -> Vec<OsString> {
            vec![
                p.mapfs.clone().into(),
                "run".into(),
                "--mount".into(),
                root.into(),
                "--".into(),
            ]
        };
        let shim = [run_prefix(&plfs_roots[0]), run_prefix(&plfs_roots[1])];
        println!(
            "### hosts: {} writers over 2 hosts, {} each, MB/s (median of {}); store: {} ({} and {})\n",
            p.writers,
            super::fmt_size(p.size),
            p.runs,
            fs_type(&p.hosts[0]),
            p.hosts[0].display(),
            p.hosts[1].display()
        );
        let mut header = String::from("| config |");
        let mut rule = String::from("|---|");
        for w in WORKLOADS {
            for bs in &p.bs {
                header.push_str(&format!(" {w} {} |", super::fmt_size(*bs)));
                rule.push_str("---:|");
            }
        }
        println!("{header}\n{rule}");
        let mut medians = std::collections::HashMap::new();
        for cfg in CONFIGS {
            let (roots, prefix) = match cfg {
                "direct" => (&direct, &none),
                "plfs" => (&plfs_roots, &none),
                _ => (&plfs_roots, &shim),
            };
            let mut line = format!("| {cfg} |");
            for w in WORKLOADS {
                for &bs in &p.bs {
                    let mut vals = Vec::new();
                    let mut err = None;
                    for _ in 0..p.runs {
                        match one(p, roots, prefix, w, bs) {
                            Ok(v) => vals.push(v),
                            Err(e) => err = Some(e),
                        }
                    }
                    vals.sort_by(f64::total_cmp);
                    let cell = match (vals.get(vals.len().saturating_sub(1) / 2), &err) {
                        (Some(m), None) => {
                            medians.insert((cfg, w, bs), *m);
                            format!("{m:.1}")
                        }
                        (_, Some(e)) => {
                            eprintln!("mapfs bench --hosts: {cfg} {w} bs {bs}: {e:#}");
                            "ERR".to_string()
                        }
                        (None, None) => "-".to_string(),
                    };
                    line.push_str(&format!(" {cell} |"));
                }
            }
            println!("{line}");
        }
        println!();
        for &bs in &p.bs {
            let get = |c, w| medians.get(&(c, w, bs)).copied();
            if let (Some(run), Some(nn), Some(n1)) = (
                get("plfs-run", "n1-strided"),
                get("direct", "nn"),
                get("direct", "n1-strided"),
            ) {
                println!(
                    "bs {}: plfs-run N-1 / direct N-N = {:.2}x; plfs-run N-1 / direct N-1 = {:.2}x",
                    super::fmt_size(bs),
                    run / nn,
                    run / n1
                );
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(p.hosts[0].join(&work));
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn params(writers: u64, size: u64) -> Params {
        Params {
            hosts: [PathBuf::new(), PathBuf::new()],
            writers,
            size,
            bs: vec![],
            runs: 1,
            mapfs: PathBuf::new(),
        }
    }

    /// A shared file of the full size in which one writer's blocks are
    /// holes (its bytes went to a file another host unlinked) fails the
    /// check; the same file with every writer's blocks passes.
    #[test]
    fn a_writer_missing_from_the_shared_file_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ckpt");
        let (bs, writers, size) = (4096u64, 2u64, 4 * 4096u64);
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(writers * size).unwrap();
        let p = params(writers, size);
        for i in 0..size / bs {
            f.write_all_at(&[7u8; 4096], (i * writers + 1) * bs)
                .unwrap();
        }
        let e = every_rank_wrote(&p, &file, bs).unwrap_err().to_string();
        assert!(e.contains("writer 0"), "{e}");
        for i in 0..size / bs {
            f.write_all_at(&[9u8; 4096], (i * writers) * bs).unwrap();
        }
        every_rank_wrote(&p, &file, bs).unwrap();
    }
}
