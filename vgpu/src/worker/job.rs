//! The job runner: one engine job (a copy or a launch) from start to end, under everything that
//! may stop or gate it — the per-job time limit (the watchdog, counting GPU time across runs),
//! the grants of a shared GPU's daemon (`host=`: acquire before each run, release with the
//! outcome after it, resume a preempted job at the next grant), a pause for a snapshot (the
//! job suspended with its context), the device going away (cancel), the live-snapshot write
//! log around each run, and the submission path timer. What the job's end means to the guest
//! (the fault it becomes) is decided here too; what the worker keeps of a suspended job is not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpu::{EngineError, EngineSnapshot, Job, Outcome, PreemptHandle, SavedContext};
use vgpu_proto::proto::{RunOutcome, monotonic_ns};

use super::Fault;
use crate::host::{HostError, HostLink};
use crate::regs::{Access, FaultKind};
use crate::snapshot::writes::WriteSetLog;
use crate::state::Shared;
use crate::watchdog::Watchdog;

/// How a job ended, where it did not fault.
pub(super) enum JobEnd {
    /// It completed.
    Completed,
    /// A pause stopped it, before a grant or mid-run: its saved context (if it ran) and the
    /// GPU time it used; the channel replays its method after the pause.
    Suspended(Option<SavedContext>, Duration),
}

/// See the module documentation. One per worker.
pub(super) struct JobRunner {
    pub shared: Arc<Shared>,
    pub engine: Arc<dyn EngineSnapshot>,
    /// Shared GPU (`host=`): every run waits for a grant of this daemon.
    pub host: Option<Arc<HostLink>>,
    /// Stops the running job (watchdog, daemon preempt, pause, device teardown). One per
    /// worker: within a turn of a shared GPU a preempt that arrives between two jobs must
    /// reach the next one.
    pub handle: PreemptHandle,
    /// Set when the device goes away: stops the running job at once.
    pub cancel: Arc<AtomicBool>,
    pub watchdog: Watchdog,
    /// Per-job write sets while a live snapshot logs (`snapshot::writes`).
    pub write_log: Option<Arc<WriteSetLog>>,
    /// The per-job time limit (`--gpu timeout_ms`).
    pub timeout: Duration,
    /// When the engine last ended a run (taken by the worker: the release after it is timed).
    pub last_end: Option<Instant>,
}

