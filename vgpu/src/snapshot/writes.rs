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
//! The extent is a speculation (a kernel could index past its buffer); PhOS validates it at run
//! time with a bounds check its transformation inserts, which is not built here
//! (docs/snapshot.md, "Live snapshots and VRAM pre-copy").

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use pgpu::{Engine, Job, MapTarget, ModuleId, Perm, SpaceId};
use shadow::SysmemMap;

const PAGE: u64 = 4096;
/// Most distinct kernels whose write sets are kept (a guest loading more re-analyses).
const MAX_CACHED: usize = 256;

#[derive(Debug, Default)]
struct Inner {
    /// VRAM partition pages: dirty since the last harvest, and pinned by the running job.
    dirty: Vec<u64>,
    pinned: Vec<u64>,
    /// A job that may have written anywhere ended since the last VRAM / RAM harvest.
    all_dirty_vram: bool,
    all_dirty_ram: bool,
    all_pinned: bool,
    /// Guest-physical RAM pages, likewise.
    ram_dirty: BTreeSet<u64>,
    ram_pinned: BTreeSet<u64>,
    /// Write sets by (module, entry); `None`: the text did not analyse (everything).
    sets: HashMap<(ModuleId, String), Option<ptx::WriteSet>>,
}

/// Per-job write sets of a device (shared by the worker and the snapshot code).
#[derive(Debug)]
pub struct WriteSetLog {
    on: AtomicBool,
    vram_base: u64,
    vram_pages: u64,
    sysmem: SysmemMap,
    inner: Mutex<Inner>,
}

fn set(bits: &mut [u64], p: u64) {
    if let Some(w) = bits.get_mut((p / 64) as usize) {
        *w |= 1 << (p % 64);
    }
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
    pub fn set(&self, on: bool) {
        let mut i = self.lock();
        let words = pgpu::dirty::words(self.vram_pages * PAGE);
        i.dirty = vec![0; words];
        i.pinned = vec![0; words];
        i.all_dirty_vram = false;
        i.all_dirty_ram = false;
        i.all_pinned = false;
        i.ram_dirty.clear();
        i.ram_pinned.clear();
        self.on.store(on, Ordering::Release);
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
        let ws = ptx::parse(text).ok().and_then(|m| m.write_set(entry));
        let mut i = self.lock();
        if i.sets.len() >= MAX_CACHED {
            i.sets.clear();
        }
        i.sets.insert(key, ws);
    }

    /// Marks (pinned) what `job` may write; call before it runs and `job_ended` after.
    pub fn job_begins(&self, engine: &dyn Engine, job: &Job) {
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
                match ws {
                    Some(ws) if !ws.unbounded => {
                        for off in ws.params {
                            let o = off as usize;
                            let Some(b) = l.params.get(o..o + 8) else {
                                all = true;
                                continue;
                            };
                            let ptr = u64::from_le_bytes(b.try_into().unwrap_or_default());
                            self.extent(engine, l.space, ptr, &mut vram, &mut ram);
                        }
                    }
                    _ => all = true,
                }
            }
        }
        let mut i = self.lock();
        i.all_pinned |= all;
        for p in vram {
            set(&mut i.pinned, p);
        }
        i.ram_pinned.extend(ram);
    }

    /// The job ended: what it pinned becomes dirty.
    pub fn job_ended(&self) {
        let mut i = self.lock();
        let pinned = std::mem::take(&mut i.pinned);
        for (d, p) in i.dirty.iter_mut().zip(&pinned) {
            *d |= p;
        }
        i.pinned = vec![0; pinned.len()];
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

    /// Marks the run of mapped, writable pages from `va` on (at most the partition's size).
    fn extent(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        vram: &mut Vec<u64>,
        ram: &mut Vec<u64>,
    ) {
        let mut page = va & !(PAGE - 1);
        for _ in 0..self.vram_pages.max(1) {
            if !self.mark(engine, space, page, vram, ram) {
                return;
            }
            page = match page.checked_add(PAGE) {
                Some(p) => p,
                None => return,
            };
        }
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
        let dirty = std::mem::take(&mut i.dirty);
        for ((b, d), p) in bits.iter_mut().zip(&dirty).zip(&i.pinned) {
            *b |= d | p;
        }
        i.dirty = vec![0; dirty.len()];
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
