//! FIFO: jobs run in submission order, one at a time, never preempted (GPUvm's FIFO).

use std::collections::VecDeque;
use std::time::Duration;

use super::{Choice, Policy};
use crate::config::PolicyKind;
use crate::types::VmId;

/// One queue entry per submitted job; the head runs to completion.
#[derive(Debug, Default)]
pub struct Fifo {
    jobs: VecDeque<VmId>,
}

impl Fifo {
    fn drop_first(&mut self, vm: VmId) {
        if let Some(i) = self.jobs.iter().position(|&v| v == vm) {
            self.jobs.remove(i);
        }
    }
}

impl Policy for Fifo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fifo
    }
    fn add(&mut self, _vm: VmId, _weight: u32, _now: Duration) {}
    fn set_weight(&mut self, _vm: VmId, _weight: u32, _now: Duration) {}
    fn remove(&mut self, vm: VmId, _now: Duration) {
        self.jobs.retain(|&v| v != vm);
    }
    fn on_submit(&mut self, vm: VmId, _now: Duration) -> bool {
        self.jobs.push_back(vm);
        false
    }
    fn on_idle(&mut self, vm: VmId, _now: Duration) {
        self.jobs.retain(|&v| v != vm);
    }
    fn on_complete(&mut self, vm: VmId, _gpu_time: Duration, _now: Duration) {
        self.drop_first(vm);
    }
    fn on_preempted(&mut self, _vm: VmId, _gpu_time: Duration, _now: Duration) {
        // Only a higher class or a removal preempts FIFO: the job keeps its place at the head.
    }
    fn pick(&mut self, _now: Duration) -> Option<Choice> {
        self.jobs.front().map(|&vm| Choice::Run { vm, slice: None })
    }
}
