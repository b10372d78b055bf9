//! Targeted engine cases the random model tests reach rarely or never:
//! error paths, remap corner cases, odd maps, and concurrent use.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread;

use mapfs::engine::{copy_range, DataFile};
use mapfs::{DataMap, Error, Extent, Growth, Opened, Result};

fn tmp() -> Arc<File> {
    Arc::new(tempfile::tempfile().expect("tempfile"))
}

fn opened(map: DataMap, files: Vec<Arc<File>>) -> Opened {
    Opened {
        map,
        files,
        handle: 7,
    }
}

fn ext(logical: u64, file: u32, offset: u64, len: u64) -> Extent {
    Extent {
        logical,
        file,
        offset,
        len,
    }
}

fn no_remap(_: &DataMap, _: u64, _: u64) -> Result<Opened> {
    panic!("remap not expected")
}

fn read_all(df: &DataFile) -> Vec<u8> {
    let mut buf = vec![0xCC; df.size().unwrap() as usize + 10];
    let n = df.read(0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn extent_past_backing_eof_reads_zeros() {
    let f = tmp();
    f.write_all_at(b"abcd", 0).unwrap();
    let map = DataMap::new(vec![ext(0, 0, 0, 10)], 10, Growth::ReadOnly).unwrap();
    let df = DataFile::new(opened(map, vec![f]));
    assert_eq!(read_all(&df), b"abcd\0\0\0\0\0\0");
}

#[test]
fn bad_file_index_is_eio() {
    let map = DataMap::new(vec![ext(0, 3, 0, 10)], 10, Growth::ReadOnly).unwrap();
    let df = DataFile::new(opened(map, vec![tmp()]));
    let mut buf = [0u8; 4];
    assert_eq!(df.read(0, &mut buf).unwrap_err().errno(), libc::EIO);
}

#[test]
fn read_only_map_asks_for_remap_once() {
    let old = tmp();
    old.write_all_at(b"hello world", 0).unwrap();
    let map = DataMap::new(vec![ext(0, 0, 0, 11)], 11, Growth::ReadOnly).unwrap();
    let df = DataFile::new(opened(map, vec![old.clone()]));
    let new = tmp();
    let mut calls = 0;
    let mut remap = |m: &DataMap, off: u64, len: u64| -> Result<Opened> {
        calls += 1;
        assert_eq!((off, len), (6, 5));
        assert_eq!(m.growth(), Growth::ReadOnly);
        let mut buf = vec![0; 11];
        old.read_exact_at(&mut buf, 0).unwrap();
        new.write_all_at(&buf, 0).unwrap();
        Ok(opened(DataMap::whole_file(), vec![new.clone()]))
    };
    assert_eq!(df.write(6, b"WORLD", &mut remap).unwrap(), 5);
    assert_eq!(calls, 1);
    // The file is now whole-file over `new`, but was not at open: size,
    // reads and truncate still go to its backing file.
    assert!(df.map().is_whole_file());
    assert!(df.whole_file_backing().is_some());
    assert_eq!(read_all(&df), b"hello WORLD");
    df.truncate(5).unwrap();
    assert_eq!(new.metadata().unwrap().len(), 5);
    assert_eq!(read_all(&df), b"hello");
    let mut buf = vec![0; 11];
    old.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"hello world", "the old backing file is untouched");
}

#[test]
fn remap_that_still_does_not_fit_is_enospc_and_errors_propagate() {
    let map = DataMap::new(vec![], 0, Growth::ReadOnly).unwrap();
    let df = DataFile::new(opened(map.clone(), vec![tmp()]));
    let mut same =
        |m: &DataMap, _: u64, _: u64| -> Result<Opened> { Ok(opened(m.clone(), vec![tmp()])) };
    assert_eq!(
        df.write(0, b"x", &mut same).unwrap_err().errno(),
        libc::ENOSPC
    );
    let mut fail =
        |_: &DataMap, _: u64, _: u64| -> Result<Opened> { Err(Error::from_errno(libc::EDQUOT)) };
    assert_eq!(
        df.write(0, b"x", &mut fail).unwrap_err().errno(),
        libc::EDQUOT
    );
    assert_eq!(df.size().unwrap(), 0);
}

#[test]
fn argument_errors() {
    for df in [
        DataFile::new(opened(DataMap::whole_file(), vec![tmp()])),
        DataFile::new(opened(
            DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap(),
            vec![tmp()],
        )),
    ] {
        assert_eq!(df.fallocate(0, 0, 0).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(
            df.seek(0, libc::SEEK_SET).unwrap_err().errno(),
            libc::EINVAL
        );
        assert_eq!(
            df.seek(0, libc::SEEK_DATA).unwrap_err().errno(),
            libc::ENXIO
        );
        assert_eq!(
            df.write(i64::MAX as u64, b"x", &mut no_remap)
                .unwrap_err()
                .errno(),
            libc::EFBIG
        );
        assert_eq!(df.write(5, b"", &mut no_remap).unwrap(), 0);
    }
    let df = DataFile::new(opened(
        DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap(),
        vec![tmp()],
    ));
    // Punching must keep the size, as the kernel insists.
    assert_eq!(
        df.fallocate(libc::FALLOC_FL_PUNCH_HOLE, 0, 10)
            .unwrap_err()
            .errno(),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        df.fallocate(libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096)
            .unwrap_err()
            .errno(),
        libc::EOPNOTSUPP
    );
}

#[test]
fn whole_file_writers_in_parallel() {
    let f = tmp();
    let df = Arc::new(DataFile::new(opened(DataMap::whole_file(), vec![f])));
    assert!(df.whole_file_backing().is_some());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let df = df.clone();
            thread::spawn(move || {
                let block = vec![t + 1; 4096];
                for i in 0..256u64 {
                    let off = (i * 4 + t as u64) * 4096;
                    df.write(off, &block, &mut no_remap).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let all = read_all(&df);
    assert_eq!(all.len(), 4 * 256 * 4096);
    for (i, chunk) in all.chunks(4096).enumerate() {
        assert!(chunk.iter().all(|&b| b == (i % 4) as u8 + 1), "block {i}");
    }
}

#[test]
fn append_log_writers_and_readers_in_parallel() {
    let map = DataMap::new(vec![], 0, Growth::AppendLog { file: 1, end: 0 }).unwrap();
    let df = Arc::new(DataFile::new(opened(map, vec![tmp(), tmp()])));
    let writers: Vec<_> = (0..4u8)
        .map(|t| {
            let df = df.clone();
            thread::spawn(move || {
                let block = vec![t + 1; 1000];
                for i in 0..100u64 {
                    // N-1 strided, the PLFS checkpoint pattern.
                    let off = (i * 4 + t as u64) * 1000;
                    df.write(off, &block, &mut no_remap).unwrap();
                }
            })
        })
        .collect();
    let reader = {
        let df = df.clone();
        thread::spawn(move || {
            for _ in 0..200 {
                // Any prefix read is either a written block or zeros.
                let mut buf = vec![0; 4000];
                let n = df.read(0, &mut buf).unwrap();
                for (i, c) in buf[..n].chunks(1000).enumerate() {
                    let want = (i % 4) as u8 + 1;
                    assert!(c.iter().all(|&b| b == want) || c.iter().all(|&b| b == 0));
                }
            }
        })
    };
    for t in writers {
        t.join().unwrap();
    }
    reader.join().unwrap();
    let all = read_all(&df);
    assert_eq!(all.len(), 400_000);
    for (i, chunk) in all.chunks(1000).enumerate() {
        assert!(chunk.iter().all(|&b| b == (i % 4) as u8 + 1), "block {i}");
    }
    // One extent per write, except that a write landing in the log right
    // after the write of the logically preceding block extends its extent
    // (threads interleave, so how often that happens varies).
    let n = df.map().extents().len();
    assert!((1..=400).contains(&n), "{n} extents for 400 writes");
}

#[test]
fn big_copy_between_whole_files() {
    let (a, b) = (tmp(), tmp());
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 241) as u8).collect();
    a.write_all_at(&data, 0).unwrap();
    let src = DataFile::new(opened(DataMap::whole_file(), vec![a]));
    let dst = DataFile::new(opened(DataMap::whole_file(), vec![b]));
    let n = copy_range(&src, 1000, &dst, 5, 10 << 20, &mut no_remap).unwrap();
    assert_eq!(n, data.len() - 1000);
    let got = read_all(&dst);
    assert_eq!(&got[..5], &[0; 5]);
    assert!(got[5..] == data[1000..]);
}

#[test]
fn copy_into_log_goes_through_the_map() {
    let a = tmp();
    let data: Vec<u8> = (0..(3u32 << 20) / 2).map(|i| (i % 239) as u8).collect();
    a.write_all_at(&data, 0).unwrap();
    let src = DataFile::new(opened(DataMap::whole_file(), vec![a]));
    let map = DataMap::new(vec![], 0, Growth::AppendLog { file: 0, end: 0 }).unwrap();
    let dst = DataFile::new(opened(map, vec![tmp()]));
    let n = copy_range(&src, 0, &dst, 100, u64::MAX, &mut no_remap).unwrap();
    assert_eq!(n, data.len());
    let got = read_all(&dst);
    assert!(got[100..] == data[..]);
    assert_eq!(dst.seek(0, libc::SEEK_DATA).unwrap(), 100);
    assert_eq!(dst.seek(0, libc::SEEK_HOLE).unwrap(), 0);
    assert_eq!(dst.seek(100, libc::SEEK_HOLE).unwrap(), got.len() as u64);
}

#[test]
fn in_place_slot_grows_then_remaps() {
    // A 4 KiB slot at 8 KiB of a shared pack file, neighbours full of 0xEE.
    let pack = tmp();
    pack.write_all_at(&vec![0xEE; 20 << 10], 0).unwrap();
    let map = DataMap::new(
        vec![ext(0, 0, 8192, 4096)],
        0,
        Growth::InPlace { limit: Some(4096) },
    )
    .unwrap();
    let df = DataFile::new(opened(map, vec![pack.clone()]));
    assert_eq!(read_all(&df), b"");
    df.write(100, b"abc", &mut no_remap).unwrap();
    assert_eq!(read_all(&df), [&[0u8; 100][..], b"abc"].concat());
    df.fallocate(0, 0, 4096).unwrap();
    assert_eq!(df.size().unwrap(), 4096);
    let mut moved = 0;
    let mut remap = |m: &DataMap, off: u64, len: u64| -> Result<Opened> {
        moved += 1;
        assert_eq!((off, len), (4000, 200));
        let f = tmp();
        let mut buf = vec![0; m.size() as usize];
        // What `pack` would do: copy the file out of its slot.
        let src = DataFile::new(opened(m.clone(), vec![pack.clone()]));
        src.read(0, &mut buf).unwrap();
        f.write_all_at(&buf, 0).unwrap();
        Ok(opened(DataMap::whole_file(), vec![f]))
    };
    df.write(4000, &[7; 200], &mut remap).unwrap();
    assert_eq!(moved, 1);
    let all = read_all(&df);
    assert_eq!(all.len(), 4200);
    assert_eq!(&all[100..103], b"abc");
    assert!(all[4000..].iter().all(|&b| b == 7));
    let mut buf = vec![0; 20 << 10];
    pack.read_exact_at(&mut buf, 0).unwrap();
    assert!(
        buf[..8192].iter().all(|&b| b == 0xEE),
        "left neighbour intact"
    );
    assert!(
        buf[12288..].iter().all(|&b| b == 0xEE),
        "right neighbour intact"
    );
}

#[test]
fn in_place_overwriters_in_parallel_with_a_grower() {
    // Two backing files, extents interleaved; overwrites take the shared
    // lock while one thread appends past the end under the exclusive one.
    let (a, b) = (tmp(), tmp());
    let extents: Vec<Extent> = (0..64)
        .map(|i| ext(i * 4096, (i % 2) as u32, (i / 2) * 4096, 4096))
        .collect();
    let map = DataMap::new(extents, 64 * 4096, Growth::InPlace { limit: None }).unwrap();
    let df = Arc::new(DataFile::new(opened(map, vec![a, b])));
    let mut threads: Vec<_> = (0..4u8)
        .map(|t| {
            let df = df.clone();
            thread::spawn(move || {
                for round in 0..20u8 {
                    for i in (t as u64..64).step_by(4) {
                        let v = vec![t * 32 + round % 32 + 1; 4096];
                        df.write(i * 4096, &v, &mut no_remap).unwrap();
                    }
                }
            })
        })
        .collect();
    {
        let df = df.clone();
        threads.push(thread::spawn(move || {
            for i in 64..128u64 {
                df.write(i * 4096, &[0x77; 4096], &mut no_remap).unwrap();
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let all = read_all(&df);
    assert_eq!(all.len(), 128 * 4096);
    for (i, c) in all.chunks(4096).enumerate() {
        let want = if i < 64 {
            (i % 4) as u8 * 32 + 20
        } else {
            0x77
        };
        assert!(c.iter().all(|&x| x == want), "block {i}");
    }
    // The appends extended the last extent (file 1) at its shift.
    assert_eq!(
        df.map().extents().last().unwrap(),
        &ext(63 * 4096, 1, 31 * 4096, 65 * 4096)
    );
}
