//! The guest's slowdown during live snapshots and live migrations, for `vgpu-bench migrate`
//! (issue 24). Live snapshots: on one
//! running VM, after its first live snapshot (whose window the caller makes with [`window`]),
//! `count` times a baseline window (`ctl stats` twice, `baseline` apart: the
//! virtual GPU's kernel launches over the host clock) immediately followed by a live snapshot
//! (`ctl snapshot --live`, whose report counts the launches over its live window, from the
//! pre-copy's start to the VM paused, `live.guest`, and over its tail, from the resume to the
//! end of the operation: KVM's log off, the files synced, `live.guest_tail`). The rates are
//! sums over the windows: launches before / ms before against launches during / ms during:
//! `slowdown` over the live window, the paused round and the tail; `slowdown_without_tail`
//! without the tail (the figure before the tail was counted); `slowdown_rounds` over the live
//! window alone. "Lost" is the launches the guest would have made at the baseline rate minus
//! those it made (live window, pause and tail). Counting the device's launches (not the guest's 20 ms progress
//! lines) measures exactly the live window, so short snapshots are not diluted by the time
//! around them.
//!
//! A live migration is one window of the same kind ([`migration_window`]): a baseline on the
//! source right before the request, the source's live window (the pre-copy rounds,
//! `precopy.guest` of the `migrate` answer) and its downtime (`paused_ms`: from the vCPUs
//! parked to the destination's `ok`, the guest running again there) — the migration from its
//! start to the guest resumed on the destination, with no tail (the source ends). The
//! destination's first window after the switch-over (`ctl stats` on it twice, a baseline
//! apart) is counted too but kept apart ([`migration_summary`]'s `dest_first_window`): a window
//! of the bench's chosen length at near full speed would dilute the migration's own figure by
//! that length, and what it shows is different — work the destination still does after the
//! switch-over (pages or modules it still waits for), not the cost of copying.

use std::path::Path;
use std::time::Duration;

use crate::error::BenchError;
use crate::migrate_vm::Vm;

/// One baseline window and the live snapshot after it.
#[derive(Debug, Clone, Default)]
pub struct Window {
    pub before_ms: f64,
    pub before_launches: u64,
    /// The GPU time of the baseline's jobs, ms (to compare a launch's GPU time before and
    /// during: the live window runs bounds-checked twins).
    pub before_gpu_ms: f64,
    /// The engine's split of the baseline's launch time (cuda; see [`Timing`]).
    pub before_timing: Timing,
    /// The live window (rounds) and the paused round, in ms, and the launches in the former.
    pub live_ms: f64,
    pub paused_ms: f64,
    pub live_launches: u64,
    /// The tail (from the resume to the end of the operation), ms and launches.
    pub tail_ms: f64,
    pub tail_launches: u64,
    /// Where the live copy's time went, from its report (see [`parts`]).
    pub parts: serde_json::Value,
    /// The VM's first live copy (which pays for whatever is made on first use).
    pub first: bool,
    /// A live migration: the destination's first window after the switch-over, ms and
    /// launches (0 for snapshots).
    pub dest_ms: f64,
    pub dest_launches: u64,
}

/// One `ctl stats`: (host uptime ms, GPU launches, GPU time of the guest's jobs in ms, the
/// engine's split of it).
pub type Stats = (f64, u64, f64, Timing);

/// The engine's split of the launches' GPU time (`ctl stats`' `gpu.sub_launches`,
/// `kernel_ns`, `launch_call_ns`; cuda only, else zero): sub-launches, their device time from
/// the event before each `cuLaunchKernel` to the one after it (ms), and the host time of those
/// driver calls (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    pub sub_launches: u64,
    pub kernel_ms: f64,
    pub call_ms: f64,
    /// Host time from each launch's origin event to its first sub-launch (ms).
    pub gap_ms: f64,
    /// GPU time of the guest's copy jobs (`gpu.copy_gpu_ns`, ms; any engine).
    pub copy_ms: f64,
    /// The copy jobs' host time in their copy calls and their waits (cuda; ms).
    pub copy_call_ms: f64,
    pub copy_wait_ms: f64,
}

