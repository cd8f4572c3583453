//! Filling (FIKIT, 2024, with preemption): while the VMs of higher priority classes are in the
//! idle gaps between their kernels, lower-class kernels predicted to fit the gap are granted.
//! This module keeps what the prediction needs per VM: the identities of its queued jobs, the
//! GPU time measured per identity, and the idle time measured after each identity (the gap from
//! a completion that left the VM idle to its next submission). Everything is learned online
//! from the scheduler's own events; tables are bounded per VM.

mod stats;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use stats::{Estimate, Table, Window};

use crate::types::{KernelKey, VmId};

/// Identities kept per VM for its queued jobs (later jobs count as unidentified).
const KEYS_QUEUED: usize = 64;

/// Parameters of filling (from `Config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillParams {
    /// A higher-class submission does not preempt a filler predicted to end within this.
    pub bound: Duration,
    /// Slice of a lower-class run while a higher VM's gap cannot be predicted.
    pub slice: Duration,
    /// Gaps shorter than this are not filled (the GPU waits for the higher VM).
    pub min_gap: Duration,
    /// A higher VM with no gap predicted yet, idle this long, no longer constrains the lower
    /// classes (it went idle; preemption covers its return).
    pub idle: Duration,
    /// The longest the GPU is held for a due VM.
    pub hold: Duration,
    /// Samples an estimate needs before it is used.
    pub samples: u32,
    /// Identities kept per VM per table.
    pub kernels: usize,
}

/// Filling state of one VM.
#[derive(Debug, Clone)]
struct VmFill {
    /// Identities of its queued jobs, head first (`None`: unidentified).
    keys: VecDeque<Option<KernelKey>>,
    /// Queued jobs beyond `keys` (unidentified, after them).
    overflow: u64,
    /// GPU time of the head job's preempted runs so far.
    head_progress: Duration,
    /// GPU time of the run in progress that went to jobs completed inside it (`on_progress`):
    /// the rest of the run's time is the head job's.
    run_done: Duration,
    /// GPU time per identity.
    kernels: Table,
    /// Idle time after each identity (the last samples: quantiles).
    gaps: Table<Window>,
    /// The completion that left it idle: (its identity, when).
    idle_since: Option<(Option<KernelKey>, Duration)>,
}

impl VmFill {
    /// Takes the head job's identity off the queue.
    fn pop_head(&mut self) -> Option<KernelKey> {
        let key = match self.keys.pop_front() {
            Some(k) => k,
            None => {
                self.overflow = self.overflow.saturating_sub(1);
                None
            }
        };
        if self.keys.is_empty() && self.overflow > 0 {
            // The unidentified tail is now at the head; identities are kept again from here.
            self.overflow -= 1;
            self.keys.push_back(None);
        }
        key
    }
}

/// How the idle higher-class VMs constrain a lower-class grant now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// No constraint: the lower class's policy decides as usual.
    Open,
    /// A higher VM may submit any time (no prediction yet): short slices.
    Short,
    /// A higher VM (`vm`) is due now: inside its predicted return window, which ends at
    /// `until`. The GPU is kept idle for it (a grant now would be preempted at once).
    Hold { vm: VmId, until: Duration },
    /// The earliest predicted submission of a higher VM is at `end` (`vm`); `short`: another
    /// higher VM is unpredictable as well.
    Gap {
        vm: VmId,
        end: Duration,
        short: bool,
    },
}

/// The filler running now: predicted to end at `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filler {
    pub vm: VmId,
    pub end: Duration,
}

/// Per-VM filling state of a scheduler.
#[derive(Debug, Clone)]
pub struct Fill {
    params: FillParams,
    vms: BTreeMap<VmId, VmFill>,
    filler: Option<Filler>,
    /// Time from a preemption request (or a slice end) to the run's end report: how early a
    /// filler cut at a gap's end must be told to stop.
    stop: Estimate,
    /// When the running VM was told to stop (`Action::Preempt`).
    stop_requested: Option<Duration>,
}

impl Fill {
    pub fn new(params: FillParams) -> Self {
        Self {
            params,
            vms: BTreeMap::new(),
            filler: None,
            stop: Estimate::default(),
            stop_requested: None,
        }
    }

    /// The running VM was told to stop at `now`.
    pub fn note_preempt(&mut self, now: Duration) {
        self.stop_requested.get_or_insert(now);
    }

