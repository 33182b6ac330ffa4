//! `bench fs --plot DIR`: SVG plots drawn with `plotters` (SVG backend only: text is left to
//! the viewer's fonts, so nothing here needs a system font or a C library).
//!
//! - `fs-overview.svg`: every figure of every system relative to the best kernel file system
//!   of its row (log scale; above 1 = better than every kernel file system).
//! - `fs-<row>.svg`: one bar chart per table row (workload, figure, threads): each system's
//!   median value in the row's unit.
//! - `fs-F1-<N>t-over-time.svg`, `fs-F5-over-time.svg`: throughput over time during F1 and F5
//!   (repetition 1), one line per system, from the progress samples of the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::report::fmt_fs_value;
use super::target::FsSystem;
use crate::report::{row_order, Record, Series};
use crate::{BenchError, Result};

const W: u32 = 900;
const H: u32 = 480;

/// One color per system, fixed so a system looks the same in every plot.
fn color(system: &str) -> RGBColor {
    match system {
        "fernfs-lib" => RGBColor(0x1b, 0x9e, 0x77),
        "fernfs-fuse" => RGBColor(0xd9, 0x5f, 0x02),
        "null-fuse" => RGBColor(0x88, 0x88, 0x88),
        "fernfs-fuse-uring" => RGBColor(0xf4, 0xa5, 0x82),
        "null-fuse-uring" => RGBColor(0xbb, 0xbb, 0xbb),
        "ext4" => RGBColor(0x75, 0x70, 0xb3),
        "xfs" => RGBColor(0xe7, 0x29, 0x8a),
        "btrfs" => RGBColor(0x66, 0xa6, 0x1e),
        _ => RGBColor(0x22, 0x22, 0x22),
    }
}

fn plot_err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Usage(format!("plot {what}: {e}"))
}

/// A file-name-safe slug of a row.
fn slug(r: &Record) -> String {
    let mut s = r.workload.clone();
    if let Some(m) = &r.metric {
        s.push('-');
        s.push_str(m);
    }
    if let Some(t) = r.threads {
        s.push_str(&format!("-{t}t"));
    }
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

fn title(r: &Record) -> String {
    let mut s = r.workload.clone();
    if let Some(m) = r.metric.as_deref().filter(|m| !m.is_empty()) {
        s.push_str(": ");
        s.push_str(m);
    }
    if let Some(t) = r.threads {
        s.push_str(&format!(", {t} thread{}", if t == 1 { "" } else { "s" }));
    }
    let better = if r.higher_is_better() {
        "higher is better"
    } else {
        "lower is better"
    };
    format!("{s} ({}, {better})", r.unit)
}

/// Writes every plot into `dir` (created); returns the files written.
pub fn write_plots(
    dir: &Path,
    medians: &[Record],
    series: &[Series],
    systems: &[String],
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let order = row_order(medians);
    let mut rows: BTreeMap<usize, Vec<&Record>> = BTreeMap::new();
    for r in medians {
        rows.entry(order[&r.row_key()]).or_default().push(r);
    }
    let rows: Vec<Vec<&Record>> = rows
        .into_values()
        .map(|mut rs| {
            rs.sort_by_key(|r| systems.iter().position(|s| *s == r.system));
            rs
        })
        .collect();
    if rows.is_empty() {
        return Ok(written);
    }
    let path = dir.join("fs-overview.svg");
    overview(&path, &rows, systems)?;
    written.push(path);
    for rs in &rows {
        // Two figures of one workload may share a metric (F8: bytes and × gzip): the unit
        // then tells their files apart.
        let mut path = dir.join(format!("fs-{}.svg", slug(rs[0])));
        if written.contains(&path) {
            let mut unit = rs[0].clone();
            unit.metric = Some(format!("{} {}", unit.metric.unwrap_or_default(), unit.unit));
            path = dir.join(format!("fs-{}.svg", slug(&unit)));
        }
        bars(&path, rs)?;
        written.push(path);
    }
    let mut keys: Vec<(String, Option<u32>)> = series
        .iter()
        .map(|s| (s.workload.clone(), s.threads))
        .collect();
    keys.sort();
    keys.dedup();
    for (w, threads) in keys {
        let of: Vec<&Series> = series
            .iter()
            .filter(|s| s.workload == w && s.threads == threads)
            .collect();
        let name = match threads {
            Some(t) => format!("fs-{}-{t}t-over-time.svg", w.to_lowercase()),
            None => format!("fs-{}-over-time.svg", w.to_lowercase()),
        };
        let path = dir.join(name);
        over_time(&path, &of, systems)?;
        written.push(path);
    }
    Ok(written)
}

/// One row: a bar per system with its value written above it.
fn bars(path: &Path, rs: &[&Record]) -> Result<()> {
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err("fill", e))?;
    let max = rs.iter().map(|r| r.value).fold(0.0f64, f64::max).max(1e-12);
    let n = rs.len();
    let names: Vec<String> = rs.iter().map(|r| r.system.clone()).collect();
    let fmt_x = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };
    let unit = rs[0].unit.clone();
    let fmt_y = |y: &f64| fmt_fs_value(*y, &unit);
    let mut chart = ChartBuilder::on(&root)
        .caption(title(rs[0]), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..max * 1.15)
        .map_err(|e| plot_err("chart", e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&fmt_y)
        .y_desc(rs[0].unit.as_str())
        .draw()
        .map_err(|e| plot_err("mesh", e))?;
    chart
        .draw_series(rs.iter().enumerate().map(|(i, r)| {
            let x = i as f64;
            Rectangle::new(
                [(x - 0.35, 0.0), (x + 0.35, r.value)],
                color(&r.system).filled(),
            )
        }))
        .map_err(|e| plot_err("bars", e))?;
    chart
        .draw_series(rs.iter().enumerate().map(|(i, r)| {
            let mut label = fmt_fs_value(r.value, &r.unit);
            if r.errors > 0 {
                label.push_str(&format!(" ({} wrong)", r.errors));
            }
            Text::new(
                label,
                (i as f64 - 0.3, r.value + max * 0.07),
                ("sans-serif", 14),
            )
        }))
        .map_err(|e| plot_err("labels", e))?;
    root.present().map_err(|e| plot_err("write", e))?;
    Ok(())
}

