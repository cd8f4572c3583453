//! CREDIT (GPUvm): each period the VMs active in it are credited their share of the period's
//! wall time (busy + idle, × weight / active weight); runs are debited; negative budget → tail.

use std::time::Duration;

use super::budget::Budgets;
use super::{Choice, Policy, share_of};
use crate::config::PolicyKind;
use crate::types::VmId;

/// Round robin over the VMs with work, those with a non-negative budget first; non-preemptive.
#[derive(Debug)]
pub struct Credit {
    b: Budgets,
}

impl Credit {
    pub fn new(period: Duration) -> Self {
        Self {
            b: Budgets::new(period),
        }
    }

    /// Credits every elapsed period to the VMs active in it: budget += share per period, capped
    /// at one period's share (no VM banks credit, as in Xen's credit scheduler).
    fn replenish(&mut self, now: Duration) {
        self.b.advance(now, |b, periods| {
            let total = b.active_weight();
            let period = b.period;
            for vm in b.vms.values_mut().filter(|v| v.active) {
                let share = share_of(period, vm.weight, total);
                let credit = share.saturating_mul(i128::try_from(periods).unwrap_or(i128::MAX));
                vm.budget = vm.budget.saturating_add(credit).min(share);
            }
        });
    }
}

impl Policy for Credit {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Credit
    }
    fn add(&mut self, vm: VmId, weight: u32, now: Duration) {
        // Before the first period, budgets are set when it starts; after, a newcomer starts
        // neutral (0) once the periods so far are accounted.
        if self.b.started() {
            self.replenish(now);
        }
        self.b.insert(vm, weight, 0);
    }
    fn set_weight(&mut self, vm: VmId, weight: u32, _now: Duration) {
        self.b.set_weight(vm, weight);
    }
    fn remove(&mut self, vm: VmId, _now: Duration) {
        self.b.remove(vm);
    }
    fn on_submit(&mut self, vm: VmId, _now: Duration) -> bool {
        self.b.submit(vm);
        false
    }
    fn on_idle(&mut self, vm: VmId, _now: Duration) {
        self.b.idle(vm);
    }
    fn on_complete(&mut self, vm: VmId, gpu_time: Duration, _now: Duration) {
        self.b.charge(vm, gpu_time);
    }
    fn on_preempted(&mut self, vm: VmId, gpu_time: Duration, _now: Duration) {
        self.b.charge(vm, gpu_time);
    }
    fn pick(&mut self, now: Duration) -> Option<Choice> {
        self.replenish(now);
        let vm = self.b.rotate(|budget| budget >= 0)?;
        Some(Choice::Run { vm, slice: None })
    }
}
