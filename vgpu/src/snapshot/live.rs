//! Live snapshots and migration of the virtual GPU (POS-style concurrent, incremental
//! checkpoint, issue 17; docs/snapshot.md "Live snapshots"): VRAM is copied in rounds while the
//! guest and the GPU run, through the engine's dirty log (`Engine::dirty_log_*`), and only the
//! pages written since the last round go into the image taken with the device paused (a `VDLT`
//! section instead of `VRAM`). A restore puts the pre-copied VRAM in place first, then the
//! delta.
//!
//! [`Precopy`] is the source's side: `round` sends the first round (every non-zero page) or
//! the pages dirtied since, `ram_dirty` hands the VMM the guest RAM the GPU wrote meanwhile (the
//! engine's jobs through host regions, the worker's own writes, the doorbell page: KVM's dirty
//! log sees none of them), `save_delta` writes the image once the device is paused. While it
//! lives the VRAM aperture traps (guest stores through a mapped aperture would bypass the log).
//! An engine without an exact log (`DirtyLogKind::Everything`) gains nothing from rounds: the
//! caller asks [`Precopy::exact`] and then pauses the GPU for the pre-copy instead, as before.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use pgpu::dirty::{self, DirtyLogKind};
use pgpu::{EngineSnapshot, MapTarget};

use super::format::{SnapReader, SnapWriter, VDLT};
use super::{SaveReport, SnapshotError, vram};
use crate::Vgpu;

const PAGE: u64 = 4096;
/// Most pages handed to a sink at once (1 MiB).
pub const MAX_RUN_PAGES: u64 = 256;
/// How long the start of a pre-copy lets a running job finish before preempting it.
pub const START_DRAIN: std::time::Duration = std::time::Duration::from_millis(250);
const RUN_HEADER: u64 = 12;

fn engine_err(e: pgpu::EngineError) -> SnapshotError {
    SnapshotError::Vram(e.to_string())
}

/// Guest RAM the worker writes itself (semaphores, small copies through `direct`), noted while
/// a live snapshot runs.
#[derive(Debug, Default)]
pub struct RamWriteLog {
    on: AtomicBool,
    pages: Mutex<BTreeSet<u64>>,
}

impl RamWriteLog {
    /// Notes guest-physical `[gpa, gpa + len)` written (while on).
    pub fn mark(&self, gpa: u64, len: u64) {
        if !self.on.load(Ordering::Acquire) || len == 0 {
            return;
        }
        let mut p = self.pages.lock().unwrap_or_else(PoisonError::into_inner);
        for page in gpa / PAGE..=(gpa + len - 1) / PAGE {
            p.insert(page);
        }
    }

    fn set(&self, on: bool) {
        let mut p = self.pages.lock().unwrap_or_else(PoisonError::into_inner);
        p.clear();
        self.on.store(on, Ordering::Release);
    }

