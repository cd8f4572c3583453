//! TIMESLICE: weighted fair share with preemption at slice end. Virtual time (GPU time / weight)
//! orders the VMs; overshoot shortens the VM's next slice (repaid); an idle VM gives up its turn.
//! A turn nobody else waits for may run past its slice (vgpud extends it) and is charged only
//! at its end: a VM that gets work meanwhile is placed against the running VM's virtual time
//! with its grant so far counted (wall time; the running VM's charge brings it at least
//! there), and the part of the turn run while no other VM had work is not overshoot — GPU time
//! nobody wanted is neither banked by the idle VMs nor repaid by the one that used it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Choice, Policy};
use crate::config::PolicyKind;
use crate::types::VmId;

/// Scale of virtual time: virtual ns = GPU ns × 2^32 / weight.
const VSCALE: u32 = 32;

fn virt(d: Duration, weight: u32) -> u128 {
    (d.as_nanos() << VSCALE) / u128::from(weight.max(1))
}

#[derive(Debug)]
struct Vm {
    weight: u32,
    /// Virtual time: weighted GPU time received.
    vtime: u128,
    runnable: bool,
    /// Grant sequence number of its last turn (ties go to the least recently run: round robin).
    last_turn: u64,
    /// Overshoot of past turns not yet repaid.
    debt: Duration,
    /// The virtual time VMs that got work during its running grant were placed against (its
    /// own with the grant so far counted): its charge at the grant's end brings it at least
    /// there, so that what placed them is what it pays.
    claim: u128,
}

/// The VM whose turn it is.
#[derive(Debug, Clone, Copy)]
struct Turn {
    vm: VmId,
    used: Duration,
    budget: Duration,
    /// How much of the turn ran while no other VM of the class had work (the wall time from
    /// its start to the first submission by another VM): not overshoot.
    alone: Duration,
}

/// Weighted fair time slicing.
#[derive(Debug)]
pub struct Timeslice {
    slice: Duration,
    /// Slice used instead when more than this many VMs share the class (NVIDIA: 1 ms above 8).
    many: Option<(usize, Duration)>,
    /// A VM that gets work preempts the running VM when it is this far behind (`None`: never).
    wake_preempt: Option<Duration>,
    vms: BTreeMap<VmId, Vm>,
    turn: Option<Turn>,
    /// The VM holding the GPU and since when.
    running: Option<(VmId, Duration)>,
    /// Monotonic floor of virtual time: the least virtual time among VMs with work. A VM that
    /// gets work is placed no lower than one turn below it, so idle time is not banked.
    floor: u128,
    turns: u64,
}

impl Timeslice {
    /// `many`: `(n, slice)`: use `slice` while more than `n` VMs are registered in the class.
    pub fn new(
        slice: Duration,
        many: Option<(usize, Duration)>,
        wake_preempt: Option<Duration>,
    ) -> Self {
        Self {
            slice,
            many,
            wake_preempt,
            vms: BTreeMap::new(),
            turn: None,
            running: None,
            floor: 0,
            turns: 0,
        }
    }

    /// The slice for the number of VMs registered now.
    fn slice(&self) -> Duration {
        match self.many {
            Some((n, many)) if self.vms.len() > n => many,
            _ => self.slice,
        }
    }

    fn charge(&mut self, vm: VmId, gpu_time: Duration) {
        if self.running.is_some_and(|(r, _)| r == vm) {
            self.running = None;
        }
        if let Some(v) = self.vms.get_mut(&vm) {
            let charged = v.vtime.saturating_add(virt(gpu_time, v.weight));
            v.vtime = charged.max(std::mem::take(&mut v.claim));
        }
        if let Some(t) = &mut self.turn
            && t.vm == vm
        {
            t.used = t.used.saturating_add(gpu_time);
        }
        self.update_floor();
    }

    fn update_floor(&mut self) {
        let least = self
            .vms
            .values()
            .filter(|v| v.runnable)
            .map(|v| v.vtime)
            .min();
        if let Some(least) = least {
            self.floor = self.floor.max(least);
        }
    }

    /// Ends the current turn: an overshoot beyond its budget becomes debt (what it ran while
    /// nobody else waited is not overshoot).
    fn end_turn(&mut self) {
        if let Some(t) = self.turn.take()
            && let Some(v) = self.vms.get_mut(&t.vm)
        {
            let allowed = t.budget.max(t.alone);
            v.debt = v.debt.saturating_add(t.used.saturating_sub(allowed));
        }
    }

    /// The running VM (other than `except`), when it started running and its virtual time
    /// with the run so far counted (charged only at the run's end).
    fn running_effective(&self, except: VmId, now: Duration) -> Option<(VmId, Duration, u128)> {
        let (r, since) = self.running.filter(|(r, _)| *r != except)?;
        let v = self.vms.get(&r)?;
        let ran = virt(now.saturating_sub(since), v.weight);
        Some((r, since, v.vtime.saturating_add(ran)))
    }

    /// The floor at `now`: the least virtual time among VMs with work, the running one counted
    /// with its grant so far (a VM that ran alone for tens of ms moved the floor with it,
    /// though none of that is charged yet), never below the recorded floor.
    fn floor_at(&self, running: Option<(VmId, Duration, u128)>) -> u128 {
        let least = self
            .vms
            .iter()
            .filter(|(_, v)| v.runnable)
            .map(|(id, v)| match running {
                Some((r, _, effective)) if r == *id => effective,
                _ => v.vtime,
            })
            .min();
        least.map_or(self.floor, |l| self.floor.max(l))
    }
}

