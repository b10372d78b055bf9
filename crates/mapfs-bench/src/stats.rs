//! Summary statistics over repeated runs: median, spread and ratio to native.

use serde::Serialize;

/// The summary of one table cell: the median of its runs and their spread.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Median over the runs (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
    /// Number of runs summarised.
    pub runs: usize,
}

impl Summary {
    /// Summarises `values`; `None` when there are none (every run failed).
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            runs: n,
        })
    }

    /// Half the min..max range relative to the median, in percent; the
    /// compact "±" figure printed in tables.
    pub fn spread_pct(&self) -> f64 {
        if self.median == 0.0 {
            return 0.0;
        }
        (self.max - self.min) / 2.0 / self.median * 100.0
    }
}

/// `value / native`, or `None` when native is missing or zero (a ratio
/// against nothing would print as infinity and mislead).
pub fn ratio(value: f64, native: Option<f64>) -> Option<f64> {
    match native {
        Some(n) if n > 0.0 && n.is_finite() => Some(value / n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_spread() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.0, 1.0, 3.0, 3));
        let s = Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!((s.spread_pct() - 60.0).abs() < 1e-9);
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[f64::NAN]), None);
        assert_eq!(Summary::of(&[7.0]).unwrap().spread_pct(), 0.0);
    }

    #[test]
    fn ratio_to_native() {
        assert_eq!(ratio(98.0, Some(100.0)), Some(0.98));
        assert_eq!(ratio(98.0, None), None);
        assert_eq!(ratio(98.0, Some(0.0)), None);
    }
}
