//! A grant taken back by the daemon itself through the VM's grant word (protocol version 4,
//! `vgpu_proto::word`), without waiting for the VM process to be scheduled (issue 25: with 64
//! VMs booting on 16 cores, a kept grant's give-back by the VM's reader thread came 4–18 ms
//! after its stop was due, and a worker woken late took its grant 2–4 ms after its slice had
//! ended, the GPU idle meanwhile): a turn's grant the VM keeps between two jobs, or a grant the
//! VM has not taken yet.
//!
//! The daemon writes `Granted` to the word before it sends a grant. When a run's stop is due (a
//! preempt the daemon sends, its backstop, or the slice end the VM was told to stop at), it
//! first tries `Kept → Revoked`, then `Granted → Revoked`, on the word of the grant's `seq`.
//! Won: the grant ends at once as if the VM had sent `Done { preempted, more }` (a latency
//! sample, `revoked`, and `kept` or `unstarted`), no message goes out, and the next VM runs;
//! the VM finds `Revoked` at its next job, or when it takes the grant, and asks again. Lost (a
//! job runs, the VM gave the grant back first, or the word holds anything else): the preempt
//! message and its revocation deadline apply as before, and the word is looked at again every
//! `RECHECK` until the grant ends (a VM that kept the grant after the preempt went out, before
//! reading it). The word is the VM's to write: nothing in it is trusted beyond "the VM lets go
//! of this grant now".
//!
//! Progress: a VM whose grant was taken back unstarted is set aside (no longer queued: the
//! scheduler's `on_idle`) until it shows it is awake: its worker, finding `Revoked`, sends a new
//! `Want`, which queues it again. After `SPARE_AFTER` such take-backs in a row (none of its
//! grants answered by message in between: `Registered::unstarted_streak`), its next grant is
//! not taken back unstarted: it runs whatever its deadline, as the VM runs the grant after one
//! it handed back late or that was taken back. So a VM always woken late loses at most
//! `SPARE_AFTER` grants in a row (one more with a late hand-back of its own), never all of
//! them, and the GPU never waits for a VM that is asleep. More than one: a VM re-queued with
//! the least GPU time is picked again at once, likely still in the boot storm that made it
//! late, and a spared grant taken late is the preemption sample the take-back avoids.

use crate::daemon::Daemon;
use crate::proto::{self, RunOutcome, ToVm};
use vgpu_proto::word::GrantWord;

/// How often the word of a run whose stop is due is looked at again.
pub(crate) const RECHECK_NS: u64 = 250_000;

/// A VM's grant after this many of its grants in a row went back unstarted is spared (see the
/// module documentation).
pub const SPARE_AFTER: u32 = 3;

impl Daemon {
    /// The grant word of a version-4 VM that asked for one: made and sent right after its
    /// `Welcome` (a daemon that cannot make one serves the VM with messages alone). `None` for
    /// the others.
    pub(crate) fn give_word(&mut self, c: u64, version: u32, asked: bool) -> Option<GrantWord> {
        if !asked || version < proto::WORD_VERSION {
            return None;
        }
        let s = self.sessions.get_mut(&c)?;
        let (word, fd) = match GrantWord::create() {
            Ok(w) => w,
            Err(e) => {
                log::warn!("vgpud: {}: no grant word: {e}", s.label());
                return None;
            }
        };
        use std::os::fd::AsFd;
        match s
            .conn
            .send(&proto::encode(&ToVm::GrantWord {}), Some(fd.as_fd()))
        {
            Ok(()) => Some(word),
            Err(e) => {
                log::warn!("vgpud: {}: grant word not sent: {e}", s.label());
                None
            }
        }
    }