    /// A run granted at `since` with `slice` ended preempted at `now`: learns the stop latency
    /// from the earlier of the slice end and the preemption request.
    pub fn learn_stop(&mut self, since: Duration, slice: Option<Duration>, now: Duration) {
        let slice_end = slice.map(|s| since.saturating_add(s));
        let asked = match (slice_end, self.stop_requested.take()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(asked) = asked.filter(|a| *a <= now) {
            self.stop.add(now - asked);
        }
    }

    /// Predicted stop latency (zero until one preemption was seen).
    pub fn stop_latency(&self) -> Duration {
        self.stop.high()
    }

    /// A run ended without preemption: a pending stop request is void.
    pub fn clear_stop(&mut self) {
        self.stop_requested = None;
    }

    pub fn params(&self) -> &FillParams {
        &self.params
    }

    pub fn add(&mut self, vm: VmId) {
        let kernels = self.params.kernels;
        self.vms.insert(
            vm,
            VmFill {
                keys: VecDeque::new(),
                overflow: 0,
                head_progress: Duration::ZERO,
                run_done: Duration::ZERO,
                kernels: Table::new(kernels),
                gaps: Table::new(kernels),
                idle_since: None,
            },
        );
    }

    pub fn remove(&mut self, vm: VmId) {
        self.vms.remove(&vm);
        if self.filler.is_some_and(|f| f.vm == vm) {
            self.filler = None;
        }
    }

    /// A job with identity `key` queued; if it ends an idle gap, the gap is learned.
    pub fn on_submit(&mut self, vm: VmId, key: Option<KernelKey>, now: Duration) {
        let Some(v) = self.vms.get_mut(&vm) else {
            return;
        };
        if let Some((after, since)) = v.idle_since.take() {
            v.gaps.add(after, now.saturating_sub(since));
        }
        if v.overflow == 0 && v.keys.len() < KEYS_QUEUED {
            v.keys.push_back(key);
        } else {
            v.overflow = v.overflow.saturating_add(1);
        }
    }

    /// Sets the identity of `vm`'s newest queued job (known only after its submission: the
    /// implicit want of a run report; `None`: several kernels ran as one job). Nothing when that
    /// job is past the identities kept.
    pub fn identify(&mut self, vm: VmId, key: Option<KernelKey>) {
        if let Some(v) = self.vms.get_mut(&vm)
            && v.overflow == 0
            && let Some(last) = v.keys.back_mut()
        {
            *last = key;
        }
    }

    /// The VM's queue was dropped: no jobs, and no gap being measured.
    pub fn on_idle(&mut self, vm: VmId) {
        if let Some(v) = self.vms.get_mut(&vm) {
            v.keys.clear();
            v.overflow = 0;
            v.head_progress = Duration::ZERO;
            v.run_done = Duration::ZERO;
            v.idle_since = None;
        }
    }

    /// Inside `vm`'s running turn, its head job completed after `gpu_time` in this run and the
    /// VM went on with its next job: the job's whole GPU time is learned under its identity
    /// (per job, not per turn), and the next job, whose identity the VM does not send, is the
    /// head, unidentified.
    pub fn on_progress(&mut self, vm: VmId, gpu_time: Duration) {
        let Some(v) = self.vms.get_mut(&vm) else {
            return;
        };
        let key = v.pop_head();
        v.kernels.add(key, v.head_progress.saturating_add(gpu_time));
        v.head_progress = Duration::ZERO;
        v.run_done = v.run_done.saturating_add(gpu_time);
        if v.keys.is_empty() && v.overflow == 0 {
            v.keys.push_back(None);
        }
    }

    /// The head job of `vm` ran `gpu_time` and was preempted (it stays queued).
    pub fn on_preempted(&mut self, vm: VmId, gpu_time: Duration) {
        if self.filler.is_some_and(|f| f.vm == vm) {
            self.filler = None;
        }
        if let Some(v) = self.vms.get_mut(&vm) {
            let head = gpu_time.saturating_sub(std::mem::take(&mut v.run_done));
            v.head_progress = v.head_progress.saturating_add(head);
        }
    }

    /// The head job of `vm` ended after `gpu_time` (this run); `measured`: it completed (its
    /// whole GPU time is learned), otherwise it faulted. `idle`: the VM has no jobs left, so a
    /// gap starts now.
    pub fn on_end(
        &mut self,
        vm: VmId,
        gpu_time: Duration,
        measured: bool,
        idle: bool,
        now: Duration,
    ) {
        if self.filler.is_some_and(|f| f.vm == vm) {
            self.filler = None;
        }
        let Some(v) = self.vms.get_mut(&vm) else {
            return;
        };
        let key = v.pop_head();
        let head = gpu_time.saturating_sub(std::mem::take(&mut v.run_done));
        if measured {
            v.kernels.add(key, v.head_progress.saturating_add(head));
        }
        v.head_progress = Duration::ZERO;
        v.idle_since = if idle { Some((key, now)) } else { None };
    }

    /// Predicted GPU time left of `vm`'s head job, if its identity has enough samples.
    pub fn head_remaining(&self, vm: VmId) -> Option<Duration> {
        let v = self.vms.get(&vm)?;
        let key = v.keys.front().copied().unwrap_or(None);
        let e = v.kernels.get(key, self.params.samples)?;
        let high = e.high();
        // A head that already ran longer than predicted has no prediction left.
        (v.head_progress < high).then(|| high - v.head_progress)
    }

    /// Predicted idle gap after `vm`'s last completion: (when it started, predicted length:
    /// the low quantile of the gaps seen after that identity).
    pub fn gap(&self, vm: VmId) -> Option<(Duration, Option<Duration>)> {
        let (since, window) = self.gap_window(vm)?;
        Some((since, window.map(|(low, _)| low)))
    }

    /// As `gap`, with the return window: (low quantile, third quartile) of the gaps seen.
    fn gap_window(&self, vm: VmId) -> Option<(Duration, Option<(Duration, Duration)>)> {
        let v = self.vms.get(&vm)?;
        let (key, since) = v.idle_since?;
        let window = v
            .gaps
            .get(key, self.params.samples)
            .map(|w| (w.low(), w.upper()));
        Some((since, window))
    }

    /// How the idle VMs `higher` (those of classes above the one that has work) constrain a
    /// grant at `now`. Per VM in a gap with a prediction: before the low quantile of its gap
    /// ends, the gap bounds the grant (`Gap`); from then until the gap's third quartile (at
    /// least `min_gap` more, at most `hold`), it is due (`Hold`: the GPU waits for it, so that its submission
    /// is granted at once, while its thread is still awake, instead of after a preempt and a
    /// save); later, it is late and
    /// constrains nothing (strict-priority preemption covers its return; slicing the lower
    /// classes finely while waiting for a late VM cost a switch and a context save per slice).
    /// Without a prediction yet: short slices until it has been idle `idle`.
    pub fn gate(&self, higher: impl Iterator<Item = VmId>, now: Duration) -> Gate {
        let (mut end, mut hold, mut short) = (None::<(Duration, VmId)>, None, false);
        let earliest = |best: &mut Option<(Duration, VmId)>, t: Duration, vm: VmId| {
            if best.is_none_or(|(b, _)| t < b) {
                *best = Some((t, vm));
            }
        };
        for vm in higher {
            let Some((since, window)) = self.gap_window(vm) else {
                continue; // not in a gap (never ran, or its queue was dropped)
            };
            match window {
                Some((low, upper)) => {
                    let due = since.saturating_add(low);
                    let late = since
                        .saturating_add(upper)
                        .max(due.saturating_add(self.params.min_gap))
                        .min(due.saturating_add(self.params.hold));
                    if now < due {
                        earliest(&mut end, due, vm);
                    } else if now < late {
                        earliest(&mut hold, late, vm);
                    }
                }
                None => short |= now < since.saturating_add(self.params.idle),
            }
        }
        match (hold, end, short) {
            (Some((until, vm)), _, _) => Gate::Hold { vm, until },
            (None, Some((end, vm)), short) => Gate::Gap { vm, end, short },
            (None, None, true) => Gate::Short,
            (None, None, false) => Gate::Open,
        }
    }

    pub fn set_filler(&mut self, filler: Option<Filler>) {
        self.filler = filler;
    }

    pub fn filler(&self) -> Option<Filler> {
        self.filler
    }

    /// Identities with a GPU-time estimate kept for `vm` (for tests and reports).
    pub fn kernels_known(&self, vm: VmId) -> usize {
        self.vms.get(&vm).map_or(0, |v| v.kernels.len())
    }
}
