//! Results: per-run records, per-workload tables, Markdown, JSON and SVG.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::stats::{ratio, Summary};

/// The figures of one run of one workload column on one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Workload name.
    pub workload: String,
    /// Configuration name.
    pub config: String,
    /// Column: the I/O size (`4k`) or the metadata phase (`create`).
    pub column: String,
    /// Run number, from 0.
    pub run: usize,
    /// Throughput in the table's unit (MB/s = 10^6 bytes/s, or ops/s);
    /// `None` when the run failed.
    pub value: Option<f64>,
    /// Operations per second.
    pub iops: Option<f64>,
    /// Median latency in microseconds (fio: completion latency).
    pub lat_p50_us: Option<f64>,
    /// 99th percentile latency in microseconds.
    pub lat_p99_us: Option<f64>,
    /// Bytes (data) or operations (metadata) done.
    pub amount: Option<u64>,
    /// Duration of the measured part in seconds.
    pub secs: Option<f64>,
    /// Requests the mount's daemon answered per application operation
    /// during the run (`mapfs stats` before and after; `None` where there
    /// is no mapfs daemon: native, bindfs).
    pub requests_per_op: Option<f64>,
    /// Why the run failed.
    pub error: Option<String>,
}

/// One table cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Cell {
    /// At least one run succeeded.
    Ok {
        /// Throughput over the successful runs.
        summary: Summary,
        /// Median throughput relative to native's median.
        ratio: Option<f64>,
        /// Median over runs of the median latency (µs).
        lat_p50_us: Option<f64>,
        /// Median over runs of the p99 latency (µs).
        lat_p99_us: Option<f64>,
        /// Median over runs of the daemon's requests per application
        /// operation.
        requests_per_op: Option<f64>,
        /// Runs that failed besides.
        failed: usize,
    },
    /// Every run failed.
    Failed {
        /// The first run's error.
        error: String,
    },
    /// Not run.
    Missing,
}

/// One table row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Configuration name.
    pub config: String,
    /// Why the configuration could not be set up, if it could not.
    pub error: Option<String>,
    /// One cell per column (empty when `error` is set).
    pub cells: Vec<Cell>,
}

/// The results of one workload: rows = configurations, columns = I/O sizes
/// or phases.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    /// Workload name.
    pub workload: String,
    /// What the workload does.
    pub about: String,
    /// `MB/s` or `ops/s`.
    pub unit: String,
    /// Column labels.
    pub columns: Vec<String>,
    /// Rows in configuration order.
    pub rows: Vec<Row>,
}

fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().collect();
    Summary::of(&v).map(|s| s.median)
}

/// Builds the table of `workload` from its records. `configs` lists every
/// row in order with its set-up error, if any; ratios are to the row named
/// `native`.
pub fn build_table(
    workload: &str,
    about: &str,
    unit: &str,
    columns: &[String],
    configs: &[(String, Option<String>)],
    records: &[Record],
) -> Table {
    let cell = |config: &str, column: &str| -> Cell {
        let rs: Vec<&Record> = records
            .iter()
            .filter(|r| r.workload == workload && r.config == config && r.column == column)
            .collect();
        if rs.is_empty() {
            return Cell::Missing;
        }
        let ok: Vec<f64> = rs.iter().filter_map(|r| r.value).collect();
        match Summary::of(&ok) {
            None => Cell::Failed {
                error: rs
                    .iter()
                    .find_map(|r| r.error.clone())
                    .unwrap_or_else(|| "no result".into()),
            },
            Some(summary) => Cell::Ok {
                summary,
                ratio: None,
                lat_p50_us: median_of(rs.iter().map(|r| r.lat_p50_us)),
                lat_p99_us: median_of(rs.iter().map(|r| r.lat_p99_us)),
                requests_per_op: median_of(rs.iter().map(|r| r.requests_per_op)),
                failed: rs.len() - ok.len(),
            },
        }
    };
    let mut rows: Vec<Row> = configs
        .iter()
        .map(|(name, err)| Row {
            config: name.clone(),
            error: err.clone(),
            cells: if err.is_some() {
                vec![]
            } else {
                columns.iter().map(|c| cell(name, c)).collect()
            },
        })
        .collect();
    let native: Vec<Option<f64>> = columns
        .iter()
        .enumerate()
        .map(|(i, _)| {
            rows.iter()
                .find(|r| r.config == "native")
                .and_then(|r| match r.cells.get(i) {
                    Some(Cell::Ok { summary, .. }) => Some(summary.median),
                    _ => None,
                })
        })
        .collect();
    for row in &mut rows {
        for (i, c) in row.cells.iter_mut().enumerate() {
            if let Cell::Ok {
                summary, ratio: r, ..
            } = c
            {
                *r = ratio(summary.median, native[i]);
            }
        }
    }
    Table {
        workload: workload.into(),
        about: about.into(),
        unit: unit.into(),
        columns: columns.to_vec(),
        rows,
    }
}

