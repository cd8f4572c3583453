//! The soak's leak verdict (`vgpu-bench soak`, issue 25: "no leak (daemon RSS, fds, VRAM
//! partitions back to free)"): what the last daemon holds once every VM is gone, against a
//! fresh daemon — its open descriptors and resident memory (`/proc`, [`crate::exp_soak::Sample`])
//! and its GPUs' VRAM and channels, read from the report it writes at its exit (`vgpud
//! --report`): every GPU's VRAM all free (no partition held, none in quarantine), no channel in
//! use, no VM still registered.

use std::path::Path;

use crate::exp_soak::{RSS_SLACK_KIB, Sample};

/// One GPU of the daemon at its exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuEnd {
    pub index: u32,
    pub vram: u64,
    pub vram_free: u64,
    pub channels_used: u32,
}

/// The daemon's GPUs at its exit (from its report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VramEnd {
    pub gpus: Vec<GpuEnd>,
    /// VMs the report still has registered (`gone_ns` unset): `name (id N)`.
    pub registered: Vec<String>,
}

impl VramEnd {
    /// What the report says of the daemon's GPUs.
    pub fn of(r: &vgpud::Report) -> Self {
        VramEnd {
            gpus: r
                .gpus
                .iter()
                .map(|g| GpuEnd {
                    index: g.index,
                    vram: g.vram,
                    vram_free: g.vram_free,
                    channels_used: g.channels_used,
                })
                .collect(),
            registered: r
                .vms
                .iter()
                .filter(|v| v.gone_ns.is_none())
                .map(|v| format!("{} (id {})", v.name, v.id))
                .collect(),
        }
    }

