//! The bookkeeping CREDIT and BAND share: each VM's weight, budget and whether it had work in the
//! current period; the round-robin queue of VMs with work; and the period clock (the first
//! decision starts the first period with every budget at the VM's share).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::{ns, share_of};
use crate::types::VmId;

#[derive(Debug)]
pub(super) struct Vm {
    pub weight: u32,
    /// Had queued jobs at some time in the current period (shares go to these VMs).
    pub active: bool,
    /// Nanoseconds of GPU time left; negative = in debt.
    pub budget: i128,
}

#[derive(Debug)]
pub(super) struct Budgets {
    pub period: Duration,
    pub vms: BTreeMap<VmId, Vm>,
    /// VMs with queued jobs, in round-robin order.
    pub queue: VecDeque<VmId>,
    period_start: Option<Duration>,
}

impl Budgets {
    pub fn new(period: Duration) -> Self {
        Budgets {
            period,
            vms: BTreeMap::new(),
            queue: VecDeque::new(),
            period_start: None,
        }
    }

    /// Whether the first period has started.
    pub fn started(&self) -> bool {
        self.period_start.is_some()
    }

    pub fn total_weight(&self) -> u64 {
        self.vms.values().map(|v| u64::from(v.weight)).sum()
    }

    /// Weight of the VMs active in the period (all VMs if none was).
    pub fn active_weight(&self) -> u64 {
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

    /// Brings the period clock to `now`. The first call starts the first period (every budget =
    /// the VM's share of it). Afterwards, when whole periods have ended, `refill(self, periods)`
    /// updates the budgets, then the next period starts with the VMs that have work now active.
    pub fn advance(&mut self, now: Duration, refill: impl FnOnce(&mut Budgets, u128)) {
        let Some(start) = self.period_start else {
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
        refill(self, periods);
        let advance = self
            .period
            .saturating_mul(u32::try_from(periods).unwrap_or(u32::MAX));
        self.period_start = Some(start.saturating_add(advance));
        for (id, vm) in &mut self.vms {
            vm.active = self.queue.contains(id);
        }
    }

    pub fn insert(&mut self, vm: VmId, weight: u32, budget: i128) {
        self.vms.insert(
            vm,
            Vm {
                weight,
                active: false,
                budget,
            },
        );
    }

    pub fn set_weight(&mut self, vm: VmId, weight: u32) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.weight = weight;
        }
    }

    pub fn remove(&mut self, vm: VmId) {
        self.vms.remove(&vm);
        self.queue.retain(|&v| v != vm);
    }

    /// `vm` has work: active in this period, queued.
    pub fn submit(&mut self, vm: VmId) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.active = true;
            if !self.queue.contains(&vm) {
                self.queue.push_back(vm);
            }
        }
    }

    /// `vm` has no work left.
    pub fn idle(&mut self, vm: VmId) {
        self.queue.retain(|&v| v != vm);
    }

    pub fn charge(&mut self, vm: VmId, gpu_time: Duration) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.budget = v.budget.saturating_sub(ns(gpu_time));
        }
    }

    pub fn budget(&self, vm: VmId) -> i128 {
        self.vms.get(&vm).map_or(0, |v| v.budget)
    }

    /// Round robin: the first queued VM whose budget satisfies `eligible` (else the head) moves
    /// to the tail (it stays queued while it has work) and is returned.
    pub fn rotate(&mut self, eligible: impl Fn(i128) -> bool) -> Option<VmId> {
        let i = self
            .queue
            .iter()
            .position(|v| self.vms.get(v).is_some_and(|x| eligible(x.budget)))
            .unwrap_or(0);
        let vm = self.queue.remove(i)?;
        self.queue.push_back(vm);
        Some(vm)
    }
}
