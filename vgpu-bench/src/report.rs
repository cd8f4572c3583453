//! Output of an experiment: `DIR/summary.json`, a CSV of the raw rows, percentiles.

use std::fs;
use std::path::Path;

use crate::error::BenchError;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Checks, before an experiment starts, that its results can be written to `dir`: creates it
/// (and its parents) if missing, refuses a path that is not a directory, and creates and
/// removes a probe file in it.
pub fn prepare_out(dir: &Path) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    if !fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err("not a directory".into());
    }
    let probe = dir.join(format!(".vgpu-bench-probe-{}", std::process::id()));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| format!("cannot create files there: {e}"))?;
    fs::remove_file(&probe).map_err(|e| e.to_string())
}

/// Writes `dir/summary.json` (pretty) and `dir/<csv_name>` (header + rows).
pub fn write(
    dir: &Path,
    summary: &serde_json::Value,
    csv_name: &str,
    header: &str,
    rows: &[String],
) -> Result<(), BenchError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    let json = dir.join("summary.json");
    let text = serde_json::to_string_pretty(summary)
        .map_err(|e| BenchError::Invalid(format!("summary: {e}")))?;
    fs::write(&json, text + "\n").map_err(io(&json))?;
    let csv = dir.join(csv_name);
    let mut body = String::with_capacity(rows.iter().map(|r| r.len() + 1).sum::<usize>() + 64);
    body.push_str(header);
    body.push('\n');
    for r in rows {
        body.push_str(r);
        body.push('\n');
    }
    fs::write(&csv, body).map_err(io(&csv))?;
    Ok(())
}

/// Median of the finite values (the mean of the middle two for an even count; 0 when none).
pub fn median(v: &[f64]) -> f64 {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// p50 / p99 / max (nearest rank) of `values` in the unit they are given; zeros when empty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| -> f64 {
            if v.is_empty() {
                return 0.0;
            }
            let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        Self {
            p50: rank(0.50),
            p99: rank(0.99),
            max: v.last().copied().unwrap_or(0.0),
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({ "p50": self.p50, "p99": self.p99, "max": self.max })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&v);
        assert_eq!((p.p50, p.p99, p.max), (50.0, 99.0, 100.0));
        let p = Percentiles::of(&[3.0]);
        assert_eq!((p.p50, p.p99, p.max), (3.0, 3.0, 3.0));
        assert_eq!(Percentiles::of(&[]).max, 0.0);
    }
}
