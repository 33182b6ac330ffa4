//! Records (the JSON format of docs/workloads.md "Reporting"), medians over repetitions and the
//! markdown table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::workloads::Workload;
use crate::Result;

/// One figure: `{"workload": "E1", "system": "fern-tree", "value": ..., "unit": "inserts/s"}`
/// plus the fields that say which figure of the workload it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Workload id ("E1" ... "E7").
    pub workload: String,
    /// System name ("fern-tree", "rocksdb", ...).
    pub system: String,
    /// The figure (the median when `reps` is set).
    pub value: f64,
    /// Unit; `.../s` is better higher, `seconds`, `us`, `x` and `MiB` better lower.
    pub unit: String,
    /// Which figure of the workload ("overall", "last 10%", "p99", ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// Data variant ("incompressible", "text").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Number of repetitions the median was taken over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reps: Option<u32>,
    /// The value of every repetition, in run order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<f64>,
    /// Rows of the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<u64>,
    /// Memory budget of every engine, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_mib: Option<u64>,
    /// Threads of the workload (file-system workloads with a thread count, e.g. F1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// Wrong answers the engine gave during this workload (summed over repetitions).
    #[serde(default)]
    pub errors: u64,
}

impl Record {
    /// A record with the four required fields.
    pub fn new(workload: Workload, system: &str, value: f64, unit: &str) -> Record {
        Record::named(workload.name(), system, value, unit)
    }

    /// A record with the four required fields, for any workload id ("F1", "F9a", ...).
    pub fn named(workload: &str, system: &str, value: f64, unit: &str) -> Record {
        Record {
            workload: workload.to_string(),
            system: system.to_string(),
            value,
            unit: unit.to_string(),
            metric: None,
            variant: None,
            reps: None,
            values: Vec::new(),
            keys: None,
            budget_mib: None,
            threads: None,
            errors: 0,
        }
    }

    /// Whether a larger value is better for this record's unit.
    pub fn higher_is_better(&self) -> bool {
        self.unit.ends_with("/s")
    }

    pub(crate) fn row_key(&self) -> RowKey {
        (
            self.workload.clone(),
            self.variant.clone().unwrap_or_default(),
            self.metric.clone().unwrap_or_default(),
            self.unit.clone(),
            self.threads,
        )
    }
}

/// Progress of one workload run over time: cumulative amount done (in the figure's unit
/// times seconds, e.g. files for files/s, MB for MB/s) at seconds since the timed region began.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Workload id.
    pub workload: String,
    /// System name.
    pub system: String,
    /// Threads, where the workload has a thread count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// Repetition.
    pub rep: u32,
    /// Unit of the rate (`files/s`, `MB/s`).
    pub unit: String,
    /// (seconds, cumulative amount), starting at (0, 0); the last point is after the sync.
    pub points: Vec<(f64, f64)>,
}

pub(crate) type RowKey = (String, String, String, String, Option<u32>);

/// The median of each (workload, variant, metric, unit, system) over repetitions, with `reps`
/// and the per-repetition `values`. Order: workload, variant, metric, then system.
pub fn medians(samples: &[Record], systems: &[String]) -> Vec<Record> {
    let order = row_order(samples);
    let mut groups: BTreeMap<(usize, usize), Vec<&Record>> = BTreeMap::new();
    for r in samples {
        let sys = systems
            .iter()
            .position(|s| *s == r.system)
            .unwrap_or(usize::MAX);
        groups
            .entry((order[&r.row_key()], sys))
            .or_default()
            .push(r);
    }
    groups
        .into_values()
        .map(|rs| {
            let values: Vec<f64> = rs.iter().map(|r| r.value).collect();
            let mut m = rs[0].clone();
            m.value = median(&values);
            m.reps = Some(values.len() as u32);
            m.errors = rs.iter().map(|r| r.errors).sum();
            m.values = values;
            m
        })
        .collect()
}

