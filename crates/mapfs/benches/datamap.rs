//! Per-operation cost of the map on a large (10,000-extent) map: what every
//! non-whole-file read and write pays before any I/O.
//!
//! Run: `cargo bench -p mapfs --bench datamap`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use mapfs::{DataMap, Extent, Growth, Placement};

const EXTENTS: u64 = 10_000;
const BLOCK: u64 = 4096;

/// The N-1 strided shape PLFS produces: every other 4 KiB block logically,
/// contiguous in the log.
fn strided(growth: Growth) -> DataMap {
    let extents = (0..EXTENTS)
        .map(|i| Extent {
            logical: i * 2 * BLOCK,
            file: (i % 4) as u32,
            offset: (i / 4) * BLOCK,
            len: BLOCK,
        })
        .collect();
    DataMap::new(extents, EXTENTS * 2 * BLOCK, growth).unwrap()
}

/// Cheap deterministic offsets spread over the map (no RNG in the loop).
struct Offsets(u64);

impl Offsets {
    fn next_block(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % EXTENTS
    }
}

fn bench(c: &mut Criterion) {
    let log = Growth::AppendLog { file: 9, end: 0 };
    let in_place = Growth::InPlace { limit: None };
    let mut g = c.benchmark_group("datamap_10k_extents");

    let whole = DataMap::whole_file();
    g.bench_function("locate_4k_whole_file", |b| {
        let mut o = Offsets(1);
        b.iter(|| black_box(whole.locate(o.next_block() * 2 * BLOCK, BLOCK)))
    });

    let map = strided(log);
    g.bench_function("locate_4k", |b| {
        let mut o = Offsets(1);
        b.iter(|| black_box(map.locate(o.next_block() * 2 * BLOCK, BLOCK)))
    });
    g.bench_function("locate_1m_spanning_128_extents", |b| {
        let mut o = Offsets(2);
        b.iter(|| black_box(map.locate((o.next_block() % (EXTENTS - 128)) * 2 * BLOCK, 1 << 20)))
    });
    g.bench_function("place_write_4k_append_log", |b| {
        let mut o = Offsets(3);
        b.iter(|| black_box(map.place_write(o.next_block() * 2 * BLOCK, BLOCK)))
    });
    let mut shadowed = strided(log);
    g.bench_function("place_and_commit_4k_append_log_shadowing", |b| {
        let mut o = Offsets(4);
        b.iter(|| {
            // Shadows one whole extent: the extent count stays 10k.
            let off = o.next_block() * 2 * BLOCK;
            let p = shadowed.place_write(off, BLOCK);
            shadowed.commit_write(off, BLOCK, &p);
        })
    });

    let map = strided(in_place);
    g.bench_function("place_write_4k_in_place_overwrite", |b| {
        let mut o = Offsets(5);
        b.iter(|| {
            let p = map.place_write(o.next_block() * 2 * BLOCK + 100, 2000);
            assert!(matches!(p, Placement::Fits(_)));
            black_box(p)
        })
    });
    let mut overwritten = strided(in_place);
    g.bench_function("place_and_commit_4k_in_place_overwrite", |b| {
        let mut o = Offsets(6);
        b.iter(|| {
            let off = o.next_block() * 2 * BLOCK;
            let p = overwritten.place_write(off, BLOCK);
            overwritten.commit_write(off, BLOCK, &p);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
