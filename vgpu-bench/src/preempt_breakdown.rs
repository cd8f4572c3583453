//! `vgpu-bench preempt` on cuda: where a preemption's time went (the engine's
//! `pgpu::cuda::CkBreakdown` of each preempted sample, see docs/performance.md, "Where the
//! request → context time goes"), summarised as p50/p99/max per part, and the path options
//! (`--flag-write`, `--end-wait`, `--status-read`, `--ck-path`, `--chunk`) that pick the
//! mechanisms.

use pgpu::cuda::{CkBreakdown, CkPathChoice, EndWait, FlagWrite, StatusRead};

use crate::error::BenchError;
use crate::report::Percentiles;

/// The cuda engine's request-path options of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaKnobs {
    pub flag_write: FlagWrite,
    pub end_wait: EndWait,
    pub status_read: StatusRead,
    /// How each run's path is chosen: the three above for every run (`fixed`), or the fast
    /// `armed` / `notice` / `mirror` for long or unmeasured kernels (`adaptive[:US]`).
    pub ck_path: CkPathChoice,
    /// Strip-mined chunk (instructions between two polls; 0: counted polls).
    pub chunk: u32,
    /// Whole chunks as constant-trip copies.
    pub fast_chunks: bool,
    /// What a global atomic counts as when a chunk is sized (instructions).
    pub atomic_weight: u32,
    /// `auto`'s wait budget, µs, on either engine (`pgpu::ckwait`; 0: never wait).
    pub wait_us: u64,
}

impl Default for CudaKnobs {
    fn default() -> Self {
        let c = pgpu::cuda::CudaConfig::default();
        CudaKnobs {
            flag_write: c.flag_write,
            end_wait: c.end_wait,
            status_read: c.status_read,
            ck_path: c.ck_path,
            chunk: c.ckpt_chunk_instructions,
            fast_chunks: c.ckpt_fast_chunks,
            atomic_weight: c.ckpt_atomic_weight,
            wait_us: c.preempt_wait.as_micros() as u64,
        }
    }
}

/// The cuda request-path options of `a` (a bad name is refused with the accepted ones).
pub fn knobs(a: &crate::exp_preempt::Args) -> Result<CudaKnobs, BenchError> {
    Ok(CudaKnobs {
        flag_write: a.flag_write.parse().map_err(BenchError::Invalid)?,
        end_wait: a.end_wait.parse().map_err(BenchError::Invalid)?,
        status_read: a.status_read.parse().map_err(BenchError::Invalid)?,
        ck_path: a.ck_path,
        chunk: a.chunk,
        fast_chunks: a.fast_chunks == "on",
        atomic_weight: a.atomic_weight,
        wait_us: a.wait_us,
    })
}

/// The parts, by name, as read from one breakdown (`None`: not measured for that path).
type Part = (&'static str, fn(&CkBreakdown) -> Option<f64>);

const PARTS: &[Part] = &[
    ("request_to_fire_returned_us", |b| Some(b.fire_us)),
    ("request_to_flag_in_vram_us_est", |b| {
        b.request_to_write_us()
    }),
    ("flag_write_to_kernel_end_gpu_us", |b| b.write_to_end_gpu_us),
    ("request_to_end_noticed_us", |b| Some(b.end_noticed_us)),
    ("end_noticed_to_signal_synced_us", |b| {
        Some(b.signal_sync_us)
    }),
    ("signal_synced_to_statuses_us", |b| Some(b.statuses_us)),
    ("request_to_context_ready_us", |b| Some(b.ready_us)),
];

/// p50/p99/max of every part over `set`, and the paths seen (a JSON object).
pub fn summary(set: &[&CkBreakdown]) -> serde_json::Value {
    let mut o = serde_json::Map::new();
    o.insert("samples".into(), set.len().into());
    let mut paths: Vec<&str> = set.iter().map(|b| b.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    o.insert("paths".into(), serde_json::json!(paths));
    for (name, f) in PARTS {
        let v: Vec<f64> = set.iter().filter_map(|b| f(b)).collect();
        if !v.is_empty() {
            o.insert((*name).into(), Percentiles::of(&v).json());
        }
    }
    serde_json::Value::Object(o)
}

/// One line: the p50 (p99) of each part that was measured.
pub fn line(set: &[&CkBreakdown]) -> String {
    if set.is_empty() {
        return "no breakdown (not cuda, or nothing preempted)".into();
    }
    let parts: Vec<String> = PARTS
        .iter()
        .filter_map(|(name, f)| {
            let v: Vec<f64> = set.iter().filter_map(|b| f(b)).collect();
            (!v.is_empty()).then(|| {
                let p = Percentiles::of(&v);
                let short = name.trim_end_matches("_us");
                format!("{short} {:.1} ({:.1})", p.p50, p.p99)
            })
        })
        .collect();
    // A fallback shows in the path (late driver write, lost notice, no free word...).
    let mut fallbacks: Vec<&str> = set
        .iter()
        .map(|b| b.path.as_str())
        .filter(|p| p.contains('('))
        .collect();
    fallbacks.sort_unstable();
    fallbacks.dedup();
    let fell = if fallbacks.is_empty() {
        String::new()
    } else {
        let n = set.iter().filter(|b| b.path.contains('(')).count();
        format!("; {n} with a fallback: {}", fallbacks.join(", "))
    };
    format!("breakdown p50 (p99) µs: {}{fell}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(fire: f64, noticed: f64, w2e: Option<f64>) -> CkBreakdown {
        CkBreakdown {
            path: "write-value/sync/strided".into(),
            fire_us: fire,
            end_noticed_us: noticed,
            write_to_end_gpu_us: w2e,
            kernel_gpu_us: 1000.0,
            signal_sync_us: 1.0,
            statuses_us: 5.0,
            ready_us: noticed + 7.0,
        }
    }

    #[test]
    fn a_fallback_path_is_named_in_the_line() {
        let mut late = b(3.0, 40.0, None);
        late.path = "armed (late: driver write)/notice/mirror".into();
        let v = [b(3.0, 40.0, Some(10.0)), late];
        let r: Vec<&CkBreakdown> = v.iter().collect();
        let l = line(&r);
        assert!(
            l.ends_with("; 1 with a fallback: armed (late: driver write)/notice/mirror"),
            "{l}"
        );
        assert!(!line(&r[..1]).contains("fallback"));
    }

    #[test]
    fn summary_has_every_measured_part_and_the_estimate() {
        let v = [b(3.0, 40.0, Some(10.0)), b(5.0, 60.0, None)];
        let r: Vec<&CkBreakdown> = v.iter().collect();
        let s = summary(&r);
        assert_eq!(s["samples"], 2);
        assert_eq!(s["paths"][0], "write-value/sync/strided");
        assert_eq!(s["request_to_end_noticed_us"]["max"], 60.0);
        // Only the first sample has the GPU write time: the estimate is 40 - 10.
        assert_eq!(s["request_to_flag_in_vram_us_est"]["p50"], 30.0);
        assert_eq!(s["request_to_context_ready_us"]["p99"], 67.0);
        let l = line(&r);
        assert!(l.contains("request_to_end_noticed 40.0 (60.0)"), "{l}");
        assert!(line(&[]).starts_with("no breakdown"));
    }

    #[test]
    fn default_knobs_are_the_engine_defaults() {
        let k = CudaKnobs::default();
        assert_eq!(k.flag_write, FlagWrite::WriteValue);
        assert_eq!(k.end_wait, EndWait::Sync);
        assert_eq!(k.chunk, 512);
        assert_eq!(k.ck_path, CkPathChoice::adaptive());
    }
}
