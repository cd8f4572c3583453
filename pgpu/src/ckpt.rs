//! Compiler-directed checkpoints (`ptx::ckpt`) as an engine's preemption method, the parts both
//! engines share: the method switch ([`PreemptMethod`]), transforming a guest's module within
//! its load budget, the parameter buffer of a transformed entry (the guest's parameters plus the
//! four `ptx::ckpt::PARAMS`), the bytes a preemption stored (from the records' status words and
//! the entry's plan), and the counters ([`CkptStats`]).
//!
//! The protocol (see `docs/ptx-subset.md`, "Preemptible kernels"): one launch of the whole grid
//! with a flag (a `u32` in engine-owned memory) and a save area (`EntryPlan::save_area_bytes`,
//! engine-owned, zeroed before its first use); a request sets the flag, every thread stops at
//! its next point (saving its live state) and the kernel ends; a record whose status word is not
//! `STATUS_DONE` means the job is not finished, and a relaunch of the same grid with
//! `__ck_resume = 1` (flag cleared) continues it. A run never preempted leaves the area all
//! zero (its threads write nothing there); a resumed run that ends with all records done
//! leaves every status word done (zero) but not the registers and shared memory saved at the
//! points, so an area is reused by another job only once scrubbed (cuda: `DevBuf::scrub`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use ptx::ckpt::{EntryPlan, STATUS_DONE, STATUS_NOT_STARTED};

use crate::engine::{EngineError, LoadLimits};

/// How an engine preempts kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreemptMethod {
    /// The engine's own method: the sim engine stops the interpreter between instructions;
    /// the cuda engine runs the grid as sliced sub-launches and stops between them.
    #[default]
    Slice,
    /// Modules are transformed by `ptx::ckpt::transform` at load; a launch runs the whole grid
    /// at once and a request stops it at the kernel's next preemption point (save and exit).
    /// Kernels the transformation refuses (or whose save area would exceed the engine's limit)
    /// fall back to `Slice`, counted in [`CkptStats`].
    Checkpoint,
    /// As `Checkpoint`, but idempotent kernels (`ptx::ckpt::Idempotence`: no global atomics,
    /// no parameter both read and written through) restart instead of saving: a stopped
    /// thread writes only its status and reruns from the start on the resume launch. A
    /// launch that is not provably idempotent (a written pointer parameter equal to a read
    /// one, or one the parameters do not hold) runs in the entry's checkpoint form, sliced
    /// only where it has none within the limits (see [`choose`]; counted).
    Restart,
    /// Per launch: a request for a launch expected to end within the engine's wait budget
    /// (`preempt_wait`, from the durations of its kernel's earlier runs) is not acted on: it
    /// runs to its end (`crate::ckwait`; counted). Otherwise many short CTAs (at least [`AUTO_SLICE_WAVES`] waves of the device's
    /// resident CTAs, estimated as one per SM on cuda and one per worker on sim) run sliced;
    /// the others run transformed, restarting when provably idempotent and checkpointing
    /// otherwise (as `Restart`). Each choice and its reason are counted in [`CkptStats`].
    Auto,
}

/// `Auto` slices a launch of at least this many waves of CTAs.
pub const AUTO_SLICE_WAVES: u64 = 4;

impl PreemptMethod {
    /// Whether modules are transformed by `ptx::ckpt` at load.
    pub fn transforms(self) -> bool {
        !matches!(self, PreemptMethod::Slice)
    }
}

impl std::str::FromStr for PreemptMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "slice" => Ok(PreemptMethod::Slice),
            "checkpoint" => Ok(PreemptMethod::Checkpoint),
            "restart" => Ok(PreemptMethod::Restart),
            "auto" => Ok(PreemptMethod::Auto),
            o => Err(format!(
                "unknown preemption method {o:?} (slice|checkpoint|restart|auto)"
            )),
        }
    }
}

