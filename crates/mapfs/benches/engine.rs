//! Per-call cost the engine adds over plain positioned I/O, on page-cached
//! tempfiles (so the syscall, not the disk, is the baseline): 4 KiB reads
//! and writes straight to a file, through a whole-file map, through an
//! in-place map, and through a 10,000-extent log-shaped map.
//!
//! Run: `cargo bench -p mapfs --bench engine`.

use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use mapfs::engine::DataFile;
use mapfs::{DataMap, Extent, Growth, Opened, Result};

const BLOCK: u64 = 4096;
/// Blocks in the working set: 16 MiB, small enough to stay cached.
const BLOCKS: u64 = 4096;

fn file_of(len: u64) -> Arc<File> {
    let f = tempfile::tempfile().unwrap();
    f.write_all_at(&vec![0x5a; len as usize], 0).unwrap();
    Arc::new(f)
}

fn data_file(map: DataMap, files: Vec<Arc<File>>) -> DataFile {
    DataFile::new(Opened {
        map,
        files,
        handle: 0,
    })
}

fn no_remap(_: &DataMap, _: u64, _: u64) -> Result<Opened> {
    unreachable!("the benchmarked writes all fit")
}

struct Offsets(u64);

impl Offsets {
    fn next(&mut self, blocks: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % blocks) * BLOCK
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_4k");
    let buf = vec![0xa5u8; BLOCK as usize];
    let mut out = vec![0u8; BLOCK as usize];

    let raw = file_of(BLOCKS * BLOCK);
    g.bench_function("pwrite_raw", |b| {
        let mut o = Offsets(1);
        b.iter(|| raw.write_all_at(&buf, o.next(BLOCKS)).unwrap())
    });
    g.bench_function("pread_raw", |b| {
        let mut o = Offsets(2);
        b.iter(|| black_box(raw.read_at(&mut out, o.next(BLOCKS)).unwrap()))
    });

    let whole = data_file(DataMap::whole_file(), vec![file_of(BLOCKS * BLOCK)]);
    g.bench_function("write_whole_file", |b| {
        let mut o = Offsets(3);
        b.iter(|| whole.write(o.next(BLOCKS), &buf, &mut no_remap).unwrap())
    });
    g.bench_function("read_whole_file", |b| {
        let mut o = Offsets(4);
        b.iter(|| black_box(whole.read(o.next(BLOCKS), &mut out).unwrap()))
    });

    let one = vec![Extent {
        logical: 0,
        file: 0,
        offset: 0,
        len: BLOCKS * BLOCK,
    }];
    let map = DataMap::new(one, BLOCKS * BLOCK, Growth::InPlace { limit: None }).unwrap();
    let in_place = data_file(map, vec![file_of(BLOCKS * BLOCK)]);
    g.bench_function("overwrite_in_place_map", |b| {
        let mut o = Offsets(5);
        b.iter(|| in_place.write(o.next(BLOCKS), &buf, &mut no_remap).unwrap())
    });
    g.bench_function("read_in_place_map", |b| {
        let mut o = Offsets(6);
        b.iter(|| black_box(in_place.read(o.next(BLOCKS), &mut out).unwrap()))
    });

    // Every other logical block, laid out round-robin over four logs: the
    // map a PLFS reader sees.
    let logs: Vec<Arc<File>> = (0..4).map(|_| file_of(BLOCKS * BLOCK / 2)).collect();
    let extents = (0..10_000u64)
        .map(|i| Extent {
            logical: i * 2 * BLOCK,
            file: (i % 4) as u32,
            offset: ((i / 4) % (BLOCKS / 8)) * BLOCK,
            len: BLOCK,
        })
        .collect();
    let map = DataMap::new(extents, 20_000 * BLOCK, Growth::ReadOnly).unwrap();
    let strided = data_file(map, logs);
    g.bench_function("read_10k_extent_map", |b| {
        let mut o = Offsets(7);
        b.iter(|| black_box(strided.read(o.next(20_000), &mut out).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
