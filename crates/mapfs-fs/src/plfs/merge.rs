//! Merging a container's droppings into the file's current map (pure).
//!
//! Every record of every dropping is applied in `seq` order to an empty map:
//! data shadows what was there, holes unmap, `SetSize` truncates or extends,
//! `GrowTo` extends only. The result's extents name logs by index into
//! [`Merged::logs`].

use std::collections::HashMap;

use mapfs::{DataMap, Extent, Extents, Growth};
use tracing::warn;

use super::format::{Dropping, Op};

/// Largest logical end a record may have (`off_t` is signed); records past
/// it are corrupt and skipped.
const MAX_END: u64 = i64::MAX as u64;

/// A file's merged index.
#[derive(Debug, Clone)]
pub(super) struct Merged {
    /// The file's map; `Extent::file` indexes `logs`. Growth is `ReadOnly`.
    pub map: DataMap,
    /// Log names, as extents index them.
    pub logs: Vec<String>,
    /// Highest sequence number seen (new records must be above it).
    pub max_seq: u64,
}

impl Merged {
    /// The merge of no droppings: an empty file.
    pub fn empty() -> Self {
        Merged {
            map: DataMap::new(Vec::new(), 0, Growth::ReadOnly).expect("empty map is valid"),
            logs: Vec::new(),
            max_seq: 0,
        }
    }

    /// The names of the logs some extent still refers to.
    pub fn referenced_logs(&self) -> Vec<&str> {
        let mut used = vec![false; self.logs.len()];
        for e in self.map.extents() {
            used[e.file as usize] = true;
        }
        self.logs
            .iter()
            .zip(used)
            .filter(|(_, u)| *u)
            .map(|(n, _)| n.as_str())
            .collect()
    }
}

/// Merges droppings, given in a stable order (by name) that breaks ties
/// between equal sequence numbers.
pub(super) fn merge<D: std::borrow::Borrow<Dropping>>(droppings: &[D]) -> Merged {
    let droppings: Vec<&Dropping> = droppings.iter().map(|d| d.borrow()).collect();
    let mut out = Merged::empty();
    let mut names: HashMap<&str, u32> = HashMap::new();
    // Per dropping: its log indexes translated to `out.logs` indexes.
    let mut tables: Vec<Vec<u32>> = Vec::with_capacity(droppings.len());
    for d in &droppings {
        let t = d
            .logs
            .iter()
            .map(|n| {
                *names.entry(n.as_str()).or_insert_with(|| {
                    out.logs.push(n.clone());
                    (out.logs.len() - 1) as u32
                })
            })
            .collect();
        tables.push(t);
    }
    let mut order: Vec<(u64, usize, usize)> = droppings
        .iter()
        .enumerate()
        .flat_map(|(i, d)| {
            d.records
                .iter()
                .enumerate()
                .map(move |(j, r)| (r.seq, i, j))
        })
        .collect();
    order.sort_unstable();
    let mut acc = Intervals::default();
    for (seq, i, j) in order {
        out.max_seq = out.max_seq.max(seq);
        acc.apply(&tables[i], droppings[i].records[j].op);
    }
    out.map = DataMap::new(acc.map.to_vec(), acc.size, Growth::ReadOnly).unwrap_or_else(|e| {
        // Unreachable: the intervals are sorted, disjoint, non-empty and
        // within the size by construction.
        warn!("plfs: merged index rejected ({e}); the file reads as empty");
        Merged::empty().map
    });
    out
}

/// The map being merged: the file's extents (a B-tree, so a record costs
/// O(log n) wherever it lands: N-1 checkpoints merge hundreds of thousands
/// of interleaved extents) and its size.
#[derive(Debug, Default)]
struct Intervals {
    map: Extents,
    size: u64,
}

