//! What the always-on request counters cost per FUSE request: a timer
//! started and dropped (two clock reads, two relaxed atomic adds), against
//! counting off (`MAPFS_STATS=off`), on one thread and on two threads
//! counting the same opcode at once (the shared cache line of a hot
//! opcode's total), plus the same with a `mapfs trace` subscribed that
//! filters every request out. Compare with the tens of microseconds a
//! request costs end to end (`mapfs stats` p50 of GETATTR).
//!
//! Run: `cargo bench -p mapfs-fuse --bench counters`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use mapfs_fuse::stats::{Counters, Op};

fn counters(c: &mut Criterion) {
    let on = Counters::default();
    let off = Counters::disabled();
    c.bench_function("request_counted", |b| {
        b.iter(|| drop(black_box(on.timer(Op::Getattr, 1, 1))))
    });
    c.bench_function("request_not_counted", |b| {
        b.iter(|| drop(black_box(off.timer(Op::Getattr, 1, 1))))
    });
    let shared = Arc::new(Counters::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let other = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(black_box(shared.timer(Op::Getattr, 2, 1)));
            }
        })
    };
    c.bench_function("request_counted_contended", |b| {
        b.iter(|| drop(black_box(shared.timer(Op::Getattr, 1, 1))))
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    other.join().unwrap();
    let traced = Counters::default();
    assert!(traced.tracer.subscribe(1, Some("LOOKUP"), None));
    c.bench_function("request_counted_trace_filtered_out", |b| {
        b.iter(|| drop(black_box(traced.timer(Op::Getattr, 1, 1))))
    });
}

criterion_group!(benches, counters);
criterion_main!(benches);
