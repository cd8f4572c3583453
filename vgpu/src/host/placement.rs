//! Where and at which priority the link's threads run, around grants: the worker raised
//! (`boost`) while it waits for or holds a grant, or with `cpus=` (`pin`) moved onto the GPU's
//! CPUs while it waits and raised only once it holds one, its reader thread there too while the
//! VM holds the grant; and both back when the grant ends.

use super::{Inner, St};

impl Inner {
    /// The calling thread waits for a grant or holds one: it runs at the GPU's priority until
    /// the grant ends (or the wait is given up).
    pub(super) fn raise(&self, st: &mut St) {
        if st.boosted.is_none() {
            st.boosted = self.boost.raise();
        }
    }

    /// The calling thread (the worker, waiting for a grant or holding one) onto the GPU's CPUs
    /// (`cpus=`, `pin`).
    pub(super) fn pin(&self, st: &mut St) {
        if st.pinned.is_none() {
            st.pinned = self.pin.pin();
        }
    }

    /// The worker starts a run under a grant: raised (`boost`), and with its reader thread on
    /// the GPU's CPUs (`pin`).
    pub(super) fn take_gpu(&self, st: &mut St) {
        self.raise(st);
        self.pin(st);
        self.pin_reader(st);
    }

    /// The VM holds a grant: the reader thread, which delivers the preempts while a job runs,
    /// onto the GPU's CPUs too (`pin`).
    pub(super) fn pin_reader(&self, st: &mut St) {
        let tid = self.reader_tid.load(std::sync::atomic::Ordering::Relaxed);
        if st.reader_pinned.is_none() && tid != 0 && self.pin.active() {
            st.reader_pinned = self.pin.pin_tid(tid);
        }
    }

    /// The grant ended (or the wait was given up): the thread goes back to its own level.
    pub(super) fn lower(&self, st: &mut St) {
        self.lower_priority(st);
        self.unpin(st);
    }

    /// Off the GPU's CPUs (`cpus=`), back on the thread's own.
    pub(super) fn unpin(&self, st: &mut St) {
        if let Some(p) = st.pinned.take() {
            self.pin.unpin(p);
        }
        self.unpin_reader(st);
    }

    /// The VM holds no grant: the reader thread back on its own CPUs.
    pub(super) fn unpin_reader(&self, st: &mut St) {
        if let Some(p) = st.reader_pinned.take() {
            self.pin.unpin(p);
        }
    }

    /// A grant kept between two jobs: the thread's own priority again, on the CPUs it has.
    pub(super) fn lower_priority(&self, st: &mut St) {
        if let Some(r) = st.boosted.take() {
            self.boost.lower(r);
        }
    }
}