impl JobRunner {
    /// Runs `job` (kernel identity `key`, for the daemon of a shared GPU) under the time limit,
    /// of which `spent` went already (loading); `resume` is the context and GPU time of the job
    /// a pause suspended, re-targeted at the job's space and module. `more` says whether
    /// another job is probably ready after this one (a shared GPU's release reports it).
    /// `twin`: the launch's bounds-checked twin runs instead of it (live write sets; the marks
    /// are the job's), and a resumed context runs that twin.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        job: &Job,
        twin: Option<&Job>,
        key: Option<u64>,
        spent: Duration,
        resume: Option<(SavedContext, Duration)>,
        ch: usize,
        more: &dyn Fn() -> bool,
    ) -> Result<JobEnd, Fault> {
        let handle = self.handle.clone();
        if self.host.is_none() {
            handle.clear();
        }
        if self.cancel.load(Ordering::SeqCst) || self.pausing() {
            // The device is going away, or pausing (the request may have come before the clear).
            handle.request();
        }
        // A context a pause suspended may hold another flag word (a restored one): its marks
        // are everything. Contexts of this run (a shared GPU's preemptions) are checked.
        let checked = twin.is_some() && resume.is_none();
        if resume.is_none() {
            self.prepare(twin.unwrap_or(job));
        }
        let (mut saved, mut gpu) = match resume {
            Some((context, gpu)) => (Some(context), gpu),
            None => (None, Duration::ZERO),
        };
        // Shared GPU: run under grants; a preempted job keeps its context (the engine's saved
        // state, in memory) and resumes at the next grant. The time limit counts GPU time.
        let (outcome, timed_out) = loop {
            let ticket = match &self.host {
                Some(h) => {
                    let pausing = || self.pausing();
                    match h.acquire_unless(&handle, key, &pausing) {
                        Ok(t) => {
                            // A grant clears the handle: a pause requested while it was on
                            // its way stops the job at once (it keeps its context, below).
                            if pausing() {
                                handle.request();
                            }
                            Some(t)
                        }
                        // Paused before the grant came: the job keeps its place (its method
                        // runs again after the pause) and a context it had.
                        Err(HostError::Interrupted) => {
                            return Ok(JobEnd::Suspended(saved.take(), gpu));
                        }
                        Err(e) => {
                            log::error!("vgpu: {e}");
                            return Err(Fault::new(FaultKind::GpuLost, 0, 0));
                        }
                    }
                }
                None => None,
            };
            let left = self.timeout.saturating_sub(gpu + spent);
            self.watchdog.arm(Instant::now() + left, handle.clone());
            let start_ns = monotonic_ns();
            log::trace!("vgpu: engine start at {start_ns}");
            {
                let mut r = self.shared.lock();
                if let Some(rung) = r.chans[ch].rung_at.take() {
                    let ns = rung.elapsed().as_nanos() as u64;
                    r.counters.path.submit.add(ns);
                }
            }
            if let Some(l) = self.write_log.as_ref().filter(|l| l.on()) {
                let t = Instant::now();
                l.job_begins(&*self.engine, job, checked);
                l.note_worker(t.elapsed().as_nanos() as u64, false);
            }
            let usage0 = self.host.as_ref().map(|_| ThreadUsage::now());
            let outcome = match saved.take() {
                None => self.engine.execute(twin.unwrap_or(job), &handle),
                Some(ctx) => self.engine.resume(ctx, &handle),
            };
            if let Some(u0) = usage0 {
                late_stop(&handle, start_ns, u0);
            }
            if let Some(l) = &self.write_log {
                let t = Instant::now();
                l.job_ended();
                if l.on() {
                    l.note_worker(t.elapsed().as_nanos() as u64, false);
                }
            }
            let end_ns = monotonic_ns();
            self.last_end = Some(Instant::now());
            let timed_out = self.watchdog.disarm();
            let run_gpu = outcome.as_ref().map_or(Duration::ZERO, Outcome::gpu_time);
            gpu += run_gpu;
            let lost = self.host.as_ref().and_then(|h| h.lost());
            if let (Some(h), Some(t)) = (&self.host, ticket) {
                let (kind, more) = match &outcome {
                    Ok(Outcome::Preempted { .. }) if !timed_out && lost.is_none() => {
                        (RunOutcome::Preempted, true)
                    }
                    Ok(Outcome::Completed { .. }) => (RunOutcome::Completed, more()),
                    _ => (RunOutcome::Faulted, false),
                };
                h.release(t, kind, run_gpu, (start_ns, end_ns), more);
            }
            match outcome {
                Ok(Outcome::Preempted { context, .. })
                    if !timed_out
                        && lost.is_none()
                        && self.pausing()
                        && !self.cancel.load(Ordering::SeqCst) =>
                {
                    // Paused for a snapshot: keep the context; the entry resumes it. A shared
                    // GPU's grant ended above (`Done` preempted); parking withdraws the Want.
                    return Ok(JobEnd::Suspended(Some(context), gpu));
                }
                Ok(Outcome::Preempted { context, .. })
                    if self.host.is_some() && !timed_out && lost.is_none() =>
                {
                    saved = Some(context);
                }
                _ if lost.is_some() => {
                    log::error!("vgpu: GPU lost mid-job: {}", lost.unwrap_or_default());
                    return Err(Fault::new(FaultKind::GpuLost, 0, 0));
                }
                other => break (other, timed_out),
            }
        };
        let outcome = outcome.map_err(refused)?;
        {
            let c = &mut self.shared.lock().counters;
            c.gpu_ns += gpu.as_nanos() as u64;
            if matches!(job, Job::Copy(_)) {
                c.copy_gpu_ns += gpu.as_nanos() as u64;
            }
        }
        self.ended(outcome, timed_out, matches!(job, Job::Launch(_)))
    }

    /// The engine's one-time work for a job (issue 25: on cuda, the kernel's functions,
    /// streams and a save area of its size, otherwise made inside its first run), done before
    /// the worker asks for the GPU: a grant kept from the previous job of a turn goes back
    /// first, so no other VM waits for it meanwhile. Nothing to do (the engine says so, without
    /// device work): nothing is handed back.
    pub fn prepare(&self, job: &Job) {
        if self.engine.prepared(job) {
            return;
        }
        self.yield_grant();
        if let Err(e) = self.engine.prepare(job) {
            // Not the job's error: its run does the work itself and reports what fails.
            log::debug!("vgpu: preparing a job: {e}");
        }
    }

    /// Hands back a grant kept between two jobs (or one not taken yet) and withdraws the Want,
    /// before work that does not need the GPU and may take long (a module load, a job's
    /// preparation): the next `acquire` asks again.
    pub fn yield_grant(&self) {
        if let Some(h) = &self.host {
            h.idle();
        }
    }

    fn pausing(&self) -> bool {
        self.shared.pausing.load(Ordering::SeqCst)
    }

    /// What the engine's last word on a job means to the guest.
    fn ended(&self, outcome: Outcome, timed_out: bool, is_launch: bool) -> Result<JobEnd, Fault> {
        match outcome {
            Outcome::Completed { .. } => Ok(JobEnd::Completed),
            Outcome::Preempted { .. } => {
                log::info!(
                    "vgpu: guest job stopped after the {:?} limit (timed out: {timed_out})",
                    self.timeout
                );
                Err(Fault::new(
                    FaultKind::Timeout,
                    0,
                    self.timeout.as_millis() as u32,
                ))
            }
            Outcome::Faulted { fault, .. } => {
                let access = match fault.access {
                    Some(pgpu::AccessKind::Read) => Access::Read,
                    Some(pgpu::AccessKind::Write) => Access::Write,
                    Some(pgpu::AccessKind::Atomic) => Access::Atomic,
                    None => Access::None,
                };
                let line = fault.site.as_ref().map_or(0, |s| s.line);
                let kind = match (&fault.kind, is_launch) {
                    (_, true) => FaultKind::KernelFault,
                    (pgpu::FaultKind::ReadOnly, false) => FaultKind::ReadOnly,
                    _ => FaultKind::Unmapped,
                };
                log::info!("vgpu: guest job faulted: {} at {:#x}", fault.kind, fault.va);
                Err(Fault::new(kind, fault.va, line).access(access))
            }
        }
    }
}

