//! The daemon's GPUs: one independent state per physical GPU — its VRAM pool (for sim, its own
//! memory object), its channel quota, its scheduler, the grant in flight on it and its
//! accounting — and the placement of a registering VM on one of them.
//!
//! Placement policy: a VM pinned with `Hello::gpu` goes to that GPU or is refused (an index
//! the daemon does not have, or not enough VRAM or channels there). Otherwise, among the GPUs
//! where its partition and channels fit, the one with the most free VRAM; on equal free VRAM
//! the least loaded one (the sum of its VMs' weights), then the lowest index.

use scheduler::{Config as SchedConfig, Scheduler, VmId};

use crate::daemon::{DaemonError, Run};
use crate::partition::VramPool;
use crate::report::GpuReport;

/// One physical GPU of the daemon.
pub(crate) struct Gpu {
    /// The daemon's index of this GPU (`Hello::gpu`, the report).
    pub index: u32,
    /// Its CUDA device ordinal (what a cuda engine opens).
    pub device: u32,
    pub pool: VramPool,
    pub sched: Scheduler,
    /// The grant in flight on this GPU.
    pub run: Option<Run>,
    /// The scheduler asked to wait (a VM's credit, a hold) until this monotonic instant.
    pub wait_until_ns: Option<u64>,
    pub channels: u32,
    pub channels_used: u32,
    /// Sum of the weights of the VMs registered on it (the load of the placement policy).
    pub weights: u64,
    /// The last run's end on this GPU: (vm, monotonic ns), for switch latency.
    pub last_end: Option<(VmId, u64)>,
    pub demand_since_ns: Option<u64>,
    /// This GPU's counters and latency samples (the report's `gpus`).
    pub report: GpuReport,
}

impl Gpu {
    /// A GPU with `vram` bytes of VRAM and `channels` channels, scheduled by `sched`.
    pub fn new(
        index: u32,
        device: u32,
        vram: u64,
        channels: u32,
        sched: &SchedConfig,
    ) -> Result<Self, DaemonError> {
        Ok(Gpu {
            index,
            device,
            pool: VramPool::new(vram)?,
            sched: Scheduler::new(sched.clone())?,
            run: None,
            wait_until_ns: None,
            channels,
            channels_used: 0,
            weights: 0,
            last_end: None,
            demand_since_ns: None,
            report: GpuReport {
                index,
                device,
                vram,
                channels,
                ..GpuReport::default()
            },
        })
    }

    /// Whether a partition of `vram` bytes and `channels` channels fit here now.
    pub fn fits(&self, vram: u64, channels: u32) -> bool {
        self.pool.largest_free() >= vram && self.channels - self.channels_used >= channels
    }

    /// Demand bookkeeping: `demand` = some VM wants this GPU or holds it now.
    pub fn track_demand(&mut self, demand: bool, now_ns: u64) -> u64 {
        let mut added = 0;
        match (demand, self.demand_since_ns) {
            (true, None) => self.demand_since_ns = Some(now_ns),
            (false, Some(since)) => {
                added = now_ns - since;
                self.demand_since_ns = None;
            }
            (true, Some(since)) => {
                added = now_ns - since;
                self.demand_since_ns = Some(now_ns);
            }
            (false, None) => {}
        }
        self.report.demand_ns += added;
        added
    }

    /// The report of this GPU as of now.
    pub fn snapshot(&self, vms: Vec<u32>) -> GpuReport {
        GpuReport {
            vram_free: self.pool.free_bytes(),
            channels_used: self.channels_used,
            vms,
            ..self.report.clone()
        }
    }
}

/// Chooses the GPU of a VM asking for `vram` bytes and `channels` channels, pinned to `pin` or
/// not (the module documentation gives the policy). Returns the index into `gpus`, or why not.
pub(crate) fn place(
    gpus: &[Gpu],
    pin: Option<u32>,
    vram: u64,
    channels: u32,
) -> Result<usize, String> {
    if let Some(p) = pin {
        let Some(g) = gpus.get(p as usize) else {
            return Err(format!(
                "gpu={p}: this daemon has {} GPU{} (0..={})",
                gpus.len(),
                if gpus.len() == 1 { "" } else { "s" },
                gpus.len().saturating_sub(1)
            ));
        };
        if !g.fits(vram, channels) {
            return Err(format!(
                "gpu={p}: {} MiB of VRAM and {channels} channels do not fit there \
                 ({} MiB free in one range, {} channels free)",
                vram >> 20,
                g.pool.largest_free() >> 20,
                g.channels - g.channels_used
            ));
        }
        return Ok(p as usize);
    }
    gpus.iter()
        .enumerate()
        .filter(|(_, g)| g.fits(vram, channels))
        .min_by_key(|(i, g)| (std::cmp::Reverse(g.pool.free_bytes()), g.weights, *i))
        .map(|(i, _)| i)
        .ok_or_else(|| {
            let best = gpus.iter().map(|g| g.pool.largest_free()).max().unwrap_or(0);
            format!(
                "no GPU has {} MiB of VRAM and {channels} channels free (largest free range {} MiB)",
                vram >> 20,
                best >> 20
            )
        })
}

