//! Retention: which versions to drop, by count per path, age, and total
//! bytes kept. Pure, so the rules are tested without a store.

use std::collections::{BTreeSet, HashMap};

/// Limits on what is kept; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Versions kept per path (the newest).
    pub keep: Option<u64>,
    /// Versions older than this many days are dropped.
    pub keep_days: Option<f64>,
    /// Bytes the store may hold in all; the oldest versions go first.
    pub keep_bytes: Option<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            keep: Some(20),
            keep_days: Some(30.0),
            keep_bytes: None,
        }
    }
}

/// What retention needs to know of one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Version id.
    pub id: i64,
    /// The path whose history it is in.
    pub path: &'a [u8],
    /// The life of one file it belongs to (undo versions chain along it).
    pub lineage: i64,
    /// When it was taken (microseconds).
    pub ts: i64,
    /// True for an undo version, which needs the next newer one to be read.
    pub undo: bool,
    /// Bytes it costs the store.
    pub stored: u64,
}

/// The ids to drop from `all` under `policy` at time `now` (microseconds),
/// never one in `protect` (versions of files being written). Dropping a
/// version also drops the older undo versions of its lineage that can only
/// be read through it.
pub fn choose(all: &[Entry<'_>], policy: &Policy, now: i64, protect: &[i64]) -> Vec<i64> {
    let mut drop: BTreeSet<i64> = BTreeSet::new();
    let mut by_path: HashMap<&[u8], Vec<&Entry<'_>>> = HashMap::new();
    for e in all {
        by_path.entry(e.path).or_default().push(e);
    }
    if let Some(keep) = policy.keep {
        for v in by_path.values_mut() {
            v.sort_by_key(|e| std::cmp::Reverse(e.ts));
            drop.extend(v.iter().skip(keep as usize).map(|e| e.id));
        }
    }
    if let Some(days) = policy.keep_days {
        let limit = now - (days * 86_400e6) as i64;
        drop.extend(all.iter().filter(|e| e.ts < limit).map(|e| e.id));
    }
    close_over_dependents(all, &mut drop);
    if let Some(max) = policy.keep_bytes {
        // Linear in the versions however many go (a store over its limit
        // may drop thousands at once): the total and each lineage's order
        // are computed once, and dropping a version walks only its own
        // lineage for the undo versions read through it.
        let mut lineages: HashMap<i64, Vec<&Entry<'_>>> = HashMap::new();
        for e in all {
            lineages.entry(e.lineage).or_default().push(e);
        }
        for v in lineages.values_mut() {
            v.sort_by_key(|e| std::cmp::Reverse(e.ts));
        }
        let mut total: u64 = all
            .iter()
            .filter(|e| !drop.contains(&e.id))
            .map(|e| e.stored)
            .sum();
        let mut oldest: Vec<&Entry<'_>> = all.iter().collect();
        oldest.sort_by_key(|e| e.ts);
        for e in oldest {
            if total <= max {
                break;
            }
            if drop.contains(&e.id) || protect.contains(&e.id) {
                continue;
            }
            drop.insert(e.id);
            total = total.saturating_sub(e.stored);
            // Older undo versions of its lineage, up to a whole version
            // still kept, can only be read through it.
            let line = &lineages[&e.lineage];
            let at = line.iter().position(|x| x.id == e.id).unwrap_or(line.len());
            for older in &line[at + 1..] {
                if drop.contains(&older.id) {
                    continue;
                }
                if !older.undo {
                    break;
                }
                drop.insert(older.id);
                total = total.saturating_sub(older.stored);
            }
        }
    }
    drop.retain(|id| !protect.contains(id));
    drop.into_iter().collect()
}

/// Adds to `drop` every undo version whose chain to a readable base passes
/// through a dropped version: going from a dropped version to older ones in
/// its lineage, undo versions follow it until a whole version.
fn close_over_dependents(all: &[Entry<'_>], drop: &mut BTreeSet<i64>) {
    let mut lineages: HashMap<i64, Vec<&Entry<'_>>> = HashMap::new();
    for e in all {
        lineages.entry(e.lineage).or_default().push(e);
    }
    for v in lineages.values_mut() {
        v.sort_by_key(|e| std::cmp::Reverse(e.ts));
        let mut broken = false;
        for e in v.iter() {
            if drop.contains(&e.id) {
                broken = true;
            } else if broken && e.undo {
                drop.insert(e.id);
            } else {
                broken = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(
        id: i64,
        path: &'static str,
        lineage: i64,
        ts: i64,
        undo: bool,
        stored: u64,
    ) -> Entry<'static> {
        Entry {
            id,
            path: path.as_bytes(),
            lineage,
            ts,
            undo,
            stored,
        }
    }

    const DAY: i64 = 86_400_000_000;

    #[test]
    fn count_age_and_bytes() {
        let all = [
            e(1, "/a", 1, 1, false, 10),
            e(2, "/a", 1, 2, false, 10),
            e(3, "/a", 1, 3, false, 10),
            e(4, "/b", 2, 4, false, 10),
        ];
        let p = Policy {
            keep: Some(2),
            keep_days: None,
            keep_bytes: None,
        };
        assert_eq!(choose(&all, &p, 10, &[]), vec![1]);
        let p = Policy {
            keep: None,
            keep_days: Some(1.0),
            keep_bytes: None,
        };
        assert_eq!(choose(&all, &p, DAY + 3, &[]), vec![1, 2]);
        let p = Policy {
            keep: None,
            keep_days: None,
            keep_bytes: Some(25),
        };
        assert_eq!(choose(&all, &p, 10, &[]), vec![1, 2]);
        assert_eq!(choose(&all, &p, 10, &[1]), vec![2, 3]);
    }

    #[test]
    fn the_byte_limit_drops_the_oldest_until_under_it_at_scale() {
        // 20,000 versions of 100 bytes over 1,000 paths, every fifth whole
        // and the others undo versions read through the next newer one.
        let paths: Vec<String> = (0..1000).map(|i| format!("/f{i}")).collect();
        let all: Vec<Entry<'_>> = (0..20_000)
            .map(|i| Entry {
                id: i,
                path: paths[(i % 1000) as usize].as_bytes(),
                lineage: i % 1000,
                ts: i,
                undo: (i / 1000) % 5 != 4,
                stored: 100,
            })
            .collect();
        let p = Policy {
            keep: None,
            keep_days: None,
            keep_bytes: Some(1_000_000),
        };
        let t = std::time::Instant::now();
        let drop = choose(&all, &p, 0, &[]);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        // The oldest half goes, exactly: what stays fits the limit, and
        // every undo version left reads through newer ones that stay.
        let kept: u64 = 100 * (20_000 - drop.len() as u64);
        assert!(kept <= 1_000_000, "kept {kept}");
        assert_eq!(drop, (0..10_000).collect::<Vec<i64>>());
    }

    #[test]
    fn dropping_a_base_drops_the_undo_versions_read_through_it() {
        // Oldest first: undo 1 reads through 2 (undo) and 3 (whole).
        let all = [
            e(1, "/a", 1, 1, true, 1),
            e(2, "/a", 1, 2, true, 1),
            e(3, "/a", 1, 3, false, 100),
            e(4, "/a", 1, 4, true, 1),
        ];
        let p = Policy {
            keep: None,
            keep_days: None,
            keep_bytes: Some(50),
        };
        // Dropping 1 and 2 saves too little; 3 must go, and nothing older
        // than it is readable any more; 4 reads through the current file.
        assert_eq!(choose(&all, &p, 10, &[]), vec![1, 2, 3]);
    }
}
