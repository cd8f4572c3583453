//! The figures of one `priority` mode: HP request latency (from the `infer` guest's lines), the
//! GPU time of the HP and LP VMs and the utilization over the daemon's accounting windows
//! while the HP VM ran (from vgpud's report), and the LP VMs' throughput (from their guests).
//! The native modes have no daemon: their GPU shares are the work done (kernels × the
//! calibrated kernel length) over the HP process's run.

use crate::exp_priority::{ModeRun, Plan};
use crate::fairness_native::done_at;
use crate::report::Percentiles;

/// The targets of the issue: HP latency within 1.10x of `alone`, LP GPU time >= 90% of the
/// time the HP VM leaves idle, utilization >= 95%.
pub const LATENCY_RATIO_MAX: f64 = 1.10;
pub const LP_FILL_MIN: f64 = 0.90;
pub const UTILIZATION_MIN: f64 = 0.95;

/// One mode's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// Requests the HP guest completed (all, as its end line says).
    pub requests: u64,
    /// Latency (µs) of the requests whose lines were printed, the first one (cold: module load)
    /// left out.
    pub lat_us: Percentiles,
    /// The samples behind `lat_us`.
    pub samples: Vec<u64>,
    /// Accounting windows counted (wholly inside the HP VM's run, after the ramp, before any
    /// VM left).
    pub windows: usize,
    /// Fractions of the counted windows' time: HP GPU time, LP GPU time, both.
    pub hp_share: f64,
    pub lp_share: f64,
    pub utilization: f64,
    /// LP GPU time / the time HP left idle (`None` when HP left none).
    pub lp_fill: Option<f64>,
    /// LP kernels per second (sum over LP guests of their completed / their guest time).
    pub lp_kernels_per_s: f64,
    /// HP guest ended with every result checked and exit 0, every LP guest likewise.
    pub ok: bool,
    /// Where the GPU shares come from: `vgpud` (its accounting windows) or `work` (kernels ×
    /// calibrated length, the native modes).
    pub share_source: &'static str,
    /// Mismatch lines of the HP guest.
    pub mismatches: u64,
}

/// GPU shares over the HP run from the work done: HP kernels × `plan.hp_kernel_us`, and each
/// LP process's kernels completed within the HP run (its progress lines, interpolated at the HP
/// run's end) × `plan.lp_kernel_us`. Returns (hp, lp).
fn work_shares(r: &ModeRun, plan: &Plan, kernels: u32) -> (f64, f64) {
    let Some(end) = r.hp.end.filter(|e| e.t_ms > 0) else {
        return (0.0, 0.0);
    };
    let t = end.t_ms as f64;
    let hp_us = end.requests as f64 * f64::from(kernels) * plan.hp_kernel_us;
    let lp_done: f64 = r.lp.iter().map(|(g, _)| done_at(g, t)).sum();
    let total_us = t * 1e3;
    (hp_us / total_us, lp_done * plan.lp_kernel_us / total_us)
}

pub fn compute(r: &ModeRun, ramp_ns: u64, plan: &Plan, kernels: u32) -> Figures {
    let Some(rep) = &r.report else {
        let (hp_share, lp_share) = work_shares(r, plan, kernels);
        let mut f = figures(r, hp_share, lp_share, 0);
        f.share_source = "work";
        return f;
    };
    let hp = rep.vms.iter().find(|v| v.name == "hp");
    let hp_id = hp.map(|v| v.id);
    // The interval in which the HP VM ran and no VM had left yet.
    let start = hp.map_or(u64::MAX, |v| v.registered_ns.saturating_add(ramp_ns));
    let end = rep
        .vms
        .iter()
        .map(|v| v.gone_ns.unwrap_or(rep.now_ns))
        .min()
        .unwrap_or(0);
    let w = rep.window_ns.max(1);
    // Windows with no use are not in the report: count every window slot in the interval.
    let first = start.div_ceil(w);
    let last = end / w; // exclusive
    let slots = last.saturating_sub(first) as usize;
    let (mut hp_ns, mut lp_ns) = (0u64, 0u64);
    for win in &rep.windows {
        let k = win.start_ns / w;
        if k >= first && k < last {
            for &(id, ns) in &win.per_vm {
                if Some(id) == hp_id {
                    hp_ns += ns;
                } else {
                    lp_ns += ns;
                }
            }
        }
    }
    let total = (slots as u64 * w) as f64;
    let frac = |ns: u64| if total > 0.0 { ns as f64 / total } else { 0.0 };
    figures(r, frac(hp_ns), frac(lp_ns), slots)
}