    fn take(&self) -> BTreeSet<u64> {
        std::mem::take(&mut *self.pages.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What one VRAM round sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VramRound {
    /// Pages sent.
    pub pages: u64,
    /// Of which pages an earlier round had sent already.
    pub resent: u64,
    /// Microseconds finding the pages (round 0: the engine's scan for non-zero pages; later:
    /// the harvest, with the write sets' flag read) and reading and handing them over.
    pub find_us: u64,
    pub read_us: u64,
}

/// The source side of a VRAM pre-copy (see the module's comment). Dropping it stops the log
/// and maps the aperture again.
pub struct Precopy<'a> {
    gpu: &'a Vgpu,
    kind: DirtyLogKind,
    /// The device's per-job write sets stand in for the engine's log.
    writesets: bool,
    /// Pages of the partition sent by some round.
    sent: Vec<u64>,
    rounds: u32,
    /// How long the start stopped the guest's GPU queue (parked around the log's start), and
    /// whether it preempted a running job (one that did not end within [`START_DRAIN`]).
    start_blocked: std::time::Duration,
    start_preempted: bool,
}

impl Vgpu {
    /// Starts a VRAM pre-copy: the engine's dirty log on, the aperture trapping, the worker's
    /// RAM writes noted. Refused like a pause for GPUs whose snapshots are not supported.
    pub fn precopy_start(&self) -> Result<Precopy<'_>, SnapshotError> {
        self.snapshot_supported()?;
        if !self.cfg.vram.is_multiple_of(PAGE) {
            return Err(SnapshotError::Vram("partition is not whole pages".into()));
        }
        if let Some(r) = &self.remap {
            r.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .suspend(true);
        }
        self.ram_log.set(true);
        // From here on, dropping it undoes all of this.
        let mut p = Precopy {
            gpu: self,
            kind: DirtyLogKind::Everything,
            writesets: false,
            sent: vec![0; dirty::words(self.cfg.vram)],
            rounds: 0,
            start_blocked: std::time::Duration::ZERO,
            start_preempted: false,
        };
        // The log starts between two runs: a job running now would have been translating
        // unseen (the engine would then report every page dirty until it ended; the write sets
        // would have to count it as writing everything), so the start waits for it to end
        // (the guest's queue runs meanwhile) and preempts it only if it runs on past
        // START_DRAIN (it then resumes as a logged run; on write sets, unchecked).
        // With write sets, the checked launches' twins are made now, on this thread and
        // while the guest's queue still runs, not by the GPU worker at their first launch
        // (`writes::twins`).
        if self.cfg.dirty_writesets || self.engine.dirty_log_kind() != DirtyLogKind::Exact {
            self.write_log.prepare(&*self.engine);
        }
        let was_paused = self.is_paused();
        if !was_paused {
            p.start_preempted = self.pause_drain_within(START_DRAIN)?;
        }
        let blocked = std::time::Instant::now();
        let kind = self.engine.dirty_log_start().map_err(engine_err);
        if let Ok(k) = &kind
            && (*k != DirtyLogKind::Exact || self.cfg.dirty_writesets)
        {
            // No exact log in the engine (or asked for): the device's per-job write sets.
            self.write_log.set(true, &*self.engine);
            p.writesets = true;
        }
        if !was_paused {
            self.resume();
            p.start_blocked = blocked.elapsed();
        }
        p.kind = kind?;
        Ok(p)
    }

    /// Bytes of the VRAM partition (the size of a pre-copied VRAM file).
    pub fn vram_bytes(&self) -> u64 {
        self.cfg.vram
    }

    /// Restores a live snapshot's image (`VDLT` in place of `VRAM`) over `base`, the
    /// pre-copied VRAM (a file of exactly the partition's size); as [`Vgpu::restore`]
    /// otherwise. Returns the delta's bytes.
    pub fn restore_live(
        &self,
        input: &mut dyn std::io::Read,
        base: &std::fs::File,
    ) -> Result<u64, SnapshotError> {
        self.restore_inner(input, Base::File(base))
    }

    /// As [`Vgpu::restore_live`] where the pre-copied VRAM is in the partition already: the
    /// device was built on an engine made before it (`Vgpu::prepare_engine`) into which the
    /// pre-copy rounds were written as they arrived (an `--incoming` VM). Only the image's
    /// delta (the pages written since the last round) is applied; returns its bytes.
    pub fn restore_live_applied(
        &self,
        input: &mut dyn std::io::Read,
    ) -> Result<u64, SnapshotError> {
        self.restore_inner(input, Base::Applied)
    }
}

/// Where a restore's VRAM comes from besides the image.
#[derive(Clone, Copy)]
pub(super) enum Base<'a> {
    /// Nowhere: the image's `VRAM` section holds it all.
    Whole,
    /// A live image's pre-copied VRAM, a file of the partition's size, then its `VDLT`.
    File(&'a std::fs::File),
    /// A live image whose pre-copied VRAM is in the partition already; its `VDLT` only.
    Applied,
}

impl Precopy<'_> {
    /// Whether rounds can tell what was written: the engine's log is exact, or the device's
    /// per-job write sets stand in for it (otherwise rounds would resend everything).
    pub fn exact(&self) -> bool {
        self.kind == DirtyLogKind::Exact || self.writesets
    }