/// `--gpus`: a count (`2`: GPUs 0 and 1) or a list of CUDA device ordinals (`0,2`), each
/// once. Returns the device ordinal of each of the daemon's GPUs, in index order.
pub fn parse_gpus(s: &str) -> Result<Vec<u32>, String> {
    let s = s.trim();
    if !s.contains(',') {
        let n: u32 = s
            .parse()
            .map_err(|_| format!("{s:?}: a count (1 to {MAX_GPUS}) or a list like 0,1"))?;
        if n == 0 || n > MAX_GPUS {
            return Err(format!("{n}: 1 to {MAX_GPUS} GPUs"));
        }
        return Ok((0..n).collect());
    }
    let mut out = Vec::new();
    for item in s.split(',') {
        let d: u32 = item
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: not a device ordinal"))?;
        if d >= 1024 {
            return Err(format!("{d}: device ordinals are below 1024"));
        }
        if out.contains(&d) {
            return Err(format!("device {d} is listed twice"));
        }
        out.push(d);
    }
    if out.len() > MAX_GPUS as usize {
        return Err(format!("{} devices: at most {MAX_GPUS}", out.len()));
    }
    Ok(out)
}

/// The most GPUs one daemon manages.
pub const MAX_GPUS: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: u32, vram_mib: u64) -> Vec<Gpu> {
        let sched = SchedConfig::parse("").unwrap();
        (0..n)
            .map(|i| Gpu::new(i, i, vram_mib << 20, 8, &sched).unwrap())
            .collect()
    }

    #[test]
    fn most_free_vram_then_load_then_index() {
        let mut g = gpus(3, 64);
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(0));
        g[0].pool.alloc(8 << 20).unwrap();
        g[0].weights += 1;
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(1));
        g[1].pool.alloc(8 << 20).unwrap();
        g[1].weights += 5;
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(2));
        g[2].pool.alloc(8 << 20).unwrap();
        g[2].weights += 2;
        // Equal free VRAM everywhere: the smallest load wins.
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(0));
        g[0].weights += 9;
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(2));
        // Only GPU 1 has room for 56 MiB in one range.
        g[0].pool.alloc(2 << 20).unwrap();
        g[2].pool.alloc(2 << 20).unwrap();
        assert_eq!(place(&g, None, 56 << 20, 1), Ok(1));
        assert!(place(&g, None, 64 << 20, 1).is_err());
        // Channels count too: GPU 1 (most free VRAM) has none left; 0 and 2 have equal free
        // VRAM and 2 the smaller load.
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(1));
        g[1].channels_used = 8;
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(2));
    }

    #[test]
    fn pins_are_honoured_or_refused() {
        let mut g = gpus(2, 64);
        assert_eq!(place(&g, Some(1), 8 << 20, 1), Ok(1));
        let e = place(&g, Some(2), 8 << 20, 1).unwrap_err();
        assert!(e.contains("2 GPUs (0..=1)"), "{e}");
        assert!(place(&g, Some(u32::MAX), 8 << 20, 1).is_err());
        g[1].pool.alloc(60 << 20).unwrap();
        let e = place(&g, Some(1), 8 << 20, 1).unwrap_err();
        assert!(e.contains("do not fit"), "{e}");
        // Unpinned, it goes where it fits.
        assert_eq!(place(&g, None, 8 << 20, 1), Ok(0));
    }

    #[test]
    fn gpus_option() {
        assert_eq!(parse_gpus("2"), Ok(vec![0, 1]));
        assert_eq!(parse_gpus("1"), Ok(vec![0]));
        assert_eq!(parse_gpus("0,2"), Ok(vec![0, 2]));
        assert_eq!(parse_gpus(" 3 , 1 "), Ok(vec![3, 1]));
        for bad in ["0", "", "x", "65", "1,1", "0,-1", "0,,1", "0,1024"] {
            assert!(parse_gpus(bad).is_err(), "{bad:?}");
        }
    }
}