impl Timing {
    fn since(&self, earlier: &Timing) -> Timing {
        Timing {
            sub_launches: self.sub_launches.saturating_sub(earlier.sub_launches),
            kernel_ms: (self.kernel_ms - earlier.kernel_ms).max(0.0),
            call_ms: (self.call_ms - earlier.call_ms).max(0.0),
            gap_ms: (self.gap_ms - earlier.gap_ms).max(0.0),
            copy_ms: (self.copy_ms - earlier.copy_ms).max(0.0),
            copy_call_ms: (self.copy_call_ms - earlier.copy_call_ms).max(0.0),
            copy_wait_ms: (self.copy_wait_ms - earlier.copy_wait_ms).max(0.0),
        }
    }
}

/// Two `ctl stats` on `vm`, `baseline` apart: the launches over a window of the host clock.
pub fn baseline(vm: &Vm, vmm: &Path, baseline: Duration) -> Result<(Stats, Stats), BenchError> {
    let s0 = stats(vm, vmm)?;
    std::thread::sleep(baseline);
    Ok((s0, stats(vm, vmm)?))
}

/// `ctl stats`: (host uptime ms, GPU launches, GPU time in ms).
pub fn stats(vm: &Vm, vmm: &Path) -> Result<Stats, BenchError> {
    let s = vm.ctl(vmm, &["stats"])?;
    let up = s["uptime_ms"].as_f64();
    let launches = s["gpu"]["launches"].as_u64();
    let gpu_ms = s["gpu"]["gpu_ns"].as_f64().unwrap_or(0.0) / 1e6;
    let timing = Timing {
        sub_launches: s["gpu"]["sub_launches"].as_u64().unwrap_or(0),
        kernel_ms: s["gpu"]["kernel_ns"].as_f64().unwrap_or(0.0) / 1e6,
        call_ms: s["gpu"]["launch_call_ns"].as_f64().unwrap_or(0.0) / 1e6,
        gap_ms: s["gpu"]["origin_gap_ns"].as_f64().unwrap_or(0.0) / 1e6,
        copy_ms: s["gpu"]["copy_gpu_ns"].as_f64().unwrap_or(0.0) / 1e6,
        copy_call_ms: s["gpu"]["copy_call_ns"].as_f64().unwrap_or(0.0) / 1e6,
        copy_wait_ms: s["gpu"]["copy_wait_ns"].as_f64().unwrap_or(0.0) / 1e6,
    };
    match (up, launches) {
        (Some(u), Some(l)) => Ok((u, l, gpu_ms, timing)),
        _ => Err(BenchError::Invalid(format!(
            "ctl stats: no uptime_ms or gpu.launches in {s} (a vgpu-vmm older than vgpu-bench?)"
        ))),
    }
}

/// Takes `count` windows on `vm` (snapshots into `dir/<name>-<k>`, removed after each).
pub fn measure(
    vm: &mut Vm,
    vmm: &Path,
    dir: &Path,
    name: &str,
    count: usize,
    baseline: Duration,
) -> Result<Vec<Window>, BenchError> {
    let mut out = Vec::with_capacity(count);
    for k in 0..count {
        let (s0, s1) = self::baseline(vm, vmm, baseline)?;
        let snap = dir.join(format!("{name}-{k}"));
        let done = vm.ctl(vmm, &["snapshot", &snap.display().to_string(), "--live"])?;
        let _ = std::fs::remove_dir_all(&snap);
        out.push(window(s0, s1, &done)?);
    }
    Ok(out)
}

/// The window of a live snapshot's answer `done`, after a baseline between two `ctl stats`.
pub fn window(b0: Stats, b1: Stats, done: &serde_json::Value) -> Result<Window, BenchError> {
    of_report(b0, b1, done, "live")
}

