//! The VM's side of the grant word (protocol version 4, `vgpu_proto::word`): memory shared
//! with the daemon through which it takes back a turn's grant this VM keeps between two jobs
//! without this process being scheduled (issue 25: during a boot storm the reader thread that
//! would give it back waited milliseconds for a core).
//!
//! The worker writes `Running` when it takes a grant and `Kept` after the `Progress` of a job
//! it follows with another under the same grant; before that next job it moves `Kept →
//! Running`, and finding `Revoked` instead, it treats the grant as ended (the daemon counted it
//! as `Done { preempted, more }`: the VM is still queued) and waits for a new one. Any thread
//! that would give the kept grant back by message (`give_up_kept`, `idle`) first moves `Kept →
//! Free`: losing to the daemon's `Revoked`, it sends nothing for the grant. A message of the
//! daemon is handled only after the state agrees with the word (`reconcile`), so that a grant
//! that follows a revocation is taken as the new grant it is. Without a word (an older daemon,
//! none made) every step is as before.

use vgpu_proto::word::{GrantWord, Resumed, State, decode};

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
        match w.resume(seq) {
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

    /// Lets go of the kept grant `seq` before giving it back by message: false when the daemon
    /// took it back already (nothing is to be sent for it).
    pub(super) fn let_go(&self, st: &St, seq: u64) -> bool {
        match st
            .word
            .as_ref()
            .map(|w| w.swap(seq, State::Kept, State::Free))
        {
            None | Some(Ok(())) => true,
            Some(Err(v)) => decode(v) != (seq, State::Revoked),
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
        if st
            .word
            .as_ref()
            .is_some_and(|w| decode(w.load()) == (*seq, State::Revoked))
        {
            self.revoked(st);
        }
    }

    /// The kept grant is gone (the daemon ended it as preempted, more work queued).
    fn revoked(&self, st: &mut St) {
        st.active = None;
        st.held = false;
        st.wanting = true;
        st.identified = false;
    }
}
