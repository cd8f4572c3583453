//! What the daemon measured, as JSON (`vgpud --report PATH`, written at exit and every
//! `--report-every`): per-VM totals, GPU time per accounting window, preemption and switch
//! latencies, utilization, each VM's share of its GPU. `vgpu-bench fairness` reads it, and
//! `vgpud status` prints it live (`status`: without the windows and latency samples).

use serde::{Deserialize, Serialize};

/// The whole report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub version: u32,
    /// The scheduler configuration in force (`Config::parse` syntax).
    pub sched: String,
    /// Nanoseconds since the daemon started (its time origin) when the report was made.
    pub now_ns: u64,
    /// Accounting window length.
    pub window_ns: u64,
    /// Every VM that registered, in registration order (also those gone).
    pub vms: Vec<VmReport>,
    /// GPU time per VM id per window, oldest first (only windows with some use).
    pub windows: Vec<WindowReport>,
    /// Sum of engine-reported run times (from the VMs' start/end stamps).
    pub busy_ns: u64,
    /// Time during which at least one VM wanted the GPU or held it.
    pub demand_ns: u64,
    /// Idle time inside grants: from one job's end to the next job's start of the same grant
    /// (stamped runs in order), summed, and how many such gaps. With the switches'
    /// (`switch_latency_ns`), what keeps `busy_ns` under `demand_ns`: a VM's host path
    /// between two of its jobs, against the hand-over between VMs. Absent in older reports.
    #[serde(default)]
    pub job_gap_ns: u64,
    #[serde(default)]
    pub job_gaps: u64,
    /// Preemption latency samples: the stop was due (slice end, or Preempt sent) → the engine
    /// stopped (VM's end stamp); for a turn's grant given back between two jobs (no run:
    /// `LatePreempt::kept`), → the daemon received it back; for a grant taken back through the
    /// word (`LatePreempt::revoked`, kept or `unstarted`), → the daemon took it.
    pub preempt_latency_ns: Vec<u64>,
    /// Switch latency samples: one VM's engine stopped → the next VM's engine started.
    pub switch_latency_ns: Vec<u64>,
    /// Grants made, switches between different VMs, preempts made (sent, or a grant taken back
    /// through its word at that moment: `kept_revoked`, `unstarted_revoked`; one taken back at
    /// a slice end the VM was told is no preempt).
    pub grants: u64,
    pub switches: u64,
    pub preempts: u64,
    /// Messages refused and VMs evicted (stopped yielding).
    pub refused: u64,
    pub evictions: u64,
    /// Turns' grants kept between two jobs that the daemon took back through the VMs' grant
    /// words (version-4 VMs), without a message (each also a latency sample, `revoked`).
    #[serde(default)]
    pub kept_revoked: u64,
    /// Grants the daemon took back through the VMs' grant words before the VMs took them (the
    /// VM woken late: its stop came first), with nothing run (each a latency sample,
    /// `unstarted`).
    #[serde(default)]
    pub unstarted_revoked: u64,
    /// This daemon instance (`Welcome::boot`).
    #[serde(default)]
    pub boot: String,
    /// Re-registrations after a restart, and how soon the GPU was in use after listening.
    #[serde(default)]
    pub restart: RestartReport,
    // multigpu: the fields above are the sums over the GPUs (latency samples of all GPUs;
    // `demand_ns` in GPU-time, so `busy_ns / demand_ns` stays the utilization).
    /// Each GPU of the daemon, in index order (reports of older daemons have none: one GPU).
    #[serde(default)]
    pub gpus: Vec<GpuReport>,
    /// The longest preemptions, longest first (at most [`WORST_KEPT`]), with where the time
    /// went: did the engine run start before the stop was due (it was slow to stop) or after
    /// (the VM came late to its grant, and the run stopped at its first check)?
    #[serde(default)]
    pub worst_preemptions: Vec<LatePreempt>,
    /// A status (`vgpud status`) whose JSON would pass the protocol's bound leaves out the
    /// oldest departed VMs (then the oldest connected ones): how many (0 in a report file,
    /// which lists all).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vms_omitted: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Preemptions kept in [`Report::worst_preemptions`].
pub const WORST_KEPT: usize = 16;

