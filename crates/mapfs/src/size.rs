//! Byte counts as people write and read them: the one parser of sizes
//! (`-o max-size=64K`, `-o threshold=4k`, `mapfs bench --size 1G`) and the
//! one formatter of byte counts (`mapfs stats`, `mapfs versions stats`)
//! of every mapfs command, so that they all take and print the same forms.

/// Parses a size: a whole number with an optional unit `K`, `M`, `G` or
/// `T` (powers of 1024, either case), which may be followed by `B` or `iB`
/// (`512`, `4k`, `256M`, `1GiB`, `64KB`). Surrounding spaces are ignored.
pub fn parse(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("bad size {s:?}: expected a number with an optional unit K, M, G or T");
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let unit = unit.to_ascii_lowercase();
    let unit = (unit.strip_suffix("ib"))
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(bad()),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Formats a byte count for people: `512 B`, `4.0 KiB`, `1.5 GiB`.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_every_written_form() {
        for (s, n) in [
            ("512", 512),
            ("0", 0),
            (" 4k ", 4096),
            ("4K", 4096),
            ("64KB", 64 << 10),
            ("256M", 256 << 20),
            ("1GiB", 1 << 30),
            ("2t", 2 << 40),
            ("3b", 3),
        ] {
            assert_eq!(parse(s), Ok(n), "{s:?}");
        }
        for s in ["", "k", "4x", "4 k", "-1", "1.5M", "4kk", "99999999999T"] {
            assert!(parse(s).is_err(), "{s:?} was accepted");
        }
    }

    #[test]
    fn byte_counts_format_with_binary_units() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(4096), "4.0 KiB");
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(u64::MAX), "16777216.0 TiB");
    }
}