/// The fault an engine error on a job becomes.
fn refused(e: EngineError) -> Fault {
    match e {
        // The physical GPU itself failed (a cuda context lost after a kernel fault): nothing
        // this VM submits can run any more.
        EngineError::Backend(_) => {
            log::warn!("vgpu: the GPU failed the job: {e}");
            Fault::new(FaultKind::GpuLost, 0, 0)
        }
        _ => {
            log::info!("vgpu: engine refused the guest's job: {e}");
            Fault::new(FaultKind::BadLaunch, 0, 0)
        }
    }
}

/// A stop this late after the slice end is logged (with what the thread did meanwhile).
const LATE_STOP_LOG: Duration = Duration::from_millis(1);

/// The calling thread's CPU time and context switches (a run's worth tells a worker waiting
/// in a run queue, or blocked, from one that ran).
#[derive(Clone, Copy)]
struct ThreadUsage {
    cpu_ns: u64,
    /// Involuntary switches: preempted by the host scheduler.
    preempted: i64,
    /// Voluntary switches: blocked (a lock, a page fault's I/O).
    blocked: i64,
}

impl ThreadUsage {
    fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writes the timespec we pass; the calling thread's CPU clock always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        // SAFETY: an all-zero rusage is a valid value of the plain C struct.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: writes the rusage we pass; RUSAGE_THREAD is the calling thread.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        ThreadUsage {
            cpu_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            preempted: ru.ru_nivcsw,
            blocked: ru.ru_nvcsw,
        }
    }
}

/// A run under a slice deadline that ended more than `LATE_STOP_LOG` after it: says how long
/// the worker was on a CPU and how often it was preempted meanwhile (issue 25: on a host with
/// more runnable threads than cores, a worker at a nice value waits in a run queue for whole
/// scheduler slices; with preemptions and little CPU time that is the cause, `--gpu rt=N`
/// bounds it where real-time is permitted; with no switch at all and little CPU time the
/// thread's CPU itself was not running it: a virtual machine's CPU taken by its hypervisor,
/// or interrupts).
fn late_stop(handle: &PreemptHandle, start_ns: u64, u0: ThreadUsage) {
    let Some(deadline) = handle.deadline() else {
        return;
    };
    let late = Instant::now().saturating_duration_since(deadline);
    if late < LATE_STOP_LOG {
        return;
    }
    let u1 = ThreadUsage::now();
    log::warn!(
        "vgpu: the GPU job stopped {} us after its slice end: it ran {} us, {} us of them on a \
         CPU; the worker was preempted {} and blocked {} times meanwhile",
        late.as_micros(),
        monotonic_ns().saturating_sub(start_ns) / 1000,
        u1.cpu_ns.saturating_sub(u0.cpu_ns) / 1000,
        u1.preempted - u0.preempted,
        u1.blocked - u0.blocked
    );
}