/// A throughput figure with as many digits as are meaningful.
pub fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Text made safe for a Markdown table cell, shortened to `max` characters.
fn md_text(s: &str, max: usize) -> String {
    let s = s.replace('|', "/").replace('\n', " ");
    if s.chars().count() > max {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    } else {
        s
    }
}

fn throughput_cell(c: &Cell, is_native: bool) -> String {
    match c {
        Cell::Missing => "–".into(),
        Cell::Failed { error } => format!("failed: {}", md_text(error, 60)),
        Cell::Ok {
            summary,
            ratio,
            failed,
            ..
        } => {
            let mut s = fmt_num(summary.median);
            if let (Some(r), false) = (ratio, is_native) {
                let _ = write!(s, " ({r:.2}x)");
            }
            if summary.runs > 1 {
                let _ = write!(s, " ±{:.0}%", summary.spread_pct());
            }
            if *failed > 0 {
                let _ = write!(s, " ({failed} failed)");
            }
            s
        }
    }
}

fn render(t: &Table, title: &str, cell: impl Fn(&Row, &Cell) -> String) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### {title}\n");
    let _ = writeln!(s, "| config | {} |", t.columns.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(t.columns.len()));
    for row in &t.rows {
        let cells: Vec<String> = match &row.error {
            Some(e) => {
                let mut v = vec![md_text(e, 100)];
                v.extend(std::iter::repeat_n(
                    String::new(),
                    t.columns.len().saturating_sub(1),
                ));
                v
            }
            None => row.cells.iter().map(|c| cell(row, c)).collect(),
        };
        let _ = writeln!(s, "| {} | {} |", row.config, cells.join(" | "));
    }
    s
}

/// The throughput table in Markdown: a cell is the median, its ratio to
/// native, and half the min..max spread relative to the median.
pub fn render_markdown(t: &Table) -> String {
    render(
        t,
        &format!("{} — {} ({})", t.workload, t.unit, t.about),
        |row, c| throughput_cell(c, row.config == "native"),
    )
}

/// The latency table in Markdown: median / p99 in microseconds.
pub fn render_latency_markdown(t: &Table) -> String {
    render(
        t,
        &format!("{} — latency median / p99 (µs)", t.workload),
        |_, c| match c {
            Cell::Ok {
                lat_p50_us: Some(a),
                lat_p99_us: Some(b),
                ..
            } => format!("{} / {}", fmt_num(*a), fmt_num(*b)),
            Cell::Ok { .. } => "?".into(),
            Cell::Missing => "–".into(),
            Cell::Failed { .. } => "failed".into(),
        },
    )
}

/// The daemon's requests per application operation, in Markdown (`–`
/// where the configuration has no mapfs daemon): how many crossings into
/// the daemon one read, write, create or process costs.
pub fn render_requests_markdown(t: &Table) -> String {
    render(
        t,
        &format!("{} — daemon requests per application operation", t.workload),
        |_, c| match c {
            Cell::Ok {
                requests_per_op: Some(r),
                ..
            } => format!("{r:.2}"),
            Cell::Ok { .. } | Cell::Missing => "–".into(),
            Cell::Failed { .. } => "failed".into(),
        },
    )
}

/// The x axis of a grouped bar chart: `n` groups of width 1 with a tick
/// (and label) at the centre of each.
struct Groups(usize);

impl plotters::coord::ranged1d::Ranged for Groups {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        limit.0 + ((limit.1 - limit.0) as f64 * v / self.0.max(1) as f64).round() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.0 as f64
    }
}

