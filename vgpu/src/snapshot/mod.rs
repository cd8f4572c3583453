//! Snapshot and restore of the virtual GPU (the device's part of VM snapshot, restore and live
//! migration; docs/snapshot.md, "Virtual GPU"). The VMM pauses its vCPUs, then calls
//! [`Vgpu::pause`] (the worker parks between turns; a running job is preempted and its saved
//! context kept), [`Vgpu::save`], and [`Vgpu::resume`]; a new VMM creates a fresh device with the
//! same configuration and calls [`Vgpu::restore`] before its vCPUs run.
//!
//! Saved: registers, channels, the fault record and interrupt state, the watched VRAM pages,
//! counters, TIMER, each channel's method registers and pushbuffer position, the module cache
//! (by PTX text), a job preempted by the pause (its engine context, tagged with the backend),
//! the para-virtual state (`mode=para`: the spaces built with hypercalls, rebuilt and
//! re-validated on restore), and the partition's non-zero VRAM pages. Not saved: shadow page tables (rebuilt from the
//! guest's tables before a channel runs again) and module `.global` variables (reloaded with
//! their initial values, as after an eviction).
//!
//! Files: `format` (framing, checksum, hostile-bytes cursor), `image` (what is saved, in
//! memory; the configuration), `head` (the sections before VRAM: their limits, and reading
//! them without a device for a standby's template), `regs_image` (the registers), `worker_image` (the worker's
//! channels, modules and preempted jobs), `para_image` (the para-virtual state), `vram` (the
//! VRAM section), `lanes` (its bytes checksummed, written and read on several threads, to a
//! stream or a file at offsets), `live` (VRAM pre-copy with the GPU running, and the `VDLT` section of live
//! snapshots), `writes` (per-job write sets: the device's dirty log where the engine keeps
//! none; `writes/twins.rs`: the checked twins made before a live copy's first round).

pub mod format;
pub mod head;
pub mod image;
mod lanes;
pub mod live;
mod mapped;
mod para_image;
pub(crate) mod regs_image;
mod vram;
mod worker_image;
pub mod writes;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgpu::SpaceId;

use crate::Vgpu;
use crate::regs;
pub use image::PauseCtl;
use image::{ConfImage, ModuleImage, RegsImage, WorkerImage};
use para_image::ParaImage;

/// Why a pause, save or restore failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a virtual GPU snapshot (bad magic)")]
    BadMagic,
    #[error("snapshot format version {0}; this build reads version {v}", v = format::VERSION)]
    Version(u32),
    #[error("snapshot truncated in {0}")]
    Truncated(&'static str),
    #[error("section {found} where {expected} belongs")]
    Section { expected: String, found: String },
    #[error("section {tag} is version {found}; this build reads version {want}")]
    SectionVersion { tag: String, found: u32, want: u32 },
    #[error("section {tag} of {len} bytes is over its limit of {limit} bytes")]
    SectionTooLarge { tag: String, len: u64, limit: u64 },
    #[error("snapshot checksum mismatch: a section is corrupted (CRC-32)")]
    Checksum,
    #[error(
        "the snapshot file is {len} bytes with CRC-32 {crc:#010x}; {want_len} bytes with \
         {want_crc:#010x} were recorded"
    )]
    FileChecksum {
        len: u64,
        crc: u32,
        want_len: u64,
        want_crc: u32,
    },
    #[error("bytes after the end of the snapshot")]
    Trailing,
    #[error("snapshot section {section}: {what}")]
    Invalid { section: &'static str, what: String },
    #[error("the snapshot's {what} is {saved:#x}, this GPU's is {here:#x}")]
    Config {
        what: &'static str,
        saved: u64,
        here: u64,
    },
    #[error(
        "the snapshot holds a job preempted mid-run on the {saved} backend and this GPU runs \
         {here}: such a context only resumes on its own backend (take the snapshot with a \
         drained pause to move between backends)"
    )]
    ForeignContext { saved: String, here: String },
    #[error("the saved job context is refused: {0}")]
    Context(String),
    #[error("reloading saved module {index}: {why}")]
    Module { index: usize, why: String },
    #[error("VRAM: {0}")]
    Vram(String),
    #[error("snapshots of a {0} are not supported")]
    Unsupported(&'static str),
    #[error("the virtual GPU is not paused")]
    NotPaused,
    #[error("restore needs a freshly created virtual GPU (channel {0} is bound)")]
    NotFresh(u32),
    #[error("the GPU worker did not pause within {0:?}")]
    PauseTimeout(Duration),
}

