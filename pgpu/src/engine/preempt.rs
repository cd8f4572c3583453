//! `PreemptHandle`: asks running jobs to stop, from any thread, and keeps the timestamps that
//! preemption and restore latency are measured with.

use crate::sync::lock;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Asks a running job to stop at its next preemption point, from any thread.
///
/// Cloning shares the flag; one handle may cover several jobs running at once (a request stops
/// them all). The flag stays set until [`PreemptHandle::clear`]; a job started
/// with the flag set is preempted at its first preemption point. The time of the latest request
/// is kept so that preemption latency can be measured.
#[derive(Debug, Clone, Default)]
pub struct PreemptHandle {
    inner: Arc<PreemptInner>,
}

/// Called on a preemption request, for engines whose inner loop polls a flag of its own.
pub(crate) type PreemptHook = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct PreemptInner {
    flag: AtomicBool,
    requested_at: Mutex<Option<Instant>>,
    running_since: Mutex<Option<Instant>>,
    /// Kernels running under this handle stop by themselves at this instant (a time slice's
    /// end), with no thread woken to ask.
    deadline: Mutex<Option<Instant>>,
    /// Hooks of the jobs running under this handle, by attach number.
    hooks: Mutex<Vec<(u64, PreemptHook)>>,
    next_hook: AtomicU64,
    /// The handle of a child's caller (`child`): marked running with it.
    parent: Option<PreemptHandle>,
}

impl fmt::Debug for PreemptInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreemptInner")
            .field("flag", &self.flag)
            .finish_non_exhaustive()
    }
}

impl PreemptHandle {
    /// A new handle with the flag clear.
    pub fn new() -> Self {
        Self::default()
    }
    /// Requests preemption (idempotent) and returns the time of the request.
    pub fn request(&self) -> Instant {
        let now = Instant::now();
        *lock(&self.inner.requested_at) = Some(now);
        self.inner.flag.store(true, Ordering::SeqCst);
        for (_, hook) in lock(&self.inner.hooks).iter() {
            hook();
        }
        now
    }
    /// Clears a request (before reusing the handle for the next job).
    pub fn clear(&self) {
        self.inner.flag.store(false, Ordering::SeqCst);
        *lock(&self.inner.requested_at) = None;
    }
    /// Whether preemption is requested (or the deadline has passed).
    pub fn is_requested(&self) -> bool {
        self.inner.flag.load(Ordering::Acquire)
            || self.deadline().is_some_and(|d| Instant::now() >= d)
    }
    /// Jobs started from now on under this handle preempt themselves at `deadline` (engines
    /// that support it check the clock at their preemption points: the sim engine's kernels);
    /// `None` removes it. A request through `request` works as before.
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        *lock(&self.inner.deadline) = deadline;
    }
    /// The deadline set by `set_deadline`.
    pub fn deadline(&self) -> Option<Instant> {
        *lock(&self.inner.deadline)
    }
    /// When the latest request was made, if the flag is set.
    pub fn requested_at(&self) -> Option<Instant> {
        *lock(&self.inner.requested_at)
    }
    /// When the engine last started (or resumed) running a job under this handle: for
    /// measuring restore latency (`resume` called → job running).
    pub fn running_since(&self) -> Option<Instant> {
        *lock(&self.inner.running_since)
    }
    /// Records that the job is now running (engines call this once state is restored).
    pub(crate) fn mark_running(&self) {
        let now = Instant::now();
        *lock(&self.inner.running_since) = Some(now);
        if let Some(p) = &self.inner.parent {
            *lock(&p.inner.running_since) = Some(now);
        }
    }
    /// A handle of its own for one job run on behalf of this one (`ckwait`: requests reach it
    /// when the engine decides): the same deadline, and marking it running marks this one.
    pub(crate) fn child(&self) -> PreemptHandle {
        PreemptHandle {
            inner: Arc::new(PreemptInner {
                deadline: Mutex::new(self.deadline()),
                parent: Some(self.clone()),
                ..PreemptInner::default()
            }),
        }
    }
    /// Installs `hook` to be called on every request until the returned guard drops; calls it
    /// at once if a request is already pending (no request is lost in between).
    pub(crate) fn attach(&self, hook: PreemptHook) -> HookGuard<'_> {
        let id = self.inner.next_hook.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.hooks).push((id, hook.clone()));
        if self.inner.flag.load(Ordering::SeqCst) {
            hook();
        }
        HookGuard { handle: self, id }
    }
    /// The flag itself, for engines that poll it in an inner loop.
    pub fn flag(&self) -> &AtomicBool {
        &self.inner.flag
    }
}

/// Removes a preemption hook when dropped.
pub(crate) struct HookGuard<'a> {
    handle: &'a PreemptHandle,
    id: u64,
}

impl Drop for HookGuard<'_> {
    fn drop(&mut self) {
        lock(&self.handle.inner.hooks).retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn preempt_hooks_fire_for_every_attached_job_and_late_attach() {
        let h = PreemptHandle::new();
        let n = Arc::new(AtomicU32::new(0));
        let hook = |n: &Arc<AtomicU32>| -> PreemptHook {
            let n = n.clone();
            Arc::new(move || {
                n.fetch_add(1, Ordering::SeqCst);
            })
        };
        let g1 = h.attach(hook(&n));
        let g2 = h.attach(hook(&n));
        assert!(h.requested_at().is_none());
        h.request();
        assert_eq!(n.load(Ordering::SeqCst), 2);
        drop(g1);
        h.request();
        assert_eq!(
            n.load(Ordering::SeqCst),
            3,
            "the second job's hook survives the first's end"
        );
        drop(g2);
        // Attaching while a request is pending fires at once.
        let _g3 = h.attach(hook(&n));
        assert_eq!(n.load(Ordering::SeqCst), 4);
        h.clear();
        assert!(!h.is_requested() && h.requested_at().is_none());
        let _g4 = h.attach(hook(&n));
        assert_eq!(n.load(Ordering::SeqCst), 4);
    }
}
