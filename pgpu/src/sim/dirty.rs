//! The sim engine's exact dirty log (see `crate::dirty`): the MMU marks every 4 KiB page it
//! translates for a store, an atomic or a copy's destination, and `vram_write`/`vram_fill` mark
//! what they change, in one bitmap per target slot (0 is VRAM, 1.. the host regions registered
//! when logging started), keyed by host address.
//!
//! Runs cache translations: the interpreter's per-worker TLB serves a page's later stores
//! without asking the MMU again for the rest of its `run` call. So a harvest must not forget a
//! page that a run still in progress translated for writing: such pages are also set in a
//! second bitmap, `pinned`, reported by every harvest; when a run ends its pinned pages become
//! dirty again (its last stores through the TLB marked nothing), and they are unpinned once no
//! run is in progress. Runs already in progress when logging starts were never seen translating: while
//! one goes on every page is pinned, and when it ends every page is dirty (its last stores
//! happened before that, so the next harvest covers them).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::dirty::{self, PAGE};
use crate::sync::lock;

/// Pages of a tracked target, as atomic bits.
#[derive(Debug)]
struct Bits(Vec<AtomicU64>);

impl Bits {
    fn new(pages: u64) -> Self {
        Bits((0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    #[inline]
    fn set(&self, p: u64) {
        if let Some(w) = self.0.get((p / 64) as usize) {
            let bit = 1u64 << (p % 64);
            // A load first: a page written over and over stays a read of a shared line.
            if w.load(Ordering::Relaxed) & bit == 0 {
                w.fetch_or(bit, Ordering::Relaxed);
            }
        }
    }
    /// ORs pages `first..first + n` into `out` (bit 0 = `first`), clearing them if `clear`.
    fn harvest(&self, first: u64, n: u64, out: &mut [u64], clear: bool) {
        for i in 0..n {
            let p = first + i;
            let Some(w) = self.0.get((p / 64) as usize) else {
                return;
            };
            let bit = 1u64 << (p % 64);
            let set = if clear {
                w.fetch_and(!bit, Ordering::AcqRel) & bit != 0
            } else {
                w.load(Ordering::Acquire) & bit != 0
            };
            if set {
                out[(i / 64) as usize] |= 1 << (i % 64);
            }
        }
    }
    fn fill(&self, v: u64) {
        for w in &self.0 {
            w.store(v, Ordering::Relaxed);
        }
    }
}

/// One logged target: its host range and bitmaps.
#[derive(Debug)]
struct Tracked {
    host_base: usize,
    pages: u64,
    dirty: Bits,
    pinned: Bits,
}

/// Runs in progress.
#[derive(Debug, Default)]
struct Runs {
    active: u32,
}

/// The engine's dirty log, shared by every page table (`Mmu`).
#[derive(Debug, Default)]
pub struct SimDirtyLog {
    on: AtomicBool,
    /// Indexed by target slot.
    slots: RwLock<Vec<Option<Tracked>>>,
    runs: Mutex<Runs>,
}

/// A run in progress (held with its space); see the module's comment.
#[derive(Debug)]
pub struct RunPin {
    log: Arc<SimDirtyLog>,
    logged: bool,
}

impl Drop for RunPin {
    fn drop(&mut self) {
        self.log.run_ended(self.logged);
    }
}

impl SimDirtyLog {
    /// Whether logging is on.
    #[inline]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Starts logging over `targets` (slot, host base, bytes), clearing any earlier log.
    pub fn start(&self, targets: &[(u16, usize, u64)]) {
        let runs = lock(&self.runs);
        let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        slots.clear();
        for &(slot, host_base, len) in targets {
            let i = usize::from(slot);
            if slots.len() <= i {
                slots.resize_with(i + 1, || None);
            }
            let pages = len / PAGE;
            let pinned = Bits::new(pages);
            if runs.active > 0 {
                pinned.fill(u64::MAX);
            }
            slots[i] = Some(Tracked {
                host_base,
                pages,
                dirty: Bits::new(pages),
                pinned,
            });
        }
        self.on.store(true, Ordering::SeqCst);
    }

    /// Stops logging and frees the bitmaps.
    pub fn stop(&self) {
        let _runs = lock(&self.runs);
        self.on.store(false, Ordering::SeqCst);
        self.slots
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// A run starts (its TLB may cache write translations until the pin drops).
    pub fn run_started(self: &Arc<Self>) -> RunPin {
        let mut runs = lock(&self.runs);
        runs.active += 1;
        RunPin {
            log: self.clone(),
            logged: self.on(),
        }
    }

    fn run_ended(&self, logged: bool) {
        let mut runs = lock(&self.runs);
        runs.active = runs.active.saturating_sub(1);
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        for t in slots.iter().flatten() {
            if !logged {
                t.dirty.fill(u64::MAX);
            }
            // What a run stored through its TLB since the last harvest is in no dirty bit:
            // the pinned pages become dirty (every run's, conservatively), and are unpinned
            // once no run is left.
            for (d, p) in t.dirty.0.iter().zip(&t.pinned.0) {
                let v = p.load(Ordering::Acquire);
                if v != 0 {
                    d.fetch_or(v, Ordering::AcqRel);
                }
            }
            if runs.active == 0 {
                t.pinned.fill(0);
            }
        }
    }

    /// Marks the pages of host range `[host, host + len)` of `slot` written (no-op when off or
    /// for an untracked slot).
    #[inline]
    pub fn mark(&self, slot: u16, host: usize, len: usize) {
        if !self.on() || len == 0 {
            return;
        }
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let Some(Some(t)) = slots.get(usize::from(slot)) else {
            return;
        };
        let Some(off) = host.checked_sub(t.host_base) else {
            return;
        };
        let first = off as u64 / PAGE;
        let last = (off as u64 + len as u64 - 1) / PAGE;
        for p in first..=last.min(t.pages.saturating_sub(1)) {
            t.dirty.set(p);
            t.pinned.set(p);
        }
    }

    /// ORs into `bits` the written pages of `slot` among `len` bytes from byte `offset` of the
    /// target at `host_base` (now), clearing them. Everything when logging is off or the slot
    /// is not tracked (or was re-registered since).
    pub fn harvest(&self, slot: u16, host_base: usize, offset: u64, len: u64, bits: &mut [u64]) {
        let runs = lock(&self.runs);
        let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let tracked = slots
            .get(usize::from(slot))
            .and_then(Option::as_ref)
            .filter(|t| t.host_base == host_base && self.on());
        let Some(t) = tracked else {
            dirty::set_all(bits, len);
            return;
        };
        let (first, n) = (offset / PAGE, len / PAGE);
        t.dirty.harvest(first, n, bits, true);
        if runs.active > 0 {
            t.pinned.harvest(first, n, bits, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: usize = 0x7000_0000_0000;

    fn harvest(log: &SimDirtyLog, pages: u64) -> Vec<u64> {
        let mut b = vec![0; dirty::words(pages * PAGE)];
        log.harvest(0, BASE, 0, pages * PAGE, &mut b);
        b
    }

    #[test]
    fn marks_harvests_and_clears() {
        let log = SimDirtyLog::default();
        log.mark(0, BASE, 8);
        log.start(&[(0, BASE, 128 * PAGE)]);
        assert_eq!(harvest(&log, 128), vec![0, 0], "marks before the start");
        log.mark(0, BASE + 4095, 2);
        log.mark(0, BASE + 70 * 4096, 1);
        log.mark(3, BASE, 1); // untracked slot: ignored
        assert_eq!(harvest(&log, 128), vec![0b11, 1 << 6]);
        assert_eq!(harvest(&log, 128), vec![0, 0], "a harvest clears");
        // A sub-range: bit 0 is its first page; pages outside it stay.
        log.mark(0, BASE + 65 * 4096, 1);
        log.mark(0, BASE + 2 * 4096, 1);
        let mut b = vec![0; 1];
        log.harvest(0, BASE, 64 * PAGE, 64 * PAGE, &mut b);
        assert_eq!(b, vec![0b10]);
        assert_eq!(harvest(&log, 128), vec![0b100, 0]);
        // Another host base at that slot (re-registered): everything.
        let mut b = vec![0; 2];
        log.harvest(0, BASE + 4096, 0, 128 * PAGE, &mut b);
        assert_eq!(b, vec![u64::MAX, u64::MAX]);
        log.stop();
        assert_eq!(harvest(&log, 128), vec![u64::MAX, u64::MAX], "off: all");
    }

    #[test]
    fn pages_of_runs_in_progress_stay_dirty() {
        let log = Arc::new(SimDirtyLog::default());
        log.start(&[(0, BASE, 64 * PAGE)]);
        let run = log.run_started();
        log.mark(0, BASE + 5 * 4096, 4);
        assert_eq!(harvest(&log, 64), vec![1 << 5]);
        // The run may store to page 5 again through its TLB: still reported.
        assert_eq!(harvest(&log, 64), vec![1 << 5]);
        drop(run);
        // Its stores since the last harvest went through the TLB: dirty once more, then clean.
        assert_eq!(harvest(&log, 64), vec![1 << 5], "the run's last stores");
        assert_eq!(harvest(&log, 64), vec![0]);
    }

    #[test]
    fn runs_from_before_the_start_make_everything_dirty() {
        let log = Arc::new(SimDirtyLog::default());
        let early = log.run_started();
        log.start(&[(0, BASE, 64 * PAGE)]);
        let late = log.run_started();
        assert_eq!(harvest(&log, 64), vec![u64::MAX]);
        assert_eq!(harvest(&log, 64), vec![u64::MAX], "still running");
        drop(early);
        // Its stores happened before it ended, so before this harvest: everything again.
        assert_eq!(harvest(&log, 64), vec![u64::MAX]);
        drop(late);
        assert_eq!(
            harvest(&log, 64),
            vec![u64::MAX],
            "the late run's last stores"
        );
        assert_eq!(harvest(&log, 64), vec![0], "no run left");
        log.mark(0, BASE, 1);
        assert_eq!(harvest(&log, 64), vec![1]);
        assert_eq!(harvest(&log, 64), vec![0]);
    }
}
