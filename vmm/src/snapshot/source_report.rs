//! What the source of a live snapshot or a migration measures about itself (issue 24,
//! docs/snapshot.md "What the source measures"): the parts of the downtime ([`SrcDowntime`],
//! `src_*` beside the destination's `dest_*`), and what the guest did while the pre-copy ran
//! ([`GuestWindow`]: its GPU's launches, exits, busy time, from the device's counters), so that
//! the guest's slowdown can be told from counters taken by the host clock over exactly the live
//! window.

use std::time::Instant;

use serde::Serialize;

/// The source's parts of the time the VM is stopped (milliseconds). `src_pause_vcpus_ms` is
/// before the `paused_ms` of the answers (which start once the vCPUs are parked); the rest add
/// up to `paused_ms`, give or take the bookkeeping between them.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct SrcDowntime {
    /// Parking the vCPUs (kicking them out of the guest).
    pub src_pause_vcpus_ms: f64,
    /// Pausing the GPU (a running kernel preempted, its context kept).
    pub src_pause_gpu_ms: f64,
    /// The last dirty harvest: KVM's log and the RAM the GPU wrote (live only).
    pub src_harvest_ms: f64,
    /// Reading and sending the last round's RAM (stop-and-copy: all of it).
    pub src_ram_ms: f64,
    /// Capturing the vCPUs', the VM's and the devices' state.
    pub src_state_ms: f64,
    /// The GPU image: registers and channels, and its VRAM (live: the pages written since the
    /// last round, harvested, read and sent; stop-and-copy: every non-zero page).
    pub src_gpu_image_ms: f64,
    /// From the GPU image sent to the end: a migration's last frames flushed and the wait for
    /// the destination's `ok` (the destination's switch-over, `dest_switch_ms`); a live
    /// snapshot: the logs stopped and the VM resumed (its files are synced after that, the
    /// report's `sync_ms`).
    pub src_end_ms: f64,
}

/// A stopwatch for the parts: `lap` returns the milliseconds since the previous lap.
#[derive(Debug)]
pub struct Laps(Instant);

impl Laps {
    pub fn start() -> Self {
        Laps(Instant::now())
    }

    /// Milliseconds since the start or the previous lap.
    pub fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let ms = now.duration_since(self.0).as_secs_f64() * 1e3;
        self.0 = now;
        ms
    }
}

/// The guest's activity over the live window (from the pre-copy's start to the VM paused for
/// the last round), from the virtual GPU's and the vCPUs' counters.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct GuestWindow {
    /// Host milliseconds of the window.
    pub window_ms: f64,
    /// Kernel launches the GPU took from the guest in the window, and per second; copies.
    pub gpu_launches: u64,
    pub gpu_launches_per_s: f64,
    pub gpu_copies: u64,
    /// GPU time of the guest's jobs in the window, its copies included (ms).
    pub gpu_busy_ms: f64,
    /// The part of `gpu_busy_ms` the copy jobs took (ms).
    pub gpu_copy_ms: f64,
    /// The engine's split of it (cuda; `vgpu::Activity`): sub-launches, their device time
    /// (start to end event, ms) and their driver calls' host time (ms). GPU time that grows
    /// with `gpu_launch_call_ms` is host time in the driver; with `gpu_kernel_ms -
    /// gpu_launch_call_ms`, the kernels themselves ran longer; with neither, the copy jobs.
    pub gpu_sub_launches: u64,
    pub gpu_kernel_ms: f64,
    pub gpu_launch_call_ms: f64,
    /// Host time from each launch's origin event to its first sub-launch (ms).
    pub gpu_origin_gap_ms: f64,
    /// The copy jobs' host time in their copy calls and in their waits for the copies (ms;
    /// cuda): which of the two `gpu_copy_ms` grows in.
    pub gpu_copy_call_ms: f64,
    pub gpu_copy_wait_ms: f64,
    /// Register and aperture accesses that trapped (MMIO exits reaching the GPU).
    pub gpu_mmio_traps: u64,
    /// Port and MMIO exits of the vCPUs (all devices).
    pub vcpu_exits: u64,
    /// Pages KVM's dirty log reported over the rounds: each was one write-protection fault of
    /// a vCPU (in the kernel; not an exit to the VMM).
    pub kvm_dirty_pages: u64,
}

/// Counters at one instant, for a [`GuestWindow`].
#[derive(Debug, Clone, Copy)]
pub struct GuestMark {
    at: Instant,
    launches: u64,
    copies: u64,
    gpu_ns: u64,
    copy_gpu_ns: u64,
    traps: u64,
    exits: u64,
    timing: (u64, u64, u64, u64),
    copy_timing: (u64, u64),
}

