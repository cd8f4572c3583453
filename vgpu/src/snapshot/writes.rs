//! The device's own dirty log for engines that keep none (cuda; or `dirtylog=writesets`):
//! per-job write sets (issue 17, POS-style). Before each job runs while a live snapshot logs,
//! the worker marks what it may write: for a kernel launch, the buffers its write-set
//! parameters point to (`ptx::Module::write_set`: the 64-bit parameters that reach the
//! addresses of global stores, atomics and reductions); for a copy, its destination range. A
//! parameter's extent is the run of mapped, writable pages from its pointer on in the
//! channel's GPU address space (until the first unmapped or read-only page, at most the
//! partition's size in pages), each page counted where it lands: a page of the VM's VRAM
//! partition, or of its RAM (system-memory mappings). A launch whose write set is unbounded
//! (or whose text does not analyse) marks everything. Marks stay "pinned" (reported by every
//! harvest) while the job runs and become ordinary dirty pages when it ends, so a harvest in
//! the middle of a job never forgets what it may still write.
//!
//! The extent is a speculation (a kernel could index past its buffer), validated at run time
//! as PhOS does: while the log is on, a launch with a bounded write set runs its module's
//! bounds-checked twin (`ptx::ckpt::bounds`, loaded like any module of the VM), whose stores
//! compare their addresses with the extents (passed as extra parameters) and store 1 into the
//! device's flag word (engine-owned, `EngineSnapshot::alloc_flag`) when outside all of them.
//! Before each harvest the flag is read and cleared ([`WriteSetLog::take_flag`]); a set flag
//! makes that harvest conservative (everything dirty) and is counted. A launch that cannot run
//! checked (no flag word, the transformation refused the module, its twin did not load) marks
//! everything (docs/snapshot.md, "Live snapshots and VRAM pre-copy").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use std::sync::Arc;

use pgpu::{Engine, EngineSnapshot, Job, LaunchJob, ModuleId, SpaceId};
use shadow::SysmemMap;

mod marks;
mod twins;

const PAGE: u64 = 4096;
/// Most distinct kernels whose write sets are kept (a guest loading more re-analyses).
const MAX_CACHED: usize = 256;
/// Most address spaces with a flag word (launches in further ones mark everything).
const MAX_FLAGS: usize = 64;
/// Most declared allocations at once.
pub const MAX_DECLARED: usize = 4096;

#[derive(Debug, Default)]
struct Inner {
    /// VRAM partition pages (bitmaps of the partition's size): dirty since the last harvest,
    /// and pinned by the running job, with the indexes of the pinned bitmap's non-zero words
    /// (a launch pins a few pages: a job's end and a harvest visit only those words, and the
    /// memory stays the bitmaps' whatever a hostile launch names).
    dirty: Vec<u64>,
    pinned: Vec<u64>,
    pinned_words: Vec<usize>,
    /// A job that may have written anywhere ended since the last VRAM / RAM harvest.
    all_dirty_vram: bool,
    all_dirty_ram: bool,
    all_pinned: bool,
    /// Guest-physical RAM pages, likewise.
    ram_dirty: BTreeSet<u64>,
    ram_pinned: BTreeSet<u64>,
    /// Write sets by (module, entry); `None`: the text did not analyse (everything).
    sets: HashMap<(ModuleId, String), Option<Arc<ptx::WriteSet>>>,
    /// Bounds-checked twins by module; `None`: the transformation refused the text.
    checked: HashMap<ModuleId, Option<Arc<Twin>>>,
    /// The flag word (VA) of the checked kernels of each address space (`None`: the engine
    /// gave none; launches there mark everything).
    flags: HashMap<SpaceId, Option<u64>>,
    stats: ValidationStats,
    /// The guest's declared allocations (`ALLOC_DECLARE`): start VA -> end VA, disjoint.
    declared: BTreeMap<u64, u64>,
    /// What the last preparation did (twins loaded, nanoseconds), for the next start's
    /// counters.
    prepared: (u64, u64),
    /// The twins whose engine load the preparation holds (given back when the log stops).
    twin_loads: Vec<Arc<Twin>>,
}

