//! Calibration of `fairness`: how many `lcg_spin` iterations make a kernel of a given length.
//! The kernel is timed on this host through a `pgpu` engine called directly — the sim engine
//! (one worker, as a VM's virtual GPU has by default) or, with `--backend cuda`, the GPU — at a
//! few sizes, and a line `t = fixed + per_iter ×
//! iters` is fitted by least squares. Each requested length is then timed at the line's answer
//! and corrected in proportion (one noisy size cannot skew every kernel through the line).

use std::time::Instant;

use pgpu::sim::{SimConfig, SimEngine};
use pgpu::{Engine, MapTarget, Mapping, Outcome, PageSize, Perm, PreemptHandle, SpaceId, VaWindow};

use crate::backend::Backend;
use crate::error::BenchError;
use crate::runner;

/// The VA window calibration runs in: the virtual GPU's own (a large reservation the CUDA
/// driver honours; small ones it may move).
const WINDOW: VaWindow = VaWindow {
    base: 0x10_0000_0000,
    size: 4 << 30,
};

/// `inst` (one output buffer, `lcg_spin`) placed in a fresh space with 2 MiB pages, which every
/// engine supports.
fn place(e: &dyn Engine, inst: &suite::Instance) -> Result<runner::Placed, BenchError> {
    let space: SpaceId = e.create_space(WINDOW)?;
    let (mut va, mut pa) = (WINDOW.base, 0u64);
    let mut addrs = Vec::new();
    for b in &inst.buffers {
        let len = (b.init.len().max(1) as u64).next_multiple_of(2 << 20);
        e.map(
            space,
            &Mapping {
                va,
                len,
                target: MapTarget::Vram { pa },
                perm: Perm::ReadWrite,
                page_size: PageSize::Size2M,
            },
        )?;
        e.copy_to_space(space, va, &b.init)?;
        addrs.push(va);
        va += len;
        pa += len;
    }
    let module = e
        .load_module(inst.ptx, &pgpu::LoadLimits::default())
        .map(|m| m.id)?;
    Ok(runner::Placed {
        space,
        module,
        addrs,
    })
}

/// One timed size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub iters: u32,
    /// Fastest of the timed runs, microseconds (the least disturbed by other work on the host).
    pub us: f64,
}

/// The fitted model.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub threads: u32,
    pub blocks: u32,
    pub workers: usize,
    pub points: Vec<Point>,
    /// Cost of a launch independent of `iters`, microseconds (clamped at 0).
    pub fixed_us: f64,
    pub us_per_iter: f64,
    /// Per requested length: (µs, iterations chosen, µs timed at the line's answer).
    pub chosen: Vec<(f64, u32, f64)>,
}

impl Calibration {
    /// Fits `points` (at least two distinct sizes).
    pub fn fit(
        threads: u32,
        blocks: u32,
        workers: usize,
        points: Vec<Point>,
    ) -> Result<Self, BenchError> {
        let n = points.len() as f64;
        let mx = points.iter().map(|p| f64::from(p.iters)).sum::<f64>() / n;
        let my = points.iter().map(|p| p.us).sum::<f64>() / n;
        let sxx: f64 = points
            .iter()
            .map(|p| (f64::from(p.iters) - mx).powi(2))
            .sum();
        let sxy: f64 = points
            .iter()
            .map(|p| (f64::from(p.iters) - mx) * (p.us - my))
            .sum();
        if points.len() < 2 || sxx <= 0.0 || sxy <= 0.0 {
            return Err(BenchError::Invalid(format!(
                "calibration: cannot fit µs per iteration to {points:?}"
            )));
        }
        let us_per_iter = sxy / sxx;
        Ok(Calibration {
            threads,
            blocks,
            workers,
            fixed_us: (my - us_per_iter * mx).max(0.0),
            us_per_iter,
            points,
            chosen: Vec::new(),
        })
    }

    /// Iterations for a kernel of `us` microseconds (at least 1): the checked choice for a
    /// requested length, else the line's answer.
    pub fn iters_for(&self, us: f64) -> u32 {
        if let Some(c) = self.chosen.iter().find(|c| c.0 == us) {
            return c.1;
        }
        self.line_iters(us)
    }

    /// The line's answer for `us` microseconds (at least 1).
    pub fn line_iters(&self, us: f64) -> u32 {
        let i = ((us - self.fixed_us) / self.us_per_iter).round();
        if i.is_finite() {
            i.clamp(1.0, f64::from(u32::MAX)) as u32
        } else {
            1
        }
    }

    /// The model's kernel length at `iters`, microseconds.
    pub fn us_at(&self, iters: u32) -> f64 {
        self.fixed_us + self.us_per_iter * f64::from(iters)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "engine": "sim (in vgpu-bench, no VM)",
            "threads": self.threads,
            "blocks": self.blocks,
            "workers": self.workers,
            "points": self.points.iter().map(|p| serde_json::json!({"iters": p.iters, "us": p.us})).collect::<Vec<_>>(),
            "fixed_us": self.fixed_us,
            "us_per_iter": self.us_per_iter,
            "chosen": self.chosen.iter().map(|(us, iters, timed)| serde_json::json!({"us": us, "iters": iters, "line_iters_timed_us": timed})).collect::<Vec<_>>(),
        })
    }
}