/// What `pause` does with a job that is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    /// Preempt it; its saved context goes into the snapshot (resumes on the same backend
    /// only). The pause takes about one preemption latency.
    Preempt,
    /// Let it finish (within the job time limit); the snapshot holds no engine context and
    /// restores on any backend.
    Drain,
}

/// What `save_report` wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveReport {
    /// Bytes of the snapshot.
    pub bytes: u64,
    /// Bytes of VRAM in it (non-zero pages).
    pub vram_bytes: u64,
    /// Modules in it.
    pub modules: usize,
    /// Jobs preempted by pauses in it (backend-specific).
    pub suspended: usize,
    /// CRC-32 of the whole snapshot (combined from its sections': no second pass).
    pub crc32: u32,
}

/// What a restore of an image did and how long its parts took (the VMM's restore report).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RestoreParts {
    /// Waiting for the device's worker to park (a fresh device's: its thread woken), ms.
    pub pause_ms: f64,
    /// The partition zeroed and the image's VRAM pages written into it, ms.
    pub vram_ms: f64,
    /// The image's modules loaded into the engine (served by its content cache where the same
    /// text is loaded already, e.g. a standby's template), ms.
    pub modules_ms: f64,
    /// The engine modules the image's texts got, in the image's order.
    pub modules: Vec<pgpu::ModuleId>,
    /// After the modules: the para-virtual spaces, the preempted jobs' contexts re-targeted,
    /// the registers applied, the doorbell and the BAR's trapped pages (a trap splits the
    /// aperture's KVM memory slots), ms.
    pub apply_ms: f64,
}

impl Vgpu {
    fn snapshot_supported(&self) -> Result<(), SnapshotError> {
        if self.cfg.mode == crate::config::Mode::Pt {
            return Err(SnapshotError::Unsupported(
                "pass-through GPU (mode=pt: a trusted guest without isolation)",
            ));
        }
        Ok(())
    }

    /// Quiesces the device (vCPUs already paused): a running job is preempted and its saved
    /// context kept; the worker parks between turns. Idempotent.
    pub fn pause(&self) -> Result<(), SnapshotError> {
        self.pause_with(PauseMode::Preempt)
    }

    /// As [`Vgpu::pause`], but a running job finishes first: the snapshot is portable across
    /// backends.
    pub fn pause_drained(&self) -> Result<(), SnapshotError> {
        self.pause_with(PauseMode::Drain)
    }

    /// Pauses in `mode`; waits at most the job time limit plus a second for the worker.
    pub fn pause_with(&self, mode: PauseMode) -> Result<(), SnapshotError> {
        let preempt_after = match mode {
            PauseMode::Preempt => Some(Duration::ZERO),
            PauseMode::Drain => None,
        };
        self.pause_inner(preempt_after).map(|_| ())
    }

    /// Pauses, letting a running job finish for at most `drain` and preempting it after that
    /// (the start of a live copy: a job that ends by itself needs no context, and on the
    /// device's write sets, none that ran unmarked). Returns whether a preemption was asked
    /// for. Waits at most `drain` plus the job time limit plus a second.
    pub fn pause_drain_within(&self, drain: Duration) -> Result<bool, SnapshotError> {
        self.pause_inner(Some(drain))
    }

