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

use pgpu::{Engine, EngineSnapshot, Job, LaunchJob, MapTarget, ModuleId, Perm, SpaceId};
use shadow::SysmemMap;

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

    /// Marks the pages `[va, va + len)` of `space` reaches.
    fn range(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        len: u64,
        vram: &mut Vec<u64>,
        ram: &mut Vec<u64>,
    ) {
        let end = va.saturating_add(len);
        let mut page = va & !(PAGE - 1);
        while page < end {
            if !self.mark(engine, space, page, vram, ram) {
                // Unmapped: the copy faults there and writes nothing further.
                return;
            }
            page += PAGE;
        }
    }

    /// Marks the run of mapped, writable pages from `va` on (at most the partition's size),
    /// jumping over the ranges in `marked` (whole pages already marked: the walk goes on after
    /// them, each of their pages counted against the size) and adding the pages it marked to
    /// it. A declared range in `marked` may hold pages that are not mapped writable, where a
    /// walk of its own would have stopped: jumping over it marks more than that walk, never
    /// less (the marks stay a superset of what each pointer's own walk marks).
    fn extent(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        marked: &mut Vec<(u64, u64)>,
        (vram, ram): (&mut Vec<u64>, &mut Vec<u64>),
    ) {
        let mut page = va & !(PAGE - 1);
        let mut left = self.vram_pages.max(1);
        let mut from = page;
        // Where the next marked range starts (the ranges are looked at there only).
        let mut check = page;
        while left > 0 {
            if page >= check {
                if let Some(hi) = covered(marked, page) {
                    if from < page {
                        marked.push((from, page));
                    }
                    left = left.saturating_sub((hi - page) / PAGE);
                    (page, from, check) = (hi, hi, hi);
                    continue;
                }
                check = next_start(marked, page);
            }
            if !self.mark(engine, space, page, vram, ram) {
                break;
            }
            left -= 1;
            page = match page.checked_add(PAGE) {
                Some(p) => p,
                None => break,
            };
        }
        if from < page {
            marked.push((from, page));
        }
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

    /// A write-set pointer's extent `[lo, hi)` and whether it is a declared allocation (the
    /// one containing it); otherwise the run of mapped, writable pages from its page on.
    fn extent_of(&self, engine: &dyn Engine, space: SpaceId, va: u64) -> (u64, u64, bool) {
        if let Some((&s, &e)) = self.lock().declared.range(..=va).next_back()
            && va < e
        {
            return (s, e, true);
        }
        let (lo, hi) = self.extent_range(engine, space, va);
        (lo, hi, false)
    }

    /// Marks the pages of a write-set pointer's extent ([`WriteSetLog::extent_of`]): every
    /// mapped, writable page of its declared allocation, or its run.
    fn mark_extent(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        marked: &mut Vec<(u64, u64)>,
        (vram, ram): (&mut Vec<u64>, &mut Vec<u64>),
    ) {
        let declared = self
            .lock()
            .declared
            .range(..=va)
            .next_back()
            .map(|(s, e)| (*s, *e));
        match declared {
            Some((s, e)) if va < e => {
                // At most the partition's size (a declaration is no longer); once per job.
                // Ranges stay whole pages: a walk that jumps over this one resumes at a page.
                let lo = s & !(PAGE - 1);
                let hi = e.checked_next_multiple_of(PAGE).unwrap_or(u64::MAX);
                if marked.iter().any(|&(a, b)| a <= lo && hi <= b) {
                    return;
                }
                let mut page = lo;
                while page < e {
                    self.mark(engine, space, page, vram, ram);
                    page = match page.checked_add(PAGE) {
                        Some(p) => p,
                        None => break,
                    };
                }
                marked.push((lo, hi));
            }
            _ => self.extent(engine, space, va, marked, (vram, ram)),
        }
    }

    /// The byte range a pointer's run covers: from its page to the end of the run of mapped,
    /// writable pages ([`WriteSetLog::extent`]); empty if its page is not mapped so.
    fn extent_range(&self, engine: &dyn Engine, space: SpaceId, va: u64) -> (u64, u64) {
        let lo = va & !(PAGE - 1);
        let mut hi = lo;
        for _ in 0..self.vram_pages.max(1) {
            match engine.lookup(space, hi) {
                Ok(Some(t)) if t.perm == Perm::ReadWrite => {}
                _ => break,
            }
            hi = match hi.checked_add(PAGE) {
                Some(h) => h,
                None => break,
            };
        }
        (lo, hi)
    }

    /// Marks the page at `va` if it is mapped writable; false if not.
    fn mark(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        vram: &mut Vec<u64>,
        ram: &mut Vec<u64>,
    ) -> bool {
        let Ok(Some(t)) = engine.lookup(space, va) else {
            return false;
        };
        if t.perm != Perm::ReadWrite {
            return false;
        }
        match t.target {
            MapTarget::Vram { pa } => {
                if let Some(off) = pa.checked_sub(self.vram_base)
                    && off / PAGE < self.vram_pages
                {
                    vram.push(off / PAGE);
                }
            }
            MapTarget::Host { region, offset } => {
                if let Some(e) = self.sysmem.entries().iter().find(|e| {
                    e.region == region
                        && (e.offset..e.offset.saturating_add(e.len)).contains(&offset)
                }) {
                    ram.push((e.gpa + (offset - e.offset)) / PAGE);
                }
            }
        }
        true
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

/// The lowest start of a range of `marked` above `page` (`u64::MAX` if none).
fn next_start(marked: &[(u64, u64)], page: u64) -> u64 {
    marked
        .iter()
        .map(|&(lo, _)| lo)
        .filter(|&lo| lo > page)
        .min()
        .unwrap_or(u64::MAX)
}

/// The end of the range of `marked` that holds `page`, if one does.
fn covered(marked: &[(u64, u64)], page: u64) -> Option<u64> {
    marked
        .iter()
        .find(|&&(lo, hi)| lo <= page && page < hi)
        .map(|&(_, hi)| hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regs::{ALLOC_OP_DECLARE, ALLOC_OP_FORGET, ALLOC_OP_FORGET_ALL};

    const WINDOW: (u64, u64) = (0x10_0000_0000, 4 << 30);
    const VA: u64 = WINDOW.0;

    fn log() -> WriteSetLog {
        WriteSetLog::new(0, 64 << 20, SysmemMap::default())
    }

    fn ranges(l: &WriteSetLog) -> Vec<(u64, u64)> {
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

    /// Marks what each pointer of `ptrs` may write, as a checked launch's parameters do; the
    /// VRAM pages listed (in order, duplicates kept).
    fn marks(l: &WriteSetLog, e: &dyn Engine, space: SpaceId, ptrs: &[u64]) -> Vec<u64> {
        let (mut marked, mut vram, mut ram) = (Vec::new(), Vec::new(), Vec::new());
        for &p in ptrs {
            l.mark_extent(e, space, p, &mut marked, (&mut vram, &mut ram));
        }
        assert!(ram.is_empty());
        vram
    }

    /// Parameters pointing into one buffer list its pages once (a hostile launch's 512
    /// pointers at one 2 GiB extent made 512 walks and a list of 512 × 512 Ki pages); a walk
    /// that reaches pages an earlier one marked goes on after them; a declared allocation is
    /// marked once.
    #[test]
    fn pointers_into_one_buffer_mark_its_pages_once() {
        let e = pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 64 << 20,
            workers: 1,
            ..Default::default()
        })
        .unwrap();
        let space = e
            .create_space(pgpu::VaWindow {
                base: WINDOW.0,
                size: WINDOW.1,
            })
            .unwrap();
        // 16 writable pages at VA -> VRAM 0x10000, then a hole, then 4 pages at VA + 1 MiB.
        let map = |va: u64, pa: u64, len: u64| pgpu::Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm: Perm::ReadWrite,
            page_size: pgpu::PageSize::Size4K,
        };
        e.map_batch(
            space,
            &[
                map(VA, 0x10000, 0x10000),
                map(VA + (1 << 20), 0x40000, 0x4000),
            ],
        )
        .unwrap();
        let l = log();
        let run: Vec<u64> = (0x10..0x20).collect();
        // From the middle: to the run's end; then its start: the pages before, the rest jumped.
        let got = marks(&l, &e, space, &[VA + 0x3000, VA + 0x5000, VA + 0x10]);
        assert_eq!(got, [&run[3..], &run[..3]].concat());
        // 512 pointers into it, and one into the other run.
        let mut ptrs = vec![VA + 0x8000; 512];
        ptrs.push(VA + (1 << 20) + 0x2000);
        let got = marks(&l, &e, space, &ptrs);
        assert_eq!(got, [&run[8..], &[0x42, 0x43][..]].concat());
        // A declared allocation: its pages, once.
        l.declare(ALLOC_OP_DECLARE, VA + 0x2000, 0x3000, WINDOW);
        let got = marks(&l, &e, space, &[VA + 0x2000, VA + 0x4000, VA + 0x3000]);
        assert_eq!(got, vec![0x12, 0x13, 0x14]);
    }

    fn map4k(va: u64, pa: u64, perm: Perm) -> pgpu::Mapping {
        pgpu::Mapping {
            va,
            len: PAGE,
            target: MapTarget::Vram { pa },
            perm,
            page_size: pgpu::PageSize::Size4K,
        }
    }

    fn sim64() -> pgpu::sim::SimEngine {
        pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 64 << 20,
            workers: 1,
            ..Default::default()
        })
        .unwrap()
    }

    fn space(e: &pgpu::sim::SimEngine) -> SpaceId {
        e.create_space(pgpu::VaWindow {
            base: WINDOW.0,
            size: WINDOW.1,
        })
        .unwrap()
    }

    /// What each pointer's own walk marks (a fresh `marked` per pointer: what the code marked
    /// before pointers shared one).
    fn alone(l: &WriteSetLog, e: &dyn Engine, space: SpaceId, ptrs: &[u64]) -> BTreeSet<u64> {
        ptrs.iter()
            .flat_map(|&p| marks(l, e, space, &[p]))
            .collect()
    }

    /// Found by review: a walk that jumped to a declared range's unaligned end and stopped at
    /// the partition's size left a range whose last page it had not marked; a declared range
    /// inside it was then skipped, its page missed. Ranges are now whole pages.
    #[test]
    fn a_capped_walk_after_a_declared_range_misses_no_page() {
        let e = sim64();
        let s = space(&e);
        // VA pages 0..8 alias VRAM page 0; VA page 8 is VRAM page 5.
        let mut ms: Vec<_> = (0..8)
            .map(|k| map4k(VA + k * PAGE, 0, Perm::ReadWrite))
            .collect();
        ms.push(map4k(VA + 8 * PAGE, 5 * PAGE, Perm::ReadWrite));
        e.map_batch(s, &ms).unwrap();
        let l = WriteSetLog::new(0, 8 * PAGE, SysmemMap::default());
        l.declare(ALLOC_OP_DECLARE, VA + 0x100, 0x1700, WINDOW);
        l.declare(ALLOC_OP_DECLARE, VA + 0x7000, 0x1400, WINDOW);
        let ptrs = [VA + 0x100, VA, VA + 0x7000];
        let one = alone(&l, &e, s, &ptrs);
        let all: BTreeSet<u64> = marks(&l, &e, s, &ptrs).into_iter().collect();
        assert!(one.contains(&5));
        assert!(all.is_superset(&one), "alone {one:?}, together {all:?}");
    }

    /// Random address spaces (holes, read-only pages, aliases), declarations and pointers:
    /// the pages marked together are a superset of those each pointer's walk marks alone.
    #[test]
    fn pointers_marked_together_cover_what_each_marks_alone() {
        let e = sim64();
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200_000 {
            let s = space(&e);
            let (pages, vram_pages) = (4 + rnd(12), 1 + rnd(12));
            let ms: Vec<_> = (0..pages)
                .filter_map(|k| {
                    let (va, pa) = (VA + k * PAGE, rnd(vram_pages + 4) * PAGE);
                    match rnd(16) {
                        0 => None,
                        1 => Some(map4k(va, pa, Perm::ReadOnly)),
                        _ => Some(map4k(va, pa, Perm::ReadWrite)),
                    }
                })
                .collect();
            if !ms.is_empty() {
                e.map_batch(s, &ms).unwrap();
            }
            let l = WriteSetLog::new(0, vram_pages * PAGE, SysmemMap::default());
            for _ in 0..1 + rnd(3) {
                l.declare(
                    ALLOC_OP_DECLARE,
                    VA + rnd(pages * PAGE),
                    1 + rnd(4 * PAGE),
                    WINDOW,
                );
            }
            let ptrs: Vec<u64> = (0..1 + rnd(8))
                .map(|_| VA + rnd((pages + 2) * PAGE))
                .collect();
            let one = alone(&l, &e, s, &ptrs);
            let all: BTreeSet<u64> = marks(&l, &e, s, &ptrs).into_iter().collect();
            assert!(
                all.is_superset(&one),
                "round {round}: {vram_pages} pages, declared {:x?}, pointers {ptrs:x?}: \
                 alone {one:?}, together {all:?}",
                ranges(&l)
            );
            e.destroy_space(s).unwrap();
        }
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
