//! The soak run's state and its actions (`vgpu-bench soak`, exp_soak.rs): the daemon, one slot
//! per VM place (a slot gets a new VM when its VM ends), the random choice of an action and of
//! its victim, and the tally of what happened to every VM.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::BenchError;
use crate::exp_soak::{Args, RSS_SLACK_KIB, Sample, sample};
use crate::migrate_vm::Vm;
use crate::procs::{self, Proc};
use crate::soak_leak::{Leak, VramEnd};

/// What the soak does to the system.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Action {
    /// SIGKILL the daemon and start it again on the same socket (the VMs re-register).
    DaemonRestart,
    /// SIGKILL a VM (its result is not counted).
    VmKill,
    /// Pause a VM for 20–300 ms, then resume it.
    Pause,
    /// Snapshot a VM (paused or live, at random) and let it run on.
    Snapshot,
    /// Snapshot a VM paused, kill it and restore the snapshot as a new process.
    SnapshotRestore,
    /// Migrate a VM (stop-and-copy or live, at random) to a new `--incoming` process.
    Migrate,
}

impl Action {
    pub const ALL: [Action; 6] = [
        Action::DaemonRestart,
        Action::VmKill,
        Action::Pause,
        Action::Snapshot,
        Action::SnapshotRestore,
        Action::Migrate,
    ];

    fn name(self) -> &'static str {
        match self {
            Action::DaemonRestart => "daemon-restart",
            Action::VmKill => "vm-kill",
            Action::Pause => "pause",
            Action::Snapshot => "snapshot",
            Action::SnapshotRestore => "snapshot-restore",
            Action::Migrate => "migrate",
        }
    }
}

/// One VM place.
struct Slot {
    vm: Option<Vm>,
    /// Killed on purpose: its end is not a result.
    killed: bool,
    /// A snapshot directory to remove once the VM restored from it has ended.
    cleanup: Option<PathBuf>,
}

/// The run.
pub struct Soak {
    dir: PathBuf,
    vmm: PathBuf,
    vgpud: PathBuf,
    daemon: Proc,
    dargs: Vec<String>,
    socket: PathBuf,
    /// The daemons' `--report` (the last one's, written at its exit, tells its GPUs' VRAM).
    report: PathBuf,
    slots: Vec<Slot>,
    actions: Vec<Action>,
    rng: u64,
    seq: u64,
    backend: &'static str,
    vm_ms: u64,
    t0: Instant,
    pub rows: Vec<String>,
    /// Per action: (done, failed).
    counts: BTreeMap<&'static str, (u64, u64)>,
    failures: Vec<String>,
    started: u64,
    ok: u64,
    wrong: u64,
    killed: u64,
    wrong_details: Vec<String>,
    samples: Vec<Sample>,
    fresh: Option<Sample>,
    restarts: u64,
}

fn err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Invalid(format!("{what}: {e}"))
}

impl Soak {
    /// Starts the daemon, measures it with no VM, and starts the VMs.
    pub fn start(
        a: &Args,
        dir: &Path,
        vmm: &Path,
        vgpud: &Path,
        actions: Vec<Action>,
    ) -> Result<Self, BenchError> {
        let socket = dir.join("vgpud.sock");
        let report = dir.join("vgpud-report.json");
        let dargs: Vec<String> = vec![
            "--socket".into(),
            socket.display().to_string(),
            "--report".into(),
            report.display().to_string(),
            "--vram".into(),
            format!("{}M", 48 * a.vms + 64),
            "--sched".into(),
            "policy=timeslice".into(),
            "--log-level".into(),
            "warn".into(),
            "--revoke-after-ms".into(),
            a.revoke_after_ms.to_string(),
        ];
        let mut daemon = Proc::spawn(dir, "vgpud", vgpud, &dargs)?;
        procs::wait_socket(&mut daemon, &socket, Duration::from_secs(10))?;
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        let fresh = sample(&daemon, t0, 0);
        let mut s = Soak {
            dir: dir.into(),
            vmm: vmm.into(),
            vgpud: vgpud.into(),
            daemon,
            dargs,
            socket,
            report,
            slots: Vec::new(),
            actions,
            rng: a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            seq: 0,
            backend: a.backend.name(),
            vm_ms: a.vm_seconds * 1000,
            t0,
            rows: Vec::new(),
            counts: BTreeMap::new(),
            failures: Vec::new(),
            started: 0,
            ok: 0,
            wrong: 0,
            killed: 0,
            wrong_details: Vec::new(),
            samples: Vec::new(),
            fresh,
            restarts: 0,
        };
        for _ in 0..a.vms {
            let vm = s.new_vm()?;
            s.slots.push(Slot {
                vm: Some(vm),
                killed: false,
                cleanup: None,
            });
        }
        Ok(s)
    }

