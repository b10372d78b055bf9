//! Open time and index memory of a plfs file written by W writers:
//! W processes, each a plfs instance with its own host id,
//! write `BLOCKS` strided blocks of `BS` bytes to one file (N-1), one
//! dropping each; then a reader host opens the file (cold: every dropping
//! read, merged, and compacted when there are more than `COMPACT_AFTER`),
//! opens it again at once (the container is listed again: its timestamps
//! are less than 1 s old) and 1.1 s later (the cached merge), a late writer adds one dropping, and the reader
//! opens again (incremental: only the new dropping read); a second reader
//! host opens the compacted file cold. Bytes are checked against the model.
//!
//! ```text
//! cargo run --release -p mapfs-fs --example plfs_index_scale -- BACKING W [BLOCKS] [BS]
//! ```
//!
//! Prints one line of `key=value` figures. Used by `scripts/plfs-index-scale.sh`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use mapfs::engine::DataFile;
use mapfs::{Ctx, FileSystem, OpenFlags};
use mapfs_fs::plfs::Plfs;

const ROOT: Ctx = Ctx {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn block(rank: u64, i: u64, bs: usize) -> Vec<u8> {
    let k = ((rank * 7 + i * 13) % 251) as usize;
    (k..k + bs).map(|j| (j % 251) as u8).collect()
}

/// One writer: opens (creating) `/file` as host `w<rank>` and writes its
/// strided blocks, then closes.
fn write(backing: &Path, rank: u64, w: u64, blocks: u64, bs: usize) {
    let fs = Plfs::on_host(backing, &format!("w{rank}")).expect("plfs");
    let path = Path::new("/file");
    let flags = OpenFlags(libc::O_RDWR);
    let opened = match fs.create(&ROOT, path, flags, 0o644) {
        Ok((_, o)) => o,
        Err(e) if e.errno() == libc::EEXIST => fs.open(&ROOT, path, flags).expect("open"),
        Err(e) => panic!("create: {e}"),
    };
    let h = opened.handle;
    let data = DataFile::new(opened);
    for i in 0..blocks {
        let off = (i * w + rank) * bs as u64;
        data.write(off, &block(rank, i, bs), &mut |m, o, l| {
            fs.remap(&ROOT, path, h, m, o, l)
        })
        .expect("write");
    }
    fs.flush(&ROOT, path, h, &data.map()).expect("flush");
    fs.release(&ROOT, path, h, &data.map()).expect("release");
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Opens `/file` read-only, returns (milliseconds, its bytes when `read`).
fn open_once(fs: &Plfs, read: bool) -> (f64, Option<Vec<u8>>) {
    let path = Path::new("/file");
    let t = Instant::now();
    let o = fs
        .open(&ROOT, path, OpenFlags(libc::O_RDONLY))
        .expect("open");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let h = o.handle;
    let data = DataFile::new(o);
    let bytes = read.then(|| {
        let mut buf = vec![0u8; data.size().unwrap() as usize];
        data.read(0, &mut buf).unwrap();
        buf
    });
    fs.release(&ROOT, path, h, &data.map()).unwrap();
    (ms, bytes)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--writer") {
        let n = |i: usize| args[i].parse::<u64>().unwrap();
        write(Path::new(&args[2]), n(3), n(4), n(5), n(6) as usize);
        return;
    }
    let backing = PathBuf::from(args.get(1).expect("BACKING"));
    let w: u64 = args.get(2).expect("W").parse().unwrap();
    let blocks: u64 = args.get(3).map_or(4, |s| s.parse().unwrap());
    let bs: usize = args.get(4).map_or(4096, |s| s.parse().unwrap());
    let me = std::env::current_exe().unwrap();
    // Writers, 8 at a time (the machine has 2 cores), or as many as
    // PLFS_SCALE_AT_ONCE says (1 keeps a one-machine Gluster volume
    // answering at W = 1,024).
    let at_once: usize = std::env::var("PLFS_SCALE_AT_ONCE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(8);
    let t = Instant::now();
    let ranks: Vec<u64> = (0..w).collect();
    for chunk in ranks.chunks(at_once) {
        let kids: Vec<_> = chunk
            .iter()
            .map(|r| {
                Command::new(&me)
                    .arg("--writer")
                    .arg(&backing)
                    .args([r, &w, &blocks].map(|v| v.to_string()))
                    .arg(bs.to_string())
                    .spawn()
                    .expect("spawn writer")
            })
            .collect();
        for mut k in kids {
            assert!(k.wait().unwrap().success(), "a writer failed");
        }
    }
    let write_s = t.elapsed().as_secs_f64();
    let mut model = vec![0u8; (w * blocks) as usize * bs];
    for r in 0..w {
        for i in 0..blocks {
            let at = ((i * w + r) as usize) * bs;
            model[at..at + bs].copy_from_slice(&block(r, i, bs));
        }
    }
    let droppings = std::fs::read_dir(backing.join("file"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("index."))
        .count();
    let reader = Plfs::on_host(&backing, "reader").expect("plfs");
    let rss0 = rss_kib();
    let (cold, bytes) = open_once(&reader, true);
    assert!(
        bytes.unwrap() == model,
        "cold open: bytes differ from the model"
    );
    let rss1 = rss_kib();
    let after_cold = reader.index_stats();
    // Right after a change (the cold open compacted), timestamps are not
    // trusted: the open lists the container again (reading nothing new).
    let (warm, _) = open_once(&reader, false);
    // Once they are (1 s later), the open uses the cached merge as it is.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (settled, _) = open_once(&reader, false);
    // A late writer adds one dropping (rank 0 rewrites its first block).
    write(&backing, 0, w, 1, bs);
    let before = reader.index_stats().droppings_read;
    let (incr, bytes) = open_once(&reader, true);
    assert!(bytes.unwrap() == model, "incremental open: bytes differ");
    let incr_read = reader.index_stats().droppings_read - before;
    let other = Plfs::on_host(&backing, "reader2").expect("plfs");
    let (other_cold, _) = open_once(&other, false);
    println!(
        "W={w} blocks={blocks} bs={bs} write_s={write_s:.2} droppings={droppings} \
         cold_open_ms={cold:.1} relisted_open_ms={warm:.2} cached_open_ms={settled:.2} incremental_open_ms={incr:.2} \
         incremental_droppings_read={incr_read} other_host_open_after_compaction_ms={other_cold:.2} \
         index_entries={} rss_growth_kib={}",
        after_cold.cached_entries,
        rss1.saturating_sub(rss0)
    );
}