/// Fastest of `reps` runs of `iters` iterations, microseconds (the first run, which loads the
/// module's decoded form into caches, is not counted); the result is checked once. The minimum,
/// not the median: on a shared host every disturbance only adds time.
fn time(
    e: &dyn Engine,
    iters: u32,
    threads: u32,
    blocks: u32,
    reps: usize,
) -> Result<f64, BenchError> {
    let inst = suite::lcg::instance(iters, blocks, threads, 0x5eed);
    let p = place(e, &inst)?;
    let job = runner::job(&p, &inst, 0)?;
    let h = PreemptHandle::new();
    let mut us = Vec::with_capacity(reps);
    for r in 0..=reps {
        let t = Instant::now();
        match e.execute(&job, &h)? {
            Outcome::Completed { .. } => {}
            other => {
                return Err(BenchError::Invalid(format!(
                    "calibration: lcg_spin did not complete: {other:?}"
                )));
            }
        }
        if r > 0 {
            us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    runner::check(e, &p, &inst)?;
    e.destroy_space(p.space)?;
    Ok(us.into_iter().fold(f64::INFINITY, f64::min))
}

/// Times the kernel and fits the model, choosing sizes that span `kernel_us` (the lengths the
/// run will ask for).
pub fn calibrate(
    backend: Backend,
    threads: u32,
    blocks: u32,
    kernel_us: &[f64],
) -> Result<Calibration, BenchError> {
    let workers = 1;
    let e: Box<dyn Engine> = match backend {
        Backend::Sim => Box::new(SimEngine::new(SimConfig {
            workers,
            ..SimConfig::default()
        })?),
        Backend::Cuda => Box::new(pgpu::cuda::CudaEngine::new(pgpu::cuda::CudaConfig {
            vram_size: 64 << 20,
            ..pgpu::cuda::CudaConfig::default()
        })?),
    };
    let e = &*e;
    // A probe for the order of magnitude, then the shortest and longest requested lengths
    // (at least a factor 4 apart, so that the slope is well defined).
    const PROBE: u32 = 2000;
    let probe = time(e, PROBE, threads, blocks, 5)?;
    let per = (probe / f64::from(PROBE)).max(1e-6);
    let lo_us = kernel_us.iter().copied().fold(f64::INFINITY, f64::min);
    let hi_us = kernel_us
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(lo_us * 4.0);
    let size = |us: f64| ((us / per).round() as u32).clamp(100, 50_000_000);
    let mut points = vec![Point {
        iters: PROBE,
        us: probe,
    }];
    for iters in [size(lo_us), size((lo_us * hi_us).sqrt()), size(hi_us)] {
        if points.iter().all(|p| p.iters != iters) {
            points.push(Point {
                iters,
                us: time(e, iters, threads, blocks, 7)?,
            });
        }
    }
    let mut c = Calibration::fit(threads, blocks, workers, points)?;
    let mut wanted: Vec<f64> = kernel_us.to_vec();
    wanted.sort_by(f64::total_cmp);
    wanted.dedup();
    for us in wanted {
        let i0 = c.line_iters(us);
        let t0 = time(e, i0, threads, blocks, 7)?;
        // The correction is bounded: a timing more than 2x off the line is disturbance more
        // likely than a line that wrong.
        let i1 = (f64::from(i0) * (us / t0.max(1e-3)).clamp(0.5, 2.0))
            .round()
            .clamp(1.0, f64::from(u32::MAX)) as u32;
        c.chosen.push((us, i1, t0));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_line_and_inverts_it() {
        let pts = vec![
            Point {
                iters: 1000,
                us: 30.0,
            },
            Point {
                iters: 2000,
                us: 50.0,
            },
            Point {
                iters: 4000,
                us: 90.0,
            },
        ];
        let c = Calibration::fit(32, 1, 1, pts).unwrap();
        assert!((c.us_per_iter - 0.02).abs() < 1e-12);
        assert!((c.fixed_us - 10.0).abs() < 1e-9);
        assert_eq!(c.iters_for(510.0), 25_000);
        let mut c2 = c.clone();
        c2.chosen.push((510.0, 24_000, 530.0));
        assert_eq!((c2.iters_for(510.0), c2.iters_for(50.0)), (24_000, 2000));
        assert_eq!(c.iters_for(1.0), 1);
        assert!((c.us_at(25_000) - 510.0).abs() < 1e-9);
        assert!(Calibration::fit(32, 1, 1, vec![Point { iters: 5, us: 1.0 }]).is_err());
    }

    #[test]
    fn calibrates_on_the_sim_engine() {
        let c = calibrate(Backend::Sim, 32, 1, &[50.0, 200.0]).unwrap();
        assert!(c.points.len() >= 2);
        assert!(c.us_per_iter > 0.0);
        // Real timings on a shared machine: only what noise cannot break is asserted (how well
        // the line fits is recorded in summary.json, not tested). Every requested length has a
        // checked choice, and a longer kernel no fewer iterations (each choice is corrected by
        // at most 2x, and the lengths are 4x apart).
        assert!(c.points.iter().all(|p| p.us > 0.0 && p.iters > 0));
        assert_eq!(c.chosen.len(), 2);
        assert!(c.iters_for(50.0) <= c.iters_for(200.0));
        assert_eq!(c.iters_for(200.0), c.chosen[1].1);
    }
}