    /// Whether the device's per-job write sets track the GPU's writes (not the engine).
    pub fn uses_write_sets(&self) -> bool {
        self.writesets
    }

    /// The validation counters of the write sets (all zero when the engine's log is used).
    pub fn validation(&self) -> crate::snapshot::writes::ValidationStats {
        self.gpu.write_log.stats()
    }

    /// Rounds done.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    /// How long the start stopped the guest's GPU queue (zero if it was paused already).
    pub fn start_blocked(&self) -> std::time::Duration {
        self.start_blocked
    }

    /// Whether the start preempted a running job (it did not end within [`START_DRAIN`]).
    pub fn start_preempted(&self) -> bool {
        self.start_preempted
    }

    fn engine(&self) -> &dyn EngineSnapshot {
        &*self.gpu.engine
    }

    fn harvest_vram(&self) -> Result<Vec<u64>, SnapshotError> {
        let mut bits = vec![0u64; dirty::words(self.gpu.cfg.vram)];
        if self.writesets {
            self.gpu.write_log.take_flag(self.engine());
            self.gpu.write_log.harvest_vram(&mut bits);
            return Ok(bits);
        }
        self.engine()
            .dirty_log_harvest(
                MapTarget::Vram {
                    pa: self.gpu.vram_base,
                },
                self.gpu.cfg.vram,
                &mut bits,
            )
            .map_err(engine_err)?;
        Ok(bits)
    }