/// The window of a live migration's answer `done` (its report is `precopy`), after a baseline
/// on the source, with the destination's first window after the switch-over (two `ctl stats`
/// on the destination, `d0` then `d1`). The VM's first live copy (`first`).
pub fn migration_window(
    b0: Stats,
    b1: Stats,
    done: &serde_json::Value,
    (d0, d1): (Stats, Stats),
) -> Result<Window, BenchError> {
    let mut w = of_report(b0, b1, done, "precopy")?;
    w.first = true;
    w.dest_ms = d1.0 - d0.0;
    w.dest_launches = d1.1.saturating_sub(d0.1);
    Ok(w)
}

/// A window from an answer whose pre-copy report is `done[key]`.
fn of_report(
    (t0, l0, g0, x0): Stats,
    (t1, l1, g1, x1): Stats,
    done: &serde_json::Value,
    key: &str,
) -> Result<Window, BenchError> {
    let live = &done[key];
    let guest = &live["guest"];
    let (Some(live_ms), Some(live_launches)) =
        (guest["window_ms"].as_f64(), guest["gpu_launches"].as_u64())
    else {
        return Err(BenchError::Invalid(format!(
            "live copy: no {key}.guest window in the answer (a vgpu-vmm older than vgpu-bench?)"
        )));
    };
    Ok(Window {
        before_ms: t1 - t0,
        before_launches: l1.saturating_sub(l0),
        before_gpu_ms: (g1 - g0).max(0.0),
        before_timing: x1.since(&x0),
        live_ms,
        paused_ms: done["paused_ms"].as_f64().unwrap_or(0.0),
        live_launches,
        // A VM that stayed paused, a migration (the source ends), or a vgpu-vmm older than
        // this count: no tail.
        tail_ms: live["guest_tail"]["window_ms"].as_f64().unwrap_or(0.0),
        tail_launches: live["guest_tail"]["gpu_launches"].as_u64().unwrap_or(0),
        parts: parts(live),
        first: false,
        dest_ms: 0.0,
        dest_launches: 0,
    })
}

/// What a window's live copy spent (its report `live`): the GPU's busy time over the live
/// window, round 0 (its RAM, its VRAM scan and read: on cuda the first copy of a VM also made
/// the bulk calls' slots there), the rounds after it, the write sets' bookkeeping on the GPU
/// worker and the twins' preparation before the start (`null` where the report has none).
pub fn parts(live: &serde_json::Value) -> serde_json::Value {
    let rounds = live["rounds"].as_array().cloned().unwrap_or_default();
    let r0 = rounds.first().cloned().unwrap_or_default();
    let later: f64 = rounds
        .iter()
        .skip(1)
        .filter(|r| r["paused"] != true)
        .filter_map(|r| r["ms"].as_f64())
        .sum();
    let ws = &live["write_sets"];
    serde_json::json!({
        "gpu_busy_ms": live["guest"]["gpu_busy_ms"],
        "gpu_copy_ms": live["guest"]["gpu_copy_ms"],
        "gpu_copy_call_ms": live["guest"]["gpu_copy_call_ms"],
        "gpu_copy_wait_ms": live["guest"]["gpu_copy_wait_ms"],
        "gpu_sub_launches": live["guest"]["gpu_sub_launches"],
        "gpu_kernel_ms": live["guest"]["gpu_kernel_ms"],
        "gpu_launch_call_ms": live["guest"]["gpu_launch_call_ms"],
        "gpu_origin_gap_ms": live["guest"]["gpu_origin_gap_ms"],
        "round0_ms": r0["ms"],
        "round0_ram_ms": r0["ram_ms"],
        "round0_vram_find_ms": r0["vram_find_ms"],
        "round0_vram_read_ms": r0["vram_read_ms"],
        "later_rounds_ms": later,
        "kvm_dirty_pages": live["guest"]["kvm_dirty_pages"],
        "worker_ms": ws["worker_ms"],
        "prepare_ms": ws["prepare_ms"],
        "twins_prepared": ws["twins_prepared"],
        "twin_loads_ready": ws["twin_loads_ready"],
        "twin_loads_cold": ws["twin_loads_cold"],
        "sync_ms": live["sync_ms"],
        "kvm_log_on_ms": live["kvm_log_on_ms"],
        "kvm_log_off_ms": live["kvm_log_off_ms"],
        "tail_ms": live["guest_tail"]["window_ms"],
    })
}

