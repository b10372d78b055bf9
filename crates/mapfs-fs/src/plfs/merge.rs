//! Merging a container's droppings into the file's current map (pure).
//!
//! Every record of every dropping is applied in `seq` order to an empty map:
//! data shadows what was there, holes unmap, `SetSize` truncates or extends,
//! `GrowTo` extends only. The result's extents name logs by index into
//! [`Merged::logs`].

use std::collections::HashMap;

use mapfs::{DataMap, Growth, Placement, Segment};

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
pub(super) fn merge(droppings: &[Dropping]) -> Merged {
    let mut out = Merged::empty();
    let mut names: HashMap<&str, u32> = HashMap::new();
    // Per dropping: its log indexes translated to `out.logs` indexes.
    let mut tables: Vec<Vec<u32>> = Vec::with_capacity(droppings.len());
    for d in droppings {
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
    for (seq, i, j) in order {
        out.max_seq = out.max_seq.max(seq);
        apply(&mut out.map, &tables[i], droppings[i].records[j].op);
    }
    out
}

/// Applies one record; corrupt records (empty, overflowing, naming an unknown
/// log) are skipped.
fn apply(map: &mut DataMap, table: &[u32], op: Op) {
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
            let p = Placement::Fits(vec![Segment::Data { file, offset, len }]);
            map.commit_write(logical, len, &p);
        }
        Op::Hole { logical, len } => {
            if in_range(logical, len) {
                map.punch_hole(logical, len);
            }
        }
        Op::SetSize(s) => {
            if s <= MAX_END {
                map.truncate(s);
            }
        }
        Op::GrowTo(s) => {
            if s <= MAX_END && s > map.size() {
                map.truncate(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::Record;
    use super::*;

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
        };
        let m = merge(&[d]);
        assert_eq!(m.map.size(), 0);
        assert!(m.map.extents().is_empty());
    }
}
