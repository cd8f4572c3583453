//! The `Policy` trait (one scheduling algorithm over the VMs of one priority class) and its four
//! implementations.

mod band;
mod budget;
mod credit;
mod fifo;
mod timeslice;

use std::fmt::Debug;
use std::time::Duration;

pub use band::Band;
pub use credit::Credit;
pub use fifo::Fifo;
pub use timeslice::Timeslice;

use crate::config::{Config, PolicyKind};
use crate::types::VmId;

/// What a policy chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Run this VM, preempting it after `slice` (`None`: until its job completes).
    Run { vm: VmId, slice: Option<Duration> },
    /// Keep the GPU idle until `until` or until `vm` submits.
    Wait { vm: VmId, until: Duration },
}

/// One scheduling algorithm over the VMs of one priority class.
///
/// The [`crate::Scheduler`] validates every event before a policy sees it, so a policy may rely
/// on this contract (and still must not panic if it is broken):
/// - `add` before any other event of a VM; nothing after `remove`;
/// - `on_submit` once per job queued; `on_idle` when the VM's last queued job is gone (it
///   completed, faulted, or the queue was dropped): the VM must not be picked until it submits;
/// - `pick` is called only when at least one VM of the class has queued jobs and the GPU is
///   free; a `Run` choice is a grant: the next event of that VM is `on_complete` or
///   `on_preempted` (or `remove`);
/// - times never go backwards.
pub trait Policy: Debug + Send {
    fn kind(&self) -> PolicyKind;
    fn add(&mut self, vm: VmId, weight: u32, now: Duration);
    fn remove(&mut self, vm: VmId, now: Duration);
    /// New weight for a registered VM (takes effect from the next decision / period).
    fn set_weight(&mut self, vm: VmId, weight: u32, now: Duration);
    /// One job queued for `vm`. Returns true when the VM running in this class (if any) should
    /// be preempted now in favour of `vm`.
    fn on_submit(&mut self, vm: VmId, now: Duration) -> bool;
    /// `vm` has no queued jobs left.
    fn on_idle(&mut self, vm: VmId, now: Duration);
    /// The granted run of `vm` ended with its job complete (or faulted), using `gpu_time`.
    fn on_complete(&mut self, vm: VmId, gpu_time: Duration, now: Duration);
    /// The granted run of `vm` was preempted after `gpu_time`; its job stays queued (resumed later).
    fn on_preempted(&mut self, vm: VmId, gpu_time: Duration, now: Duration);
    /// Chooses among the VMs with queued jobs; `None` only if none has any.
    fn pick(&mut self, now: Duration) -> Option<Choice>;
    /// The GPU was granted to `vm` of another class. A policy that keeps a turn for an idle VM
    /// (TIMESLICE) ends it here: the turn is kept only until the next grant, and a grant in
    /// another class is one (without this, a VM alone in a higher class went on with one old
    /// turn across its idle gaps and was preempted mid-request at that turn's stale end).
    fn on_foreign_grant(&mut self, _vm: VmId, _now: Duration) {}
    /// A guess, changing nothing, of the VM the next new turn goes to if `running` stops now
    /// (for dispatchers that warn the next VM ahead); `None` when the policy cannot tell.
    fn peek_next(&self, _running: Option<VmId>) -> Option<VmId> {
        None
    }
}

/// Makes the policy `kind` with the parameters of `config`.
pub fn make_policy(kind: PolicyKind, config: &Config) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Fifo => Box::new(Fifo::default()),
        PolicyKind::Credit => Box::new(Credit::new(config.credit_period)),
        PolicyKind::Band => Box::new(Band::new(config.band_period, config.band_wait)),
        PolicyKind::Timeslice => {
            let wake = config.wake_preempt.then_some(config.wake_granularity);
            let many = config.slice_many.map(|s| (config.many_vms, s));
            Box::new(Timeslice::new(config.slice, many, wake))
        }
    }
}

/// Nanoseconds of a duration as i128 (budgets can go negative).
pub(crate) fn ns(d: Duration) -> i128 {
    i128::try_from(d.as_nanos()).unwrap_or(i128::MAX)
}

/// `period × weight / total` in nanoseconds (a VM's share of a period); 0 when `total` is 0.
pub(crate) fn share_of(period: Duration, weight: u32, total: u64) -> i128 {
    if total == 0 {
        return 0;
    }
    ns(period).saturating_mul(i128::from(weight)) / i128::from(total)
}
