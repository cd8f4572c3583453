//! The VM's side of the grant word (protocol version 4, `vgpu_proto::word`): memory shared
//! with the daemon through which it takes back a grant this VM has not taken yet, or a turn's
//! grant it keeps between two jobs, without this process being scheduled (issue 25: during a
//! boot storm the worker that would take the grant, or the reader thread that would give it
//! back, waited milliseconds for a core).
//!
//! The daemon writes `Granted` before it sends a grant; the worker, taking it, moves `Granted
//! → Running` (`take_granted`), and finding `Revoked` instead (the daemon took it back at its
//! stop, counted as preempted with nothing run, and set the VM aside until it asks again), it
//! sends nothing for that grant, sends a new `Want` (the sign that it is awake) and runs its
//! next grant whatever its deadline (`returned_late`: the daemon does not take that one back
//! unstarted either). The worker writes `Kept` after the `Progress` of a job it follows with
//! another under the same grant; before that next job it moves `Kept → Running`, and finding
//! `Revoked` instead, it treats the grant as ended (the daemon counted it as `Done { preempted,
//! more }`: the VM is still queued) and waits for a new one. Any thread that would give a grant
//! back by message (`give_up_kept`, `idle`, a late grant handed back, a grant crossing an
//! `Idle`) first moves `Kept → Free` or `Granted → Free`: losing to the daemon's `Revoked`, it
//! sends nothing for the grant. A word naming a later grant means the same as `Revoked` (the
//! daemon wrote its next grant's `Granted`). A message of the daemon is handled only after the
//! state agrees with the word (`reconcile`), so that a grant that follows a revocation is taken
//! as the new grant it is. Without a word (an older daemon, none made) every step is as before.

use vgpu_proto::word::{GrantWord, Resumed, State, ended};

use super::*;

impl Inner {
    /// The daemon's word for this connection came (`ToVm::GrantWord`).
    pub(super) fn take_word(&self, st: &mut St, fd: Option<OwnedFd>) {
        let Some(fd) = fd else {
            return log::error!("vgpu: vgpud sent a grant word without its memory object");
        };
        match GrantWord::map(&fd) {
            Ok(w) => st.word = Some(w),
            Err(e) => log::error!("vgpu: grant word not used: {e}"),
        }
    }

    /// Writes `(seq, state)` to the word, if there is one.
    pub(super) fn word_store(&self, st: &St, seq: u64, state: State) {
        if let Some(w) = &st.word {
            w.store(seq, state);
        }
    }

    /// The worker is about to run a job under the kept grant `seq`: false when the daemon took
    /// it back (the state then says so: no grant, a want outstanding without its identity).
    pub(super) fn resume_kept(&self, st: &mut St, seq: u64) -> bool {
        let Some(w) = &st.word else {
            return true;
        };
        match w.resume(seq, State::Kept) {
            Resumed::Go => true,
            Resumed::Revoked => {
                log::debug!("vgpu: kept grant {seq} was taken back by vgpud");
                self.revoked(st);
                false
            }
            Resumed::Other(v) => {
                // Nobody but this process and the daemon's exact swap writes it: not ours to
                // guess; the messages decide, as without a word.
                log::warn!("vgpu: grant word {v:#x} for kept grant {seq}: ignored");
                true
            }
        }
    }

    /// The worker takes the grant `seq` it was sent (`Granted → Running`): false when the
    /// daemon took it back before (the state then says so: no grant, no want outstanding, so
    /// that the worker's loop sends a new `Want`; its next grant runs whatever its deadline).
    pub(super) fn take_granted(&self, st: &mut St, seq: u64) -> bool {
        let Some(w) = &st.word else {
            return true;
        };
        match w.resume(seq, State::Granted) {
            Resumed::Go => true,
            Resumed::Revoked => {
                log::debug!("vgpu: grant {seq} was taken back by vgpud before it was taken");
                self.revoked_unstarted(st);
                false
            }
            Resumed::Other(v) => {
                // Not the daemon's `Granted` (nothing else writes it): the messages decide, as
                // without a word; the word says the grant runs.
                log::debug!("vgpu: grant word {v:#x} at grant {seq}: running it");
                w.store(seq, State::Running);
                true
            }
        }
    }

    /// Lets go of the kept grant `seq` before giving it back by message: false when the daemon
    /// took it back already (nothing is to be sent for it).
    pub(super) fn let_go(&self, st: &St, seq: u64) -> bool {
        self.let_go_from(st, seq, State::Kept)
    }

    /// Lets go of the grant `seq` not taken yet before giving it back by message: false when
    /// the daemon took it back already (nothing is to be sent for it; the caller then says so
    /// with `revoked_unstarted`).
    pub(super) fn let_go_granted(&self, st: &St, seq: u64) -> bool {
        self.let_go_from(st, seq, State::Granted)
    }

    fn let_go_from(&self, st: &St, seq: u64, from: State) -> bool {
        match st.word.as_ref().map(|w| w.swap(seq, from, State::Free)) {
            None | Some(Ok(())) => true,
            Some(Err(v)) => !ended(v, seq),
        }
    }

    /// The state catches up with a revocation the daemon made through the word while this
    /// process was elsewhere (before any message of the daemon is acted on).
    pub(super) fn reconcile(&self, st: &mut St) {
        if !st.held {
            return;
        }
        let Some((seq, _)) = &st.active else {
            return;
        };
        if st.word.as_ref().is_some_and(|w| ended(w.load(), *seq)) {
            self.revoked(st);
        }
    }

    /// A grant not taken yet is gone (the daemon took it back at its stop and set the VM aside
    /// until it asks again): a new `Want` goes out (`wanting` false), and the next grant runs
    /// whatever its deadline (a VM always late still progresses).
    pub(super) fn revoked_unstarted(&self, st: &mut St) {
        st.wanting = false;
        st.identified = false;
        st.returned_late = true;
    }

    /// The kept grant is gone (the daemon ended it as preempted, more work queued).
    fn revoked(&self, st: &mut St) {
        st.active = None;
        st.held = false;
        st.wanting = true;
        st.identified = false;
        // Its worker (doing the guest's work) off the GPU's priority and CPUs (`cpus=`): the
        // next holder runs there.
        self.lower(st);
    }
}