/// One long preemption (monotonic ns of this host, as the VMs' stamps).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatePreempt {
    pub vm: u32,
    pub gpu: u32,
    /// When the stop was due (slice end or preempt sent) → the engine stopped.
    pub late_ns: u64,
    /// Grant sent → this engine run started (earlier runs of the same turn included).
    pub grant_to_start_ns: u64,
    /// The run's start → the stop was due (negative: it started after it was due).
    pub start_to_due_ns: i64,
    /// The run's length (start → end).
    pub run_ns: u64,
    /// The grant's slice (grant → slice end).
    pub slice_ns: u64,
    /// Jobs of the same turn that completed before this run (`Progress`): with any, the grant
    /// → start time is theirs, not an idle wait.
    #[serde(default)]
    pub jobs_before: u32,
    /// The turn ran past its slice because no other VM waited; the stop was due when one
    /// asked (the daemon's preempt).
    #[serde(default)]
    pub extended: bool,
    /// When the stop was due, in nanoseconds since the daemon started (its time origin, as
    /// `now_ns` and the windows): tells start-up from steady state (absent in older reports).
    #[serde(default)]
    pub due_at_ns: u64,
    /// No run: the VM gave back a turn's grant it kept between two jobs (`Done` preempted
    /// without stamps); `late_ns` runs to the daemon receiving it, `run_ns` and
    /// `start_to_due_ns` are 0, `grant_to_start_ns` is the grant → the end of the turn's last
    /// job (the GPU idle since then). False in older reports.
    #[serde(default)]
    pub kept: bool,
    /// A kept grant the daemon took back itself through the VM's grant word (protocol version
    /// 4, `vgpu_proto::word`) without the VM being scheduled: `late_ns` is the daemon's own
    /// delay from the stop being due to it acting (its thread woke late, or the VM stored the
    /// word late). False in older reports.
    #[serde(default)]
    pub revoked: bool,
    /// With `revoked`: the grant was taken back before the VM took it (it had not started:
    /// `run_ns`, `start_to_due_ns`, `grant_to_start_ns` and `jobs_before` are 0). False in
    /// older reports.
    #[serde(default)]
    pub unstarted: bool,
    /// For `revoked`: the daemon's looks at the word for this grant, the last one won (1: the
    /// VM kept the grant when the stop was due, so `late_ns` is all the daemon's; more: the VM
    /// kept it later, after the preempt went out, say).
    #[serde(default)]
    pub word_looks: u32,
    /// For `revoked`: how late the daemon's loop made the look that won, after the instant it
    /// was planned for (the slice end, the backstop, a recheck): its own thread waiting for a
    /// core.
    #[serde(default)]
    pub look_late_ns: u64,
}

impl LatePreempt {
    /// Keeps `p` among the longest `WORST_KEPT` of `v` (longest first).
    pub fn keep(v: &mut Vec<LatePreempt>, p: LatePreempt) {
        if v.len() >= WORST_KEPT && v.last().is_some_and(|l| l.late_ns >= p.late_ns) {
            return;
        }
        let at = v.partition_point(|x| x.late_ns >= p.late_ns);
        v.insert(at, p);
        v.truncate(WORST_KEPT);
    }
}

/// A restart as this instance saw it (`adopt`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RestartReport {
    /// A stale socket was replaced at start: the previous instance did not exit cleanly.
    pub stale_socket: bool,
    /// VMs of an earlier instance that re-registered, and claims refused.
    pub adopted: u64,
    pub claims_refused: u64,
    /// First registrations that waited for the adoption window's end.
    pub deferred: u64,
    /// Socket listening → the first grant sent, and → the first engine run that started (the
    /// VM's stamp): the GPU in use again.
    pub listen_to_first_grant_ns: Option<u64>,
    pub listen_to_first_run_ns: Option<u64>,
}

/// One GPU of the daemon (multigpu).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GpuReport {
    /// The daemon's index (`gpu=N`) and the CUDA device ordinal.
    pub index: u32,
    pub device: u32,
    /// The device's name and memory in bytes, where the daemon discovered them (`--gpus all`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    pub vram: u64,
    pub vram_free: u64,
    pub channels: u32,
    pub channels_used: u32,
    /// Ids of the VMs placed here (also those gone).
    pub vms: Vec<u32>,
    pub busy_ns: u64,
    pub demand_ns: u64,
    /// See [`Report::job_gap_ns`] (this GPU's).
    #[serde(default)]
    pub job_gap_ns: u64,
    #[serde(default)]
    pub job_gaps: u64,
    pub grants: u64,
    pub switches: u64,
    pub preempts: u64,
    pub preempt_latency_ns: Vec<u64>,
    pub switch_latency_ns: Vec<u64>,
    /// `(vm id, share)` of each VM of `vms`: its part of the GPU time its GPU's VMs used so
    /// far (they sum to 1 once any ran; all 0 before). Absent in older reports.
    #[serde(default)]
    pub shares: Vec<(u32, f64)>,
}