    fn next(&mut self) -> u64 {
        // xorshift64*: the choices of a seed are the same on every run.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn name(&mut self, what: &str) -> String {
        self.seq += 1;
        format!("{what}{}", self.seq)
    }

    /// The VMM's time limit: the guest's own time with a wide margin (pauses, migrations, a
    /// loaded host).
    fn vm_timeout(&self) -> String {
        (self.vm_ms / 1000 * 10 + 300).to_string()
    }

    fn new_vm(&mut self) -> Result<Vm, BenchError> {
        let name = self.name("vm");
        let args: Vec<String> = vec![
            "--guest".into(),
            "fairness".into(),
            "--memory".into(),
            "64".into(),
            "--timeout".into(),
            self.vm_timeout(),
            "--gpu".into(),
            format!(
                "host={},name={name},vram=32M,backend={}",
                self.socket.display(),
                self.backend
            ),
            "--cmdline".into(),
            format!(
                "iters=20000 threads=64 blocks=4 depth=2 ms={} report_ms=100 out=vram \
                 pool_mib=4 dirty_mib_s=8 vpool_mib=8 sys_mib=16",
                self.vm_ms
            ),
        ];
        self.started += 1;
        Vm::start(&self.dir, &name, &self.vmm, &args)
    }

    /// VMs still running.
    pub fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.vm.is_some()).count()
    }

    /// Tallies the VMs that ended; with `replace`, starts new ones in their places.
    pub fn reap(&mut self, replace: bool) -> Result<(), BenchError> {
        for i in 0..self.slots.len() {
            let ended = self.slots[i].vm.as_mut().is_some_and(|v| v.proc.poll());
            if !ended {
                continue;
            }
            let slot = &mut self.slots[i];
            let Some(vm) = slot.vm.take() else { continue };
            let g = vm.output();
            if std::mem::take(&mut slot.killed) {
                self.killed += 1;
            } else if vm.proc.code() == Some(0) && g.ok() {
                self.ok += 1;
            } else {
                self.wrong += 1;
                self.wrong_details.push(format!(
                    "{}: exit {:?}, fault {:?}, working set {:?}: {}",
                    vm.proc.name,
                    vm.proc.status,
                    g.fault,
                    g.pool_ok,
                    vm.proc.stderr_head()
                ));
            }
            if let Some(d) = slot.cleanup.take() {
                let _ = std::fs::remove_dir_all(d);
            }
            if replace {
                let vm = self.new_vm()?;
                self.slots[i].vm = Some(vm);
            }
        }
        Ok(())
    }

    /// A VM that runs kernels and has at least 3 s of them left (an action on a VM about to
    /// end would fail for no fault of the system), at random.
    fn victim(&mut self) -> Option<usize> {
        let vm_ms = self.vm_ms;
        let ready: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                self.slots[i].vm.as_ref().is_some_and(|v| {
                    let g = v.output();
                    g.started
                        && g.end.is_none()
                        && g.progress.last().is_some_and(|p| p.0 + 3000 < vm_ms)
                })
            })
            .collect();
        if ready.is_empty() {
            return None;
        }
        Some(ready[(self.next() % ready.len() as u64) as usize])
    }

    /// One random action.
    pub fn act(&mut self) -> Result<(), BenchError> {
        let k = (self.next() % self.actions.len() as u64) as usize;
        let action = self.actions[k];
        let t = Instant::now();
        let (who, result) = if action == Action::DaemonRestart {
            ("vgpud".to_string(), self.restart_daemon())
        } else {
            let Some(i) = self.victim() else {
                return Ok(());
            };
            let who = self.slots[i]
                .vm
                .as_ref()
                .map_or(String::new(), |v| v.proc.name.clone());
            (who, self.on_vm(action, i))
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let c = self.counts.entry(action.name()).or_default();
        c.0 += 1;
        let (outcome, detail) = match &result {
            Ok(d) => ("ok", d.clone()),
            Err(e) => {
                c.1 += 1;
                self.failures.push(format!("{} {who}: {e}", action.name()));
                ("failed", e.to_string())
            }
        };
        self.rows.push(format!(
            "{:.3},{},{who},{outcome},{ms:.1},\"{}\"",
            self.t0.elapsed().as_secs_f64(),
            action.name(),
            detail.replace('"', "'")
        ));
        Ok(())
    }

    fn restart_daemon(&mut self) -> Result<String, BenchError> {
        let t = Instant::now();
        self.daemon.stop(libc::SIGKILL, Duration::from_secs(2));
        self.restarts += 1;
        let name = format!("vgpud-{}", self.restarts);
        self.daemon = Proc::spawn(&self.dir, &name, &self.vgpud, &self.dargs)?;
        // The killed daemon's socket file is still there: wait until the new one accepts.
        let until = Instant::now() + Duration::from_secs(10);
        while vgpud::wire::Conn::connect(&self.socket).is_err() {
            if self.daemon.poll() || Instant::now() >= until {
                return Err(err(
                    "the restarted vgpud does not listen",
                    self.daemon.stderr_head(),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(format!(
            "listening {:.1} ms after the kill",
            t.elapsed().as_secs_f64() * 1e3
        ))
    }

    fn on_vm(&mut self, action: Action, i: usize) -> Result<String, BenchError> {
        let coin = self.next() & 1 == 1;
        let pause_ms = 20 + self.next() % 280;
        let vmm = self.vmm.clone();
        let Some(vm) = self.slots[i].vm.as_mut() else {
            return Ok(String::new());
        };
        match action {
            Action::DaemonRestart => Ok(String::new()),
            Action::VmKill => {
                vm.proc.stop(libc::SIGKILL, Duration::from_secs(2));
                self.slots[i].killed = true;
                Ok("killed".into())
            }
            Action::Pause => {
                vm.ctl(&vmm, &["pause"])?;
                std::thread::sleep(Duration::from_millis(pause_ms));
                vm.ctl(&vmm, &["resume"])?;
                Ok(format!("paused {pause_ms} ms"))
            }
            Action::Snapshot => {
                let snap = self.dir.join(format!("snap-{}", vm.proc.name));
                let mut req = vec!["snapshot", snap.to_str().unwrap_or_default()];
                if coin {
                    req.push("--live");
                }
                let done = vm.ctl(&vmm, &req);
                let _ = std::fs::remove_dir_all(&snap);
                let done = done?;
                Ok(format!(
                    "{} snapshot, paused {:.1} ms",
                    if coin { "live" } else { "paused" },
                    done["paused_ms"].as_f64().unwrap_or(0.0)
                ))
            }
            Action::SnapshotRestore => {
                let snap = self.dir.join(format!("snap-{}", vm.proc.name));
                vm.ctl(
                    &vmm,
                    &["snapshot", snap.to_str().unwrap_or_default(), "--paused"],
                )?;
                // The snapshot replaces the VM: its end is not a result.
                vm.proc.stop(libc::SIGKILL, Duration::from_secs(2));
                let name = self.name("restored");
                let args = vec![
                    "--restore".into(),
                    snap.display().to_string(),
                    "--timeout".into(),
                    self.vm_timeout(),
                ];
                let restored = Vm::start(&self.dir, &name, &self.vmm, &args)?;
                self.slots[i].vm = Some(restored);
                self.slots[i].cleanup = Some(snap);
                Ok(format!("restored as {name}"))
            }
            Action::Migrate => {
                let name = self.name("dest");
                let insock = self.dir.join(format!("{name}.in"));
                let args = vec![
                    "--incoming".into(),
                    insock.display().to_string(),
                    "--timeout".into(),
                    self.vm_timeout(),
                ];
                let mut dest = Vm::start(&self.dir, &name, &self.vmm, &args)?;
                let until = Instant::now() + Duration::from_secs(30);
                while !insock.exists() {
                    if dest.proc.poll() || Instant::now() > until {
                        return Err(err("no incoming socket", dest.proc.stderr_head()));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let Some(vm) = self.slots[i].vm.as_mut() else {
                    return Ok(String::new());
                };
                let to = format!("unix:{}", insock.display());
                let mut req = vec!["migrate", to.as_str()];
                if coin {
                    req.push("--live");
                }
                let done = match vm.ctl(&vmm, &req) {
                    Ok(d) => d,
                    Err(e) => {
                        // Refused or failed: the source runs on; the destination goes.
                        dest.proc.stop(libc::SIGKILL, Duration::from_secs(2));
                        return Err(e);
                    }
                };
                // The source ends (exit 0, no end line of its own); the destination is the VM.
                let (code, _) = vm.finish(Duration::from_secs(30))?;
                if code != Some(0) {
                    return Err(err("migration source", format!("exit {code:?}")));
                }
                self.slots[i].vm = Some(dest);
                Ok(format!(
                    "{} migration to {name}, paused {:.1} ms",
                    if coin { "live" } else { "stop-and-copy" },
                    done["paused_ms"].as_f64().unwrap_or(0.0)
                ))
            }
        }
    }

    /// One sample of the daemon.
    pub fn sample(&mut self, t0: Instant) {
        let running = self.running();
        if let Some(s) = sample(&self.daemon, t0, running) {
            self.samples.push(s);
        }
    }

    /// VMs still running when the run is over are stopped (and counted wrong: they did not
    /// finish).
    pub fn stop_stragglers(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut vm) = slot.vm.take() {
                vm.proc.stop(libc::SIGKILL, Duration::from_secs(2));
                self.wrong += 1;
                self.wrong_details
                    .push(format!("{}: did not finish in time", vm.proc.name));
            }
            if let Some(d) = slot.cleanup.take() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }

    /// The summary (and the verdict); stops the daemon (SIGTERM: it writes its report, whose
    /// GPUs must have every partition back to free).
    pub fn finish(&mut self, a: &Args, t0: Instant) -> Result<serde_json::Value, BenchError> {
        let end = self.samples.last().copied();
        // A report of a daemon killed earlier must not stand in for this one's.
        let _ = std::fs::remove_file(&self.report);
        self.daemon.stop(libc::SIGTERM, Duration::from_secs(10));
        let vram = VramEnd::read(&self.report);
        let fresh = self.fresh;
        let leak = Leak::judge(fresh, end, vram.as_ref().ok());
        let leak_free = leak.free();
        let failed: u64 = self.counts.values().map(|c| c.1).sum();
        let total: u64 = self.counts.values().map(|c| c.0).sum();
        let pass = self.wrong == 0 && failed == 0 && leak_free;
        let per_action: serde_json::Map<String, serde_json::Value> = self
            .counts
            .iter()
            .map(|(k, (n, f))| {
                (
                    (*k).to_string(),
                    serde_json::json!({"done": n, "failed": f}),
                )
            })
            .collect();
        let max_rss = self.samples.iter().map(|s| s.rss_kib).max();
        Ok(serde_json::json!({
            "experiment": "soak",
            "backend": self.backend,
            "duration_s": a.duration_s,
            "wall_s": t0.elapsed().as_secs_f64(),
            "vms_at_once": a.vms,
            "vm_seconds": a.vm_seconds,
            "action_every_ms": a.action_every_ms,
            "revoke_after_ms": a.revoke_after_ms,
            "seed": a.seed,
            "actions": {"total": total, "failed": failed, "per_action": per_action,
                        "failures": self.failures},
            "vms": {"started": self.started, "ok": self.ok, "wrong": self.wrong,
                    "killed": self.killed, "wrong_details": self.wrong_details},
            "daemon": {"restarts": self.restarts, "fresh": fresh.map(|s| s.json()),
                       "end": end.map(|s| s.json()),
                       "max_rss_kib": max_rss, "rss_slack_kib": RSS_SLACK_KIB,
                       "vram_end": match &vram {
                           Ok(v) => v.json(),
                           Err(e) => serde_json::json!({"all_free": false,
                                                        "error": format!("no report: {e}")}),
                       }},
            "leak": leak.json(),
            "leak_free": leak_free,
            "pass": pass,
            "samples": self.samples.iter().map(Sample::json).collect::<Vec<_>>(),
        }))
    }
}
