//! BAND (Gdev / GPUvm): budgets reset to each VM's share every period; the current VM keeps the
//! GPU while it has budget (waiting briefly for its next submission); over budget → tail.

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
    /// Nanoseconds left in this period.
    budget: i128,
}

/// Non-preemptive bandwidth scheduler.
#[derive(Debug)]
pub struct Band {
    period: Duration,
    wait: Duration,
    vms: BTreeMap<VmId, Vm>,
    /// VMs with queued jobs, in round-robin order.
    queue: VecDeque<VmId>,
    period_start: Option<Duration>,
    /// The VM that ran last, and when its last run ended.
    current: Option<(VmId, Duration)>,
}

impl Band {
    pub fn new(period: Duration, wait: Duration) -> Self {
        Self {
            period,
            wait,
            vms: BTreeMap::new(),
            queue: VecDeque::new(),
            period_start: None,
            current: None,
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

    /// At each period boundary every budget is reset to the VM's share (debt forgiven).
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
        // Shares of the period go to the VMs that were active; one that was not gets the share it
        // would have had next to them.
        let total = self.active_weight();
        let all_active =
            self.vms.values().all(|v| v.active) || self.vms.values().all(|v| !v.active);
        for vm in self.vms.values_mut() {
            let with = if vm.active || all_active {
                total
            } else {
                total + u64::from(vm.weight)
            };
            vm.budget = share_of(self.period, vm.weight, with);
        }
        let advance = self
            .period
            .saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX));
        self.period_start = Some(start.saturating_add(advance));
        self.reset_active();
    }

    fn charge(&mut self, vm: VmId, gpu_time: Duration, now: Duration) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.budget = v.budget.saturating_sub(ns(gpu_time));
        }
        self.current = Some((vm, now));
    }

    fn budget(&self, vm: VmId) -> i128 {
        self.vms.get(&vm).map_or(0, |v| v.budget)
    }
}

impl Policy for Band {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Band
    }
    fn add(&mut self, vm: VmId, weight: u32, now: Duration) {
        // Before the first period, budgets are set when it starts; after, a newcomer starts with its share.
        let budget = if self.period_start.is_some() {
            self.replenish(now);
            share_of(self.period, weight, self.total_weight() + u64::from(weight))
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
        if self.current.is_some_and(|(c, _)| c == vm) {
            self.current = None;
        }
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
    fn on_complete(&mut self, vm: VmId, gpu_time: Duration, now: Duration) {
        self.charge(vm, gpu_time, now);
    }
    fn on_preempted(&mut self, vm: VmId, gpu_time: Duration, now: Duration) {
        self.charge(vm, gpu_time, now);
    }
    fn pick(&mut self, now: Duration) -> Option<Choice> {
        self.replenish(now);
        if let Some((c, ended)) = self.current
            && self.budget(c) > 0
        {
            if self.queue.contains(&c) {
                return Some(Choice::Run { vm: c, slice: None });
            }
            let until = ended.saturating_add(self.wait);
            if now < until {
                return Some(Choice::Wait { vm: c, until });
            }
        }
        // Switch: round robin from the queue, VMs with budget first, over-budget ones last.
        let with_budget = |v: &VmId| self.vms.get(v).is_some_and(|x| x.budget > 0);
        let i = self.queue.iter().position(with_budget).unwrap_or(0);
        let vm = self.queue.remove(i)?;
        self.queue.push_back(vm);
        self.current = Some((vm, now));
        Some(Choice::Run { vm, slice: None })
    }
}
