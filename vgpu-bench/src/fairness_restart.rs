//! `vgpu-bench fairness --kill-daemon-at MS`: a restart of `vgpud` under running VMs. Once every
//! guest runs kernels, waits MS milliseconds, kills the daemon with SIGKILL and starts it again
//! with the same arguments on the same socket; the VMs re-register by themselves (protocol
//! version 3). At the end, `restart.json` in the output directory says what it cost: VMs lost
//! (exit code not 0), wrong results (a guest's check failed), the VMs the new daemon adopted,
//! and how soon after it listened the GPU was in use again (its report's `restart` section).
//! The fairness figures of such a run are the restarted daemon's (its report) only.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::BenchError;
use crate::fairness_guest;
use crate::procs::Proc;

/// The kill and restart, as the run goes.
pub struct Restarter {
    at: Duration,
    out: PathBuf,
    vgpud: PathBuf,
    args: Vec<String>,
    socket: PathBuf,
    all_started: Option<Instant>,
    killed: Option<Instant>,
    /// Kill → the new daemon's socket listening, milliseconds.
    down_ms: Option<f64>,
    /// `--daemon-cpus`: the new daemon's CPUs, as the first one's.
    cpus: Option<Vec<usize>>,
}

impl Restarter {
    pub fn new(
        at_ms: f64,
        out: &Path,
        vgpud: &Path,
        args: &[String],
        socket: &Path,
        cpus: Option<Vec<usize>>,
    ) -> Self {
        Restarter {
            cpus,
            at: Duration::from_secs_f64(at_ms / 1e3),
            out: out.into(),
            vgpud: vgpud.into(),
            args: args.to_vec(),
            socket: socket.into(),
            all_started: None,
            killed: None,
            down_ms: None,
        }
    }

    /// Called while the VMs run: `started` of `total` guests run kernels. Kills and restarts
    /// `daemon` once, `at` after all of them started.
    pub fn tick(
        &mut self,
        started: usize,
        total: usize,
        daemon: &mut Proc,
    ) -> Result<(), BenchError> {
        if started == total && self.all_started.is_none() {
            self.all_started = Some(Instant::now());
        }
        let due = self.all_started.is_some_and(|t| t.elapsed() >= self.at);
        if !due || self.killed.is_some() {
            return Ok(());
        }
        let t = Instant::now();
        daemon.stop(libc::SIGKILL, Duration::from_secs(2));
        self.killed = Some(t);
        let mut next = Proc::spawn_on(
            &self.out,
            "vgpud-restarted",
            &self.vgpud,
            &self.args,
            &[],
            self.cpus.as_deref(),
        )?;
        // The killed daemon's socket is still there: wait until the new one accepts.
        let until = Instant::now() + Duration::from_secs(10);
        while vgpud::wire::Conn::connect(&self.socket).is_err() {
            if next.poll() || Instant::now() >= until {
                return Err(BenchError::Invalid(format!(
                    "the restarted vgpud does not listen: {}",
                    next.stderr_head()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.down_ms = Some(t.elapsed().as_secs_f64() * 1e3);
        *daemon = next;
        Ok(())
    }
}

/// Writes `restart.json` and returns a one-line summary.
pub fn summarize(
    r: &Restarter,
    out: &Path,
    vms: &[Proc],
    report: &vgpud::Report,
) -> Result<String, BenchError> {
    let guests: Vec<_> = vms
        .iter()
        .map(|v| fairness_guest::parse(&std::fs::read_to_string(&v.out).unwrap_or_default()))
        .collect();
    let ms = |ns: Option<u64>| ns.map(|n| n as f64 / 1e6);
    let killed = r.killed.is_some();
    let vms_lost = vms.iter().filter(|v| v.code() != Some(0)).count();
    let wrong = guests
        .iter()
        .filter(|g| {
            g.end.is_some_and(|e| !e.ok)
                || g.fault.as_deref().is_some_and(|f| f.contains("MISMATCH"))
        })
        .count();
    let (grant, run) = (
        ms(report.restart.listen_to_first_grant_ns),
        ms(report.restart.listen_to_first_run_ns),
    );
    // SIGKILL -> the new daemon accepting connections; listening -> its first grant, and ->
    // the first engine run (the VM's stamp).
    let s = serde_json::json!({
        "kill_daemon_at_ms": r.at.as_secs_f64() * 1e3,
        "killed": killed,
        "down_ms": r.down_ms,
        "vms": vms.len(),
        "vms_lost": vms_lost,
        "wrong_results": wrong,
        "adopted": report.restart.adopted,
        "claims_refused": report.restart.claims_refused,
        "listen_to_first_grant_ms": grant,
        "listen_to_first_run_ms": run,
    });
    let path = out.join("restart.json");
    let body = serde_json::to_vec_pretty(&s).map_err(|e| BenchError::Invalid(e.to_string()))?;
    std::fs::write(&path, body).map_err(|source| BenchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2} ms"));
    Ok(format!(
        "restart: killed {}; {vms_lost} of {} VMs lost, {wrong} wrong results, {} adopted, {} \
         claims refused; down {}, listening -> first grant {}, -> first run {} ({})",
        if killed {
            "yes"
        } else {
            "NO (not every guest ran in time)"
        },
        vms.len(),
        report.restart.adopted,
        report.restart.claims_refused,
        f(r.down_ms),
        f(grant),
        f(run),
        path.display()
    ))
}
