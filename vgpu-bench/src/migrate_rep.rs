//! One repetition of `vgpu-bench migrate` (`exp_migrate`): a paused snapshot and its restore,
//! the stop-and-copy and live migrations, and the live snapshots of the slowdown measurement,
//! each on fresh `fairness` VMs (`--live-migration-only`: the live migration alone), and what
//! the repetition measured ([`Rep`]).

use std::path::Path;
use std::time::Duration;

use crate::error::BenchError;
use crate::exp_migrate::{Args, Dest, Plan, copy_args, machine_args, vm_args};
use crate::fairness_guest::GuestRun;
use crate::migrate_slowdown;
use crate::migrate_vm::{self, Vm};
use crate::procs::Proc;

/// One repetition's figures (None: not measured on this backend).
#[derive(Debug, Default, Clone)]
pub(crate) struct Rep {
    pub(crate) snapshot_ms: f64,
    pub(crate) snapshot_disk_bytes: u64,
    pub(crate) snapshot_apparent_bytes: u64,
    pub(crate) snapshot_gpu_bytes: u64,
    pub(crate) restore_ms: Option<f64>,
    pub(crate) stop_copy: Option<(f64, f64)>,
    /// (total ms, paused ms, report).
    pub(crate) live: Option<(f64, f64, serde_json::Value)>,
    /// The destinations' own figures (`dest_*`; null without them): stop-and-copy's, live's.
    pub(crate) dest: [serde_json::Value; 2],
    /// The sources' `downtime` answers (`src_*`): stop-and-copy's, live migration's.
    pub(crate) stop_downtime: serde_json::Value,
    pub(crate) live_downtime: serde_json::Value,
    pub(crate) live_snapshot_ms: f64,
    pub(crate) live_snapshot_paused_ms: f64,
    pub(crate) live_snapshot: serde_json::Value,
    pub(crate) rate_before: f64,
    pub(crate) rate_during: f64,
    /// The launch-counted windows of the slowdown measurement (`migrate_slowdown`).
    pub(crate) windows: Vec<migrate_slowdown::Window>,
    /// The live migration's launch-counted window (`migrate_slowdown::migration_window`).
    pub(crate) live_window: Option<migrate_slowdown::Window>,
}

fn ok_run(what: &str, code: Option<i32>, g: &GuestRun) -> Result<(), BenchError> {
    if code == Some(0) && g.ok() {
        return Ok(());
    }
    Err(BenchError::Invalid(format!(
        "{what}: the guest did not finish ok=1 (exit {code:?}, {:?})",
        g.fault
    )))
}

/// A number of an answer (0 when missing).
pub(crate) fn f(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

/// Starts a guest and waits until its kernels are running.
fn start(dir: &Path, name: &str, vmm: &Path, args: &[String]) -> Result<Vm, BenchError> {
    let mut vm = Vm::start(dir, name, vmm, args)?;
    vm.wait_for("progress", Duration::from_secs(120), |g| {
        g.progress.len() >= 3
    })?;
    Ok(vm)
}

/// Kernels per second of guest time between two progress points.
fn rate(a: (u64, u64), b: (u64, u64)) -> f64 {
    let dt = b.0.saturating_sub(a.0) as f64 / 1e3;
    if dt <= 0.0 {
        return 0.0;
    }
    b.1.saturating_sub(a.1) as f64 / dt
}

fn last(g: &GuestRun) -> (u64, u64) {
    g.progress.last().copied().unwrap_or((0, 0))
}

/// One repetition: the phases `--live-migration-only` keeps or skips.
pub(crate) fn one_rep(
    a: &Args,
    p: &Plan,
    vmm: &Path,
    dir: &Path,
    i: usize,
) -> Result<Rep, BenchError> {
    let run = RepRun {
        a,
        p,
        vmm,
        dir,
        i,
        args: vm_args(a, p),
        long: Duration::from_millis(p.guest_ms) + Duration::from_secs(120),
    };
    let mut r = Rep::default();
    if !a.live_migration_only {
        run.paused_snapshot(&mut r)?;
    }
    run.migrations(&mut r)?;
    if !a.live_migration_only {
        run.live_snapshots(&mut r)?;
    }
    Ok(r)
}

/// What every phase of repetition `i` shares: the arguments, the plan, the VMM binary, the
/// run's directory, the guest's command line and how long a guest may run.
struct RepRun<'a> {
    a: &'a Args,
    p: &'a Plan,
    vmm: &'a Path,
    dir: &'a Path,
    i: usize,
    args: Vec<String>,
    long: Duration,
}