/// Every row's values divided by the best kernel file system's (inverted for lower-is-better
/// units), grouped bars per row, log scale.
fn overview(path: &Path, rows: &[Vec<&Record>], systems: &[String]) -> Result<()> {
    let mut bars: Vec<(usize, usize, f64)> = Vec::new();
    let mut labels = Vec::new();
    for (i, rs) in rows.iter().enumerate() {
        let higher = rs[0].higher_is_better();
        let best = rs
            .iter()
            .filter(|r| FsSystem::name_is_kernel(&r.system) && r.value > 0.0)
            .map(|r| r.value)
            .reduce(|a, b| if (a >= b) == higher { a } else { b });
        let mut l = rs[0].workload.clone();
        if let Some(m) = rs[0].metric.as_deref().filter(|m| !m.is_empty()) {
            let short: String = m.chars().take(30).collect();
            l.push(' ');
            l.push_str(&short);
        }
        if let Some(t) = rs[0].threads {
            l.push_str(&format!(" {t}t"));
        }
        let unit = &rs[0].unit;
        if !unit.ends_with("/s") && unit != "seconds" {
            l.push_str(&format!(" [{unit}]"));
        }
        labels.push(l);
        let Some(best) = best else { continue };
        for r in rs.iter().filter(|r| r.value > 0.0) {
            let ratio = if higher {
                r.value / best
            } else {
                best / r.value
            };
            let s = systems.iter().position(|s| *s == r.system).unwrap_or(0);
            bars.push((i, s, ratio));
        }
    }
    let lo = bars.iter().map(|b| b.2).fold(1.0f64, f64::min).max(1e-4) * 0.7;
    let hi = bars.iter().map(|b| b.2).fold(1.0f64, f64::max) * 1.4;
    let n = rows.len();
    let ns = systems.len().max(1);
    // Horizontal bars, one group per figure, first figure on top: the figure names stay
    // readable however many there are.
    let height = (60 + 14 * ns as u32 * n as u32 / 2).max(H) + 120;
    let root = SVGBackend::new(path, (W + 200, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err("fill", e))?;
    let y_of = |i: usize| (n - 1 - i) as f64;
    let fmt_y = |y: &f64| {
        let r = y.round();
        if (y - r).abs() < 1e-6 && r >= 0.0 && (r as usize) < n {
            labels[n - 1 - r as usize].clone()
        } else {
            String::new()
        }
    };
    let fmt_x = |x: &f64| {
        if *x >= 1.0 {
            format!("{x:.0}×")
        } else {
            format!("{x:.2}×")
        }
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Each system vs the best kernel file system of each figure (>1: better)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(230)
        .build_cartesian_2d((lo..hi).log_scale(), -0.5f64..(n as f64 - 0.5))
        .map_err(|e| plot_err("chart", e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&fmt_y)
        .x_label_formatter(&fmt_x)
        .x_desc("ratio to the best of ext4 / xfs / btrfs (log scale)")
        .draw()
        .map_err(|e| plot_err("mesh", e))?;
    let width = 0.8 / ns as f64;
    for (si, sys) in systems.iter().enumerate() {
        let c = color(sys);
        chart
            .draw_series(bars.iter().filter(|b| b.1 == si).map(|&(i, _, ratio)| {
                let y0 = y_of(i) + 0.4 - (si as f64 + 1.0) * width;
                // Bars grow from 1× (equal to the best kernel file system) left or right.
                Rectangle::new([(1.0, y0), (ratio, y0 + width)], c.filled())
            }))
            .map_err(|e| plot_err("bars", e))?
            .label(sys.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    chart
        .draw_series(LineSeries::new(
            [(1.0, -0.5), (1.0, n as f64 - 0.5)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| plot_err("line", e))?;
    legend_and_write(&mut chart, &root)
}

/// Draws the legend (upper right) and writes the file: the end of every chart with series.
fn legend_and_write<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_err("legend", e))?;
    root.present().map_err(|e| plot_err("write", e))
}

/// Rate between sample points at least `total / 40` seconds apart: the raw 10 ms samples are
/// too noisy to read.
fn rates(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let Some(&(end, _)) = points.last() else {
        return Vec::new();
    };
    let step = end / 40.0;
    let mut out = Vec::new();
    let mut prev = points[0];
    for &p in &points[1..] {
        let dt = p.0 - prev.0;
        if dt >= step || p == *points.last().unwrap_or(&p) {
            if dt > 0.0 {
                out.push((p.0, (p.1 - prev.1) / dt));
            }
            prev = p;
        }
    }
    out
}

/// Throughput over time, one line per system (repetition 1 of each).
fn over_time(path: &Path, series: &[&Series], systems: &[String]) -> Result<()> {
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for sys in systems {
        if let Some(s) = series
            .iter()
            .filter(|s| &s.system == sys)
            .min_by_key(|s| s.rep)
        {
            lines.push((sys.clone(), rates(&s.points)));
        }
    }
    let Some(first) = series.first() else {
        return Ok(());
    };
    let xmax = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.0))
        .fold(1e-3f64, f64::max);
    let ymax = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(1e-9f64, f64::max)
        * 1.1;
    let mut cap = format!("{} throughput over time", first.workload);
    if let Some(t) = first.threads {
        cap.push_str(&format!(", {t} thread{}", if t == 1 { "" } else { "s" }));
    }
    cap.push_str(" (the last point includes the sync)");
    let root = SVGBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err("fill", e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(cap, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(|e| plot_err("chart", e))?;
    let unit = first.unit.clone();
    let fmt_y = |y: &f64| crate::report::fmt_value(*y);
    chart
        .configure_mesh()
        .x_desc("seconds since the workload began")
        .y_desc(unit.as_str())
        .y_label_formatter(&fmt_y)
        .draw()
        .map_err(|e| plot_err("mesh", e))?;
    for (sys, pts) in &lines {
        let c = color(sys);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(|e| plot_err("line", e))?
            .label(sys.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    legend_and_write(&mut chart, &root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_window_and_end_at_the_last_point() {
        let pts: Vec<(f64, f64)> = (0..=100)
            .map(|i| (i as f64 / 10.0, i as f64 * 5.0))
            .collect();
        let r = rates(&pts);
        assert!(r.len() >= 30, "{r:?}");
        assert!(r.iter().all(|p| (p.1 - 50.0).abs() < 1e-6), "{r:?}");
        assert_eq!(r.last().unwrap().0, 10.0);
        assert!(rates(&[]).is_empty());
    }

    #[test]
    fn plots_are_written_for_rows_and_series() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Record::named("F1", "fernfs-lib", 100.0, "files/s");
        a.threads = Some(1);
        let mut b = a.clone();
        b.system = "ext4".into();
        b.value = 50.0;
        let mut c = Record::named("F6", "ext4", 0.2, "seconds");
        c.metric = Some("1000 × 4 B + fsync, cold".into());
        let mut d = c.clone();
        d.system = "fernfs-lib".into();
        d.value = 0.01;
        let s = Series {
            workload: "F1".into(),
            system: "ext4".into(),
            threads: Some(1),
            rep: 0,
            unit: "files/s".into(),
            points: vec![(0.0, 0.0), (0.5, 30.0), (1.0, 50.0)],
        };
        let mut e = Record::named("F8", "ext4", 1e6, "bytes");
        e.metric = Some("corpus".into());
        let mut f = e.clone();
        f.unit = "x gzip -5".into();
        f.value = 3.0;
        let systems = vec!["fernfs-lib".to_string(), "ext4".to_string()];
        let files = write_plots(dir.path(), &[a, b, c, d, e, f], &[s], &systems).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "fs-overview.svg",
                "fs-f1-1t.svg",
                "fs-f6-1000-4-b-fsync-cold.svg",
                "fs-f8-corpus.svg",
                "fs-f8-corpus-x-gzip-5.svg",
                "fs-f1-1t-over-time.svg"
            ]
        );
        for f in &files {
            let t = std::fs::read_to_string(f).unwrap();
            assert!(
                t.starts_with("<svg") && t.contains("</svg>"),
                "{}",
                f.display()
            );
        }
        let overview = std::fs::read_to_string(&files[0]).unwrap();
        assert!(overview.contains("fernfs-lib") && overview.contains("ext4"));
    }
}
