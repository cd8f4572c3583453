//! CTA scheduling over worker threads, preemption and fault propagation.

use crate::exec::launch::{Launch, RunControl, RunOutcome, Stats};
use crate::memory::GlobalMemory;

/// Run a launch (not yet implemented: reports preemption without progress).
pub(crate) fn run(_l: &mut Launch, _mem: &dyn GlobalMemory, _ctl: &RunControl) -> RunOutcome {
    RunOutcome::Preempted(Stats::default())
}