/// The figures from the GPU shares and the guests' lines.
fn figures(r: &ModeRun, hp_share: f64, lp_share: f64, slots: usize) -> Figures {
    let idle_left = 1.0 - hp_share;
    let samples: Vec<u64> = r.hp.lat_us.iter().skip(1).copied().collect();
    let lat: Vec<f64> = samples.iter().map(|&v| v as f64).collect();
    let lp_kernels_per_s =
        r.lp.iter()
            .filter_map(|(g, _)| g.end)
            .filter(|e| e.t_ms > 0)
            .map(|e| e.done as f64 * 1e3 / e.t_ms as f64)
            .fold(0.0, |a, b| a + b);
    let ok = r.hp.ok()
        && r.hp_exit == Some(0)
        && r.lp.iter().all(|(g, code)| g.ok() && *code == Some(0));
    Figures {
        requests: r.hp.end.map_or(0, |e| e.requests),
        lat_us: Percentiles::of(&lat),
        samples,
        windows: slots,
        hp_share,
        lp_share,
        utilization: hp_share + lp_share,
        lp_fill: (r.mode.with_lp && idle_left > 1e-9).then(|| lp_share / idle_left),
        lp_kernels_per_s,
        ok,
        mismatches: r.hp.mismatches,
        share_source: "vgpud",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exp_priority::MODES;
    use crate::priority_guest;
    use vgpud::report::{Report, VmReport, WindowReport};

    const MS: u64 = 1_000_000;

    #[test]
    fn shares_count_only_windows_inside_the_hp_run() {
        let vm = |id, name: &str, reg, gone| VmReport {
            id,
            name: name.into(),
            registered_ns: reg,
            gone_ns: gone,
            ..VmReport::default()
        };
        let report = Report {
            window_ns: 100 * MS,
            now_ns: 1000 * MS,
            vms: vec![
                vm(0, "lp0", 0, Some(900 * MS)),
                vm(1, "hp", 150 * MS, Some(650 * MS)),
            ],
            windows: (0..9)
                .map(|k| WindowReport {
                    start_ns: k * 100 * MS,
                    per_vm: vec![(0, 60 * MS), (1, 30 * MS)],
                })
                .collect(),
            ..Report::default()
        };
        let hp = priority_guest::parse(
            "INFER start\nINFER req=1 lat_us=9000\nINFER req=2 lat_us=100\nINFER req=3 lat_us=300\n\
             INFER end t_ms=500 requests=3 ok=1\n",
        );
        let lp =
            crate::fairness_guest::parse("FAIRNESS start\nFAIRNESS end t_ms=2000 done=50 ok=1\n");
        let r = ModeRun {
            mode: MODES[3],
            sched: MODES[3].sched.to_string(),
            report: Some(report),
            hp,
            hp_exit: Some(0),
            lp: vec![(lp, Some(0))],
            commands: vec![],
        };
        // HP from 150 ms + 50 ms ramp = 200 ms to 650 ms: windows 2, 3, 4, 5 (500..600 ends
        // at 600 <= 650).
        let f = compute(&r, 50 * MS, &plan(), 2);
        assert_eq!(f.windows, 4);
        assert!((f.hp_share - 0.3).abs() < 1e-9 && (f.lp_share - 0.6).abs() < 1e-9);
        assert!((f.utilization - 0.9).abs() < 1e-9);
        assert!((f.lp_fill.unwrap() - 0.6 / 0.7).abs() < 1e-9);
        assert!((f.lp_kernels_per_s - 25.0).abs() < 1e-9);
        assert_eq!(f.samples, [100, 300], "the cold first request is left out");
        assert_eq!(f.requests, 3);
        assert!(f.ok);
        let mut bad = r;
        bad.lp[0].1 = None;
        assert!(
            !compute(&bad, 0, &plan(), 2).ok,
            "an LP VM that did not exit 0"
        );
    }

    fn plan() -> Plan {
        Plan {
            lp: 1,
            duration: 1.0,
            hp_kernel_us: 500.0,
            lp_kernel_us: 2000.0,
            vram_per_vm: 64 << 20,
        }
    }

    #[test]
    fn native_shares_come_from_the_work_done_during_the_hp_run() {
        // HP: 400 requests x 2 kernels x 500 µs in 1000 ms = 40%. LP: 100 kernels at 800 ms,
        // 150 at 1200 ms -> 125 at 1000 ms, x 2000 µs = 25%; a second LP that ended at 500 ms
        // with 40 kernels counts them all: 8%.
        let hp = priority_guest::parse(
            "INFER start\nINFER req=1 lat_us=9000\nINFER req=2 lat_us=700\n\
             INFER end t_ms=1000 requests=400 ok=1\n",
        );
        let lp1 = crate::fairness_guest::parse(
            "FAIRNESS start\nFAIRNESS t_ms=800 done=100\nFAIRNESS t_ms=1200 done=150\n\
             FAIRNESS end t_ms=2000 done=300 ok=1\n",
        );
        let lp2 =
            crate::fairness_guest::parse("FAIRNESS start\nFAIRNESS end t_ms=500 done=40 ok=1\n");
        let r = ModeRun {
            mode: crate::priority_native::NATIVE_MODES[1],
            sched: String::new(),
            report: None,
            hp,
            hp_exit: Some(0),
            lp: vec![(lp1, Some(0)), (lp2, Some(0))],
            commands: vec![],
        };
        let f = compute(&r, 0, &plan(), 2);
        assert_eq!(f.share_source, "work");
        assert!((f.hp_share - 0.4).abs() < 1e-9, "{}", f.hp_share);
        assert!((f.lp_share - 0.33).abs() < 1e-9, "{}", f.lp_share);
        assert!((f.utilization - 0.73).abs() < 1e-9);
        assert!((f.lp_fill.unwrap() - 0.33 / 0.6).abs() < 1e-9);
        assert!(f.ok);
        assert_eq!(f.windows, 0);
    }
}