/// One VM.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VmReport {
    pub id: u32,
    pub name: String,
    pub pid: Option<i32>,
    pub weight: u32,
    pub priority: u8,
    pub vram_offset: u64,
    pub vram_size: u64,
    pub channels: u32,
    /// The daemon's GPU index it was placed on (multigpu; 0 in older reports), its last one
    /// after moves.
    #[serde(default)]
    pub gpu: u32,
    /// Moves to another GPU (multigpu).
    #[serde(default)]
    pub moves: u32,
    pub registered_ns: u64,
    /// When it left (disconnected, evicted); `None` while connected.
    pub gone_ns: Option<u64>,
    pub evicted: bool,
    pub gpu_ns: u64,
    pub grants: u64,
    pub completed: u64,
    pub preempted: u64,
    pub faulted: u64,
    /// A re-registration: its VM id in the earlier daemon instance.
    #[serde(default)]
    pub resumed_from: Option<u32>,
    /// Its part of the GPU time used by the VMs of its GPU (`gpu`) so far: `gpu_ns` over
    /// their sum (0 before any ran). Absent in older reports.
    #[serde(default)]
    pub share: f64,
}

/// One accounting window.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WindowReport {
    pub start_ns: u64,
    /// `(vm id, GPU ns)` pairs.
    pub per_vm: Vec<(u32, u64)>,
}

impl Report {
    /// Sets each VM's `share` and each GPU's `shares` from the VMs' GPU time (a VM counts on
    /// the GPU it is on now, `VmReport::gpu`, with all its time).
    pub fn fill_shares(&mut self) {
        for g in &mut self.gpus {
            let on = |v: &&mut VmReport| v.gpu == g.index;
            let total: u64 = self.vms.iter_mut().filter(on).map(|v| v.gpu_ns).sum();
            g.shares.clear();
            for v in self.vms.iter_mut().filter(on) {
                v.share = if total == 0 {
                    0.0
                } else {
                    v.gpu_ns as f64 / total as f64
                };
                g.shares.push((v.id, v.share));
            }
        }
    }

    /// Writes the report to `path` atomically (a temporary file beside it, renamed over it).
    pub fn write(&self, path: &std::path::Path) -> std::io::Result<()> {
        let tmp = temp_path(path);
        let body = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let written = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Checks before the daemon starts that a report can be written at `path`: not a
    /// directory, in an existing directory where a file can be created (the temporary file is
    /// created and removed).
    pub fn check_path(path: &std::path::Path) -> std::io::Result<()> {
        use std::io::{Error, ErrorKind};
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            return Err(Error::new(ErrorKind::InvalidInput, "is a directory"));
        }
        let tmp = temp_path(path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        std::fs::remove_file(&tmp)
    }
}

/// `PATH.PID.tmp`: a name no user file is likely to have (never another's file overwritten).
fn temp_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_per_gpu_and_zero_before_any_ran() {
        let vm = |id, gpu, gpu_ns| VmReport {
            id,
            gpu,
            gpu_ns,
            ..VmReport::default()
        };
        let gpu = |index| GpuReport {
            index,
            ..GpuReport::default()
        };
        let mut r = Report {
            vms: vec![vm(1, 0, 3000), vm(2, 1, 0), vm(3, 0, 1000), vm(4, 1, 0)],
            gpus: vec![gpu(0), gpu(1)],
            ..Report::default()
        };
        r.fill_shares();
        let shares: Vec<f64> = r.vms.iter().map(|v| v.share).collect();
        assert_eq!(shares, [0.75, 0.0, 0.25, 0.0]);
        assert_eq!(r.gpus[0].shares, [(1, 0.75), (3, 0.25)]);
        assert_eq!(r.gpus[1].shares, [(2, 0.0), (4, 0.0)]);
        r.vms[1].gpu_ns = 5;
        r.fill_shares();
        assert_eq!(r.gpus[1].shares, [(2, 1.0), (4, 0.0)]);
    }

    #[test]
    fn worst_preemptions_keep_the_longest_first() {
        let mut v = Vec::new();
        for late in [5u64, 1, 9, 3, 9, 7].into_iter().chain(10..40) {
            LatePreempt::keep(
                &mut v,
                LatePreempt {
                    late_ns: late,
                    ..LatePreempt::default()
                },
            );
        }
        let got: Vec<u64> = v.iter().map(|p| p.late_ns).collect();
        let want: Vec<u64> = (24..40).rev().collect();
        assert_eq!(got, want);
        let mut w = Vec::new();
        for late in [5u64, 1, 9] {
            LatePreempt::keep(
                &mut w,
                LatePreempt {
                    late_ns: late,
                    ..LatePreempt::default()
                },
            );
        }
        assert_eq!(w.iter().map(|p| p.late_ns).collect::<Vec<_>>(), [9, 5, 1]);
    }
}