impl GuestMark {
    /// Now, from the GPU's counters (none: zero) and the vCPUs' exit counts.
    pub fn now(gpu: Option<&vgpu::Vgpu>, vcpus: &[crate::vcpu::ExitCounts]) -> Self {
        let a = gpu.map(|g| g.activity()).unwrap_or_default();
        GuestMark {
            at: Instant::now(),
            launches: a.launches,
            copies: a.copies,
            gpu_ns: a.gpu_ns,
            copy_gpu_ns: a.copy_gpu_ns,
            traps: a.mmio_traps,
            timing: (
                a.sub_launches,
                a.kernel_ns,
                a.launch_call_ns,
                a.origin_gap_ns,
            ),
            copy_timing: (a.copy_call_ns, a.copy_wait_ns),
            exits: vcpus
                .iter()
                .map(|e| e.io_in + e.io_out + e.mmio_read + e.mmio_write)
                .sum(),
        }
    }

    /// The window from `self` to `end`.
    pub fn window(&self, end: &GuestMark, kvm_dirty_pages: u64) -> GuestWindow {
        let ms = end.at.duration_since(self.at).as_secs_f64() * 1e3;
        let launches = end.launches.saturating_sub(self.launches);
        GuestWindow {
            window_ms: ms,
            gpu_launches: launches,
            gpu_launches_per_s: if ms > 0.0 {
                launches as f64 * 1e3 / ms
            } else {
                0.0
            },
            gpu_copies: end.copies.saturating_sub(self.copies),
            gpu_busy_ms: end.gpu_ns.saturating_sub(self.gpu_ns) as f64 / 1e6,
            gpu_copy_ms: end.copy_gpu_ns.saturating_sub(self.copy_gpu_ns) as f64 / 1e6,
            gpu_sub_launches: end.timing.0.saturating_sub(self.timing.0),
            gpu_kernel_ms: end.timing.1.saturating_sub(self.timing.1) as f64 / 1e6,
            gpu_launch_call_ms: end.timing.2.saturating_sub(self.timing.2) as f64 / 1e6,
            gpu_origin_gap_ms: end.timing.3.saturating_sub(self.timing.3) as f64 / 1e6,
            gpu_copy_call_ms: end.copy_timing.0.saturating_sub(self.copy_timing.0) as f64 / 1e6,
            gpu_copy_wait_ms: end.copy_timing.1.saturating_sub(self.copy_timing.1) as f64 / 1e6,
            gpu_mmio_traps: end.traps.saturating_sub(self.traps),
            vcpu_exits: end.exits.saturating_sub(self.exits),
            kvm_dirty_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_the_differences() {
        let t = Instant::now();
        let a = GuestMark {
            at: t,
            launches: 10,
            copies: 0,
            gpu_ns: 1_000_000,
            copy_gpu_ns: 100_000,
            traps: 5,
            exits: 7,
            timing: (10, 900_000, 70_000, 20_000),
            copy_timing: (30_000, 60_000),
        };
        let b = GuestMark {
            at: t + std::time::Duration::from_millis(250),
            launches: 60,
            copies: 2,
            gpu_ns: 3_500_000,
            copy_gpu_ns: 400_000,
            traps: 9,
            exits: 7,
            timing: (60, 3_000_000, 420_000, 120_000),
            copy_timing: (80_000, 310_000),
        };
        let w = a.window(&b, 3);
        assert_eq!(w.gpu_launches, 50);
        assert!((w.gpu_launches_per_s - 200.0).abs() < 1e-6, "{w:?}");
        assert!((w.gpu_busy_ms - 2.5).abs() < 1e-9);
        assert!((w.gpu_copy_ms - 0.3).abs() < 1e-9, "{w:?}");
        assert_eq!(w.gpu_sub_launches, 50);
        assert!((w.gpu_kernel_ms - 2.1).abs() < 1e-9, "{w:?}");
        assert!((w.gpu_launch_call_ms - 0.35).abs() < 1e-9, "{w:?}");
        assert!((w.gpu_origin_gap_ms - 0.1).abs() < 1e-9, "{w:?}");
        assert!((w.gpu_copy_call_ms - 0.05).abs() < 1e-9, "{w:?}");
        assert!((w.gpu_copy_wait_ms - 0.25).abs() < 1e-9, "{w:?}");
        assert_eq!(
            (w.gpu_mmio_traps, w.vcpu_exits, w.kvm_dirty_pages),
            (4, 0, 3)
        );
        // Counters that went backwards (a device replaced) give zero, not a wrap.
        assert_eq!(b.window(&a, 0).gpu_launches, 0);
    }
}