impl Intervals {
    /// Applies one record; corrupt records (empty, overflowing, naming an
    /// unknown log) are skipped.
    fn apply(&mut self, table: &[u32], op: Op) {
        let in_range = |logical: u64, len: u64| {
            len > 0 && logical.checked_add(len).is_some_and(|end| end <= MAX_END)
        };
        match op {
            Op::Data {
                logical,
                len,
                log,
                offset,
            } => {
                let Some(&file) = table.get(log as usize) else {
                    return;
                };
                if !in_range(logical, len) || offset.checked_add(len).is_none() {
                    return;
                }
                self.map.insert(Extent {
                    logical,
                    file,
                    offset,
                    len,
                });
                self.size = self.size.max(logical + len);
            }
            Op::Hole { logical, len } => {
                if in_range(logical, len) {
                    self.map.remove_range(logical, logical + len);
                }
            }
            Op::SetSize(s) => {
                if s <= MAX_END {
                    if s < self.size {
                        self.map.remove_range(s, u64::MAX);
                    }
                    self.size = s;
                }
            }
            Op::GrowTo(s) => {
                if s <= MAX_END && s > self.size {
                    self.size = s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::Record;
    use super::*;
    use mapfs::{Placement, Segment};

    /// The straightforward merge on a `DataMap` (quadratic on interleaved
    /// extents), with logs numbered by first use: the reference the B-tree
    /// merge must agree with, as (log name, offset, len) segments.
    fn reference(droppings: &[Dropping]) -> Vec<(String, u64, u64)> {
        let mut names: Vec<String> = Vec::new();
        let mut order = Vec::new();
        for (i, d) in droppings.iter().enumerate() {
            for (j, r) in d.records.iter().enumerate() {
                order.push((r.seq, i, j));
            }
        }
        order.sort_unstable();
        let mut map = DataMap::new(Vec::new(), 0, Growth::ReadOnly).unwrap();
        for (_, i, j) in order {
            match droppings[i].records[j].op {
                Op::Data {
                    logical,
                    len,
                    log,
                    offset,
                } => {
                    let name = droppings[i].logs[log as usize].clone();
                    let file = match names.iter().position(|n| *n == name) {
                        Some(f) => f,
                        None => {
                            names.push(name);
                            names.len() - 1
                        }
                    } as u32;
                    let p = Placement::Fits(vec![Segment::Data { file, offset, len }]);
                    map.commit_write(logical, len, &p);
                }
                Op::Hole { logical, len } => {
                    map.punch_hole(logical, len);
                }
                Op::SetSize(s) => map.truncate(s),
                Op::GrowTo(s) => {
                    if s > map.size() {
                        map.truncate(s)
                    }
                }
            }
        }
        segments(&map, &|f| names[f as usize].clone())
    }

    fn segments(map: &DataMap, name: &dyn Fn(u32) -> String) -> Vec<(String, u64, u64)> {
        map.locate(0, map.size())
            .into_iter()
            .map(|s| match s {
                Segment::Data { file, offset, len } => (name(file), offset, len),
                Segment::Hole { len } => (String::new(), 0, len),
            })
            .collect()
    }

    #[test]
    fn btree_merge_agrees_with_the_reference() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..300 {
            let mut ds = Vec::new();
            for d in 0..1 + rnd(4) {
                let mut records = Vec::new();
                for _ in 0..rnd(30) {
                    let logical = rnd(2000);
                    let len = 1 + rnd(300);
                    let op = match rnd(10) {
                        0 => Op::Hole { logical, len },
                        1 => Op::SetSize(rnd(2500)),
                        2 => Op::GrowTo(rnd(2500)),
                        _ => Op::Data {
                            logical,
                            len,
                            log: 0,
                            offset: rnd(10_000),
                        },
                    };
                    records.push(Record { seq: rnd(50), op });
                }
                ds.push(Dropping {
                    logs: vec![format!("data.{d}")],
                    records,
                    open: false,
                });
            }
            let m = merge(&ds);
            assert_eq!(
                segments(&m.map, &|f| m.logs[f as usize].clone()),
                reference(&ds)
            );
        }
    }

    #[test]
    fn interleaved_writers_merge_fast() {
        // 4 writers x 50_000 strided 1 KiB blocks: quadratic would take
        // minutes, the B-tree well under a second.
        let ds: Vec<Dropping> = (0..4u64)
            .map(|r| Dropping {
                logs: vec![format!("data.{r}")],
                records: (0..50_000u64)
                    .map(|i| Record {
                        seq: r,
                        op: Op::Data {
                            logical: (i * 4 + r) * 1024,
                            len: 1024,
                            log: 0,
                            offset: i * 1024,
                        },
                    })
                    .collect(),
                open: false,
            })
            .collect();
        let m = merge(&ds);
        assert_eq!(m.map.size(), 200_000 * 1024);
        assert_eq!(m.map.extents().len(), 200_000);
    }

    fn data(seq: u64, logical: u64, len: u64, log: u32, offset: u64) -> Record {
        Record {
            seq,
            op: Op::Data {
                logical,
                len,
                log,
                offset,
            },
        }
    }

    #[test]
    fn later_seq_wins_across_droppings() {
        let a = Dropping {
            logs: vec!["data.a".into()],
            records: vec![data(1, 0, 10, 0, 0), data(4, 20, 5, 0, 10)],
            open: false,
        };
        let b = Dropping {
            logs: vec!["data.b".into()],
            records: vec![
                data(2, 5, 10, 0, 0),
                Record {
                    seq: 3,
                    op: Op::SetSize(22),
                },
            ],
            open: false,
        };
        let m = merge(&[a, b]);
        assert_eq!(m.max_seq, 4);
        assert_eq!(m.map.size(), 25);
        let ex: Vec<_> = m
            .map
            .extents()
            .iter()
            .map(|e| (e.logical, m.logs[e.file as usize].as_str(), e.offset, e.len))
            .collect();
        assert_eq!(
            ex,
            vec![
                (0, "data.a", 0, 5),
                (5, "data.b", 0, 10),
                (20, "data.a", 10, 5)
            ]
        );
        assert_eq!(m.referenced_logs(), vec!["data.a", "data.b"]);
    }

    #[test]
    fn corrupt_records_are_skipped() {
        let d = Dropping {
            logs: vec![],
            records: vec![
                data(1, 0, 10, 3, 0),
                data(2, u64::MAX - 1, 10, 0, 0),
                Record {
                    seq: 3,
                    op: Op::GrowTo(u64::MAX),
                },
            ],
            open: false,
        };
        let m = merge(&[d]);
        assert_eq!(m.map.size(), 0);
        assert!(m.map.extents().is_empty());
    }
}