/// A module's bounds-checked twin (`ptx::ckpt::bounds`).
#[derive(Debug)]
pub struct Twin {
    /// Its PTX (loaded through the VM's module cache).
    pub ptx: Arc<str>,
    checked: ptx::ckpt::bounds::Checked,
    /// The engine module a preparation loaded it as (`twins`), held until the log stops.
    prepared: Mutex<Option<ModuleId>>,
}

impl Twin {
    /// The bounds-checked twin of `text`, or `None` when the transformation refuses it.
    fn of(text: &str) -> Option<Arc<Twin>> {
        match ptx::ckpt::bounds::transform(text, &ptx::LoadOptions::default()) {
            Ok(c) => Some(Arc::new(Twin {
                ptx: c.ptx.as_str().into(),
                checked: c,
                prepared: Mutex::new(None),
            })),
            Err(e) => {
                log::info!("vgpu: write sets: module not checkable: {e}");
                None
            }
        }
    }

    /// The engine module a preparation loaded for it (the worker loading the same text gets
    /// this module back from the engine's content cache: no second transformation or JIT).
    pub fn prepared(&self) -> Option<ModuleId> {
        *self.prepared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Counters of write-set validation since the log was last started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValidationStats {
    /// Runs of launches that ran bounds-checked.
    pub checked_runs: u64,
    /// Runs of launches with a bounded write set that could not run checked (marked
    /// everything).
    pub unchecked_runs: u64,
    /// Harvests made conservative because a checked kernel stored outside its extents.
    pub outside: u64,
    /// Write-set pointers of checked launches inside a declared allocation (their extent).
    pub declared_extents: u64,
    /// Those in none (their extent: the mapped run from their page on).
    pub undeclared_extents: u64,
    /// `ALLOC_DECLARE` writes refused (since the device was made).
    pub declarations_refused: u64,
    /// Nanoseconds the GPU worker spent on the write sets' bookkeeping (choosing and loading
    /// the checked twin, marking a job's extents, its end), between the guest's jobs: time the
    /// guest's queue waits that it does not wait with the log off.
    pub worker_ns: u64,
    /// Jobs that bookkeeping ran for.
    pub worker_jobs: u64,
    /// Twins the preparation before this start analysed, transformed and loaded into the
    /// engine (off the GPU worker, before the log was on), and the nanoseconds it took.
    pub twins_prepared: u64,
    pub prepare_ns: u64,
    /// Launches that loaded their twin into the VM's module cache: the module the
    /// preparation had loaded (no JIT at the launch), or another (transformed and loaded by
    /// the worker at the launch: the guest's queue waits for it).
    pub twin_loads_ready: u64,
    pub twin_loads_cold: u64,
}

/// What a launch runs while the log is on.
#[derive(Debug)]
pub enum Checked {
    /// As it is: the log is off, or its write set is unbounded (it marks everything anyway).
    Plain,
    /// Its bounds-checked twin: load `twin.ptx` and run the same entry with `params`.
    Twin { twin: Arc<Twin>, params: Vec<u8> },
    /// It cannot run checked: it marks everything.
    Unchecked,
}

/// Per-job write sets of a device (shared by the worker and the snapshot code).
#[derive(Debug)]
pub struct WriteSetLog {
    on: AtomicBool,
    vram_base: u64,
    vram_pages: u64,
    sysmem: SysmemMap,
    inner: Mutex<Inner>,
    /// The modules, entries and spaces the guest launched (for the preparation, `twins`).
    seen: Mutex<twins::Seen>,
}

impl WriteSetLog {
    /// A log for the partition `[vram_base, vram_base + vram)` and the RAM of `sysmem`.
    pub fn new(vram_base: u64, vram: u64, sysmem: SysmemMap) -> Self {
        WriteSetLog {
            on: AtomicBool::new(false),
            vram_base,
            vram_pages: vram / PAGE,
            sysmem,
            inner: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether it logs.
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Starts (clearing) or stops logging. A job running at the start was marked by no one: it
    /// pins everything until it ends (the device preempts it for the start, so there is none).
    /// The checked kernels' flag words (one per address space, taken from `engine` at the
    /// first checked launch there) are kept until [`WriteSetLog::release`] (a checked
    /// kernel's context, suspended, keeps its address); each start clears them and the
    /// counters.
    pub fn set(&self, on: bool, engine: &dyn EngineSnapshot) {
        let mut i = self.lock();
        if on {
            for va in i.flags.values().flatten() {
                if let Err(e) = engine.take_flag(*va) {
                    log::warn!("vgpu: write sets: flag word {va:#x}: {e}");
                }
            }
            let (twins, ns) = std::mem::take(&mut i.prepared);
            i.stats = ValidationStats {
                declarations_refused: i.stats.declarations_refused,
                twins_prepared: twins,
                prepare_ns: ns,
                ..ValidationStats::default()
            };
        } else {
            self.unload_prepared(&mut i, engine);
        }
        let words = pgpu::dirty::words(self.vram_pages * PAGE);
        i.dirty = vec![0; words];
        i.pinned = vec![0; words];
        i.pinned_words.clear();
        i.all_dirty_vram = false;
        i.all_dirty_ram = false;
        i.all_pinned = false;
        i.ram_dirty.clear();
        i.ram_pinned.clear();
        self.on.store(on, Ordering::Release);
    }

    /// Gives the flag words and the prepared twins' engine modules back (the device goes
    /// away).
    pub fn release(&self, engine: &dyn EngineSnapshot) {
        self.unload_prepared(&mut self.lock(), engine);
        for va in std::mem::take(&mut self.lock().flags)
            .into_values()
            .flatten()
        {
            engine.free_flag(va);
        }
    }

    /// The flag word of `space`'s checked kernels, taken from `engine` the first time.
    fn flag(&self, engine: &dyn EngineSnapshot, space: SpaceId) -> Option<u64> {
        let mut i = self.lock();
        if let Some(f) = i.flags.get(&space) {
            return *f;
        }
        if i.flags.len() >= MAX_FLAGS {
            return None;
        }
        let f = engine.alloc_flag(space).unwrap_or_else(|e| {
            log::warn!("vgpu: write sets: no flag word ({e}): launches mark everything");
            None
        });
        i.flags.insert(space, f);
        f
    }

    /// Analyses (once per module and entry) the write set of a kernel about to be launched.
    pub fn note_kernel(&self, module: ModuleId, entry: &str, text: &str) {
        if !self.on() {
            return;
        }
        let key = (module, entry.to_owned());
        if self.lock().sets.contains_key(&key) {
            return;
        }
        let ws = ptx::parse(text)
            .ok()
            .and_then(|m| m.write_set(entry))
            .map(Arc::new);
        let twin = if self.lock().checked.contains_key(&module) {
            None
        } else {
            Some(Twin::of(text))
        };
        let mut i = self.lock();
        if i.sets.len() >= MAX_CACHED {
            i.sets.clear();
        }
        if i.checked.len() >= MAX_CACHED {
            i.checked.clear();
        }
        i.sets.insert(key, ws);
        if let Some(t) = twin {
            i.checked.insert(module, t);
        }
    }

    /// What launch `l` runs while the log is on (see [`Checked`]); its extents are those
    /// [`WriteSetLog::job_begins`] marks.
    pub fn checked_launch(&self, engine: &dyn EngineSnapshot, l: &LaunchJob) -> Checked {
        if !self.on() {
            return Checked::Plain;
        }
        let (ws, twin) = {
            let i = self.lock();
            let ws = i.sets.get(&(l.module, l.entry.clone())).cloned().flatten();
            (ws, i.checked.get(&l.module).cloned().flatten())
        };
        let Some(ws) = ws.filter(|w| !w.unbounded) else {
            return Checked::Plain;
        };
        let (Some(twin), Some(flag)) = (twin, self.flag(engine, l.space)) else {
            return Checked::Unchecked;
        };
        let Some(e) = twin.checked.entry(&l.entry) else {
            return Checked::Unchecked;
        };
        if e.params.iter().copied().collect::<BTreeSet<u32>>() != ws.params
            || l.params.len() > e.own_size as usize
        {
            return Checked::Unchecked;
        }
        let ranges: Vec<(u64, u64)> = e
            .params
            .iter()
            .map(|&off| {
                let o = off as usize;
                let ptr = l
                    .params
                    .get(o..o + 8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes);
                let (lo, hi, declared) = self.extent_of(engine, l.space, ptr);
                let mut i = self.lock();
                if declared {
                    i.stats.declared_extents += 1;
                } else {
                    i.stats.undeclared_extents += 1;
                }
                (lo, hi)
            })
            .collect();
        let params = e.buffer(&l.params, flag, &ranges);
        Checked::Twin { twin, params }
    }

    /// Reads and clears the flag word: a checked kernel stored outside its extents since the
    /// last take, so everything counts as written (RAM and VRAM). Call before harvesting.
    pub fn take_flag(&self, engine: &dyn EngineSnapshot) {
        let flags: Vec<u64> = self.lock().flags.values().flatten().copied().collect();
        let mut outside = false;
        for va in flags {
            outside |= engine.take_flag(va).unwrap_or_else(|e| {
                log::warn!("vgpu: write sets: flag word unreadable ({e}): everything dirty");
                true
            });
        }
        if outside {
            let mut i = self.lock();
            i.all_dirty_vram = true;
            i.all_dirty_ram = true;
            i.stats.outside += 1;
        }
    }

    /// Adds `ns` of the worker's bookkeeping ([`ValidationStats::worker_ns`]); `job`: for a
    /// job not counted yet.
    pub fn note_worker(&self, ns: u64, job: bool) {
        let mut i = self.lock();
        i.stats.worker_ns = i.stats.worker_ns.saturating_add(ns);
        i.stats.worker_jobs += u64::from(job);
    }

    /// The counters since the log was last started.
    pub fn stats(&self) -> ValidationStats {
        self.lock().stats
    }

    /// Marks (pinned) what `job` may write; call before it runs and `job_ended` after.
    /// `checked`: a launch runs its bounds-checked twin; one with a bounded write set that
    /// does not marks everything.
    pub fn job_begins(&self, engine: &dyn Engine, job: &Job, checked: bool) {
        if !self.on() {
            return;
        }
        let mut vram = Vec::new();
        let mut ram = Vec::new();
        let mut all = false;
        match job {
            Job::Copy(c) => {
                self.range(engine, c.space, c.dst, c.len, &mut vram, &mut ram);
            }
            Job::Launch(l) => {
                let ws = self
                    .lock()
                    .sets
                    .get(&(l.module, l.entry.clone()))
                    .cloned()
                    .flatten();
                if ws.as_ref().is_some_and(|w| !w.unbounded) {
                    let mut i = self.lock();
                    if checked {
                        i.stats.checked_runs += 1;
                    } else {
                        i.stats.unchecked_runs += 1;
                        all = true;
                    }
                }
                match ws {
                    Some(ws) if !ws.unbounded && checked => {
                        // The VA ranges marked so far: parameters pointing into one buffer
                        // (up to the parameter space's 512 pointers at one 2 GiB extent)
                        // visit and list its pages once.
                        let mut marked = Vec::new();
                        for &off in &ws.params {
                            let o = off as usize;
                            let Some(b) = l.params.get(o..o + 8) else {
                                all = true;
                                continue;
                            };
                            let ptr = u64::from_le_bytes(b.try_into().unwrap_or_default());
                            let out = (&mut vram, &mut ram);
                            self.mark_extent(engine, l.space, ptr, &mut marked, out);
                        }
                    }
                    _ => all = true,
                }
            }
        }
        let mut i = self.lock();
        i.all_pinned |= all;
        let i = &mut *i;
        for p in vram {
            let w = (p / 64) as usize;
            if let Some(word) = i.pinned.get_mut(w) {
                if *word == 0 {
                    i.pinned_words.push(w);
                }
                *word |= 1 << (p % 64);
            }
        }
        i.ram_pinned.extend(ram);
    }

    /// The job ended: what it pinned becomes dirty.
    pub fn job_ended(&self) {
        let mut i = self.lock();
        let i = &mut *i;
        for w in i.pinned_words.drain(..) {
            if let (Some(d), Some(p)) = (i.dirty.get_mut(w), i.pinned.get_mut(w)) {
                *d |= std::mem::take(p);
            }
        }
        if std::mem::take(&mut i.all_pinned) {
            i.all_dirty_vram = true;
            i.all_dirty_ram = true;
        }
        let ram = std::mem::take(&mut i.ram_pinned);
        i.ram_dirty.extend(ram);
    }

    /// A guest's `ALLOC_DECLARE` write (`op`, with `ALLOC_VA`, `ALLOC_LEN` as written; the VA
    /// window `(base, size)`): see docs/hardware.md, "Declared allocations". Refusals are
    /// counted; nothing else happens (declarations are hints).
    pub fn declare(&self, op: u32, va: u64, len: u64, window: (u64, u64)) {
        let mut i = self.lock();
        let ok = match op {
            vgpu_hw::regs::ALLOC_OP_DECLARE => {
                let end = va.checked_add(len);
                let inside =
                    end.is_some_and(|e| va >= window.0 && e <= window.0.saturating_add(window.1));
                if len == 0 || !inside || len > self.vram_pages * PAGE {
                    false
                } else {
                    let end = va + len;
                    let overlapping: Vec<u64> = i
                        .declared
                        .range(..end)
                        .rev()
                        .take_while(|(_, e)| **e > va)
                        .map(|(s, _)| *s)
                        .collect();
                    for s in overlapping {
                        i.declared.remove(&s);
                    }
                    if i.declared.len() < MAX_DECLARED {
                        i.declared.insert(va, end);
                        true
                    } else {
                        false
                    }
                }
            }
            vgpu_hw::regs::ALLOC_OP_FORGET => i.declared.remove(&va).is_some(),
            vgpu_hw::regs::ALLOC_OP_FORGET_ALL => {
                i.declared.clear();
                true
            }
            _ => false,
        };
        if !ok {
            i.stats.declarations_refused += 1;
            log::debug!(
                "vgpu: ALLOC_DECLARE {op} [{va:#x}, +{len:#x}) refused (alloc_refused {})",
                i.stats.declarations_refused
            );
        }
    }

    /// Declared allocations now.
    pub fn declared(&self) -> usize {
        self.lock().declared.len()
    }

    /// ORs the partition pages written since the last harvest (and those the running job
    /// may still write) into `bits`, clearing the former.
    pub fn harvest_vram(&self, bits: &mut [u64]) {
        let mut i = self.lock();
        if std::mem::take(&mut i.all_dirty_vram) || i.all_pinned {
            pgpu::dirty::set_all(bits, self.vram_pages * PAGE);
        }
        for (b, d) in bits.iter_mut().zip(i.dirty.iter_mut()) {
            *b |= std::mem::take(d);
        }
        for &w in &i.pinned_words {
            if let (Some(b), Some(p)) = (bits.get_mut(w), i.pinned.get(w)) {
                *b |= p;
            }
        }
    }

    /// Guest-physical pages written since the last harvest (and those pinned); `None` when a
    /// job may have written anywhere (every page of RAM the GPU maps).
    pub fn harvest_ram(&self) -> Option<BTreeSet<u64>> {
        let mut i = self.lock();
        let mut out = std::mem::take(&mut i.ram_dirty);
        out.extend(i.ram_pinned.iter().copied());
        if std::mem::take(&mut i.all_dirty_ram) || i.all_pinned {
            return None;
        }
        Some(out)
    }

    /// Every guest-physical page of the RAM the GPU can map (the conservative answer).
    pub fn all_ram(&self) -> BTreeSet<u64> {
        self.sysmem
            .entries()
            .iter()
            .flat_map(|e| e.gpa / PAGE..(e.gpa + e.len) / PAGE)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regs::{ALLOC_OP_DECLARE, ALLOC_OP_FORGET, ALLOC_OP_FORGET_ALL};

    // Shared with `marks`' tests.
    pub(super) const WINDOW: (u64, u64) = (0x10_0000_0000, 4 << 30);
    pub(super) const VA: u64 = WINDOW.0;

    pub(super) fn log() -> WriteSetLog {
        WriteSetLog::new(0, 64 << 20, SysmemMap::default())
    }

    pub(super) fn ranges(l: &WriteSetLog) -> Vec<(u64, u64)> {
        l.lock().declared.iter().map(|(s, e)| (*s, *e)).collect()
    }

    #[test]
    fn declarations_replace_what_they_overlap_and_are_forgotten() {
        let l = log();
        l.declare(ALLOC_OP_DECLARE, VA, 0x1000, WINDOW);
        l.declare(ALLOC_OP_DECLARE, VA + 0x1000, 0x1000, WINDOW);
        l.declare(ALLOC_OP_DECLARE, VA + 0x3000, 0x100, WINDOW);
        assert_eq!(l.declared(), 3);
        // Overlaps the first two: they go.
        l.declare(ALLOC_OP_DECLARE, VA + 0x800, 0x1000, WINDOW);
        assert_eq!(
            ranges(&l),
            vec![(VA + 0x800, VA + 0x1800), (VA + 0x3000, VA + 0x3100)]
        );
        l.declare(ALLOC_OP_FORGET, VA + 0x3000, 0, WINDOW);
        assert_eq!(ranges(&l), vec![(VA + 0x800, VA + 0x1800)]);
        l.declare(ALLOC_OP_FORGET_ALL, 0, 0, WINDOW);
        assert_eq!(l.declared(), 0);
        assert_eq!(l.stats().declarations_refused, 0);
    }

    #[test]
    fn hostile_declarations_are_refused_and_counted() {
        let l = log();
        for (op, va, len) in [
            (ALLOC_OP_DECLARE, VA, 0),                  // empty
            (ALLOC_OP_DECLARE, u64::MAX - 10, 100),     // wraps
            (ALLOC_OP_DECLARE, VA - 0x1000, 0x2000),    // below the window
            (ALLOC_OP_DECLARE, VA + (4 << 30) - 8, 16), // past its end
            (ALLOC_OP_DECLARE, VA, (64 << 20) + 1),     // longer than the partition
            (ALLOC_OP_FORGET, VA, 0),                   // nothing there
            (7, VA, 0x1000),                            // no such operation
        ] {
            l.declare(op, va, len, WINDOW);
        }
        assert_eq!(l.declared(), 0);
        assert_eq!(l.stats().declarations_refused, 7);
        for k in 0..MAX_DECLARED as u64 + 10 {
            l.declare(ALLOC_OP_DECLARE, VA + k * 0x100, 0x100, WINDOW);
        }
        assert_eq!(l.declared(), MAX_DECLARED);
        assert_eq!(l.stats().declarations_refused, 17);
    }
}