/// A baseline's split figure per launch (`None` without sub-launches counted).
fn before_split(w: &Window, f: impl Fn(&Timing) -> f64) -> Option<f64> {
    (w.before_timing.sub_launches > 0)
        .then(|| us_per(f(&w.before_timing), w.before_launches))
        .flatten()
}

/// A live window's split figure `key` per launch (`None` without sub-launches counted).
fn live_split(w: &Window, key: &str) -> Option<f64> {
    (w.parts["gpu_sub_launches"].as_u64().unwrap_or(0) > 0)
        .then(|| {
            w.parts[key]
                .as_f64()
                .and_then(|ms| us_per(ms, w.live_launches))
        })
        .flatten()
}

/// Microseconds per launch of `ms` (`None` without launches).
fn us_per(ms: f64, launches: u64) -> Option<f64> {
    (launches > 0).then(|| ms * 1e3 / launches as f64)
}

/// Launches per second.
fn per_s(launches: u64, ms: f64) -> Option<f64> {
    (ms > 0.0).then(|| launches as f64 * 1e3 / ms)
}

/// The sums over `ws` (see the module's comment), and the same slowdown over the VMs' first
/// windows alone and over the others (where the cost of a live copy is a first-use one, the
/// split shows it); `null` fields where nothing was measured.
pub fn summary(ws: &[Window]) -> serde_json::Value {
    let mut s = sums(ws);
    let (first, later): (Vec<Window>, Vec<Window>) = ws.iter().cloned().partition(|w| w.first);
    s["slowdown_first_windows"] = sums(&first)["slowdown"].clone();
    s["slowdown_later_windows"] = sums(&later)["slowdown"].clone();
    s
}

/// A live migration's windows (one per migration): [`summary`] (no tail: `slowdown` is the
/// rounds and the downtime, the migration from its start to the guest running on the
/// destination), and apart from it the destinations' first windows after the switch-over
/// against the sources' baselines (`dest_first_window`), per window too.
pub fn migration_summary(ws: &[Window]) -> serde_json::Value {
    let mut s = summary(ws);
    let before_ms: f64 = ws.iter().map(|w| w.before_ms).sum();
    let before = per_s(ws.iter().map(|w| w.before_launches).sum(), before_ms);
    let ms: f64 = ws.iter().map(|w| w.dest_ms).sum();
    let launches: u64 = ws.iter().map(|w| w.dest_launches).sum();
    let after = per_s(launches, ms);
    let slowdown = match (before, after) {
        (Some(b), Some(a)) if b > 0.0 => Some(1.0 - a / b),
        _ => None,
    };
    s["dest_first_window"] = serde_json::json!({
        "ms": ms,
        "launches": launches,
        "launches_per_s": after,
        "slowdown": slowdown,
    });
    if let Some(per) = s["per_window"].as_array_mut() {
        for (p, w) in per.iter_mut().zip(ws) {
            p["dest_ms"] = w.dest_ms.into();
            p["dest_launches"] = w.dest_launches.into();
        }
    }
    s
}

/// The median of the slowdowns of `groups` (each one VM's windows, a repetition), and them.
pub fn median_of(groups: &[&[Window]]) -> serde_json::Value {
    let mut v: Vec<f64> = groups
        .iter()
        .filter_map(|g| sums(g)["slowdown"].as_f64())
        .collect();
    v.sort_by(f64::total_cmp);
    let median = match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    };
    serde_json::json!({ "slowdown_median_of_reps": median, "slowdown_per_rep": v })
}