impl Policy for Timeslice {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Timeslice
    }
    fn add(&mut self, vm: VmId, weight: u32, _now: Duration) {
        let state = Vm {
            weight,
            vtime: self.floor,
            runnable: false,
            last_turn: 0,
            debt: Duration::ZERO,
            claim: 0,
        };
        self.vms.insert(vm, state);
    }
    fn set_weight(&mut self, vm: VmId, weight: u32, _now: Duration) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.weight = weight;
        }
    }
    fn remove(&mut self, vm: VmId, _now: Duration) {
        self.vms.remove(&vm);
        if self.turn.is_some_and(|t| t.vm == vm) {
            self.turn = None;
        }
        if self.running.is_some_and(|(r, _)| r == vm) {
            self.running = None;
        }
        self.update_floor();
    }
    fn on_submit(&mut self, vm: VmId, now: Duration) -> bool {
        // A VM getting work may lag the floor by one turn of the lightest VM (the most any one
        // turn moves virtual time), no more: idle time is not banked.
        let lightest = self.vms.values().map(|v| v.weight).min().unwrap_or(1);
        let lag = virt(self.slice(), lightest);
        if self.vms.get(&vm).is_none_or(|v| v.runnable) {
            return false;
        }
        let running = self.running_effective(vm, now);
        let floor = self.floor_at(running);
        if let Some((r, since, effective)) = running {
            let others = self
                .vms
                .iter()
                .any(|(id, v)| v.runnable && *id != r && *id != vm);
            if let Some(v) = self.vms.get_mut(&r) {
                v.claim = v.claim.max(effective.min(floor));
            }
            if !others && let Some(t) = self.turn.as_mut().filter(|t| t.vm == r) {
                // The first VM to want the GPU beside the running one: the turn so far ran
                // alone (past its slice if nobody asked sooner: vgpud extends such a turn).
                t.alone = t
                    .alone
                    .max(t.used.saturating_add(now.saturating_sub(since)));
            }
        }
        let Some(v) = self.vms.get_mut(&vm) else {
            return false;
        };
        v.runnable = true;
        v.vtime = v.vtime.max(floor.saturating_sub(lag));
        let (mine, granularity) = (v.vtime, self.wake_preempt);
        let (Some(granularity), Some((_, _, effective))) = (granularity, running) else {
            return false;
        };
        let weight = self.vms.get(&vm).map_or(1, |v| v.weight);
        let preempt = mine.saturating_add(virt(granularity, weight)) < effective;
        if preempt {
            // The running VM's turn ends here; the next pick goes by virtual time.
            self.end_turn();
        }
        preempt
    }
    fn on_idle(&mut self, vm: VmId, _now: Duration) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.runnable = false;
        }
        // The turn is kept: a VM that submits again before the next pick goes on with it; one
        // still idle at the pick gives up the rest of its turn.
        self.update_floor();
    }
    fn on_complete(&mut self, vm: VmId, gpu_time: Duration, _now: Duration) {
        self.charge(vm, gpu_time);
    }
    fn on_preempted(&mut self, vm: VmId, gpu_time: Duration, _now: Duration) {
        self.charge(vm, gpu_time);
        // A preempted VM's turn is over even if the engine reports less GPU time than the
        // turn's budget (the engine does not count the dispatch overheads the wall clock
        // does): granting "the rest" would only buy a round trip for a sliver of a slice.
        if self.turn.is_some_and(|t| t.vm == vm) {
            self.end_turn();
        }
    }
    fn on_foreign_grant(&mut self, _vm: VmId, _now: Duration) {
        // The kept turn of an idle VM ends at the next grant (see `on_idle`), also one made in
        // another class.
        if let Some(t) = self.turn
            && !self.vms.get(&t.vm).is_some_and(|v| v.runnable)
        {
            self.end_turn();
        }
    }
    fn peek_next(&self, running: Option<VmId>) -> Option<VmId> {
        self.vms
            .iter()
            .filter(|(vm, v)| v.runnable && Some(**vm) != running)
            .min_by_key(|(_, v)| (v.vtime, v.last_turn))
            .map(|(vm, _)| *vm)
    }
    fn pick(&mut self, now: Duration) -> Option<Choice> {
        if let Some(t) = self.turn
            && t.used < t.budget
            && self.vms.get(&t.vm).is_some_and(|v| v.runnable)
        {
            self.running = Some((t.vm, now));
            return Some(Choice::Run {
                vm: t.vm,
                slice: Some(t.budget - t.used),
            });
        }
        self.end_turn();
        let (&vm, _) = self
            .vms
            .iter()
            .filter(|(_, v)| v.runnable)
            .min_by_key(|(_, v)| (v.vtime, v.last_turn))?;
        self.turns += 1;
        let slice = self.slice();
        // Repay debt by shortening this turn, keeping at least a quarter slice.
        let repay = self
            .vms
            .get(&vm)
            .map_or(Duration::ZERO, |v| v.debt)
            .min(slice - slice / 4);
        if let Some(v) = self.vms.get_mut(&vm) {
            v.last_turn = self.turns;
            v.debt -= repay;
        }
        let budget = (slice - repay).max(Duration::from_nanos(1));
        self.turn = Some(Turn {
            vm,
            used: Duration::ZERO,
            budget,
            alone: Duration::ZERO,
        });
        self.running = Some((vm, now));
        Some(Choice::Run {
            vm,
            slice: Some(budget),
        })
    }
}