impl std::fmt::Display for PreemptMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PreemptMethod::Slice => "slice",
            PreemptMethod::Checkpoint => "checkpoint",
            PreemptMethod::Restart => "restart",
            PreemptMethod::Auto => "auto",
        })
    }
}

/// Counters of the checkpoint method (cumulative since the engine was made).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CkptStats {
    /// Modules transformed.
    pub modules_transformed: u64,
    /// Modules the transformation refused (they run with the fallback method).
    pub fallback_modules: u64,
    /// Launches that ran with the fallback method because their save area would exceed the
    /// engine's limit.
    pub fallback_launches: u64,
    /// Reasons of the latest refusals (at most [`MAX_REASONS`], newest last).
    pub fallback_reasons: Vec<String>,
    /// Checkpointed launches started (`execute`).
    pub launches: u64,
    /// Runs of a checkpointed launch that ended preempted (some record not done).
    pub preemptions: u64,
    /// Threads that stopped at a point (saved registers) over all preemptions.
    pub saved_threads: u64,
    /// Bytes a full save would have stored at those points (registers, plus each saving CTA's
    /// shared memory for class `Cta`).
    pub saved_full_bytes: u64,
    /// Bytes the incremental saves actually stored.
    pub saved_incremental_bytes: u64,
    /// Launches run transformed with restarting threads (idempotent entries).
    pub restart_launches: u64,
    /// Launches run sliced by the method's choice: `Auto`'s many short CTAs, or a launch not
    /// provably idempotent whose entry has no checkpoint form within the limits (also counted
    /// in `unproven_launches`).
    pub sliced_launches: u64,
    /// Launches of a restarting entry that are not provably idempotent (a written pointer
    /// parameter equal to a read one, or missing from the parameters: [`Choice::SaveForm`]).
    /// They run in the entry's checkpoint form (counted in `launches`), or sliced where it has
    /// none within the limits (counted in `sliced_launches` too).
    pub unproven_launches: u64,
    /// Restarting launches escalated to the checkpoint form (or, where the engine has none
    /// for the entry, to slicing) after a run that finished no thread: see [`stalled`].
    pub escalated_launches: u64,
    /// Fresh checkpointed runs that completed with no request (the never-preempted case of
    /// issue 23's cost target; counted by the cuda engine only, 0 on sim).
    pub unrequested_runs: u64,
    /// Driver calls those runs made on the launching thread, from the run's start to its
    /// outcome (`unrequested_driver_calls / unrequested_runs` is the per-launch host work).
    pub unrequested_driver_calls: u64,
    /// `Auto`'s `wait` (`crate::ckwait`): requests not acted on because the launch was
    /// expected to end within the wait budget.
    pub waited_preemptions: u64,
    /// Of those, launches still running when the budget passed (the estimate was wrong):
    /// stopped then by their own method.
    pub wait_overruns: u64,
    /// The expected remaining time of the latest waited request and the budget it was within,
    /// ns (0: none yet).
    pub wait_last_expected_ns: u64,
    pub wait_budget_ns: u64,
    /// cuda: fresh checkpointed launches whose first run took the fast request path
    /// (`armed` / `notice` / `mirror`, chosen by `cuda::CkPathChoice`: adaptive and the
    /// kernel unmeasured or long, or configured as the fixed path), and those that took the
    /// fixed one. The path chosen: its parts' fallbacks (no `cuStreamWaitValue32_v2`, no free
    /// host word) show in the preemption breakdowns' `path`. 0 on sim.
    pub fast_path_launches: u64,
    pub fixed_path_launches: u64,
}

/// Default of the engines' `ckpt_poll_interval`: the transformation's own default.
pub fn default_poll_interval() -> u32 {
    ptx::ckpt::Options::default().poll_interval
}

/// Most fallback reasons kept.
pub const MAX_REASONS: usize = 16;

