//! What the daemon does with each message of a VM process: registration (`Hello` → partition,
//! channel quota, scheduler entry, `Welcome` with the VRAM memory object; a re-registration
//! after a restart is `adopt`'s), `Want`/`Idle` (the
//! VM's queue in the scheduler, with the kernel identity of its job) and `Done` (end of a grant: charge, latencies, next job).
//! Anything out of order or malformed is refused with an `Error` and counted; nothing a VM
//! sends can touch another VM's state.

use std::os::fd::OwnedFd;
use std::time::Duration;

use scheduler::{Action, KernelKey, VmId};

use crate::daemon::Daemon;
use crate::proto::{self, Hello, RunOutcome, ToDaemon, ToVm, monotonic_ns};
use crate::session::{Limits, validate_hello};

impl Daemon {
    /// Handles one datagram from connection `c`, with the descriptor it carried (accepted
    /// only with a re-registration: its VRAM memory object).
    pub(crate) fn handle(&mut self, c: u64, bytes: &[u8], fd: Option<OwnedFd>) {
        let msg = match proto::decode::<ToDaemon>(bytes) {
            Ok(m) => m,
            Err(e) => return self.refuse(c, e.to_string(), false),
        };
        let claim = matches!(&msg, ToDaemon::Hello(h) if h.resume.is_some());
        if matches!(msg, ToDaemon::Done { .. } | ToDaemon::Progress { .. })
            && let Some(r) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut())
        {
            // The VM answered a grant itself: no longer late in a row (`kept`).
            r.unstarted_streak = 0;
        }
        if fd.is_some() && !claim {
            return self.refuse(
                c,
                "descriptors are accepted only with a re-registration".into(),
                false,
            );
        }
        let session = self.sessions.get(&c);
        let registered = session.and_then(|s| s.reg.as_ref()).map(|r| (r.id, r.gpu));
        // status: a connection that asked for status takes nothing else, ever.
        if session.is_some_and(|s| s.status.is_some()) && !matches!(msg, ToDaemon::Status { .. }) {
            return self.refuse_status(c, "a status connection takes only status requests".into());
        }
        match (msg, registered) {
            (ToDaemon::Status { part }, None) => self.status(c, part),
            (ToDaemon::Status { .. }, Some(_)) => self.refuse(
                c,
                "status is answered on a connection of its own, not on a VM's".into(),
                false,
            ),
            (ToDaemon::Hello(h), None) if claim => self.resume(c, h, fd),
            (ToDaemon::Hello(h), None) => self.hello(c, h),
            (ToDaemon::Hello(_), Some(_)) => self.refuse(c, "already registered".into(), false),
            (_, None) => self.refuse(c, "the first message must be hello".into(), true),
            (ToDaemon::Want { kernel }, Some((vm, _))) => self.want(c, vm, kernel.map(KernelKey)),
            (ToDaemon::Idle {}, Some((vm, _))) => self.idle(c, vm),
            (
                ToDaemon::Done {
                    seq,
                    outcome,
                    gpu_ns,
                    start_ns,
                    end_ns,
                    more,
                },
                Some((vm, _)),
            ) => self.done(c, vm, seq, outcome, gpu_ns, (start_ns, end_ns), more),
            (
                ToDaemon::Progress {
                    seq,
                    gpu_ns,
                    start_ns,
                    end_ns,
                },
                Some((vm, _)),
            ) => self.progress(c, vm, seq, gpu_ns, (start_ns, end_ns)),
            (ToDaemon::Bye {}, Some(_)) => self.drop_session(c),
            // multigpu: moves between the daemon's GPUs (`moving`).
            (ToDaemon::Move { gpu }, Some(_)) => self.move_request(c, gpu),
            (ToDaemon::Moved {}, Some(_)) => self.move_commit(c),
            (ToDaemon::MoveAbort {}, Some(_)) => self.move_abort(c),
        }
    }

    /// The GPU index of registered connection `c` (0 for one that is not).
    fn gpu_of(&self, c: u64) -> usize {
        self.sessions
            .get(&c)
            .and_then(|s| s.reg.as_ref())
            .map_or(0, |r| r.gpu)
    }

    fn refuse(&mut self, c: u64, why: String, fatal: bool) {
        self.report.refused += 1;
        if let Some(s) = self.sessions.get_mut(&c) {
            s.refuse(why, fatal);
        }
    }

    pub(crate) fn hello(&mut self, c: u64, reg: Hello) {
        // restart: first registrations wait during the adoption window (`adopt`).
        if self.defer_hello(c, &reg) {
            return;
        }
        // The checks that do not depend on the GPU, against the largest one (then placement).
        let limits = Limits {
            vram_free: self
                .gpus
                .iter()
                .map(|g| g.pool.free_bytes())
                .max()
                .unwrap_or(0),
            channels_free: self
                .gpus
                .iter()
                .map(|g| g.channels - g.channels_used)
                .max()
                .unwrap_or(0),
        };
        if let Err(why) = validate_hello(&reg, &limits) {
            return self.refuse(c, why, true);
        }
        let g = match crate::gpus::place(&self.gpus, reg.gpu, reg.vram, reg.channels) {
            Ok(g) => g,
            Err(why) => return self.refuse(c, why, true),
        };
        let offset = match self.gpus[g].pool.alloc(reg.vram) {
            Ok(o) => o,
            Err(e) => return self.refuse(c, e.to_string(), true),
        };
        let own = self.own_object(g);
        self.admit(c, reg, g, offset, own);
    }

    /// Marks `vm` queued (once) with the identity `key` of its job, and sends a preempt the
    /// scheduler asks for. A want while queued identifies the job queued by a `Done`'s `more`
    /// (whose identity the VM did not know yet).
    pub(crate) fn want(&mut self, c: u64, vm: VmId, key: Option<KernelKey>) {
        let g = self.gpu_of(c);
        // A crossing Want while the grant is in flight: the VM answers the grant instead.
        // One sent after the VM saw its grant taken back waits for the grant's end.
        if let Some(r) = self.gpus[g].run.as_mut().filter(|r| r.vm == vm) {
            if r.revoking {
                r.after_revoke = Some(crate::daemon::AfterRevoke::Want(key));
            }
            return;
        }
        let queued = self
            .sessions
            .get(&c)
            .and_then(|s| s.reg.as_ref())
            .is_some_and(|r| r.pending);
        if queued {
            // Any u64 a VM sends only names an entry of its own bounded tables.
            self.gpus[g].sched.identify(vm, key);
            return;
        }
        self.submit(c, vm, key);
        self.gpus[g].wait_until_ns = None;
    }

    fn submit(&mut self, c: u64, vm: VmId, key: Option<KernelKey>) {
        let g = self.gpu_of(c);
        let now = self.at(monotonic_ns());
        let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) else {
            return;
        };
        if reg.pending {
            return;
        }
        let gpu = &mut self.gpus[g];
        match gpu.sched.on_submit_kernel(vm, key, now) {
            Ok(action) => {
                log::debug!(
                    "vgpud: want of vm {} (kernel {:?}) at {}: {action:?}",
                    vm.0,
                    key.map(|k| k.0),
                    monotonic_ns()
                );
                reg.pending = true;
                reg.want_since_ns = monotonic_ns();
                if let Action::Preempt(v) = action {
                    self.preempt_now(g, v);
                } else if let Action::PreemptAt { vm: v, at } = action {
                    // Filling: the running filler should end within the bound; stop it then if
                    // it has not.
                    let at_ns = self.mono_of(at);
                    if let Some(r) = self.gpus[g].run.as_mut().filter(|r| r.vm == v) {
                        r.deadline_ns = r.deadline_ns.min(at_ns);
                        r.extended = false;
                    }
                } else if let Some(r) = &self.gpus[g].run
                    && r.extended
                    && r.vm != vm
                {
                    // The running turn was extended past its slice because nobody waited.
                    let v = r.vm;
                    self.preempt_now(g, v);
                }
            }
            Err(e) => self.refuse(c, format!("want: {e}"), false),
        }
    }

    /// Stops the running VM `v` of GPU `g` now (wake-up or priority preemption, a slice end or
    /// a run limit): takes its grant back through its word if it keeps it between two jobs or
    /// has not taken it yet (`kept`), else sends a preempt.
    pub(crate) fn preempt_now(&mut self, g: usize, v: VmId) {
        let now_ns = monotonic_ns();
        let Some(run) = self.gpus[g].run.as_mut().filter(|r| r.vm == v) else {
            return;
        };
        if run.preempt_sent_ns.is_some() {
            return;
        }
        run.preempt_sent_ns = Some(now_ns);
        let (conn, seq) = (run.conn, run.seq);
        // Planned at the run's deadline when that is what brought the stop (the slice end, the
        // backstop, a run limit), else now (a want).
        let planned_ns = if now_ns >= run.deadline_ns {
            run.deadline_ns
        } else {
            now_ns
        };
        self.report.preempts += 1;
        self.gpus[g].report.preempts += 1;
        if self.revoke_kept(g, planned_ns) {
            return;
        }
        let word = self.sessions.get_mut(&conn).is_some_and(|s| {
            s.send(&ToVm::Preempt { seq });
            s.reg.as_ref().is_some_and(|r| r.word.is_some())
        });
        if let Some(run) = self.gpus[g].run.as_mut().filter(|_| word) {
            // The VM may keep the grant before it reads the preempt: look at its word again.
            run.word_check_ns = Some(now_ns + crate::kept::RECHECK_NS);
        }
    }

    pub(crate) fn idle(&mut self, c: u64, vm: VmId) {
        let g = self.gpu_of(c);
        if let Some(r) = self.gpus[g].run.as_mut().filter(|r| r.vm == vm) {
            if r.revoking {
                r.after_revoke = Some(crate::daemon::AfterRevoke::Idle);
            }
            return;
        }
        let now = self.at(monotonic_ns());
        let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) else {
            return;
        };
        if !reg.pending {
            return;
        }
        match self.gpus[g].sched.on_idle(vm, now) {
            Ok(()) => reg.pending = false,
            Err(e) => log::error!("vgpud: idle of vm {}: {e}", vm.0),
        }
    }

    /// A job of a time-sliced grant finished; the VM goes on under the same grant.
    fn progress(&mut self, c: u64, vm: VmId, seq: u64, gpu_ns: u64, stamps: (u64, u64)) {
        let g = self.gpu_of(c);
        let ok = self.gpus[g]
            .run
            .as_ref()
            .is_some_and(|r| r.vm == vm && r.seq == seq && r.turn);
        if !ok {
            return self.refuse(
                c,
                format!("progress for grant {seq}, which is not a running turn"),
                false,
            );
        }
        log::debug!(
            "vgpud: progress {seq} from vm {}: run {}..{} ns",
            vm.0,
            stamps.0,
            stamps.1
        );
        let gpu = self.record_job(c, vm, gpu_ns, stamps, false);
        if let Some(run) = &mut self.gpus[g].run {
            run.turn_gpu_ns += gpu;
            run.turn_jobs = run.turn_jobs.saturating_add(1);
        }
        // Per job inside the turn (filling): the finished job's GPU time is learned under its
        // identity; the job the VM goes on with is unidentified (the VM sends none inside a
        // turn). The policies see the whole turn at its end.
        let now = self.at(monotonic_ns());
        if let Err(e) = self.gpus[g]
            .sched
            .on_progress(vm, Duration::from_nanos(gpu), now)
        {
            log::error!("vgpud: progress of vm {}: {e}", vm.0);
        }
        if let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) {
            reg.report.completed += 1;
        }
    }

    /// Charges one finished job (or run) to the windows and the VM's total, and takes the
    /// latency samples its stamps give (only stamps in order inside the grant count). Returns the
    /// GPU time charged: the engine's report, capped so that the grant's jobs together never
    /// exceed the grant's wall time.
    fn record_job(
        &mut self,
        c: u64,
        vm: VmId,
        gpu_ns: u64,
        (start_ns, end_ns): (u64, u64),
        preempted: bool,
    ) -> u64 {
        let g = self.gpu_of(c);
        let now_ns = monotonic_ns();
        let now = self.at(now_ns);
        let origin_ns = self.mono_of(Duration::ZERO);
        // Since when another VM waits for the GPU (a grant given back with nobody waiting kept
        // no one from it).
        let waiting_since = self
            .sessions
            .values()
            .filter_map(|s| s.reg.as_ref())
            .filter(|r| r.pending && r.id != vm && r.gpu == g)
            .map(|r| r.want_since_ns)
            .min();
        let gpu = &mut self.gpus[g];
        let Some(run) = gpu.run.as_mut() else {
            return 0;
        };
        // The grant's jobs together never ran longer than the grant has existed.
        let wall = now_ns.saturating_sub(run.granted_ns);
        let gpu_ns = gpu_ns.min(wall.saturating_sub(run.turn_gpu_ns));
        let first = run.last_stamp_ns == run.granted_ns;
        let stamped = start_ns != 0
            && run.last_stamp_ns <= start_ns
            && start_ns <= end_ns
            && end_ns <= now_ns;
        // The grant's idle time since its previous job ended (none before its first job: that
        // is the switch's).
        let job_gap = (stamped && !first).then(|| start_ns - run.last_stamp_ns);
        if stamped {
            run.last_stamp_ns = end_ns;
        }
        // When the stop was due: the slice end the VM was told to stop at, or the preempt.
        let due = match (
            run.self_deadline.then_some(run.slice_end_ns),
            run.preempt_sent_ns,
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.accounting
            .charge(vm, Duration::from_nanos(gpu_ns), now);
        // A preemption's lateness, of a run that stopped or of a grant given back.
        let mut late_preempt = None;
        if stamped {
            // The daemon's totals and this GPU's own figures.
            let busy = end_ns - start_ns;
            self.report.busy_ns += busy;
            gpu.report.busy_ns += busy;
            if let Some(gap) = job_gap {
                self.report.job_gap_ns += gap;
                self.report.job_gaps += 1;
                gpu.report.job_gap_ns += gap;
                gpu.report.job_gaps += 1;
            }
            if preempted && let Some(due) = due {
                let late = end_ns.saturating_sub(due);
                late_preempt = Some(crate::report::LatePreempt {
                    vm: vm.0,
                    gpu: g as u32,
                    late_ns: late,
                    grant_to_start_ns: start_ns.saturating_sub(run.granted_ns),
                    start_to_due_ns: due as i64 - start_ns as i64,
                    run_ns: end_ns - start_ns,
                    slice_ns: run.slice_end_ns.saturating_sub(run.granted_ns),
                    jobs_before: run.turn_jobs,
                    extended: run.extended,
                    due_at_ns: due.saturating_sub(origin_ns),
                    kept: false,
                    ..Default::default()
                });
            }
            if first
                && let Some((prev, prev_end)) = gpu.last_end
                && prev != vm
                && start_ns >= prev_end
            {
                self.report.switch_latency_ns.push(start_ns - prev_end);
                self.report.switches += 1;
                gpu.report.switch_latency_ns.push(start_ns - prev_end);
                gpu.report.switches += 1;
            }
            gpu.last_end = Some((vm, end_ns));
        }
        // Since when a stop was wanted: a VM waiting, or the preempt (a grant given back with
        // nobody waiting kept no one from the GPU).
        let wanted = match (waiting_since, run.preempt_sent_ns) {
            (Some(w), Some(p)) => Some(w.min(p)),
            (w, p) => w.or(p),
        };
        if preempted
            && (start_ns, end_ns) == (0, 0)
            && (run.turn_jobs > 0 || run.unstarted)
            && let Some(wanted) = wanted
            && let Some(due) = due
        {
            // A turn's grant given back between two jobs (no run): the GPU stood idle from the
            // turn's last job, and the VMs waiting got it when this came — a preemption like
            // any other, timed to its receipt (issue 25: one kept 12.8 ms by a worker busy
            // elsewhere; the VM's reader thread gives it back at a preempt now, the backstop's
            // included, or its worker at its next acquire after the slice end; with a grant
            // word the daemon takes it back itself, `kept`). Late from when the stop was due
            // and wanted: a turn told its slice end that nobody waited for at its end goes on
            // (`extended`), yet the worker gives it back at its next job past that slice end;
            // timed from the slice end, that read as a stop late by the guest's CPU work (9-10
            // ms samples on the 2-core dev box, the daemon never having looked at the word),
            // though nobody waited, or only since a want (which also preempts an extended turn).
            // A grant taken back through the word before the VM took it (`unstarted`) is the
            // same kind of sample: nothing ran, the GPU went on when the daemon acted.
            let due = due.max(wanted);
            let late = now_ns.saturating_sub(due);
            late_preempt = Some(crate::report::LatePreempt {
                vm: vm.0,
                gpu: g as u32,
                late_ns: late,
                grant_to_start_ns: run.last_stamp_ns.saturating_sub(run.granted_ns),
                unstarted: run.unstarted,
                start_to_due_ns: 0,
                run_ns: 0,
                slice_ns: run.slice_end_ns.saturating_sub(run.granted_ns),
                jobs_before: run.turn_jobs,
                extended: run.extended,
                due_at_ns: due.saturating_sub(origin_ns),
                kept: !run.unstarted,
                revoked: run.revoked,
                word_looks: run.word_looks,
                look_late_ns: run.look_late_ns,
            });
        }
        if let Some(p) = late_preempt {
            self.report.preempt_latency_ns.push(p.late_ns);
            gpu.report.preempt_latency_ns.push(p.late_ns);
            crate::report::LatePreempt::keep(&mut self.report.worst_preemptions, p);
        }
        if stamped && first {
            // restart: the GPU in use again since the socket listened.
            self.note_use(None, Some(start_ns));
        }
        if let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) {
            reg.report.gpu_ns += gpu_ns;
        }
        gpu_ns
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn done(
        &mut self,
        c: u64,
        vm: VmId,
        seq: u64,
        outcome: RunOutcome,
        gpu_ns: u64,
        stamps: (u64, u64),
        more: bool,
    ) {
        let g = self.gpu_of(c);
        if !self.gpus[g]
            .run
            .as_ref()
            .is_some_and(|r| r.vm == vm && r.seq == seq)
        {
            return self.refuse(
                c,
                format!("done for grant {seq}, which is not running"),
                false,
            );
        }
        log::debug!(
            "vgpud: done {seq} from vm {}: {outcome:?}, more {more}, run {}..{} ns, now {}",
            vm.0,
            stamps.0,
            stamps.1,
            monotonic_ns()
        );
        let last = self.record_job(c, vm, gpu_ns, stamps, outcome == RunOutcome::Preempted);
        let Some(run) = self.gpus[g].run.take() else {
            return;
        };
        let now = self.at(monotonic_ns());
        // The scheduler sees the grant as one job: the whole turn's GPU time.
        let gpu = Duration::from_nanos(run.turn_gpu_ns + last);
        let sched = &mut self.gpus[g].sched;
        let r = match outcome {
            RunOutcome::Completed => sched.on_complete(vm, gpu, now),
            RunOutcome::Preempted => sched.on_preempted(vm, gpu, now),
            RunOutcome::Faulted => sched.on_fault(vm, gpu, now),
        };
        if let Err(e) = r {
            log::error!("vgpud: end of run of vm {}: {e}", vm.0);
        }
        let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) else {
            return;
        };
        match outcome {
            RunOutcome::Completed => reg.report.completed += u64::from(gpu_ns > 0),
            RunOutcome::Preempted => reg.report.preempted += 1,
            RunOutcome::Faulted => reg.report.faulted += 1,
        }
        let commit = reg.moving.is_some_and(|m| m.commit_pending);
        if outcome == RunOutcome::Preempted {
            // Queued again from now on (the standby hint goes to the VM waiting longest).
            reg.want_since_ns = monotonic_ns();
        } else {
            reg.pending = false;
            if more {
                // Its identity comes with the VM's next want.
                self.submit(c, vm, None);
            }
        }
        if commit {
            // multigpu: the `Moved` that waited for this grant's end.
            self.move_commit(c);
        }
    }
}