impl RepRun<'_> {
    /// A paused snapshot, then its restore.
    fn paused_snapshot(&self, r: &mut Rep) -> Result<(), BenchError> {
        let RepRun {
            vmm,
            dir,
            i,
            ref args,
            long,
            ..
        } = *self;
        let mut vm = start(dir, &format!("snap{i}"), vmm, args)?;
        let snap = dir.join(format!("snap{i}"));
        let done = vm.ctl(vmm, &["snapshot", &snap.display().to_string(), "--paused"])?;
        r.snapshot_ms = f(&done, "ms");
        (r.snapshot_disk_bytes, r.snapshot_apparent_bytes) = migrate_vm::dir_bytes(&snap)?;
        r.snapshot_gpu_bytes = done["gpu_bytes"].as_u64().unwrap_or(0);
        vm.proc.stop(libc::SIGKILL, Duration::from_secs(5));
        {
            let mut rp = Proc::spawn(
                dir,
                &format!("restore{i}"),
                vmm,
                &[
                    "--restore".into(),
                    snap.display().to_string(),
                    "--log-level".into(),
                    "debug".into(),
                ],
            )?;
            let (code, g) = migrate_vm::wait_run(&mut rp, long)?;
            ok_run("restore", code, &g)?;
            let err = std::fs::read_to_string(&rp.err).unwrap_or_default();
            r.restore_ms = Some(migrate_vm::restore_ms(&err).ok_or_else(|| {
                BenchError::Invalid("restore: no \"restore to running\" in its log".into())
            })?);
        }
        let _ = std::fs::remove_dir_all(&snap);
        Ok(())
    }

    /// The stop-and-copy migration (unless `--live-migration-only`), then the live one (the
    /// destination restores on the same backend).
    fn migrations(&self, r: &mut Rep) -> Result<(), BenchError> {
        let RepRun {
            a,
            p,
            vmm,
            dir,
            i,
            ref args,
            long,
        } = *self;
        {
            let kinds: &[bool] = if a.live_migration_only {
                &[true]
            } else {
                &[false, true]
            };
            for &live in kinds {
                let tag = if live { "live" } else { "stop" };
                let dest_name = format!("{tag}-dest{i}");
                let (mut dest, sock) = match a.dest {
                    Dest::Incoming => {
                        let x = copy_args(a);
                        migrate_vm::incoming(dir, &dest_name, vmm, &x, &dest_env(a))?
                    }
                    Dest::Standby => {
                        let m = machine_args(a, p);
                        let (vm, sock, _) =
                            migrate_vm::standby_incoming(dir, &dest_name, vmm, &m, &dest_env(a))?;
                        (vm, sock)
                    }
                };
                let mut vm = start(dir, &format!("{tag}-src{i}"), vmm, args)?;
                let mut req = vec!["migrate", sock.to_str().unwrap_or_default()];
                if live {
                    req.push("--live");
                }
                // Live: the guest's launches over a baseline right before the request, and the
                // destination's first window right after the switch-over (`migrate_slowdown`),
                // each as long as the one before a VM's first live snapshot (`window`: one
                // migration per rep, and the sim guest launches a few kernels a second).
                let base = if live {
                    Some(migrate_slowdown::baseline(&vm, vmm, p.window)?)
                } else {
                    None
                };
                let done = vm.ctl(vmm, &req)?;
                if let Some((b0, b1)) = base {
                    let after = migrate_slowdown::baseline(&dest, vmm, p.window)?;
                    r.live_window = Some(migrate_slowdown::migration_window(b0, b1, &done, after)?);
                }
                let (code, _) = vm.finish(Duration::from_secs(30))?;
                if code != Some(0) {
                    return Err(BenchError::Invalid(format!(
                        "{tag} migration: source exit {code:?}"
                    )));
                }
                let (code, g) = migrate_vm::wait_run(&mut dest.proc, long)?;
                ok_run(&format!("{tag} migration"), code, &g)?;
                r.dest[usize::from(live)] = migrate_vm::incoming_report(dir, &dest_name);
                if live {
                    r.live_downtime = done["downtime"].clone();
                } else {
                    r.stop_downtime = done["downtime"].clone();
                }
                if live {
                    r.live = Some((
                        f(&done, "ms"),
                        f(&done, "paused_ms"),
                        done["precopy"].clone(),
                    ));
                } else {
                    r.stop_copy = Some((f(&done, "ms"), f(&done, "paused_ms")));
                }
            }
        }
        Ok(())
    }

    /// The guest's slowdown during live snapshots.
    fn live_snapshots(&self, r: &mut Rep) -> Result<(), BenchError> {
        let RepRun {
            a,
            p,
            vmm,
            dir,
            i,
            long,
            ..
        } = *self;
        // Slowdown during a live snapshot: guest progress before vs during (the first), then
        // more live snapshots counted by the GPU's launches (the guest runs long enough for them).
        let slow_plan = Plan {
            guest_ms: p.guest_ms + p.live_windows as u64 * 2000,
            ..Plan::of(a)
        };
        let mut vm = start(dir, &format!("slow{i}"), vmm, &vm_args(a, &slow_plan))?;
        let s0 = migrate_slowdown::stats(&vm, vmm)?;
        let g0 = vm.output();
        std::thread::sleep(p.window);
        let g1 = vm.output();
        let s1 = migrate_slowdown::stats(&vm, vmm)?;
        let live_snap = dir.join(format!("live{i}"));
        let done = vm.ctl(
            vmm,
            &["snapshot", &live_snap.display().to_string(), "--live"],
        )?;
        // The progress line printed after the snapshot ended (the guest prints every 20 ms).
        let before_end = last(&vm.output());
        let g2 = vm.wait_for(
            "progress after the snapshot",
            Duration::from_secs(30),
            |g| last(g).0 > before_end.0,
        )?;
        r.rate_before = rate(last(&g0), last(&g1));
        r.rate_during = rate(last(&g1), last(&g2));
        r.live_snapshot_ms = f(&done, "ms");
        r.live_snapshot_paused_ms = f(&done, "paused_ms");
        r.live_snapshot = done["live"].clone();
        // The VM's first live copy is a window too (with write sets it pays for the checked
        // twins' transformation and load), then `live_windows - 1` more.
        let mut first = migrate_slowdown::window(s0, s1, &done)?;
        first.first = true;
        r.windows = vec![first];
        r.windows.extend(migrate_slowdown::measure(
            &mut vm,
            vmm,
            dir,
            &format!("window{i}"),
            p.live_windows.saturating_sub(1),
            p.baseline,
        )?);
        let long = long + Duration::from_millis(p.live_windows as u64 * 2000);
        let (code, g) = vm.finish(long)?;
        ok_run("live snapshot's VM", code, &g)?;
        let _ = std::fs::remove_dir_all(&live_snap);
        Ok(())
    }
}

/// The migration destinations' added environment (`--dest-gpu`).
fn dest_env(a: &Args) -> Vec<(String, String)> {
    a.dest_gpu
        .map(|n| vec![("CUDA_VISIBLE_DEVICES".to_string(), n.to_string())])
        .unwrap_or_default()
}
