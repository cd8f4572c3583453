//! `Scheduler`: validates events, keeps VM state (queued jobs, running VM), strict priority
//! classes over per-class policies, and charges GPU time to the accounting.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::accounting::Accounting;
use crate::config::{Charge, Config, ConfigError};
use crate::error::SchedError;
use crate::fill::{Fill, FillParams, Filler, Gate};
use crate::policy::{Choice, Policy, make_policy};
use crate::types::{Action, Decision, KernelKey, Pick, Removed, Running, VmId, VmParams, VmStats};

#[derive(Debug)]
struct Vm {
    params: VmParams,
    stats: VmStats,
}

/// How a granted run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Completed,
    Faulted,
    Preempted,
}

/// The GPU scheduler: one policy per priority class, the highest class with work runs.
#[derive(Debug)]
pub struct Scheduler {
    config: Config,
    vms: BTreeMap<VmId, Vm>,
    /// Policy per class; the class of every registered VM has one.
    classes: BTreeMap<u8, Box<dyn Policy>>,
    running: Option<Running>,
    last: Duration,
    accounting: Accounting,
    /// Filling state (`fill=on`).
    fill: Option<Fill>,
}

impl Scheduler {
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        let accounting = Accounting::new(config.window, config.history);
        let fill = config.fill.then(|| {
            Fill::new(FillParams {
                bound: config.fill_bound,
                slice: config.fill_slice,
                min_gap: config.fill_min,
                idle: config.fill_idle,
                hold: config.fill_hold,
                samples: config.fill_samples,
                kernels: config.fill_kernels,
            })
        });
        Ok(Self {
            config,
            vms: BTreeMap::new(),
            classes: BTreeMap::new(),
            running: None,
            last: Duration::ZERO,
            accounting,
            fill,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Refuses a time earlier than the last event's; otherwise records it.
    fn tick(&mut self, now: Duration) -> Result<(), SchedError> {
        if now < self.last {
            return Err(SchedError::TimeWentBackwards {
                last: self.last,
                now,
            });
        }
        self.last = now;
        Ok(())
    }

    fn check_time(&self, now: Duration) -> Result<(), SchedError> {
        if now < self.last {
            return Err(SchedError::TimeWentBackwards {
                last: self.last,
                now,
            });
        }
        Ok(())
    }

    fn vm(&self, vm: VmId) -> Result<&Vm, SchedError> {
        self.vms.get(&vm).ok_or(SchedError::UnknownVm(vm))
    }

    fn policy(&mut self, class: u8) -> Option<&mut Box<dyn Policy>> {
        self.classes.get_mut(&class)
    }

    /// Registers a VM (no queued jobs).
    pub fn register(
        &mut self,
        vm: VmId,
        params: VmParams,
        now: Duration,
    ) -> Result<(), SchedError> {
        self.check_time(now)?;
        if self.vms.contains_key(&vm) {
            return Err(SchedError::AlreadyRegistered(vm));
        }
        if params.weight == 0 || params.weight > self.config.max_weight {
            return Err(SchedError::BadWeight {
                weight: params.weight,
                max: self.config.max_weight,
            });
        }
        if self.vms.len() >= self.config.max_vms {
            return Err(SchedError::TooManyVms(self.config.max_vms));
        }
        self.tick(now)?;
        let config = &self.config;
        let policy = self
            .classes
            .entry(params.priority)
            .or_insert_with(|| make_policy(config.policy_of(params.priority), config));
        policy.add(vm, params.weight, now);
        if let Some(f) = &mut self.fill {
            f.add(vm);
        }
        self.vms.insert(
            vm,
            Vm {
                params,
                stats: VmStats::default(),
            },
        );
        Ok(())
    }

    /// Removes a VM at any time (it died, hung, or left): its queued jobs are dropped and, if it
    /// held the GPU, the GPU is free at once (`was_running`: stop or abandon its job).
    pub fn remove(&mut self, vm: VmId, now: Duration) -> Result<Removed, SchedError> {
        self.check_time(now)?;
        let entry = self.vm(vm)?;
        let (class, pending) = (entry.params.priority, entry.stats.pending);
        self.tick(now)?;
        let was_running = self.running.is_some_and(|r| r.vm == vm);
        if was_running {
            self.running = None;
        }
        self.vms.remove(&vm);
        if let Some(p) = self.policy(class) {
            p.remove(vm, now);
        }
        if !self.vms.values().any(|v| v.params.priority == class) {
            self.classes.remove(&class);
        }
        self.accounting.forget(vm);
        if let Some(f) = &mut self.fill {
            f.remove(vm);
            if was_running {
                f.clear_stop();
            }
        }
        Ok(Removed {
            was_running,
            pending,
        })
    }

    /// One job queued for `vm`. Returns `Action::Preempt` when the VM's class is higher than the
    /// running VM's (and `priority_preempt` is on), or when its class's policy asks for it
    /// (TIMESLICE wake-up preemption).
    pub fn on_submit(&mut self, vm: VmId, now: Duration) -> Result<Action, SchedError> {
        self.on_submit_kernel(vm, None, now)
    }

    /// `on_submit` for a job whose kernel identity is known (`key`): with `fill=on` the
    /// scheduler learns the GPU time per identity and the idle gap after each, and a higher
    /// class's submission lets a filler that will end within `fill_bound` finish
    /// (`Action::PreemptAt`) instead of preempting it.
    pub fn on_submit_kernel(
        &mut self,
        vm: VmId,
        key: Option<KernelKey>,
        now: Duration,
    ) -> Result<Action, SchedError> {
        self.check_time(now)?;
        let entry = self.vm(vm)?;
        let (class, limit) = (entry.params.priority, self.config.max_pending);
        if entry.stats.pending >= limit {
            return Err(SchedError::TooManyJobs { vm, limit });
        }
        self.tick(now)?;
        if let Some(v) = self.vms.get_mut(&vm) {
            v.stats.pending += 1;
        }
        if let Some(f) = &mut self.fill {
            f.on_submit(vm, key, now);
        }
        let wake = self.policy(class).is_some_and(|p| p.on_submit(vm, now));
        let action = match self.running {
            Some(r) if r.vm != vm => {
                let running_class = self.vms.get(&r.vm).map_or(0, |v| v.params.priority);
                let higher = self.config.priority_preempt && class > running_class;
                let finishing = self.fill.as_ref().and_then(|f| {
                    let filler = f.filler().filter(|x| x.vm == r.vm)?;
                    let bound = f.params().bound;
                    (now <= filler.end && filler.end - now <= bound)
                        .then(|| now.saturating_add(bound))
                });
                if let (true, Some(at)) = (higher, finishing) {
                    Action::PreemptAt { vm: r.vm, at }
                } else if higher || (wake && class == running_class) {
                    Action::Preempt(r.vm)
                } else {
                    Action::None
                }
            }
            _ => Action::None,
        };
        if let (Action::Preempt(_), Some(f)) = (action, &mut self.fill) {
            f.note_preempt(now);
        }
        Ok(action)
    }

    /// With `fill=on`: the identity of `vm`'s newest queued job, when it is known only after the
    /// submission (vgpud: a run report's `more` queues the next job, whose identity comes with the
    /// VM's next `want`); `None` makes it unidentified (a turn that ran several kernels). Nothing
    /// for an unknown VM, without filling, or without a queued job.
    pub fn identify(&mut self, vm: VmId, key: Option<KernelKey>) {
        if let Some(f) = &mut self.fill
            && self.vms.get(&vm).is_some_and(|v| v.stats.pending > 0)
        {
            f.identify(vm, key);
        }
    }

    /// With `fill=on`: inside `vm`'s running grant (a turn), its current job completed after
    /// `gpu_time` and the VM goes on with its next job under the same grant (vgpud: a
    /// `progress`). The job's GPU time is learned under its identity; the next job is
    /// unidentified. The policies hear of the turn's GPU time at its end, as before. Refused
    /// for a VM that does not hold the GPU; nothing without filling.
    pub fn on_progress(
        &mut self,
        vm: VmId,
        gpu_time: Duration,
        now: Duration,
    ) -> Result<(), SchedError> {
        self.check_time(now)?;
        self.vm(vm)?;
        let run = match self.running {
            Some(r) if r.vm == vm => r,
            _ => return Err(SchedError::NotRunning(vm)),
        };
        self.tick(now)?;
        // A job cannot have run longer than the grant has existed.
        let gpu_time = gpu_time.min(now.saturating_sub(run.since));
        if let Some(f) = &mut self.fill {
            f.on_progress(vm, gpu_time);
        }
        Ok(())
    }

    /// `vm`'s queue was dropped (channel reset, VM stopped submitting): it has no jobs left.
    /// Refused while it holds the GPU (report the end of the run first).
    pub fn on_idle(&mut self, vm: VmId, now: Duration) -> Result<(), SchedError> {
        self.check_time(now)?;
        let class = self.vm(vm)?.params.priority;
        if self.running.is_some_and(|r| r.vm == vm) {
            return Err(SchedError::Busy(vm));
        }
        self.tick(now)?;
        if let Some(v) = self.vms.get_mut(&vm) {
            v.stats.pending = 0;
        }
        if let Some(f) = &mut self.fill {
            f.on_idle(vm);
        }
        if let Some(p) = self.policy(class) {
            p.on_idle(vm, now);
        }
        Ok(())
    }

    /// The running VM's job completed after `gpu_time` on the engine.
    pub fn on_complete(
        &mut self,
        vm: VmId,
        gpu_time: Duration,
        now: Duration,
    ) -> Result<(), SchedError> {
        self.end_run(vm, gpu_time, now, End::Completed)
    }

    /// The running VM's job faulted after `gpu_time` (charged; the job is gone like a completed one).
    pub fn on_fault(
        &mut self,
        vm: VmId,
        gpu_time: Duration,
        now: Duration,
    ) -> Result<(), SchedError> {
        self.end_run(vm, gpu_time, now, End::Faulted)
    }

    /// The running VM's job was preempted after `gpu_time`; it stays queued and resumes later.
    pub fn on_preempted(
        &mut self,
        vm: VmId,
        gpu_time: Duration,
        now: Duration,
    ) -> Result<(), SchedError> {
        self.end_run(vm, gpu_time, now, End::Preempted)
    }

    fn end_run(
        &mut self,
        vm: VmId,
        gpu_time: Duration,
        now: Duration,
        end: End,
    ) -> Result<(), SchedError> {
        self.check_time(now)?;
        let class = self.vm(vm)?.params.priority;
        let run = match self.running {
            Some(r) if r.vm == vm => r,
            _ => return Err(SchedError::NotRunning(vm)),
        };
        self.tick(now)?;
        self.running = None;
        let held = now.saturating_sub(run.since);
        let charged = match self.config.charge {
            Charge::Engine => gpu_time.min(held),
            Charge::Wall => held,
        };
        self.accounting.charge(vm, charged, now);
        let mut idle = false;
        if let Some(v) = self.vms.get_mut(&vm) {
            let s = &mut v.stats;
            s.gpu_time = s.gpu_time.saturating_add(charged);
            match end {
                End::Preempted => s.preemptions += 1,
                End::Completed | End::Faulted => {
                    if end == End::Faulted {
                        s.faults += 1;
                    } else {
                        s.completions += 1;
                    }
                    s.pending = s.pending.saturating_sub(1);
                    idle = s.pending == 0;
                }
            }
        }
        if let Some(f) = &mut self.fill {
            match end {
                End::Preempted => {
                    f.learn_stop(run.since, run.slice, now);
                    f.on_preempted(vm, charged);
                }
                _ => f.clear_stop(),
            }
            match end {
                End::Preempted => {}
                End::Completed => f.on_end(vm, charged, true, idle, now),
                End::Faulted => f.on_end(vm, charged, false, idle, now),
            }
        }
        if let Some(p) = self.policy(class) {
            match end {
                End::Preempted => p.on_preempted(vm, charged, now),
                End::Completed | End::Faulted => p.on_complete(vm, charged, now),
            }
            if idle {
                p.on_idle(vm, now);
            }
        }
        Ok(())
    }

    /// Chooses who gets the GPU now: the highest priority class with queued jobs decides with
    /// its policy. A `Run` is a grant: the VM is running until its run is reported or it is removed.
    pub fn pick(&mut self, now: Duration) -> Result<Pick, SchedError> {
        self.check_time(now)?;
        if let Some(r) = self.running {
            return Err(SchedError::Busy(r.vm));
        }
        self.tick(now)?;
        let class = self
            .vms
            .values()
            .filter(|v| v.stats.pending > 0)
            .map(|v| v.params.priority)
            .max();
        let Some(class) = class else {
            return Ok(Pick::Idle);
        };
        // Filling: the VMs of higher classes are all idle; how do their gaps constrain this grant?
        let gate = self.fill.as_ref().map_or(Gate::Open, |f| {
            let higher = self
                .vms
                .iter()
                .filter(|(_, v)| v.params.priority > class)
                .map(|(id, _)| *id);
            f.gate(higher, now)
        });
        let cap = match gate {
            Gate::Open => None,
            Gate::Short => Some(self.config.fill_slice),
            Gate::Hold { vm, until } => return Ok(Pick::Wait { vm, until }),
            Gate::Gap { vm, end, short } => {
                let left = end - now;
                if left < self.config.fill_min {
                    // Too short to fill: keep the GPU for the higher VM's next kernel.
                    return Ok(Pick::Wait { vm, until: end });
                }
                // Whatever runs is told to stop early enough for its context to be saved by
                // the time the higher VM is due.
                let stop = self
                    .fill
                    .as_ref()
                    .map_or(Duration::ZERO, Fill::stop_latency);
                let until_end = left.saturating_sub(stop);
                if let Some((filler, predicted)) = self.best_fit(left) {
                    return Ok(self.grant_filler(filler, predicted, until_end, now));
                }
                // Nothing is predicted to fit: the class's choice runs until then.
                if until_end < self.config.fill_min {
                    return Ok(Pick::Wait { vm, until: end });
                }
                Some(if short {
                    until_end.min(self.config.fill_slice)
                } else {
                    until_end
                })
            }
        };
        let choice = self.policy(class).and_then(|p| p.pick(now));
        let choice = match (choice, cap) {
            (Some(Choice::Run { vm, slice }), Some(cap)) => Some(Choice::Run {
                vm,
                slice: Some(slice.map_or(cap, |s| s.min(cap))),
            }),
            (c, _) => c,
        };
        let pick = match choice {
            Some(Choice::Run { vm, slice })
                if self.vms.get(&vm).is_some_and(|v| v.stats.pending > 0) =>
            {
                if let Some(v) = self.vms.get_mut(&vm) {
                    v.stats.runs += 1;
                }
                self.running = Some(Running {
                    vm,
                    since: now,
                    slice,
                });
                self.tell_other_classes(vm, class, now);
                Pick::Run(Decision { run: vm, slice })
            }
            Some(Choice::Wait { vm, until }) if self.vms.contains_key(&vm) && until > now => {
                Pick::Wait { vm, until }
            }
            // A policy that broke its contract: refuse to grant rather than run an idle VM.
            _ => Pick::Idle,
        };
        Ok(pick)
    }

    /// The filler for a gap of `left`: among the VMs with queued jobs whose head job's predicted
    /// GPU time fits, the highest class first, then the best fit (the longest, in eighths of the
    /// gap), then the least GPU time per weight (weights within a class hold), then the lowest id.
    fn best_fit(&self, left: Duration) -> Option<(VmId, Duration)> {
        let fill = self.fill.as_ref()?;
        let eighth = (left / 8).max(Duration::from_nanos(1));
        self.vms
            .iter()
            .filter(|(_, v)| v.stats.pending > 0)
            .filter_map(|(&id, v)| {
                let predicted = fill.head_remaining(id).filter(|p| *p <= left)?;
                let fit = predicted.as_nanos() / eighth.as_nanos();
                let per_weight = (v.stats.gpu_time.as_nanos() << 16) / u128::from(v.params.weight);
                let key = (
                    v.params.priority,
                    fit,
                    std::cmp::Reverse(per_weight),
                    std::cmp::Reverse(id),
                );
                Some((key, id, predicted))
            })
            .max_by_key(|(key, _, _)| *key)
            .map(|(_, id, predicted)| (id, predicted))
    }

    /// Grants `vm`, whose head job is predicted to end after `predicted`, within the gap, as a
    /// filler. Its slice ends at the later of that end and `until_end` (the gap's end less the
    /// stop latency): a job that fits completes, not preempted just before its end, and a
    /// dispatcher that runs turns (vgpud) stops the VM's next jobs by then, by the VM's own
    /// deadline. (A one-job grant instead measured worse with real VMs: the rest of the gap
    /// then needs a grant of its own, a round trip, while a turn goes on at no cost.)
    fn grant_filler(
        &mut self,
        vm: VmId,
        predicted: Duration,
        until_end: Duration,
        now: Duration,
    ) -> Pick {
        let slice = Some(predicted.max(until_end));
        if let Some(v) = self.vms.get_mut(&vm) {
            v.stats.runs += 1;
        }
        if let Some(f) = &mut self.fill {
            f.set_filler(Some(Filler {
                vm,
                end: now.saturating_add(predicted),
            }));
        }
        self.running = Some(Running {
            vm,
            since: now,
            slice,
        });
        let class = self.vms.get(&vm).map_or(0, |v| v.params.priority);
        self.tell_other_classes(vm, class, now);
        Pick::Run(Decision { run: vm, slice })
    }

    /// `vm` of `class` was granted: the policies of the other classes hear of it.
    fn tell_other_classes(&mut self, vm: VmId, class: u8, now: Duration) {
        for (_, p) in self.classes.iter_mut().filter(|(c, _)| **c != class) {
            p.on_foreign_grant(vm, now);
        }
    }

    /// Kernel identities with a measured GPU time kept for `vm` (0 without `fill=on`).
    pub fn kernels_known(&self, vm: VmId) -> usize {
        self.fill.as_ref().map_or(0, |f| f.kernels_known(vm))
    }

    /// The predicted idle gap of `vm` now: (when it started, predicted length if learned);
    /// `None` without `fill=on` or when the VM is not idle after a completion.
    pub fn predicted_gap(&self, vm: VmId) -> Option<(Duration, Option<Duration>)> {
        self.fill.as_ref()?.gap(vm)
    }

    /// Predicted GPU time left of `vm`'s head job (`fill=on`, identity measured enough).
    pub fn predicted_head(&self, vm: VmId) -> Option<Duration> {
        self.fill.as_ref()?.head_remaining(vm)
    }

    /// Changes a VM's weight (same limits as `register`); its policy uses it from the next
    /// decision (CREDIT / BAND: from the next period's shares).
    /// A guess, changing nothing, of the VM that gets the GPU next if the running one stops
    /// now: the highest class's policy's own guess (TIMESLICE: least virtual time; others give
    /// none). For dispatchers that warn the next VM ahead of a switch.
    pub fn peek_next(&self) -> Option<VmId> {
        let running = self.running.map(|r| r.vm);
        self.classes
            .values()
            .rev()
            .find_map(|p| p.peek_next(running))
    }

    pub fn set_weight(&mut self, vm: VmId, weight: u32, now: Duration) -> Result<(), SchedError> {
        self.check_time(now)?;
        let class = self.vm(vm)?.params.priority;
        if weight == 0 || weight > self.config.max_weight {
            return Err(SchedError::BadWeight {
                weight,
                max: self.config.max_weight,
            });
        }
        self.tick(now)?;
        if let Some(v) = self.vms.get_mut(&vm) {
            v.params.weight = weight;
        }
        if let Some(p) = self.policy(class) {
            p.set_weight(vm, weight, now);
        }
        Ok(())
    }

    /// The running VM if it has held the GPU longer than its slice plus `grace` (no slice: than
    /// `grace`): a VM that does not yield. The caller then stops its job or removes it.
    pub fn overdue(&self, now: Duration, grace: Duration) -> Option<VmId> {
        let r = self.running?;
        let limit = r
            .since
            .saturating_add(r.slice.unwrap_or_default())
            .saturating_add(grace);
        (now >= limit).then_some(r.vm)
    }

    /// The run in progress, if any (a daemon checks it against the slice to catch a VM that
    /// does not yield; see `overdue`).
    pub fn running(&self) -> Option<Running> {
        self.running
    }

    /// A VM's registration parameters and totals.
    pub fn vm_info(&self, vm: VmId) -> Result<(VmParams, VmStats), SchedError> {
        self.vm(vm).map(|v| (v.params, v.stats))
    }

    /// Registered VMs in id order.
    pub fn vms(&self) -> impl Iterator<Item = VmId> + '_ {
        self.vms.keys().copied()
    }

    /// Whether any VM has queued jobs.
    pub fn has_work(&self) -> bool {
        self.vms.values().any(|v| v.stats.pending > 0)
    }

    /// GPU time per VM per window.
    pub fn accounting(&self) -> &Accounting {
        &self.accounting
    }
}