    /// Reads the pages of `runs` and hands them to `sink` (first page, bytes) in pieces of at
    /// most [`MAX_RUN_PAGES`], through the engine's bulk read (on cuda: pinned, double-buffered
    /// transfers instead of one synchronous copy per piece).
    fn send(
        &mut self,
        runs: &[(u64, u64)],
        sink: &mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> Result<VramRound, SnapshotError> {
        let base = self.gpu.vram_base;
        let mut pieces: Vec<(u64, u64)> = Vec::new();
        for &(first, count) in runs {
            let mut p = first;
            while p < first + count {
                let n = (first + count - p).min(MAX_RUN_PAGES);
                pieces.push((base + p * PAGE, n * PAGE));
                p += n;
            }
        }
        // The bulk read hands whole pages in order, never spanning two of `pieces`.
        let (mut i, mut at, mut failed) = (0usize, 0u64, None);
        let flow = self
            .engine()
            .vram_read_runs(&pieces, &mut |b: &[u8]| {
                let Some(&(pa, len)) = pieces.get(i) else {
                    failed = Some(std::io::Error::other("the engine read more than asked"));
                    return std::ops::ControlFlow::Break(());
                };
                if let Err(e) = sink((pa - base + at) / PAGE, b) {
                    failed = Some(e);
                    return std::ops::ControlFlow::Break(());
                }
                at += b.len() as u64;
                if at >= len {
                    (i, at) = (i + 1, 0);
                }
                std::ops::ControlFlow::Continue(())
            })
            .map_err(engine_err)?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        if flow.is_break() || i != pieces.len() {
            return Err(SnapshotError::Vram(format!(
                "the engine's bulk read ended after {i} of {} runs",
                pieces.len()
            )));
        }
        let mut r = VramRound::default();
        for &(first, count) in runs {
            for q in first..first + count {
                let (w, bit) = ((q / 64) as usize, 1u64 << (q % 64));
                if self.sent[w] & bit != 0 {
                    r.resent += 1;
                }
                self.sent[w] |= bit;
            }
            r.pages += count;
        }
        self.rounds += 1;
        Ok(r)
    }

    /// One round, with the GPU running: the first sends every non-zero page of the partition
    /// (the destination's starts zeroed), later ones the pages written since the previous
    /// (zero or not). `sink` gets (page in the partition, whole pages).
    pub fn round(
        &mut self,
        sink: &mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> Result<VramRound, SnapshotError> {
        let t = std::time::Instant::now();
        let runs = if self.rounds == 0 {
            vram::nonzero_runs(self.engine(), self.gpu.vram_base, self.gpu.cfg.vram)?
        } else {
            let bits = self.harvest_vram()?;
            dirty::runs(&bits, self.gpu.cfg.vram / PAGE, MAX_RUN_PAGES)
        };
        let find_us = t.elapsed().as_micros() as u64;
        let t = std::time::Instant::now();
        let r = self.send(&runs, sink)?;
        Ok(VramRound {
            find_us,
            read_us: t.elapsed().as_micros() as u64,
            ..r
        })
    }

    /// multigpu: with the device paused, the pages written since the previous round, to
    /// `sink` like [`Precopy::round`] (the last round of a move to another GPU).
    pub fn final_round(
        &mut self,
        sink: &mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> Result<VramRound, SnapshotError> {
        let bits = self.harvest_vram()?;
        let runs = dirty::runs(&bits, self.gpu.cfg.vram / PAGE, MAX_RUN_PAGES);
        self.send(&runs, sink)
    }

    /// Guest-physical pages (addresses / 4096) the GPU wrote since the previous call: through
    /// the engine's host regions, by the worker itself, and the doorbell page. Ascending.
    pub fn ram_dirty(&self) -> Result<Vec<u64>, SnapshotError> {
        let mut pages = self.gpu.ram_log.take();
        if self.writesets {
            self.gpu.write_log.take_flag(self.engine());
            match self.gpu.write_log.harvest_ram() {
                Some(p) => pages.extend(p),
                None => pages.extend(self.gpu.write_log.all_ram()),
            }
        }
        for e in self.gpu.sysmem.entries().iter().filter(|_| !self.writesets) {
            let mut bits = vec![0u64; dirty::words(e.len)];
            self.engine()
                .dirty_log_harvest(
                    MapTarget::Host {
                        region: e.region,
                        offset: e.offset,
                    },
                    e.len,
                    &mut bits,
                )
                .map_err(engine_err)?;
            for (first, n) in dirty::runs(&bits, e.len / PAGE, u64::MAX) {
                pages.extend((first..first + n).map(|p| e.gpa / PAGE + p));
            }
        }
        if let Some(b) = &self.gpu.shared.lock().bell {
            pages.insert(b.addr() / PAGE);
        }
        Ok(pages.into_iter().collect())
    }

    /// With the device paused: the image (as [`Vgpu::save_report`]) with the pages written
    /// since the last round as a `VDLT` section. Returns the report and that last round.
    pub fn save_delta(
        &mut self,
        out: &mut dyn Write,
    ) -> Result<(SaveReport, VramRound), SnapshotError> {
        let t = std::time::Instant::now();
        let bits = self.harvest_vram()?;
        let pages = self.gpu.cfg.vram / PAGE;
        let runs = dirty::runs(&bits, pages, u64::from(u32::MAX));
        let mut last = VramRound {
            find_us: t.elapsed().as_micros() as u64,
            ..VramRound::default()
        };
        let t = std::time::Instant::now();
        let gpu = self.gpu;
        let report = gpu.save_with(out, &mut |w: &mut SnapWriter<'_>| {
            let data: u64 = runs.iter().map(|(_, n)| n * PAGE).sum();
            w.header(VDLT, data + RUN_HEADER * runs.len() as u64)?;
            for &(first, count) in &runs {
                w.raw(&first.to_le_bytes())?;
                w.raw(&(count as u32).to_le_bytes())?;
                let mut sink =
                    |_: u64, b: &[u8]| w.raw(b).map_err(|e| std::io::Error::other(e.to_string()));
                let r = self.send(&[(first, count)], &mut sink)?;
                self.rounds -= 1;
                last.pages += r.pages;
                last.resent += r.resent;
            }
            Ok(data)
        })?;
        self.rounds += 1;
        last.read_us = t.elapsed().as_micros() as u64;
        Ok((report, last))
    }
}

impl Drop for Precopy<'_> {
    fn drop(&mut self) {
        self.gpu.engine.dirty_log_stop();
        self.gpu.write_log.set(false, &*self.gpu.engine);
        self.gpu.ram_log.set(false);
        if let Some(r) = &self.gpu.remap {
            r.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .suspend(false);
        }
    }
}

/// Restores the VRAM of a live snapshot: `base` (the pre-copied partition, exactly `size`
/// bytes, unless it is in the partition already) into the partition, then the `VDLT` runs over
/// it. Returns the delta's bytes. On error the caller scrubs.
pub(super) fn restore_delta(
    r: &mut SnapReader<'_>,
    engine: &dyn EngineSnapshot,
    base_pa: u64,
    size: u64,
    base: Base<'_>,
) -> Result<u64, SnapshotError> {
    const CHUNK: u64 = 4 << 20;
    if let Base::File(file) = base {
        let found = file.metadata()?.len();
        if found != size {
            return Err(SnapshotError::Vram(format!(
                "the pre-copied VRAM is {found} bytes, the partition {size}"
            )));
        }
        let n = write_base(engine, base_pa, file, size)?;
        log::debug!("vgpu restore: {n} bytes of pre-copied VRAM written");
    }
    let mut want = vec![0u8; CHUNK.min(size) as usize];
    // The delta.
    let pages = size / PAGE;
    let bad = |what: String| SnapshotError::Invalid {
        section: "VDLT",
        what,
    };
    let mut left = r.header(VDLT, vram::limit(size))?;
    let mut next = 0u64;
    let mut data = 0u64;
    while left > 0 {
        if left < RUN_HEADER {
            return Err(bad(format!("{left} bytes left, not a run")));
        }
        let mut h = [0u8; RUN_HEADER as usize];
        r.exact(&mut h, "VDLT")?;
        let first = u64::from_le_bytes(h[..8].try_into().unwrap_or_default());
        let count = u64::from(u32::from_le_bytes(h[8..].try_into().unwrap_or_default()));
        left -= RUN_HEADER;
        let end = first.checked_add(count).filter(|&e| e <= pages);
        let Some(end) = end.filter(|_| count > 0 && first >= next) else {
            return Err(bad(format!(
                "run of {count} pages at page {first:#x} (overlapping, empty or outside the \
                 {pages} pages)"
            )));
        };
        if count * PAGE > left {
            return Err(bad(format!(
                "run at page {first:#x} longer than the section"
            )));
        }
        let mut p = first;
        while p < end {
            let n = (end - p).min(CHUNK / PAGE) as usize * PAGE as usize;
            r.exact(&mut want[..n], "VDLT")?;
            engine
                .vram_write(base_pa + p * PAGE, &want[..n])
                .map_err(engine_err)?;
            p += n as u64 / PAGE;
        }
        left -= count * PAGE;
        data += count * PAGE;
        next = end;
    }
    Ok(data)
}

/// Writes the non-zero pages of `file`'s data extents (a migration's memfd and a live
/// snapshot's `vram.bin` hold just the pages the rounds sent; the rest are holes) into the
/// partition at `base_pa`, through the engine's batched writes. The partition of the freshly
/// created device a restore goes into is zero (the sim engine's new mapping, the cuda engine's
/// memset at creation), so holes and zero pages need nothing. Returns the bytes written.
fn write_base(
    engine: &dyn EngineSnapshot,
    base_pa: u64,
    file: &std::fs::File,
    size: u64,
) -> Result<u64, SnapshotError> {
    let mut extents = data_extents(file, size)?.into_iter();
    let mut cur = (0u64, 0u64);
    let mut failed = None;
    let mut written = 0u64;
    let mut source = |buf: &mut [u8], pas: &mut Vec<u64>| {
        let room = buf.len() / PAGE as usize;
        let mut kept = 0usize;
        while kept < room {
            if cur.0 >= cur.1 {
                match extents.next() {
                    Some(e) => cur = e,
                    None => break,
                }
                continue;
            }
            let n = (cur.1 - cur.0).min(((room - kept) * PAGE as usize) as u64) as usize;
            let at = kept * PAGE as usize;
            if let Err(e) = file.read_exact_at(&mut buf[at..at + n], cur.0) {
                failed = Some(e);
                return std::ops::ControlFlow::Break(());
            }
            // Keep the non-zero pages, packed at the front of what is free.
            for i in 0..n / PAGE as usize {
                let src = at + i * PAGE as usize;
                if buf[src..src + PAGE as usize].iter().all(|&b| b == 0) {
                    continue;
                }
                let dst = kept * PAGE as usize;
                if dst != src {
                    buf.copy_within(src..src + PAGE as usize, dst);
                }
                pas.push(base_pa + cur.0 + (i as u64) * PAGE);
                kept += 1;
            }
            cur.0 += n as u64;
        }
        written += kept as u64 * PAGE;
        std::ops::ControlFlow::Continue(())
    };
    let flow = engine.vram_write_pages(&mut source).map_err(engine_err)?;
    if let Some(e) = failed {
        return Err(SnapshotError::Io(e));
    }
    if flow.is_break() {
        return Err(SnapshotError::Vram(
            "the pre-copied VRAM's writes stopped early".into(),
        ));
    }
    Ok(written)
}

/// The page-aligned ranges of `f` (of `size` bytes) that hold data (`SEEK_DATA`/`SEEK_HOLE`);
/// the whole file where the file system cannot tell.
fn data_extents(f: &std::fs::File, size: u64) -> Result<Vec<(u64, u64)>, SnapshotError> {
    use std::os::fd::AsRawFd;
    let seek = |off: u64, whence: libc::c_int| -> Option<u64> {
        let off = libc::off_t::try_from(off).ok()?;
        // SAFETY: lseek on a descriptor we hold; it moves only the file offset (the reads here
        // are positional), and the result is checked.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
        u64::try_from(r).ok()
    };
    let mut out = Vec::new();
    let mut at = 0;
    while at < size {
        let Some(start) = seek(at, libc::SEEK_DATA) else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data after `at`
            }
            return Ok(vec![(0, size)]); // not supported: read it all
        };
        let end = seek(start, libc::SEEK_HOLE).unwrap_or(size).min(size);
        let (s, e) = (start / PAGE * PAGE, end.div_ceil(PAGE) * PAGE);
        if s >= size || e <= s {
            break;
        }
        out.push((s, e.min(size)));
        at = e;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgpu::Engine;
    use std::io::Write;

