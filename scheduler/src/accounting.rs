//! Accounting of GPU time per VM: totals and usage per fixed window (for reports and plots).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::types::VmId;

/// GPU time of each VM in one window `[start, start + window)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowUsage {
    pub start: Duration,
    pub per_vm: BTreeMap<VmId, Duration>,
}

impl WindowUsage {
    /// Sum over all VMs.
    pub fn total(&self) -> Duration {
        self.per_vm.values().sum()
    }
}

/// Windows are aligned at multiples of `window` from time zero; the last `history` are kept.
#[derive(Debug, Clone)]
pub struct Accounting {
    window: Duration,
    history: usize,
    /// Index (start / window) of the first window kept.
    first: u128,
    windows: VecDeque<BTreeMap<VmId, Duration>>,
    totals: BTreeMap<VmId, Duration>,
}

impl Accounting {
    /// `window` of zero is treated as 1 ns and `history` of zero as 1 (never panics).
    pub fn new(window: Duration, history: usize) -> Self {
        Self {
            window: window.max(Duration::from_nanos(1)),
            history: history.max(1),
            first: 0,
            windows: VecDeque::new(),
            totals: BTreeMap::new(),
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// Charges `vm` for the GPU time of `[end - gpu_time, end)`, split across windows.
    pub fn charge(&mut self, vm: VmId, gpu_time: Duration, end: Duration) {
        let total = self.totals.entry(vm).or_default();
        *total = total.saturating_add(gpu_time);
        let w = self.window.as_nanos();
        let end_ns = end.as_nanos();
        let start_ns = end_ns.saturating_sub(gpu_time.as_nanos());
        if end_ns == start_ns {
            return;
        }
        let last_idx = (end_ns - 1) / w;
        // Windows older than the history are not materialized (bounded work on any input).
        let keep_from = (last_idx + 1).saturating_sub(self.history as u128);
        let lo_idx = (start_ns / w).max(keep_from);
        self.ensure(lo_idx, last_idx);
        let first_idx = lo_idx.max(self.first);
        for idx in first_idx..=last_idx {
            let lo = start_ns.max(idx * w);
            let hi = end_ns.min((idx + 1) * w);
            if hi <= lo {
                continue;
            }
            let slot = usize::try_from(idx.saturating_sub(self.first)).ok();
            let Some(slot) = slot.and_then(|i| self.windows.get_mut(i)) else {
                continue;
            };
            let d = slot.entry(vm).or_default();
            *d = d.saturating_add(Duration::from_nanos(
                u64::try_from(hi - lo).unwrap_or(u64::MAX),
            ));
        }
    }

    /// Makes windows up to `idx` exist, dropping the oldest beyond the history.
    fn ensure(&mut self, lo_idx: u128, idx: u128) {
        if self.windows.is_empty() {
            self.first = lo_idx;
        }
        let have_last = self.first + self.windows.len() as u128;
        if idx >= have_last.saturating_add(self.history as u128) {
            // A jump longer than the history: start over at the new window range.
            self.windows.clear();
            self.first = idx + 1 - self.history as u128;
        }
        while self.first + (self.windows.len() as u128) <= idx {
            self.windows.push_back(BTreeMap::new());
            if self.windows.len() > self.history {
                self.windows.pop_front();
                self.first += 1;
            }
        }
    }

    /// Total GPU time charged to `vm` (zero if never charged).
    pub fn total(&self, vm: VmId) -> Duration {
        self.totals.get(&vm).copied().unwrap_or_default()
    }

    /// Windows kept, oldest first (windows in which nothing ran are present as empty maps).
    pub fn windows(&self) -> impl Iterator<Item = WindowUsage> + '_ {
        self.windows.iter().enumerate().map(|(i, per_vm)| {
            let idx = self.first + i as u128;
            let ns = idx.saturating_mul(self.window.as_nanos());
            let start = Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX));
            WindowUsage {
                start,
                per_vm: per_vm.clone(),
            }
        })
    }

    /// Forgets a VM's totals (its windows keep what it used).
    pub fn forget(&mut self, vm: VmId) {
        self.totals.remove(&vm);
    }
}
