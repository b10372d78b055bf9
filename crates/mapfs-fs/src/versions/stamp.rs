//! Version names: `NAME@2026-11-23T18:45:10.123456Z`, the UTC time a version
//! was taken, in microseconds, readable and sortable as text.

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a number of days since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The text form of a time in microseconds since the epoch.
pub fn format(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let frac = us.rem_euclid(1_000_000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// The time in microseconds of a text made by [`format()`]; `None` for
/// anything else.
pub fn parse(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 27 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[26] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s, f) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..26)?);
    if b[13] != b':' || b[16] != b':' || b[19] != b'.' {
        return None;
    }
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 59 {
        return None;
    }
    let days = days_from_civil(y, mo as u32, d as u32);
    let us = ((days * 86_400 + h * 3600 + mi * 60 + s) * 1_000_000) + f;
    // Reject dates like 02-31 that do not round-trip.
    (format(us) == text).then_some(us)
}

/// Splits a virtual entry name `NAME@STAMP` at its last `@`.
pub fn split_name(name: &[u8]) -> Option<(&[u8], i64)> {
    let at = name.iter().rposition(|&c| c == b'@')?;
    let stamp = std::str::from_utf8(&name[at + 1..]).ok()?;
    Some((&name[..at], parse(stamp)?))
}

/// Now, in microseconds since the epoch.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for us in [0, 1, 1_795_000_000_123_456, 951_782_400_000_000, -1] {
            let t = format(us);
            assert_eq!(parse(&t), Some(us), "{t}");
        }
        assert_eq!(format(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(format(951_782_400_000_000), "2000-02-29T00:00:00.000000Z");
        assert_eq!(parse("2026-02-31T00:00:00.000000Z"), None);
        assert_eq!(parse("2026-01-01 00:00:00.000000Z"), None);
        assert_eq!(
            split_name(b"a@b@1970-01-01T00:00:00.000001Z"),
            Some((&b"a@b"[..], 1))
        );
        assert_eq!(split_name(b"plain"), None);
    }
}