#[derive(Debug, Default)]
pub(crate) struct CkptCounters {
    modules_transformed: AtomicU64,
    fallback_modules: AtomicU64,
    fallback_launches: AtomicU64,
    reasons: Mutex<Vec<String>>,
    pub launches: AtomicU64,
    preemptions: AtomicU64,
    saved_threads: AtomicU64,
    saved_full_bytes: AtomicU64,
    saved_incremental_bytes: AtomicU64,
    restart_launches: AtomicU64,
    sliced_launches: AtomicU64,
    unproven_launches: AtomicU64,
    escalated_launches: AtomicU64,
    unrequested_runs: AtomicU64,
    unrequested_driver_calls: AtomicU64,
    fast_path_launches: AtomicU64,
    fixed_path_launches: AtomicU64,
    /// Durations and counters of `Auto`'s `wait`.
    pub(crate) waits: std::sync::Arc<crate::ckwait::Waits>,
}

impl CkptCounters {
    /// Runs a fresh launch under `Auto`'s wait (`crate::ckwait`): with a non-zero `budget`,
    /// `run` gets the gate's handle (requests reach it when the gate decides) and the gate
    /// ends with the run's outcome; otherwise `run` gets `h` itself.
    pub(crate) fn waited<E>(
        &self,
        method: PreemptMethod,
        budget: std::time::Duration,
        key: impl FnOnce() -> crate::ckwait::Key,
        h: &crate::engine::PreemptHandle,
        run: impl FnOnce(&crate::engine::PreemptHandle) -> Result<crate::engine::Outcome, E>,
    ) -> Result<crate::engine::Outcome, E> {
        if method != PreemptMethod::Auto || budget.is_zero() {
            return run(h);
        }
        let gate = crate::ckwait::Gate::new(&self.waits, key(), h, budget);
        let out = run(gate.handle());
        gate.finish(&self.waits, out.as_ref().ok());
        out
    }

    /// Records a fresh run's GPU time as its kernel's duration where [`waited`]'s gate did not
    /// (it does under `Auto` with a non-zero budget): the estimates that
    /// `cuda::CkPathChoice::Adaptive` reads under every method. A completed run's time is
    /// recorded; a preempted run's only when it is longer than the current estimate (the
    /// kernel runs at least that long: as the gate records a launch that outran its estimate),
    /// since a request chose where it stopped, and a kernel stopped early every time would
    /// otherwise look short.
    ///
    /// [`waited`]: CkptCounters::waited
    pub(crate) fn record_unwaited(
        &self,
        method: PreemptMethod,
        budget: std::time::Duration,
        key: impl FnOnce() -> crate::ckwait::Key,
        out: Option<&crate::engine::Outcome>,
    ) {
        use crate::engine::Outcome;
        if method == PreemptMethod::Auto && !budget.is_zero() {
            return;
        }
        match out {
            Some(Outcome::Completed { gpu_time }) => self.waits.record(&key(), *gpu_time),
            Some(Outcome::Preempted { gpu_time, .. }) => {
                let k = key();
                if self.waits.expected(&k).is_some_and(|e| *gpu_time > e) {
                    self.waits.record(&k, *gpu_time);
                }
            }
            _ => {}
        }
    }