    /// Reads the report at `path` (a daemon that did not write one, or wrote something else:
    /// an error, and the verdict fails).
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let r: vgpud::Report =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self::of(&r))
    }

    /// Every partition back to free: at least one GPU (a report without any tells nothing),
    /// each with all its VRAM free and no channel in use, and no VM registered.
    pub fn all_free(&self) -> bool {
        !self.gpus.is_empty()
            && self
                .gpus
                .iter()
                .all(|g| g.vram_free == g.vram && g.channels_used == 0)
            && self.registered.is_empty()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "all_free": self.all_free(),
            "registered": self.registered,
            "gpus": self.gpus.iter().map(|g| serde_json::json!({
                "index": g.index, "vram": g.vram, "vram_free": g.vram_free,
                "vram_held": g.vram.saturating_sub(g.vram_free),
                "channels_used": g.channels_used,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The verdict, criterion by criterion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leak {
    /// The last sample was taken with no VM running.
    pub no_vm: bool,
    /// Descriptors at most a fresh daemon's.
    pub fds: bool,
    /// Resident memory at most a fresh daemon's plus [`RSS_SLACK_KIB`].
    pub rss: bool,
    /// Every GPU's VRAM and channels free at the daemon's exit ([`VramEnd::all_free`]).
    pub vram: bool,
}

impl Leak {
    /// Judges the daemon: `fresh` (no VM yet) and `end` (every VM gone) samples, and its
    /// GPUs at its exit (`None`: no readable report). A missing sample fails the criterion.
    pub fn judge(fresh: Option<Sample>, end: Option<Sample>, vram: Option<&VramEnd>) -> Self {
        let both = fresh.zip(end);
        Leak {
            no_vm: end.is_some_and(|e| e.vms == 0),
            fds: both.is_some_and(|(f, e)| e.fds <= f.fds),
            rss: both.is_some_and(|(f, e)| e.rss_kib <= f.rss_kib + RSS_SLACK_KIB),
            vram: vram.is_some_and(VramEnd::all_free),
        }
    }

    pub fn free(&self) -> bool {
        self.no_vm && self.fds && self.rss && self.vram
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"no_vm": self.no_vm, "fds": self.fds, "rss": self.rss,
                           "vram_partitions_free": self.vram})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpud::report::{GpuReport, Report, VmReport};

    fn gpu(index: u32, vram: u64, vram_free: u64, channels_used: u32) -> GpuReport {
        GpuReport {
            index,
            vram,
            vram_free,
            channels: 16,
            channels_used,
            ..GpuReport::default()
        }
    }

    fn vm(id: u32, gone: bool) -> VmReport {
        VmReport {
            id,
            name: format!("vm{id}"),
            vram_size: 32 << 20,
            gone_ns: gone.then_some(1),
            ..VmReport::default()
        }
    }

    fn sample(vms: usize, fds: u64, rss_kib: u64) -> Sample {
        Sample {
            t_s: 0.0,
            pid: 1,
            vms,
            rss_kib,
            fds,
        }
    }

    #[test]
    fn a_partition_still_held_is_a_leak() {
        let mut r = Report {
            gpus: vec![
                gpu(0, 256 << 20, 256 << 20, 0),
                gpu(1, 256 << 20, 256 << 20, 0),
            ],
            vms: vec![vm(1, true), vm(2, true)],
            ..Report::default()
        };
        let free = VramEnd::of(&r);
        assert!(free.all_free(), "{free:?}");
        // The samples are clean: the verdict is the VRAM's.
        let (f, e) = (Some(sample(0, 9, 4000)), Some(sample(0, 9, 4100)));
        assert!(Leak::judge(f, e, Some(&free)).free());
        // 32 MiB of GPU 1 not back (a partition held, or quarantined for ever).
        r.gpus[1].vram_free -= 32 << 20;
        let held = VramEnd::of(&r);
        assert!(!held.all_free(), "{held:?}");
        let leak = Leak::judge(f, e, Some(&held));
        assert!(
            !leak.free() && !leak.vram && leak.fds && leak.rss,
            "{leak:?}"
        );
        assert_eq!(held.json()["gpus"][1]["vram_held"], 32u64 << 20);
        // A channel still counted in use.
        r.gpus[1].vram_free = 256 << 20;
        r.gpus[0].channels_used = 1;
        assert!(!VramEnd::of(&r).all_free());
        // A VM the daemon still has registered.
        r.gpus[0].channels_used = 0;
        r.vms.push(vm(3, false));
        let reg = VramEnd::of(&r);
        assert!(!reg.all_free());
        assert_eq!(reg.registered, vec!["vm3 (id 3)".to_string()]);
        // A report without GPUs, or none at all, proves nothing.
        assert!(!VramEnd::of(&Report::default()).all_free());
        assert!(!Leak::judge(f, e, None).free());
    }

    #[test]
    fn descriptors_memory_and_running_vms_each_fail_the_verdict() {
        let r = Report {
            gpus: vec![gpu(0, 64 << 20, 64 << 20, 0)],
            ..Report::default()
        };
        let v = VramEnd::of(&r);
        let fresh = Some(sample(0, 9, 4000));
        assert!(Leak::judge(fresh, Some(sample(0, 9, 4000 + RSS_SLACK_KIB)), Some(&v)).free());
        let l = Leak::judge(fresh, Some(sample(0, 10, 4000)), Some(&v));
        assert!(!l.free() && !l.fds);
        let l = Leak::judge(fresh, Some(sample(0, 9, 4001 + RSS_SLACK_KIB)), Some(&v));
        assert!(!l.free() && !l.rss);
        let l = Leak::judge(fresh, Some(sample(1, 9, 4000)), Some(&v));
        assert!(!l.free() && !l.no_vm);
        assert!(!Leak::judge(None, Some(sample(0, 9, 4000)), Some(&v)).free());
        assert!(!Leak::judge(fresh, None, Some(&v)).free());
    }

    #[test]
    fn the_report_is_read_from_its_file() {
        let dir = std::env::temp_dir().join(format!("soak-leak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("report.json");
        assert!(VramEnd::read(&p).is_err(), "no file");
        std::fs::write(&p, b"{not json").unwrap();
        assert!(VramEnd::read(&p).is_err(), "not a report");
        let r = Report {
            gpus: vec![gpu(0, 64 << 20, 62 << 20, 0)],
            ..Report::default()
        };
        r.write(&p).unwrap();
        let v = VramEnd::read(&p).unwrap();
        assert_eq!(v.gpus[0].vram_free, 62 << 20);
        assert!(!v.all_free());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
