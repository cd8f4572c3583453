//! CREDIT (GPUvm): each period the VMs active in it are credited their share of the period's
//! wall time (busy + idle, × weight / active weight); runs are debited; negative budget → tail.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::{Choice, Policy, ns, share_of};
use crate::config::PolicyKind;
use crate::types::VmId;

#[derive(Debug)]
struct Vm {
    weight: u32,
    /// Had queued jobs at some time in the current period (shares go to these VMs).
    active: bool,
    /// Nanoseconds of GPU time the VM may still use; negative = in debt.
    budget: i128,
}

/// Round robin over the VMs with work, those with a non-negative budget first; non-preemptive.
#[derive(Debug)]
pub struct Credit {
    period: Duration,
    vms: BTreeMap<VmId, Vm>,
    /// VMs with queued jobs, in round-robin order.
    queue: VecDeque<VmId>,
    period_start: Option<Duration>,
}

impl Credit {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            vms: BTreeMap::new(),
            queue: VecDeque::new(),
            period_start: None,
        }
    }

    fn total_weight(&self) -> u64 {
        self.vms.values().map(|v| u64::from(v.weight)).sum()
    }

    /// Weight of the VMs active in the period (all VMs if none was).
    fn active_weight(&self) -> u64 {
        let active: u64 = self
            .vms
            .values()
            .filter(|v| v.active)
            .map(|v| u64::from(v.weight))
            .sum();
        if active == 0 {
            self.total_weight()
        } else {
            active
        }
    }

    /// Starts a period: a VM is active in it if it has queued jobs now.
    fn reset_active(&mut self) {
        for (id, vm) in &mut self.vms {
            vm.active = self.queue.contains(id);
        }
    }

    /// Credits every elapsed period to the VMs active in it: budget += share per period, capped
    /// at one period's share (no VM banks credit, as in Xen's credit scheduler).
    fn replenish(&mut self, now: Duration) {
        let Some(start) = self.period_start else {
            // The first period starts at the first decision, with every VM registered by then.
            self.period_start = Some(now);
            let total = self.total_weight();
            for vm in self.vms.values_mut() {
                vm.budget = share_of(self.period, vm.weight, total);
            }
            return;
        };
        let Some(elapsed) = now.checked_sub(start) else {
            return;
        };
        let periods = elapsed.as_nanos() / self.period.as_nanos().max(1);
        if periods == 0 {
            return;
        }
        let total = self.active_weight();
        for vm in self.vms.values_mut().filter(|v| v.active) {
            let share = share_of(self.period, vm.weight, total);
            let credit = share.saturating_mul(i128::try_from(periods).unwrap_or(i128::MAX));
            vm.budget = vm.budget.saturating_add(credit).min(share);
        }
        let advance = self
            .period
            .saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX));
        self.period_start = Some(start.saturating_add(advance));
        self.reset_active();
    }

    fn charge(&mut self, vm: VmId, gpu_time: Duration) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.budget = v.budget.saturating_sub(ns(gpu_time));
        }
    }
}

impl Policy for Credit {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Credit
    }
    fn add(&mut self, vm: VmId, weight: u32, now: Duration) {
        // Before the first period, budgets are set when it starts; after, a newcomer starts neutral (0).
        let budget = if self.period_start.is_some() {
            self.replenish(now);
            0
        } else {
            0
        };
        self.vms.insert(
            vm,
            Vm {
                weight,
                active: false,
                budget,
            },
        );
    }
    fn set_weight(&mut self, vm: VmId, weight: u32, _now: Duration) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.weight = weight;
        }
    }
    fn remove(&mut self, vm: VmId, _now: Duration) {
        self.vms.remove(&vm);
        self.queue.retain(|&v| v != vm);
    }
    fn on_submit(&mut self, vm: VmId, _now: Duration) -> bool {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.active = true;
            if !self.queue.contains(&vm) {
                self.queue.push_back(vm);
            }
        }
        false
    }
    fn on_idle(&mut self, vm: VmId, _now: Duration) {
        self.queue.retain(|&v| v != vm);
    }
    fn on_complete(&mut self, vm: VmId, gpu_time: Duration, _now: Duration) {
        self.charge(vm, gpu_time);
    }
    fn on_preempted(&mut self, vm: VmId, gpu_time: Duration, _now: Duration) {
        self.charge(vm, gpu_time);
    }
    fn pick(&mut self, now: Duration) -> Option<Choice> {
        self.replenish(now);
        let in_credit = |v: &VmId| self.vms.get(v).is_some_and(|x| x.budget >= 0);
        let i = self.queue.iter().position(in_credit).unwrap_or(0);
        let vm = self.queue.remove(i)?;
        // Round robin: the chosen VM goes to the tail (it stays queued while it has work).
        self.queue.push_back(vm);
        Some(Choice::Run { vm, slice: None })
    }
}
