//! BAND (Gdev / GPUvm): budgets reset to each VM's share every period; the current VM keeps the
//! GPU while it has budget (waiting briefly for its next submission); over budget → tail.

use std::time::Duration;

use super::budget::Budgets;
use super::{Choice, Policy, share_of};
use crate::config::PolicyKind;
use crate::types::VmId;

/// Non-preemptive bandwidth scheduler.
#[derive(Debug)]
pub struct Band {
    b: Budgets,
    wait: Duration,
    /// The VM that ran last, and when its last run ended.
    current: Option<(VmId, Duration)>,
}

impl Band {
    pub fn new(period: Duration, wait: Duration) -> Self {
        Self {
            b: Budgets::new(period),
            wait,
            current: None,
        }
    }

    /// At each period boundary every budget is reset to the VM's share (debt forgiven).
    fn replenish(&mut self, now: Duration) {
        self.b.advance(now, |b, _| {
            // Shares of the period go to the VMs that were active; one that was not gets the
            // share it would have had next to them.
            let total = b.active_weight();
            let all_active = b.vms.values().all(|v| v.active) || b.vms.values().all(|v| !v.active);
            let period = b.period;
            for vm in b.vms.values_mut() {
                let with = if vm.active || all_active {
                    total
                } else {
                    total + u64::from(vm.weight)
                };
                vm.budget = share_of(period, vm.weight, with);
            }
        });
    }

    fn charge(&mut self, vm: VmId, gpu_time: Duration, now: Duration) {
        self.b.charge(vm, gpu_time);
        self.current = Some((vm, now));
    }
}

impl Policy for Band {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Band
    }
    fn add(&mut self, vm: VmId, weight: u32, now: Duration) {
        // Before the first period, budgets are set when it starts; after, a newcomer starts with
        // its share.
        let budget = if self.b.started() {
            self.replenish(now);
            share_of(
                self.b.period,
                weight,
                self.b.total_weight() + u64::from(weight),
            )
        } else {
            0
        };
        self.b.insert(vm, weight, budget);
    }
    fn set_weight(&mut self, vm: VmId, weight: u32, _now: Duration) {
        self.b.set_weight(vm, weight);
    }
    fn remove(&mut self, vm: VmId, _now: Duration) {
        self.b.remove(vm);
        if self.current.is_some_and(|(c, _)| c == vm) {
            self.current = None;
        }
    }
    fn on_submit(&mut self, vm: VmId, _now: Duration) -> bool {
        self.b.submit(vm);
        false
    }
    fn on_idle(&mut self, vm: VmId, _now: Duration) {
        self.b.idle(vm);
    }
    fn on_complete(&mut self, vm: VmId, gpu_time: Duration, now: Duration) {
        self.charge(vm, gpu_time, now);
    }
    fn on_preempted(&mut self, vm: VmId, gpu_time: Duration, now: Duration) {
        self.charge(vm, gpu_time, now);
    }
    fn pick(&mut self, now: Duration) -> Option<Choice> {
        self.replenish(now);
        if let Some((c, ended)) = self.current
            && self.b.budget(c) > 0
        {
            if self.b.queue.contains(&c) {
                return Some(Choice::Run { vm: c, slice: None });
            }
            let until = ended.saturating_add(self.wait);
            if now < until {
                return Some(Choice::Wait { vm: c, until });
            }
        }
        // Switch: round robin from the queue, VMs with budget first, over-budget ones last.
        let vm = self.b.rotate(|budget| budget > 0)?;
        self.current = Some((vm, now));
        Some(Choice::Run { vm, slice: None })
    }
}