    /// Takes back GPU `g`'s grant if its VM keeps it between two jobs (its word says `Kept`
    /// for this grant) or has not taken it yet (`Granted`, unless the grant is spared): ends it
    /// as a preemption now. `planned_ns`: when this look was due (the report's
    /// `look_late_ns`). True when the grant ended.
    pub(crate) fn revoke_kept(&mut self, g: usize, planned_ns: u64) -> bool {
        let Some(run) = &self.gpus[g].run else {
            return false;
        };
        let (c, vm, seq, unstarted_ok) = (run.conn, run.vm, run.seq, run.may_revoke_unstarted);
        let Some(word) = self
            .sessions
            .get(&c)
            .and_then(|s| s.reg.as_ref())
            .filter(|r| r.id == vm)
            .and_then(|r| r.word.as_ref())
        else {
            return false;
        };
        let kept = word.revoke(seq);
        let unstarted = !kept && unstarted_ok && word.revoke_unstarted(seq);
        let took = kept || unstarted;
        let now_ns = proto::monotonic_ns();
        if let Some(r) = &mut self.gpus[g].run {
            r.word_looks = r.word_looks.saturating_add(1);
            r.look_late_ns = now_ns.saturating_sub(planned_ns);
        }
        if !took {
            return false;
        }
        if kept {
            // The VM stores `Kept` only after sending the `Progress` of the turn's last job:
            // read it (and anything before it) so that the job is charged to this grant. A
            // `Want`/`Idle` behind it (the VM saw `Revoked` meanwhile) is kept for after.
            if let Some(r) = &mut self.gpus[g].run {
                r.revoking = true;
            }
            self.read_all(c);
        }
        let after = self.gpus[g]
            .run
            .as_mut()
            .filter(|r| r.vm == vm && r.seq == seq)
            .and_then(|r| {
                r.revoking = false;
                r.after_revoke.take()
            });
        if !self.gpus[g]
            .run
            .as_ref()
            .is_some_and(|r| r.vm == vm && r.seq == seq)
        {
            // The session went away meanwhile (a malformed message closed it, say).
            return true;
        }
        if let Some(r) = &mut self.gpus[g].run {
            r.revoked = true;
            r.unstarted = unstarted;
        }
        if unstarted {
            self.report.unstarted_revoked += 1;
        } else {
            self.report.kept_revoked += 1;
        }
        log::debug!(
            "vgpud: grant {seq} of vm {} taken back through its word{} at {}",
            vm.0,
            if unstarted { " before it took it" } else { "" },
            proto::monotonic_ns()
        );
        self.done(c, vm, seq, RunOutcome::Preempted, 0, (0, 0), true);
        if unstarted {
            self.set_aside(c, vm);
        }
        match after {
            Some(crate::daemon::AfterRevoke::Want(key)) => self.want(c, vm, key),
            Some(crate::daemon::AfterRevoke::Idle) => self.idle(c, vm),
            None => {}
        }
        true
    }

    /// A VM whose grant was taken back before it took it is no longer queued until its next
    /// `Want` (it shows it is awake), and one more such take-back counts towards sparing its
    /// next grant (see the module documentation).
    fn set_aside(&mut self, c: u64, vm: scheduler::VmId) {
        let now = self.at(proto::monotonic_ns());
        let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) else {
            return;
        };
        // Its GPU now: the grant's end may have committed a move to another (multigpu).
        let g = reg.gpu;
        reg.unstarted_streak = reg.unstarted_streak.saturating_add(1);
        if !reg.pending {
            return;
        }
        match self.gpus[g].sched.on_idle(vm, now) {
            Ok(()) => reg.pending = false,
            Err(e) => log::error!("vgpud: vm {} set aside: {e}", vm.0),
        }
    }

    /// Looks at the word of GPU `g`'s run when its stop is due and a look is scheduled
    /// (`Run::word_check_ns`); schedules the next look. `others`: other VMs wait for the GPU
    /// (a slice end the VM was told is due only then). True when the grant ended.
    pub(crate) fn recheck_word(&mut self, g: usize, now_ns: u64, others: bool) -> bool {
        let Some(run) = &mut self.gpus[g].run else {
            return false;
        };
        if run.word_check_ns.is_none_or(|t| now_ns < t) {
            return false;
        }
        let planned_ns = run.word_check_ns.unwrap_or(now_ns);
        run.word_check_ns = Some(now_ns + RECHECK_NS);
        let due = run.preempt_sent_ns.is_some()
            || (run.self_deadline && others && now_ns >= run.slice_end_ns);
        due && self.revoke_kept(g, planned_ns)
    }
}