    /// A fresh checkpointed launch's request path (`fast`: `armed` / `notice` / `mirror`).
    pub(crate) fn path_chosen(&self, fast: bool) {
        let c = if fast {
            &self.fast_path_launches
        } else {
            &self.fixed_path_launches
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn transformed(&self) {
        self.modules_transformed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused(&self, reason: &str) {
        self.fallback_modules.fetch_add(1, Ordering::Relaxed);
        self.reason(format!("module: {reason}"));
    }

    pub(crate) fn launch_fallback(&self, entry: &str, need: u64, limit: u64) {
        self.fallback_launches.fetch_add(1, Ordering::Relaxed);
        self.reason(format!(
            "launch of {entry}: save area of {need} bytes exceeds the limit {limit}"
        ));
    }

    /// The method of one launch of a transformed entry (see [`choose`]), counting the
    /// restarting and the sliced ones; a [`Choice::SaveForm`] is counted by the engine once it
    /// knows where the launch runs ([`CkptCounters::unproven`]).
    pub(crate) fn choose(
        &self,
        method: PreemptMethod,
        plan: &ptx::ckpt::EntryPlan,
        params: &[u8],
        blocks: u64,
        wave: u64,
    ) -> Choice {
        let c = choose(method, plan, params, blocks, wave);
        match &c {
            Choice::Restart => {
                self.restart_launches.fetch_add(1, Ordering::Relaxed);
            }
            Choice::Slice(why) => {
                self.sliced_launches.fetch_add(1, Ordering::Relaxed);
                log::debug!("launch of {}: {why}", plan.name);
            }
            Choice::Checkpoint | Choice::SaveForm(_) => {}
        }
        c
    }

    /// A launch that is not provably idempotent (`why`) runs in its entry's checkpoint form
    /// (`sliced` false) or, where the entry has none within the limits, sliced.
    pub(crate) fn unproven(&self, entry: &str, why: &str, sliced: bool) {
        self.unproven_launches.fetch_add(1, Ordering::Relaxed);
        if sliced {
            self.sliced_launches.fetch_add(1, Ordering::Relaxed);
        }
        let to = if sliced {
            "sliced (no checkpoint form within the limits)"
        } else {
            "checkpoint form"
        };
        log::debug!("launch of {entry}: {why}: {to}");
    }

    fn reason(&self, r: String) {
        log::warn!("checkpoint fallback: {r}");
        let mut v = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() >= MAX_REASONS {
            v.remove(0);
        }
        v.push(r.chars().take(300).collect());
    }

    pub(crate) fn escalated(&self, entry: &str, to: &str) {
        self.escalated_launches.fetch_add(1, Ordering::Relaxed);
        log::debug!("restarting launch of {entry} finished no thread in its last run: {to}");
    }

    pub(crate) fn preempted(&self, s: &SaveTally) {
        self.preemptions.fetch_add(1, Ordering::Relaxed);
        self.saved_threads.fetch_add(s.threads, Ordering::Relaxed);
        self.saved_full_bytes.fetch_add(s.full, Ordering::Relaxed);
        self.saved_incremental_bytes
            .fetch_add(s.incremental, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CkptStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CkptStats {
            modules_transformed: g(&self.modules_transformed),
            fallback_modules: g(&self.fallback_modules),
            fallback_launches: g(&self.fallback_launches),
            fallback_reasons: self
                .reasons
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            launches: g(&self.launches),
            preemptions: g(&self.preemptions),
            saved_threads: g(&self.saved_threads),
            saved_full_bytes: g(&self.saved_full_bytes),
            saved_incremental_bytes: g(&self.saved_incremental_bytes),
            restart_launches: g(&self.restart_launches),
            sliced_launches: g(&self.sliced_launches),
            unproven_launches: g(&self.unproven_launches),
            escalated_launches: g(&self.escalated_launches),
            unrequested_runs: g(&self.unrequested_runs),
            unrequested_driver_calls: g(&self.unrequested_driver_calls),
            waited_preemptions: g(&self.waits.waited),
            wait_overruns: g(&self.waits.overruns),
            wait_last_expected_ns: g(&self.waits.last_expected_ns),
            wait_budget_ns: g(&self.waits.last_budget_ns),
            fast_path_launches: g(&self.fast_path_launches),
            fixed_path_launches: g(&self.fixed_path_launches),
        }
    }

    /// A fresh run completed with no request, after `calls` driver calls.
    pub(crate) fn unrequested(&self, calls: u64) {
        self.unrequested_runs.fetch_add(1, Ordering::Relaxed);
        self.unrequested_driver_calls
            .fetch_add(calls, Ordering::Relaxed);
    }
}

/// How one launch of a transformed entry runs (see [`choose`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Transformed, restarting: an idempotent entry whose pointer parameters are all present
    /// and no written one equals a read one.
    Restart,
    /// Transformed, checkpointing: the entry's loaded form does not restart (not idempotent,
    /// or the method is `Checkpoint`).
    Checkpoint,
    /// The entry restarts but this launch is not provably idempotent (the reason): it runs in
    /// the entry's checkpoint form (the same text transformed without `restart`, loaded beside
    /// the restarting form), from its first run; sliced only where the entry has no such form
    /// or its save area is over the limit.
    SaveForm(String),
    /// Sliced (the reason): `Auto` and a grid of many short CTAs.
    Slice(String),
}

/// How one launch of a transformed entry runs. The rule, in order:
/// 1. `Auto` slices a grid of at least [`AUTO_SLICE_WAVES`] `wave`s of CTAs (many short CTAs:
///    between sub-launches the device frees within one CTA, and nothing is saved);
/// 2. an entry whose loaded form does not restart checkpoints;
/// 3. a restarting entry restarts only when the launch is provably idempotent: every pointer
///    parameter it reads or writes through is in `params`, and no written one holds the value
///    of a read one (an in-place launch would read what it wrote, and a rerun thread would
///    start from its own output); otherwise [`Choice::SaveForm`]: checkpointed.
pub fn choose(
    method: PreemptMethod,
    plan: &ptx::ckpt::EntryPlan,
    params: &[u8],
    blocks: u64,
    wave: u64,
) -> Choice {
    if method == PreemptMethod::Auto && blocks >= AUTO_SLICE_WAVES * wave.max(1) {
        return Choice::Slice(format!(
            "{blocks} CTAs, at least {AUTO_SLICE_WAVES} waves of {wave}: many short CTAs"
        ));
    }
    if !plan.restart {
        return Choice::Checkpoint;
    }
    let ptr = |off: &u32| {
        let at = *off as usize;
        params
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let reads: Vec<Option<u64>> = plan.idempotence.reads.iter().map(ptr).collect();
    let writes: Vec<Option<u64>> = plan.idempotence.writes.iter().map(ptr).collect();
    if reads.iter().chain(&writes).any(Option::is_none) {
        return Choice::SaveForm("a pointer parameter is missing from the parameters".into());
    }
    if writes.iter().any(|w| reads.contains(w)) {
        return Choice::SaveForm("a written buffer is also read (aliased pointers)".into());
    }
    Choice::Restart
}

/// Whether a run of a *restarting* launch made no progress: it ended preempted with no more
/// records done than when it started (`before`: the statuses it was resumed from, empty for a
/// fresh launch, where nothing was done). A restarted thread keeps nothing, so a launch whose
/// threads all run longer than the time between two preemptions would be rerun from the start
/// forever; the engines therefore *escalate* a stalled restarting launch before its next run:
/// it continues in the entry's checkpoint form (the same text transformed without `restart`,
/// loaded beside the restarting form), where a stopped thread saves its registers and every
/// run moves each running thread to a later point — progress whatever the preemption rate.
/// The engines do not ask about a run whose request came before it started: its threads
/// stopped at their entry points, which says nothing of their length.
pub fn stalled(before: &[u32], after: &[u32]) -> bool {
    let done = |v: &[u32]| v.iter().filter(|&&s| s == STATUS_DONE).count();
    let was = if before.is_empty() { 0 } else { done(before) };
    done(after) <= was
}

/// Whether a run that ended with no request (its flag never raised) left every record done,
/// as it must: without the flag no thread writes a status other than done. A resumed run
/// whose records say otherwise read an area that had not landed yet when its kernel started
/// (on cuda: a status-only area written on the legacy stream after an escalation, issue 23)
/// and is not complete: the engine reports it preempted, and the next run resumes what the
/// records say.
pub fn unrequested_end_complete(after: &[u32]) -> bool {
    after.iter().all(|&s| s == STATUS_DONE)
}

/// The save area of a launch that continues in another form of its entry (`record_bytes` per
/// thread, `len` bytes in all): every record's status word from `statuses`, with a thread that
/// is not done marked `STATUS_NOT_STARTED` (it runs from its start: the escalated form knows
/// nothing of the restarting form's points, and a restarting thread saved nothing anyway), and
/// nothing else.
pub fn status_area(statuses: &[u32], record_bytes: u32, len: u64) -> Vec<u8> {
    let mut a = vec![0u8; len as usize];
    let stride = record_bytes.max(4) as usize;
    for (i, &st) in statuses.iter().enumerate() {
        let at = i * stride;
        if st != STATUS_DONE
            && let Some(w) = a.get_mut(at..at + 4)
        {
            w.copy_from_slice(&STATUS_NOT_STARTED.to_le_bytes());
        }
    }
    a
}

/// How [`transform`] strip-mines loops (`ptx::ckpt::Options`' `chunk_instructions`,
/// `fast_chunks` and `atomic_weight`): an engine's choice, sized for where its kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunking {
    pub instructions: u32,
    pub fast: bool,
    pub atomic_weight: u32,
}

impl Default for Chunking {
    fn default() -> Self {
        let o = ptx::ckpt::Options::default();
        Chunking {
            instructions: o.chunk_instructions,
            fast: o.fast_chunks,
            atomic_weight: o.atomic_weight,
        }
    }
}

/// Transforms a guest's module within its load limits (the text is hostile: the same host-byte
/// bound, deadline and cancel flag as the plain load).
pub(crate) fn transform(
    text: &str,
    limits: &LoadLimits,
    poll_interval: u32,
    chunks: Chunking,
    restart: bool,
) -> Result<ptx::ckpt::Transformed, ptx::ckpt::Unsupported> {
    let opts = ptx::ckpt::Options {
        poll_interval: poll_interval.max(1),
        chunk_instructions: chunks.instructions,
        fast_chunks: chunks.fast,
        atomic_weight: chunks.atomic_weight,
        restart,
        load: ptx::LoadOptions {
            max_host_bytes: limits.max_host_bytes,
            cancel: limits.cancel.clone(),
            deadline: limits.deadline,
            ..ptx::LoadOptions::default()
        },
        ..ptx::ckpt::Options::default()
    };
    ptx::ckpt::transform(text, &opts)
}

/// A transformation that stopped on the caller's limits is the load's error, not a fallback.
pub(crate) fn limit_error(e: &ptx::ckpt::Unsupported) -> Option<EngineError> {
    match e {
        ptx::ckpt::Unsupported::Parse(ptx::PtxError::Cancelled) => Some(EngineError::LoadCancelled),
        ptx::ckpt::Unsupported::Parse(ptx::PtxError::DeadlineExceeded) => {
            Some(EngineError::LoadDeadline)
        }
        _ => None,
    }
}

/// Where the four checkpoint parameters go in a transformed entry's parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CkParams {
    /// End of the guest's own parameters (offset of `__ck_flag`).
    pub own_end: usize,
    /// Offsets of flag, save, resume, dyn_smem.
    pub off: [usize; 4],
    /// Size of the whole buffer.
    pub size: usize,
}

impl CkParams {
    /// From the offsets of the entry's last four parameters and the buffer size.
    pub(crate) fn new(off: [usize; 4], size: usize) -> CkParams {
        CkParams {
            own_end: off[0],
            off,
            size,
        }
    }

    /// The full buffer: the guest's parameters (refused if longer than the entry's own), then
    /// the flag and save-area addresses, `resume` and the dynamic shared bytes.
    pub(crate) fn buffer(
        &self,
        guest: &[u8],
        flag: u64,
        save: u64,
        resume: bool,
        dynamic_shared: u32,
    ) -> Result<Vec<u8>, EngineError> {
        if guest.len() > self.own_end {
            return Err(EngineError::BadLaunch(format!(
                "parameter buffer is {} bytes, the entry takes {}",
                guest.len(),
                self.own_end
            )));
        }
        let mut b = vec![0u8; self.size];
        b[..guest.len()].copy_from_slice(guest);
        let [f, s, r, d] = self.off;
        b[f..f + 8].copy_from_slice(&flag.to_le_bytes());
        b[s..s + 8].copy_from_slice(&save.to_le_bytes());
        b[r..r + 4].copy_from_slice(&u32::from(resume).to_le_bytes());
        b[d..d + 4].copy_from_slice(&dynamic_shared.to_le_bytes());
        Ok(b)
    }
}

/// What one preemption stored, from the records' status words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SaveTally {
    /// Records not done (the job must be resumed).
    pub pending: u64,
    /// Threads stopped at a point.
    pub threads: u64,
    /// Bytes a full save stores at those points (plus saved shared memory).
    pub full: u64,
    /// Bytes the incremental saves stored (plus saved shared memory).
    pub incremental: u64,
}

/// Tallies the status words after a run (`after`), given the ones before it (`before`, the
/// points the threads were resumed from; empty for a fresh launch). `threads_per_cta` and
/// `shared_per_cta` count a CTA's shared-memory save once per CTA that saved at a point.
pub(crate) fn tally(
    plan: &EntryPlan,
    before: &[u32],
    after: &[u32],
    threads_per_cta: u64,
    shared_per_cta: u64,
) -> SaveTally {
    let mut t = SaveTally::default();
    let mut cta_saved = false;
    for (i, &st) in after.iter().enumerate() {
        if (i as u64).is_multiple_of(threads_per_cta.max(1)) {
            cta_saved = false;
        }
        if st == STATUS_DONE {
            continue;
        }
        t.pending += 1;
        if st == STATUS_NOT_STARTED {
            continue;
        }
        let at = st - 2;
        let from = match before.get(i) {
            Some(&b) if b > STATUS_NOT_STARTED => b - 2,
            _ => 0,
        };
        t.threads += 1;
        t.full += u64::from(plan.full_bytes(at));
        t.incremental += u64::from(plan.incremental_bytes(from, at));
        if plan.saves_shared && !cta_saved {
            cta_saved = true;
            t.full += shared_per_cta;
            t.incremental += shared_per_cta;
        }
    }
    t
}

/// Bytes of one CTA's shared-memory save block of `plan` with `dynamic_shared` bytes.
pub(crate) fn shared_per_cta(plan: &EntryPlan, dynamic_shared: u32) -> u64 {
    if plan.saves_shared {
        u64::from(plan.shared_static_bytes) + u64::from(dynamic_shared).next_multiple_of(8)
    } else {
        0
    }
}

/// Save-area bytes of a launch shape: `EntryPlan::save_area_bytes`, once a saturating estimate
/// of the same shows it cannot overflow (hostile shapes compare as huge).
pub fn area_bytes(plan: &EntryPlan, grid: [u32; 3], block: [u32; 3], dynamic_shared: u32) -> u64 {
    let (all, per_cta) = threads(grid, block);
    let ctas = all / per_cta.max(1);
    let bound = all
        .saturating_mul(u64::from(plan.record_bytes))
        .saturating_add(ctas.saturating_mul(shared_per_cta(plan, dynamic_shared)));
    if bound >= u64::MAX / 4 {
        return u64::MAX;
    }
    plan.save_area_bytes(grid, block, dynamic_shared)
}

/// Threads of a launch shape.
pub(crate) fn threads(grid: [u32; 3], block: [u32; 3]) -> (u64, u64) {
    let per_cta: u64 = block.iter().map(|&b| u64::from(b)).product();
    let ctas: u64 = grid.iter().map(|&g| u64::from(g)).product();
    (ctas.saturating_mul(per_cta), per_cta)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Completed fresh runs are kept as their kernel's durations (the adaptive request path's
    /// estimates) wherever `auto`'s wait gate does not keep them itself; errors are not.
    #[test]
    fn unwaited_completed_runs_are_recorded_once() {
        use std::time::Duration;
        let l = crate::engine::LaunchJob {
            space: crate::engine::SpaceId(1),
            module: crate::engine::ModuleId(2),
            entry: "k".into(),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dynamic_shared: 0,
            params: Vec::new(),
        };
        let key = || crate::ckwait::Key::of(&l);
        let done = |us| crate::engine::Outcome::Completed {
            gpu_time: Duration::from_micros(us),
        };
        let budget = Duration::from_micros(40);
        let c = CkptCounters::default();
        // The gate records under auto with a budget: not recorded twice.
        for _ in 0..3 {
            c.record_unwaited(PreemptMethod::Auto, budget, key, Some(&done(700)));
        }
        assert_eq!(c.waits.expected(&key()), None);
        // Under the other methods (and auto without a wait), completed runs are.
        c.record_unwaited(PreemptMethod::Checkpoint, budget, key, Some(&done(700)));
        c.record_unwaited(PreemptMethod::Checkpoint, budget, key, None);
        assert_eq!(c.waits.expected(&key()), None, "one run is not an estimate");
        c.record_unwaited(PreemptMethod::Auto, Duration::ZERO, key, Some(&done(1500)));
        assert_eq!(c.waits.expected(&key()), Some(Duration::from_micros(1500)));
        // A preempted run: only a time past the estimate says more about the kernel.
        let stopped = |us| crate::engine::Outcome::Preempted {
            context: crate::engine::SavedContext::from_bytes(Vec::new()),
            gpu_time: Duration::from_micros(us),
        };
        for _ in 0..2 * crate::ckwait::RECENT {
            c.record_unwaited(PreemptMethod::Restart, budget, key, Some(&stopped(300)));
        }
        assert_eq!(
            c.waits.expected(&key()),
            Some(Duration::from_micros(1500)),
            "early stops do not make a kernel look short"
        );
        c.record_unwaited(PreemptMethod::Restart, budget, key, Some(&stopped(4000)));
        assert_eq!(c.waits.expected(&key()), Some(Duration::from_micros(4000)));
        let other = crate::ckwait::Key::of(&crate::engine::LaunchJob {
            entry: "j".into(),
            ..l.clone()
        });
        let k2 = || other.clone();
        c.record_unwaited(PreemptMethod::Restart, budget, k2, Some(&stopped(9)));
        assert_eq!(c.waits.expected(&other), None, "no estimate: not recorded");
        c.path_chosen(true);
        c.path_chosen(false);
        c.path_chosen(false);
        let s = c.snapshot();
        assert_eq!((s.fast_path_launches, s.fixed_path_launches), (1, 2));
    }

    /// An escalated area (statuses of a restarting run stopped before any thread finished)
    /// read back after a run that ended unrequested must not pass for complete; a run whose
    /// threads all finished must.
    #[test]
    fn an_unrequested_run_is_complete_only_when_every_record_is_done() {
        let stopped = [STATUS_NOT_STARTED, STATUS_DONE, STATUS_NOT_STARTED, 7];
        let stride = 24u32;
        let area = status_area(&stopped, stride, 4 * u64::from(stride));
        let read: Vec<u32> = (0..4)
            .map(|i| {
                let o = i * stride as usize;
                u32::from_le_bytes(area[o..o + 4].try_into().unwrap())
            })
            .collect();
        assert_eq!(
            read,
            [
                STATUS_NOT_STARTED,
                STATUS_DONE,
                STATUS_NOT_STARTED,
                STATUS_NOT_STARTED
            ]
        );
        assert!(!unrequested_end_complete(&read));
        assert!(!unrequested_end_complete(&[STATUS_DONE, 5]));
        assert!(unrequested_end_complete(&[STATUS_DONE; 32]));
        assert!(unrequested_end_complete(&[]));
    }
}