fn sums(ws: &[Window]) -> serde_json::Value {
    let sum = |f: &dyn Fn(&Window) -> f64| ws.iter().map(f).sum::<f64>();
    let (before_ms, live_ms, paused_ms, tail_ms) = (
        sum(&|w| w.before_ms),
        sum(&|w| w.live_ms),
        sum(&|w| w.paused_ms),
        sum(&|w| w.tail_ms),
    );
    let before_n: u64 = ws.iter().map(|w| w.before_launches).sum();
    let live_n: u64 = ws.iter().map(|w| w.live_launches).sum();
    let tail_n: u64 = ws.iter().map(|w| w.tail_launches).sum();
    let before = per_s(before_n, before_ms);
    let rounds = per_s(live_n, live_ms);
    let no_tail = per_s(live_n, live_ms + paused_ms);
    let whole = per_s(live_n + tail_n, live_ms + paused_ms + tail_ms);
    let slow = |d: Option<f64>| match (before, d) {
        (Some(b), Some(d)) if b > 0.0 => Some(1.0 - d / b),
        _ => None,
    };
    let lost = before.map(|b| b * (live_ms + paused_ms + tail_ms) / 1e3 - (live_n + tail_n) as f64);
    serde_json::json!({
        "windows": ws.len(),
        "baseline_ms": before_ms,
        "baseline_launches": before_n,
        "live_ms": live_ms,
        "paused_ms": paused_ms,
        "live_launches": live_n,
        "tail_ms": tail_ms,
        "tail_launches": tail_n,
        "launches_per_s_before": before,
        "launches_per_s_during_rounds": rounds,
        "launches_per_s_during_without_tail": no_tail,
        "launches_per_s_during": whole,
        "slowdown_rounds": slow(rounds),
        "slowdown_without_tail": slow(no_tail),
        "slowdown": slow(whole),
        "launches_lost": lost,
        "per_window": ws.iter().map(|w| serde_json::json!({
            "before_ms": w.before_ms, "before_launches": w.before_launches,
            "before_gpu_us_per_launch": us_per(w.before_gpu_ms, w.before_launches),
            "live_gpu_us_per_launch": w.parts["gpu_busy_ms"].as_f64()
                .and_then(|ms| us_per(ms, w.live_launches)),
            // The split (cuda): the sub-launches' device time and their calls' host time; null
            // where the engine counts none (sim, checkpointed launches, an older vgpu-vmm).
            "before_kernel_us_per_launch": before_split(w, |t| t.kernel_ms),
            "before_call_us_per_launch": before_split(w, |t| t.call_ms),
            "before_gap_us_per_launch": before_split(w, |t| t.gap_ms),
            "live_kernel_us_per_launch": live_split(w, "gpu_kernel_ms"),
            "live_call_us_per_launch": live_split(w, "gpu_launch_call_ms"),
            "live_gap_us_per_launch": live_split(w, "gpu_origin_gap_ms"),
            // The copy jobs' GPU time per launch (any engine; null from an older vgpu-vmm).
            "before_copy_us_per_launch": us_per(w.before_timing.copy_ms, w.before_launches),
            "live_copy_us_per_launch": w.parts["gpu_copy_ms"].as_f64()
                .and_then(|ms| us_per(ms, w.live_launches)),
            // Of which the copy calls' and the waits' host time (cuda; null like the split).
            "before_copy_call_us_per_launch": before_split(w, |t| t.copy_call_ms),
            "before_copy_wait_us_per_launch": before_split(w, |t| t.copy_wait_ms),
            "live_copy_call_us_per_launch": live_split(w, "gpu_copy_call_ms"),
            "live_copy_wait_us_per_launch": live_split(w, "gpu_copy_wait_ms"),
            "live_ms": w.live_ms, "paused_ms": w.paused_ms, "live_launches": w.live_launches,
            "tail_ms": w.tail_ms, "tail_launches": w.tail_launches, "parts": w.parts,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(before: (f64, u64), live: (f64, f64, u64)) -> Window {
        Window {
            before_ms: before.0,
            before_launches: before.1,
            before_gpu_ms: 0.0,
            before_timing: Timing::default(),
            live_ms: live.0,
            paused_ms: live.1,
            live_launches: live.2,
            tail_ms: 0.0,
            tail_launches: 0,
            parts: serde_json::Value::Null,
            first: false,
            dest_ms: 0.0,
            dest_launches: 0,
        }
    }

    #[test]
    fn rates_are_sums_over_the_windows() {
        // 1000 launches/s before; during: 150 launches in 200 + 50 ms of rounds and pauses.
        let s = summary(&[
            w((500.0, 500), (100.0, 20.0, 80)),
            w((500.0, 500), (100.0, 30.0, 70)),
        ]);
        assert_eq!(s["windows"], 2);
        assert_eq!(s["launches_per_s_before"].as_f64(), Some(1000.0));
        assert_eq!(s["launches_per_s_during_rounds"].as_f64(), Some(750.0));
        assert_eq!(s["launches_per_s_during"].as_f64(), Some(600.0));
        assert!((s["slowdown"].as_f64().unwrap() - 0.4).abs() < 1e-9, "{s}");
        assert!((s["slowdown_rounds"].as_f64().unwrap() - 0.25).abs() < 1e-9);
        assert!((s["launches_lost"].as_f64().unwrap() - 100.0).abs() < 1e-9);
        // A tail of 100 ms with 50 launches: 200 launches in 350 ms against 1000/s.
        let mut ws = vec![w((1000.0, 1000), (200.0, 50.0, 150))];
        ws[0].tail_ms = 100.0;
        ws[0].tail_launches = 50;
        let s = summary(&ws);
        assert!(
            (s["slowdown"].as_f64().unwrap() - (1.0 - 200.0 / 350.0)).abs() < 1e-9,
            "{s}"
        );
        assert!(
            (s["slowdown_without_tail"].as_f64().unwrap() - 0.4).abs() < 1e-9,
            "{s}"
        );
        assert!(
            (s["launches_lost"].as_f64().unwrap() - 150.0).abs() < 1e-9,
            "{s}"
        );
        // The first windows apart from the others, and the median of per-VM slowdowns.
        let mut ws = vec![
            w((500.0, 500), (100.0, 0.0, 50)),
            w((500.0, 500), (100.0, 0.0, 100)),
            w((500.0, 500), (100.0, 0.0, 90)),
            w((500.0, 500), (100.0, 0.0, 100)),
        ];
        ws[0].first = true;
        ws[2].first = true;
        let s = summary(&ws);
        assert!(
            (s["slowdown_first_windows"].as_f64().unwrap() - 0.3).abs() < 1e-9,
            "{s}"
        );
        assert!(
            (s["slowdown_later_windows"].as_f64().unwrap()).abs() < 1e-9,
            "{s}"
        );
        let m = median_of(&[&ws[..2], &ws[2..], &ws[1..2]]);
        assert_eq!(m["slowdown_per_rep"].as_array().unwrap().len(), 3, "{m}");
        assert!(
            (m["slowdown_median_of_reps"].as_f64().unwrap() - 0.05).abs() < 1e-9,
            "{m}"
        );
        // Nothing measured: no figures, not a division by zero.
        let s = summary(&[]);
        assert!(
            s["slowdown"].is_null() && s["launches_per_s_before"].is_null(),
            "{s}"
        );
    }

    #[test]
    fn a_live_migration_is_its_rounds_and_downtime_with_the_destination_apart() {
        // A `migrate --live` answer: 120 launches in a 200 ms live window, paused 50 ms.
        let done = serde_json::json!({
            "paused_ms": 50.0,
            "precopy": {"guest": {"window_ms": 200.0, "gpu_launches": 120, "gpu_busy_ms": 12.0,
                                  "gpu_sub_launches": 120, "gpu_kernel_ms": 10.8,
                                  "gpu_launch_call_ms": 2.4, "gpu_copy_ms": 1.8},
                        "rounds": [{"round": 0, "ms": 30.0}, {"round": 1, "paused": true}]},
        });
        // Baseline 1000 launches/s on the source; the destination 400 launches in 500 ms.
        let w = migration_window(
            (10.0, 100, 0.0, Timing::default()),
            (
                510.0,
                600,
                40.0,
                Timing {
                    sub_launches: 500,
                    kernel_ms: 35.0,
                    call_ms: 5.0,
                    gap_ms: 1.0,
                    copy_ms: 4.0,
                    copy_call_ms: 1.0,
                    copy_wait_ms: 2.5,
                },
            ),
            &done,
            (
                (5.0, 7, 0.0, Timing::default()),
                (505.0, 407, 0.0, Timing::default()),
            ),
        )
        .unwrap();
        assert!(w.first && w.tail_ms == 0.0 && w.tail_launches == 0, "{w:?}");
        assert_eq!((w.live_launches, w.dest_launches), (120, 400));
        let s = migration_summary(&[w]);
        // 120 launches in 250 ms against 1000/s: 52% slower; the rounds alone 40%.
        assert!((s["slowdown"].as_f64().unwrap() - 0.52).abs() < 1e-9, "{s}");
        assert!(
            (s["slowdown_rounds"].as_f64().unwrap() - 0.4).abs() < 1e-9,
            "{s}"
        );
        assert!(
            (s["launches_lost"].as_f64().unwrap() - 130.0).abs() < 1e-9,
            "{s}"
        );
        // The destination's first window is not in it: 800/s, 20% below the baseline.
        let d = &s["dest_first_window"];
        assert_eq!(d["launches"], 400, "{s}");
        assert!((d["slowdown"].as_f64().unwrap() - 0.2).abs() < 1e-9, "{s}");
        assert_eq!(s["per_window"][0]["dest_launches"], 400, "{s}");
        assert_eq!(s["per_window"][0]["parts"]["round0_ms"], 30.0, "{s}");
        // A launch's GPU time: 40 ms over 500 launches before, 12 ms over 120 during.
        assert_eq!(s["per_window"][0]["before_gpu_us_per_launch"], 80.0, "{s}");
        assert_eq!(s["per_window"][0]["live_gpu_us_per_launch"], 100.0, "{s}");
        // Of which the copy jobs: 4 ms over 500 before, 1.8 ms over 120 during.
        assert_eq!(s["per_window"][0]["before_copy_us_per_launch"], 8.0, "{s}");
        assert_eq!(s["per_window"][0]["live_copy_us_per_launch"], 15.0, "{s}");
        assert_eq!(
            s["per_window"][0]["before_copy_wait_us_per_launch"], 5.0,
            "{s}"
        );
        assert!(
            s["per_window"][0]["live_copy_call_us_per_launch"].is_null(),
            "{s}"
        );
        // No sub-launches counted (a sim engine): no split, not zeros.
        let sim = migration_window(
            (10.0, 100, 0.0, Timing::default()),
            (510.0, 600, 40.0, Timing::default()),
            &done,
            (
                (5.0, 7, 0.0, Timing::default()),
                (505.0, 407, 0.0, Timing::default()),
            ),
        )
        .unwrap();
        let sim = migration_summary(&[sim]);
        assert!(
            sim["per_window"][0]["before_copy_call_us_per_launch"].is_null(),
            "{sim}"
        );
        assert!(
            sim["per_window"][0]["before_kernel_us_per_launch"].is_null(),
            "{sim}"
        );
        // Its split: the kernels' device time and the launch calls' host time, before and during.
        let pw = &s["per_window"][0];
        assert_eq!(pw["before_kernel_us_per_launch"], 70.0, "{s}");
        assert_eq!(pw["before_call_us_per_launch"], 10.0, "{s}");
        assert_eq!(pw["before_gap_us_per_launch"], 2.0, "{s}");
        assert!(
            (pw["live_kernel_us_per_launch"].as_f64().unwrap() - 90.0).abs() < 1e-9,
            "{s}"
        );
        assert!(
            (pw["live_call_us_per_launch"].as_f64().unwrap() - 20.0).abs() < 1e-9,
            "{s}"
        );
        // An answer without the source's live window is refused, not counted as zero.
        let old = serde_json::json!({"paused_ms": 50.0, "precopy": {"rounds": []}});
        let (a, b) = (
            (0.0, 0, 0.0, Timing::default()),
            (1.0, 1, 0.0, Timing::default()),
        );
        assert!(migration_window(a, b, &old, (a, b)).is_err());
        // No window: no figures.
        assert!(migration_summary(&[])["dest_first_window"]["slowdown"].is_null());
    }
}