/// Row keys numbered by workload, then by first appearance (the order workloads emit their
/// figures in, e.g. "overall" before "last 10%").
pub(crate) fn row_order(records: &[Record]) -> BTreeMap<RowKey, usize> {
    let mut seen: Vec<RowKey> = Vec::new();
    for r in records {
        let k = r.row_key();
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    let mut idx: Vec<usize> = (0..seen.len()).collect();
    idx.sort_by(|&a, &b| {
        workload_key(&seen[a].0)
            .cmp(&workload_key(&seen[b].0))
            .then(a.cmp(&b))
    });
    idx.into_iter()
        .enumerate()
        .map(|(rank, i)| (seen[i].clone(), rank))
        .collect()
}

/// Sort key of a workload id in natural order: F2 before F10, F9a before F9b.
fn workload_key(id: &str) -> (String, u64, String) {
    let start = id.find(|c: char| c.is_ascii_digit()).unwrap_or(id.len());
    let end = id[start..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(id.len(), |i| start + i);
    (
        id[..start].to_string(),
        id[start..end].parse().unwrap_or(0),
        id[end..].to_string(),
    )
}

/// Median (mean of the two middle values for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A value in 3-4 significant digits with a k/M suffix for large numbers.
pub fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a >= 10e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 10e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The markdown table: one row per figure, one column per system, and the ratio of fern-tree
/// to the best peer (the best of the other systems; the arrow says which way is better).
pub fn markdown_table(records: &[Record], systems: &[String]) -> String {
    let order = row_order(records);
    let mut rows: BTreeMap<usize, (RowKey, BTreeMap<String, &Record>)> = BTreeMap::new();
    for r in records {
        rows.entry(order[&r.row_key()])
            .or_insert_with(|| (r.row_key(), BTreeMap::new()))
            .1
            .insert(r.system.clone(), r);
    }
    let mut s = String::new();
    let _ = write!(s, "| workload | figure | unit |");
    for sys in systems {
        let _ = write!(s, " {sys} |");
    }
    let _ = writeln!(s, " fern-tree / best peer |");
    let _ = write!(s, "|---|---|---|");
    for _ in systems {
        let _ = write!(s, "---:|");
    }
    let _ = writeln!(s, "---:|");
    for ((workload, variant, metric, unit, _), by_sys) in rows.values() {
        let any = by_sys.values().next().copied();
        let higher = any.map(|r| r.higher_is_better()).unwrap_or(true);
        let figure = match (variant.is_empty(), metric.is_empty()) {
            (true, _) => metric.clone(),
            (false, true) => variant.clone(),
            (false, false) => format!("{metric} ({variant})"),
        };
        let arrow = if higher { "↑" } else { "↓" };
        let _ = write!(s, "| {workload} | {figure} | {unit} {arrow} |");
        for sys in systems {
            match by_sys.get(sys) {
                Some(r) if r.errors > 0 => {
                    let _ = write!(s, " {} ({} wrong) |", fmt_value(r.value), r.errors);
                }
                Some(r) => {
                    let _ = write!(s, " {} |", fmt_value(r.value));
                }
                None => {
                    let _ = write!(s, " – |");
                }
            }
        }
        let best_peer = by_sys
            .iter()
            .filter(|(sys, _)| sys.as_str() != "fern-tree")
            .map(|(sys, r)| (sys, r.value))
            .reduce(|a, b| {
                let a_better = if higher { a.1 >= b.1 } else { a.1 <= b.1 };
                if a_better {
                    a
                } else {
                    b
                }
            });
        match (by_sys.get("fern-tree"), best_peer) {
            (Some(f), Some((peer, v))) if v != 0.0 => {
                let _ = writeln!(s, " {:.2}× ({peer}) |", f.value / v);
            }
            _ => {
                let _ = writeln!(s, " – |");
            }
        }
    }
    s
}

/// Writes `records` as a JSON list.
pub fn write_json(path: &Path, records: &[Record]) -> Result<()> {
    let text = serde_json::to_string_pretty(records)?;
    std::fs::write(path, text + "\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_natural_workload_order() {
        let ids = ["F10", "F2", "F9b", "F1", "F9a", "F12"];
        let recs: Vec<Record> = ids
            .iter()
            .map(|w| Record::named(w, "ext4", 1.0, "seconds"))
            .collect();
        let order = row_order(&recs);
        let mut sorted: Vec<(usize, &str)> = recs
            .iter()
            .map(|r| (order[&r.row_key()], r.workload.as_str()))
            .collect();
        sorted.sort();
        let got: Vec<&str> = sorted.into_iter().map(|x| x.1).collect();
        assert_eq!(got, ["F1", "F2", "F9a", "F9b", "F10", "F12"]);
    }

    fn rec(sys: &str, v: f64, unit: &str) -> Record {
        let mut r = Record::new(Workload::E1, sys, v, unit);
        r.metric = Some("overall".into());
        r
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn medians_group_per_system_and_keep_values() {
        let systems = vec!["fern-tree".to_string(), "redb".to_string()];
        let s = vec![
            rec("fern-tree", 10.0, "inserts/s"),
            rec("redb", 5.0, "inserts/s"),
            rec("fern-tree", 30.0, "inserts/s"),
            rec("redb", 7.0, "inserts/s"),
            rec("fern-tree", 20.0, "inserts/s"),
            rec("redb", 6.0, "inserts/s"),
        ];
        let m = medians(&s, &systems);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].system, "fern-tree");
        assert_eq!(m[0].value, 20.0);
        assert_eq!(m[0].reps, Some(3));
        assert_eq!(m[0].values, vec![10.0, 30.0, 20.0]);
        assert_eq!(m[1].value, 6.0);
        let table = markdown_table(&m, &systems);
        assert!(table.contains("| E1 | overall | inserts/s ↑ | 20.00 | 6.00 | 3.33× (redb) |"));
    }

    #[test]
    fn lower_is_better_picks_smallest_peer() {
        let systems: Vec<String> = ["fern-tree", "redb", "lmdb"].map(String::from).to_vec();
        let m = vec![
            rec("fern-tree", 2.0, "x"),
            rec("redb", 4.0, "x"),
            rec("lmdb", 1.0, "x"),
        ];
        let table = markdown_table(&m, &systems);
        assert!(table.contains("2.00× (lmdb)"), "{table}");
    }
}