    /// The pause: a running job is preempted once it has had `preempt_after` (never with
    /// `None`: it finishes); then the worker has the job time limit plus a second to park.
    /// Returns whether a preemption was asked for.
    fn pause_inner(&self, preempt_after: Option<Duration>) -> Result<bool, SnapshotError> {
        self.snapshot_supported()?;
        let limit = self.cfg.job_timeout + Duration::from_secs(1);
        let shared = &self.shared;
        let mut r = shared.lock();
        r.pause.requested = true;
        shared.wake.notify_all();
        let start = Instant::now();
        let mut preempt = false;
        while !r.pause.parked {
            let waited = start.elapsed();
            if let Some(drain) = preempt_after
                && !preempt
                && waited >= drain
            {
                preempt = true;
                shared.pausing.store(true, Ordering::SeqCst);
                self.job.request();
                // A worker waiting for the daemon's grant looks at `pausing` when woken.
                if let Some(link) = &self.link {
                    link.interrupt();
                }
            }
            let until = match preempt_after {
                Some(drain) if preempt => drain + limit,
                Some(drain) => drain,
                None => limit,
            };
            let left = until.saturating_sub(waited);
            let out_of_time = left.is_zero() && (preempt || preempt_after.is_none());
            if out_of_time || r.shutdown {
                r.pause.requested = false;
                shared.pausing.store(false, Ordering::SeqCst);
                shared.wake.notify_all();
                return Err(SnapshotError::PauseTimeout(limit));
            }
            r = shared
                .parked
                .wait_timeout(r, left.max(Duration::from_micros(1)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        shared.pausing.store(false, Ordering::SeqCst);
        Ok(preempt)
    }

    /// Lets the device run again (a preempted job resumes at its channel's next turn).
    pub fn resume(&self) {
        let mut r = self.shared.lock();
        r.pause.requested = false;
        self.shared.pausing.store(false, Ordering::SeqCst);
        self.shared.wake.notify_all();
        drop(r);
    }

    /// Whether the device is paused.
    pub fn is_paused(&self) -> bool {
        let r = self.shared.lock();
        r.pause.requested && r.pause.parked
    }

    fn conf_here(&self) -> ConfImage {
        head::conf_of(&self.cfg, self.engine.info())
    }

    /// Serializes the whole device state (device paused).
    pub fn save(&self, out: &mut dyn std::io::Write) -> Result<(), SnapshotError> {
        self.save_report(out).map(|_| ())
    }

    /// As [`Vgpu::save`], returning what was written.
    pub fn save_report(&self, out: &mut dyn std::io::Write) -> Result<SaveReport, SnapshotError> {
        let (engine, base, size) = (&*self.engine, self.vram_base, self.cfg.vram);
        self.save_with(out, &mut |w| {
            vram::save(w, engine, base, size, lanes::Io::Stream)
        })
    }

    /// As [`Vgpu::save_report`], into `file` from its offset 0 (cut to the snapshot's length):
    /// the VRAM section is written at its offsets by several threads (`pwrite`), its CRC-32
    /// computed in their lanes. The file is not synced (the caller's `sync_all`, once).
    pub fn save_file(&self, file: &std::fs::File) -> Result<SaveReport, SnapshotError> {
        let (engine, base, size) = (&*self.engine, self.vram_base, self.cfg.vram);
        let at = std::cell::Cell::new(0);
        let io = lanes::Io::File { file, at: &at };
        let mut out = lanes::FileAt { file, at: &at };
        let report = self.save_with(&mut out, &mut |w| vram::save(w, engine, base, size, io))?;
        file.set_len(report.bytes)?;
        Ok(report)
    }

    /// As [`Vgpu::save_report`], with `vram` writing the VRAM section (returns its VRAM bytes).
    fn save_with(
        &self,
        out: &mut dyn std::io::Write,
        vram: &mut dyn FnMut(&mut format::SnapWriter<'_>) -> Result<u64, SnapshotError>,
    ) -> Result<SaveReport, SnapshotError> {
        self.snapshot_supported()?;
        let (regs, image) = {
            let r = self.shared.lock();
            let image = match (&r.pause.image, r.pause.requested && r.pause.parked) {
                (Some(i), true) => i.clone(),
                _ => return Err(SnapshotError::NotPaused),
            };
            (RegsImage::capture(&r, self.shared.timer_ns()), image)
        };
        let mut w = format::SnapWriter::new(out)?;
        w.section(format::CONF, &self.conf_here().encode())?;
        w.section(format::REGS, &regs.encode())?;
        w.section(format::CHAN, &image.encode_chans())?;
        w.section(format::MODS, &image.encode_modules())?;
        w.section(format::CTXT, &image.encode_suspended())?;
        w.section(format::PARA, &ParaImage::encode(self.para_image().as_ref()))?;
        let vram_bytes = vram(&mut w)?;
        let total = w.finish_total()?;
        Ok(SaveReport {
            bytes: total.len,
            vram_bytes,
            modules: image.modules.len(),
            suspended: image.suspended.len(),
            crc32: total.value,
        })
    }

    /// Restores a snapshot into this freshly created device (same configuration; the backend
    /// may differ for a snapshot without a preempted job), before vCPUs run. Everything is
    /// validated before it is applied; on error the partition is zeroed and the device stays
    /// as created. The device runs afterwards (no `resume` needed).
    pub fn restore(&self, input: &mut dyn std::io::Read) -> Result<(), SnapshotError> {
        self.restore_inner(input, live::Base::Whole).map(|_| ())
    }

    /// As [`Vgpu::restore`], from `file` (the snapshot from its offset 0 to its end): the VRAM
    /// section is read at its offsets by several threads (`pread`) straight into the engine's
    /// transfer buffers and checksummed in their lanes. With `want` (the file's length and
    /// CRC-32 as a manifest records them), a file of another length or CRC-32 is refused
    /// before the device takes anything of it (its VRAM is scrubbed).
    pub fn restore_file(
        &self,
        file: &std::fs::File,
        want: Option<(u64, u32)>,
    ) -> Result<(), SnapshotError> {
        self.restore_file_parts(file, want).map(|_| ())
    }

    /// As [`Vgpu::restore_file`], returning what the restore did and how long its parts took.
    pub fn restore_file_parts(
        &self,
        file: &std::fs::File,
        want: Option<(u64, u32)>,
    ) -> Result<RestoreParts, SnapshotError> {
        let at = std::cell::Cell::new(0);
        let io = lanes::Io::File { file, at: &at };
        let mut input = lanes::FileAt { file, at: &at };
        let mut parts = RestoreParts::default();
        self.restore_io(&mut input, live::Base::Whole, io, want, &mut parts)?;
        Ok(parts)
    }

    /// `restore`, or with `base` (pre-copied VRAM) `restore_live`.
    fn restore_inner(
        &self,
        input: &mut dyn std::io::Read,
        base: live::Base<'_>,
    ) -> Result<u64, SnapshotError> {
        self.restore_io(
            input,
            base,
            lanes::Io::Stream,
            None,
            &mut RestoreParts::default(),
        )
    }

    /// Returns the VRAM bytes the image's own section wrote (for a live image: its delta).
    fn restore_io(
        &self,
        input: &mut dyn std::io::Read,
        base: live::Base<'_>,
        io: lanes::Io<'_>,
        want: Option<(u64, u32)>,
        parts: &mut RestoreParts,
    ) -> Result<u64, SnapshotError> {
        self.snapshot_supported()?;
        {
            let r = self.shared.lock();
            if let Some(ch) = r.chans.iter().position(|c| c.state != regs::CHAN_UNBOUND) {
                return Err(SnapshotError::NotFresh(ch as u32));
            }
        }
        let t = Instant::now();
        self.pause_with(PauseMode::Drain)?;
        parts.pause_ms = t.elapsed().as_secs_f64() * 1e3;
        let result = self.restore_paused(input, base, io, want, parts);
        if result.is_err()
            && let Err(e) = vram::scrub(&*self.engine, self.vram_base, self.cfg.vram)
        {
            log::error!("vgpu: scrubbing VRAM after a failed restore: {e}");
        }
        self.resume();
        result
    }

    fn restore_paused(
        &self,
        input: &mut dyn std::io::Read,
        base: live::Base<'_>,
        io: lanes::Io<'_>,
        want: Option<(u64, u32)>,
        parts: &mut RestoreParts,
    ) -> Result<u64, SnapshotError> {
        let here = self.conf_here();
        let (vram, channels) = (self.cfg.vram, self.cfg.channels);
        let lim = head::Limits::of(&self.cfg, self.engine.info());
        let mut rd = format::SnapReader::new(input)?;
        let conf = ConfImage::decode(&rd.section(format::CONF, head::CONF_LIMIT)?)?;
        conf.check(&here)?;
        let regs = RegsImage::decode(&rd.section(format::REGS, lim.regs)?, vram, channels)?;
        if let Some(b) = &regs.bell
            && !self
                .device()
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .bell_allowed(b.addr)
        {
            return Err(SnapshotError::Invalid {
                section: "REGS",
                what: format!("doorbell page at {:#x} outside this VM's RAM", b.addr),
            });
        }
        let head::Jobs {
            seen_epoch,
            next,
            chans,
            texts,
            suspended,
        } = head::read_jobs(&mut rd, &lim, &regs, self.cfg.lazy_shadowing, &here.backend)?;
        let para = {
            let spaces = self.para.as_ref().map(crate::para::lock);
            ParaImage::decode(
                &rd.section(format::PARA, para_image::LIMIT)?,
                spaces.as_deref(),
                vram,
            )?
        };
        let t = Instant::now();
        let vram_bytes = match base {
            live::Base::Whole => vram::restore(&mut rd, &*self.engine, self.vram_base, vram, io)?,
            b => live::restore_delta(&mut rd, &*self.engine, self.vram_base, vram, b)?,
        };
        parts.vram_ms = t.elapsed().as_secs_f64() * 1e3;
        let total = rd.finish_total()?;
        if let Some((len, crc)) = want
            && (total.len, total.value) != (len, crc)
        {
            return Err(SnapshotError::FileChecksum {
                len: total.len,
                crc: total.value,
                want_len: len,
                want_crc: crc,
            });
        }
        // All bytes verified: reload modules, validate the job context against its module.
        let t = Instant::now();
        let modules = self.reload_modules(texts)?;
        parts.modules_ms = t.elapsed().as_secs_f64() * 1e3;
        parts.modules = modules.iter().map(|m| m.id).collect();
        let t = Instant::now();
        if let Err(e) = self.restore_para(para.as_ref()) {
            self.unload(&modules);
            return Err(e);
        }
        let mut jobs = Vec::with_capacity(suspended.len());
        for mut s in suspended {
            let module = s.module.map(|i| modules[i as usize].id);
            // The space is set when the job resumes (its shadow does not exist yet).
            match self
                .engine
                .retarget_context(s.context, SpaceId(u64::MAX), module, None)
            {
                Ok(c) => s.context = c,
                Err(e) => {
                    self.unload(&modules);
                    return Err(SnapshotError::Context(format!(
                        "channel {}: {e}",
                        s.channel
                    )));
                }
            }
            jobs.push(s);
        }
        let mut r = self.shared.lock();
        regs.apply(&mut r);
        self.shared.set_timer_ns(regs.timer_ns);
        // An image restored before in the same pause, not yet taken by the worker, is replaced:
        // its modules' loads go back to the engine.
        let replaced = r.pause.image.replace(Box::new(WorkerImage {
            seen_epoch,
            next,
            chans,
            modules,
            suspended: jobs,
        }));
        r.pause.restored = true;
        drop(r);
        if let Some(old) = replaced {
            self.unload(&old.modules);
        }
        if let Some(b) = &regs.bell {
            self.device()
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .restore_bell(b);
        }
        if let Some(remap) = &self.remap {
            remap
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .trap(regs.watched.iter().map(|(p, _)| p << 12));
        }
        parts.apply_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok(vram_bytes)
    }

    /// The para-virtual state (device paused), in para mode.
    fn para_image(&self) -> Option<ParaImage> {
        let spaces = crate::para::lock(self.para.as_ref()?);
        let front = self
            .device()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .para_front()
            .map(|p| p.image())?;
        Some(ParaImage::capture(&spaces, front))
    }

    /// Rebuilds the saved para-virtual spaces and front end (decoded and checked already).
    fn restore_para(&self, image: Option<&ParaImage>) -> Result<(), SnapshotError> {
        let (Some(p), Some(spaces)) = (image, &self.para) else {
            return Ok(());
        };
        let bad = |what: String| SnapshotError::Invalid {
            section: "PARA",
            what,
        };
        crate::para::lock(spaces)
            .restore(&p.spaces, p.current, p.counters())
            .map_err(bad)?;
        let dev = self.device();
        let mut dev = dev
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match dev.para_front() {
            Some(front) => front
                .restore_image(p.args, p.status, &p.blocks)
                .map_err(bad),
            None => Err(bad("no para-virtual BAR on this device".into())),
        }
    }

    /// Loads the saved module texts within the VM's host memory budget and the job limit each.
    fn reload_modules(&self, texts: Vec<Arc<str>>) -> Result<Vec<ModuleImage>, SnapshotError> {
        let mut budget = head::ModuleBudget::of(&self.cfg);
        let mut out: Vec<ModuleImage> = Vec::with_capacity(texts.len());
        for (index, text) in texts.into_iter().enumerate() {
            let limits = budget.limits(&text, Some(self.cancel.clone()));
            // A load the engine's content cache serves (the text loaded already, e.g. by a
            // standby's template under another budget) is held to this budget as a fresh one
            // would be.
            let loaded = self.engine.load_module(&text, &limits).and_then(|m| {
                if m.host_bytes <= limits.max_host_bytes {
                    return Ok(m);
                }
                if let Err(e) = self.engine.unload_module(m.id) {
                    log::warn!("vgpu: unload module {:?}: {e}", m.id);
                }
                Err(pgpu::EngineError::HostBudget {
                    what: "module",
                    used: m.host_bytes,
                    limit: limits.max_host_bytes,
                })
            });
            match loaded {
                Ok(m) => {
                    budget.charge(&text, m.host_bytes);
                    out.push(ModuleImage {
                        text,
                        id: m.id,
                        host_bytes: m.host_bytes,
                    });
                }
                Err(e) => {
                    self.unload(&out);
                    return Err(SnapshotError::Module {
                        index,
                        why: e.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }

    fn unload(&self, modules: &[ModuleImage]) {
        for m in modules {
            if let Err(e) = self.engine.unload_module(m.id) {
                log::warn!("vgpu: unload module {:?}: {e}", m.id);
            }
        }
    }
}