    #[test]
    fn data_extents_skip_holes() {
        let mut f = tempfile();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[1; 10], (3 << 20) + 5).unwrap();
        f.write_all_at(&[1; 4096], 40 << 20).unwrap();
        f.flush().unwrap();
        let e = data_extents(&f, 64 << 20).unwrap();
        // File systems allocate in blocks; every written byte is inside an extent, and most
        // of the file is not.
        let covered = |off: u64| e.iter().any(|&(s, t)| (s..t).contains(&off));
        assert!(covered((3 << 20) + 5) && covered(40 << 20), "{e:?}");
        let total: u64 = e.iter().map(|(s, t)| t - s).sum();
        assert!(total < 16 << 20, "{e:?}");
    }

    /// A snapshot holding only a VDLT section with `runs` (first page, pages, byte).
    fn delta(runs: &[(u64, u32, u8)]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = SnapWriter::new(&mut out).unwrap();
        let len: u64 = runs.iter().map(|r| 12 + u64::from(r.1) * PAGE).sum();
        w.header(VDLT, len).unwrap();
        for &(first, n, b) in runs {
            w.raw(&first.to_le_bytes()).unwrap();
            w.raw(&n.to_le_bytes()).unwrap();
            w.raw(&vec![b; (u64::from(n) * PAGE) as usize]).unwrap();
        }
        out
    }

    fn apply(
        e: &pgpu::sim::SimEngine,
        snap: &[u8],
        base: &std::fs::File,
    ) -> Result<u64, SnapshotError> {
        let mut input = snap;
        let mut r = SnapReader::new(&mut input)?;
        restore_delta(&mut r, e, 2 << 20, 2 << 20, Base::File(base))
    }

    #[test]
    fn the_delta_goes_over_the_pre_copied_vram_and_hostile_runs_are_refused() {
        let e = pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 4 << 20,
            workers: 1,
            ..Default::default()
        })
        .unwrap();
        let base = tempfile();
        base.set_len(2 << 20).unwrap();
        base.write_all_at(&[0xab; 4096], 3 * PAGE).unwrap();
        base.write_all_at(&[0xee; 4096], 5 * PAGE).unwrap();
        // Page 5 of the base is overwritten by the delta, page 6 comes from it only.
        assert_eq!(apply(&e, &delta(&[(5, 2, 0xcd)]), &base).unwrap(), 2 * PAGE);
        let page = |p: u64| {
            let mut b = vec![0u8; 4096];
            e.vram_read((2 << 20) + p * PAGE, &mut b).unwrap();
            b
        };
        assert_eq!(page(3), vec![0xab; 4096]);
        assert_eq!(page(5), vec![0xcd; 4096]);
        assert_eq!(page(6), vec![0xcd; 4096]);
        assert_eq!(page(4), vec![0; 4096]);
        let refused = |runs: &[(u64, u32, u8)]| apply(&e, &delta(runs), &base).unwrap_err();
        // Outside the partition (512 pages), overlapping, empty.
        let err = refused(&[(511, 2, 1)]).to_string();
        assert!(err.contains("outside the 512 pages"), "{err}");
        let err = refused(&[(5, 2, 1), (6, 1, 1)]).to_string();
        assert!(err.contains("overlapping"), "{err}");
        let err = refused(&[(5, 0, 1)]).to_string();
        assert!(err.contains("empty"), "{err}");
        // A base of another size.
        base.set_len(1 << 20).unwrap();
        let err = apply(&e, &delta(&[]), &base).unwrap_err().to_string();
        assert!(err.contains("pre-copied VRAM is 1048576 bytes"), "{err}");
        // A full image's VRAM section where the delta belongs.
        base.set_len(2 << 20).unwrap();
        let mut out = Vec::new();
        let mut w = SnapWriter::new(&mut out).unwrap();
        w.section(super::super::format::VRAM, &[]).unwrap();
        let err = apply(&e, &out, &base).unwrap_err().to_string();
        assert!(err.contains("VRAM where VDLT belongs"), "{err}");
    }

    /// A base already in the partition (an `--incoming` VM's prepared engine): only the delta
    /// is written, counted in its bytes; a zero page of the base file is never written either.
    #[test]
    fn an_applied_base_is_left_alone_and_only_the_delta_is_written() {
        let e = pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 4 << 20,
            workers: 1,
            ..Default::default()
        })
        .unwrap();
        // What the rounds wrote into the prepared partition.
        e.vram_write((2 << 20) + 7 * PAGE, &[0x11; 4096]).unwrap();
        let mut input = &delta(&[(9, 1, 0x22)])[..];
        let mut r = SnapReader::new(&mut input).unwrap();
        let n = restore_delta(&mut r, &e, 2 << 20, 2 << 20, Base::Applied).unwrap();
        assert_eq!(n, PAGE, "the delta's one page");
        let page = |p: u64| {
            let mut b = vec![0u8; 4096];
            e.vram_read((2 << 20) + p * PAGE, &mut b).unwrap();
            b
        };
        assert_eq!(page(7), vec![0x11; 4096]);
        assert_eq!(page(9), vec![0x22; 4096]);
        // A base file whose data extent holds a zero page and a non-zero one: 4 KiB written.
        let base = tempfile();
        base.set_len(2 << 20).unwrap();
        base.write_all_at(&[0; 4096], 20 * PAGE).unwrap();
        base.write_all_at(&[0x33; 4096], 21 * PAGE).unwrap();
        let written = write_base(&e, 2 << 20, &base, 2 << 20).unwrap();
        assert_eq!(written, PAGE);
        assert_eq!(page(21), vec![0x33; 4096]);
        assert_eq!(page(20), vec![0; 4096]);
    }

    fn tempfile() -> std::fs::File {
        // One name per call: tests of this module run in parallel in one process.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("vgpu-extents-{}-{n}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }
}