/// Writes a grouped bar chart of `t` to `path` (SVG): one group per column,
/// one bar per configuration (median), with a min..max whisker.
pub fn write_svg(t: &Table, path: &Path) -> Result<()> {
    use plotters::prelude::*;

    let colors = [
        RGBColor(0x4c, 0x72, 0xb0),
        RGBColor(0xdd, 0x84, 0x52),
        RGBColor(0x55, 0xa8, 0x68),
        RGBColor(0xc4, 0x4e, 0x52),
        RGBColor(0x81, 0x72, 0xb3),
        RGBColor(0x93, 0x78, 0x60),
    ];
    let rows: Vec<&Row> = t.rows.iter().filter(|r| r.error.is_none()).collect();
    let ymax = rows
        .iter()
        .flat_map(|r| r.cells.iter())
        .filter_map(|c| match c {
            Cell::Ok { summary, .. } => Some(summary.max),
            _ => None,
        })
        .fold(0.0f64, f64::max);
    // Headroom for the legend, which sits above the tallest bars.
    let ymax = if ymax > 0.0 { ymax * 1.4 } else { 1.0 };
    let ncol = t.columns.len();
    let columns = t.columns.clone();

    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (200 + 160 * ncol as u32, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&t.workload, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(Groups(ncol), 0f64..ymax)?;
        let label = |x: &f64| {
            let i = (x - 0.5).round();
            if i >= 0.0 && (i as usize) < columns.len() {
                columns[i as usize].clone()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&label)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .y_desc(t.unit.as_str())
            .x_desc(if t.unit == "MB/s" {
                "I/O size"
            } else {
                "phase"
            })
            .draw()?;
        let n = rows.len().max(1) as f64;
        let group = 0.8;
        let w = group / n;
        for (k, row) in rows.iter().enumerate() {
            let color = colors[k % colors.len()];
            let bars: Vec<(f64, Summary)> = row
                .cells
                .iter()
                .enumerate()
                .filter_map(|(i, c)| match c {
                    Cell::Ok { summary, .. } => Some((i as f64 + 0.1 + w * k as f64, *summary)),
                    _ => None,
                })
                .collect();
            chart
                .draw_series(bars.iter().map(|(x0, s)| {
                    Rectangle::new(
                        [(*x0 + w * 0.05, 0.0), (*x0 + w * 0.95, s.median)],
                        color.filled(),
                    )
                }))?
                .label(row.config.as_str())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
            chart.draw_series(bars.iter().filter(|(_, s)| s.runs > 1).map(|(x0, s)| {
                let xm = *x0 + w / 2.0;
                PathElement::new(vec![(xm, s.min), (xm, s.max)], BLACK.stroke_width(1))
            }))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("drawing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(config: &str, column: &str, run: usize, value: Option<f64>) -> Record {
        Record {
            // A daemon answers fuse's runs: 2 requests per operation.
            requests_per_op: (config == "fuse" && value.is_some()).then_some(2.0),
            workload: "w".into(),
            config: config.into(),
            column: column.into(),
            run,
            value,
            iops: None,
            lat_p50_us: value.map(|v| v / 10.0),
            lat_p99_us: value.map(|v| v / 5.0),
            amount: None,
            secs: None,
            error: value.is_none().then(|| "boom | bang".to_string()),
        }
    }

    fn table() -> Table {
        let records = vec![
            rec("native", "4k", 0, Some(1000.0)),
            rec("native", "4k", 1, Some(1200.0)),
            rec("native", "4k", 2, Some(1100.0)),
            rec("native", "1m", 0, Some(2000.0)),
            rec("fuse", "4k", 0, Some(550.0)),
            rec("fuse", "4k", 1, None),
            rec("fuse", "1m", 0, None),
            rec("other-workload-ignored", "4k", 0, Some(1.0)),
        ];
        let configs = vec![
            ("native".to_string(), None),
            ("fuse".to_string(), None),
            (
                "bindfs".to_string(),
                Some("skipped: bindfs is not installed".to_string()),
            ),
        ];
        build_table(
            "w",
            "about",
            "MB/s",
            &["4k".into(), "1m".into()],
            &configs,
            &records,
        )
    }

    #[test]
    fn table_cells_and_ratios() {
        let t = table();
        match &t.rows[1].cells[0] {
            Cell::Ok {
                summary,
                ratio,
                failed,
                ..
            } => {
                assert_eq!(summary.median, 550.0);
                assert_eq!(*ratio, Some(0.5));
                assert_eq!(*failed, 1);
            }
            c => panic!("{c:?}"),
        }
        assert_eq!(
            t.rows[1].cells[1],
            Cell::Failed {
                error: "boom | bang".into()
            }
        );
        let json = serde_json::to_value(&t.rows[1].cells[1]).unwrap();
        assert_eq!(json["status"], "failed");
        assert!(t.rows[2].cells.is_empty());
    }

    #[test]
    fn markdown_rendering() {
        let md = render_markdown(&table());
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines[0], "### w — MB/s (about)");
        assert_eq!(lines[2], "| config | 4k | 1m |");
        assert_eq!(lines[3], "|---|---:|---:|");
        assert_eq!(lines[4], "| native | 1100 ±9% | 2000 |");
        assert_eq!(
            lines[5],
            "| fuse | 550 (0.50x) (1 failed) | failed: boom / bang |"
        );
        assert_eq!(lines[6], "| bindfs | skipped: bindfs is not installed |  |");
        let lat = render_latency_markdown(&table());
        assert!(lat.contains("| native | 110 / 220 | 200 / 400 |"), "{lat}");
        let req = render_requests_markdown(&table());
        assert!(req.contains("| native | – | – |"), "{req}");
        assert!(req.contains("| fuse | 2.00 | failed |"), "{req}");
    }

    #[test]
    fn number_format() {
        assert_eq!(fmt_num(1234.4), "1234");
        assert_eq!(fmt_num(12.34), "12.3");
        assert_eq!(fmt_num(1.234), "1.23");
    }

    #[test]
    fn svg_chart_is_written() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("w.svg");
        write_svg(&table(), &p).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("native") && svg.contains("4k"));
    }
}
