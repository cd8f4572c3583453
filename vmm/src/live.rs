//! The pre-copy of live migration and live snapshots (docs/snapshot.md, "Live snapshots and
//! pre-copy"), as [`Controller`] operations: RAM through KVM's dirty log and, while the virtual
//! GPU keeps running, VRAM through the engine's dirty log (`vgpu::snapshot::live`), in rounds
//! until a round is small or [`MAX_ROUNDS`] passed; then the caller pauses the VM and its GPU
//! and sends the last round with the state. A GPU whose engine keeps no exact log is paused for
//! the whole pre-copy instead (KVM's log misses what it writes into guest RAM) and its VRAM goes
//! with the paused round.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use vgpu::snapshot::live::Precopy;

use crate::control::{ControlError, Controller, MAX_ROUNDS, SMALL_ROUND_PAGES, SnapshotDone};
use crate::memory;
use crate::snapshot::manifest;
use crate::snapshot::precopy::{self, RamSent, Report, Round, Sink};
use crate::snapshot::save::OutputDir;

const PAGE: u64 = 4096;

/// A pre-copy in progress: the GPU's side (if it runs on), the RAM pages sent, the rounds.
pub struct Live<'g> {
    pub vram: Option<Precopy<'g>>,
    pub ram: RamSent,
    pub report: Report,
}

impl Live<'_> {
    /// Copies the write sets' validation counters into the report (after a round).
    pub fn note_validation(&mut self) {
        if let Some(v) = self.vram.as_ref().filter(|v| v.uses_write_sets()) {
            let s = v.validation();
            self.report.write_sets = Some(crate::snapshot::precopy::WriteSetValidation {
                checked_runs: s.checked_runs,
                unchecked_runs: s.unchecked_runs,
                outside_rounds: s.outside,
                declared_extents: s.declared_extents,
                undeclared_extents: s.undeclared_extents,
                declarations_refused: s.declarations_refused,
            });
        }
    }
}

/// A live snapshot's files, written round by round.
struct DirSink {
    ram: std::fs::File,
    vram: Option<std::fs::File>,
}

impl Sink for DirSink {
    fn ram(&mut self, off: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.ram.write_all_at(bytes, off)
    }
    fn vram(&mut self, _round: u32, page: u64, bytes: &[u8]) -> std::io::Result<()> {
        match &self.vram {
            Some(f) => f.write_all_at(bytes, page * PAGE),
            None => Err(std::io::Error::other("VRAM pages without a VRAM file")),
        }
    }
}

impl Controller {
    /// Starts the GPU's side: a VRAM pre-copy with the GPU running if its engine logs exactly,
    /// else the GPU paused now (as before VRAM pre-copy existed).
    pub(crate) fn live_start<'g>(
        &self,
        gpu: Option<&'g vgpu::Vgpu>,
    ) -> Result<Live<'g>, ControlError> {
        let vram = match gpu {
            None => None,
            Some(gpu) => {
                let p = gpu.precopy_start()?;
                if p.exact() {
                    Some(p)
                } else {
                    drop(p);
                    gpu.pause()?;
                    None
                }
            }
        };
        let log = match &vram {
            Some(p) if p.uses_write_sets() => "write sets",
            Some(_) => "engine",
            None => "none",
        };
        Ok(Live {
            report: Report {
                gpu_running: vram.is_some(),
                gpu_dirty_log: log.into(),
                ..Report::default()
            },
            vram,
            ram: RamSent::new(&self.mem),
        })
    }

    /// The rounds with the VM running (KVM's dirty log must be on): the first sends every
    /// non-zero page of RAM and VRAM, the next ones what was dirtied since, until a round
    /// sends at most [`SMALL_ROUND_PAGES`] pages or [`MAX_ROUNDS`] passed.
    pub(crate) fn live_rounds(
        &self,
        live: &mut Live<'_>,
        sink: &mut dyn Sink,
    ) -> Result<(), ControlError> {
        for round in 0..=MAX_ROUNDS as u32 {
            let t = Instant::now();
            let mut dirty = if round == 0 {
                precopy::all_dirty(&self.mem)
            } else {
                self.dirty_log()?
            };
            if let Some(v) = &live.vram {
                precopy::add_pages(&self.mem, &mut dirty, &v.ram_dirty()?);
            }
            let (ram, ram_resent) = live.ram.send(&self.mem, &dirty, round == 0, sink)?;
            let vram = match &mut live.vram {
                Some(v) => v.round(&mut |page, b| sink.vram(round, page, b))?,
                None => Default::default(),
            };
            live.note_validation();
            live.report.push(Round {
                round,
                paused: false,
                ms: t.elapsed().as_secs_f64() * 1e3,
                ram_bytes: ram * PAGE,
                ram_resent_bytes: ram_resent * PAGE,
                vram_bytes: vram.pages * PAGE,
                vram_resent_bytes: vram.resent * PAGE,
            });
            if round > 0 && ram + vram.pages <= SMALL_ROUND_PAGES {
                break;
            }
        }
        Ok(())
    }

    /// The last round's RAM, the VM and its GPU paused: what KVM and the GPU logged since the
    /// previous round. Its VRAM part (the GPU image) is added by the caller.
    pub(crate) fn live_last_ram(
        &self,
        live: &mut Live<'_>,
        sink: &mut dyn Sink,
    ) -> Result<Round, ControlError> {
        let t = Instant::now();
        let mut dirty = self.dirty_log()?;
        if let Some(v) = &live.vram {
            precopy::add_pages(&self.mem, &mut dirty, &v.ram_dirty()?);
        }
        let (ram, resent) = live.ram.send(&self.mem, &dirty, false, sink)?;
        Ok(Round {
            round: live.report.rounds.len() as u32,
            paused: true,
            ms: t.elapsed().as_secs_f64() * 1e3,
            ram_bytes: ram * PAGE,
            ram_resent_bytes: resent * PAGE,
            ..Round::default()
        })
    }

    /// A live snapshot to `out` (the VM running, the operation lock held): pre-copy rounds
    /// into `ram.bin` and `vram.bin`, then the VM and its GPU paused for the last round, the
    /// GPU image (the VRAM written since the last round) and the state. The VM runs on after
    /// unless `resume` is false; on failure it runs on.
    pub(crate) fn snapshot_live(
        &self,
        out: &mut OutputDir,
        resume: bool,
        drain: bool,
    ) -> Result<(manifest::Manifest, Report), ControlError> {
        let gpu = self.gpu()?;
        let mut live = None;
        let result = (|| -> Result<manifest::Manifest, ControlError> {
            let l = live.insert(self.live_start(gpu.as_deref())?);
            let ram_bytes = self.manifest_ram_bytes();
            let mut sink = DirSink {
                ram: out.create_sized(manifest::RAM_FILE, ram_bytes)?,
                vram: match (&l.vram, &gpu) {
                    (Some(_), Some(g)) => {
                        Some(out.create_sized(manifest::VRAM_FILE, g.vram_bytes())?)
                    }
                    _ => None,
                },
            };
            memory::set_dirty_logging(&self.vm, &self.mem, true)?;
            self.live_rounds(l, &mut sink)?;
            self.pause_now()?;
            let paused_at = Instant::now();
            if let Some(gpu) = &gpu {
                gpu.pause_with(if drain {
                    vgpu::snapshot::PauseMode::Drain
                } else {
                    vgpu::snapshot::PauseMode::Preempt
                })?;
            }
            let mut last = self.live_last_ram(l, &mut sink)?;
            let state = self.capture()?;
            out.sync(manifest::RAM_FILE, &sink.ram)?;
            if let Some(f) = &sink.vram {
                out.sync(manifest::VRAM_FILE, f)?;
            }
            let mut m = self.manifest.clone();
            m.ram_bytes = ram_bytes;
            m.ram_pages = l.ram.pages();
            m.gpu_live = l.vram.is_some();
            let m = match (&gpu, &mut l.vram) {
                (Some(_), Some(v)) => out.finish(
                    m,
                    &state,
                    Some(&mut |w| {
                        let (report, r) = v.save_delta(w)?;
                        last.vram_bytes = r.pages * PAGE;
                        last.vram_resent_bytes = r.resent * PAGE;
                        Ok(report)
                    }),
                )?,
                (Some(gpu), None) => out.finish(
                    m,
                    &state,
                    Some(&mut |w| {
                        let report = gpu.save_report(w)?;
                        last.vram_bytes = report.vram_bytes;
                        Ok(report)
                    }),
                )?,
                (None, _) => out.finish(m, &state, None)?,
            };
            last.ms = paused_at.elapsed().as_secs_f64() * 1e3;
            l.note_validation();
            l.report.push(last);
            Ok(m)
        })();
        if let Err(e) = memory::set_dirty_logging(&self.vm, &self.mem, false) {
            log::warn!("live snapshot: turn dirty logging off: {e}");
        }
        let report = live.take().map(|l| l.report).unwrap_or_default();
        if result.is_err() || resume {
            self.resume_gpu();
            if self.gate.is_paused() {
                self.gate.resume();
            }
        }
        result.map(|m| (m, report))
    }

    /// RAM bytes of the VM (the RAM file's length).
    fn manifest_ram_bytes(&self) -> u64 {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        self.mem.iter().map(|r| r.len()).sum()
    }

    /// `ctl snapshot DIR --live` (`"live":true`): as [`Controller::snapshot`], with the pre-copy
    /// while the VM runs; a VM paused already gets a plain snapshot.
    pub fn snapshot_live_op(
        &self,
        dir: &Path,
        resume: bool,
        drain: bool,
    ) -> Result<SnapshotDone, ControlError> {
        let _op = crate::control::lock(&self.op);
        self.disks.check_snapshot()?;
        if self.gate.is_paused() {
            drop(_op);
            return self.snapshot(dir, resume, drain);
        }
        let start = Instant::now();
        let mut out = OutputDir::prepare(dir)?;
        let (m, report) = self.snapshot_live(&mut out, resume, drain)?;
        let gpu_report = out.gpu_report;
        out.keep();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        log::info!(
            "live snapshot to {} in {ms:.1} ms: rounds {:?}",
            dir.display(),
            report.rounds
        );
        self.record_live(&report);
        Ok(SnapshotDone {
            dir: dir.display().to_string(),
            ms,
            ram_bytes: m.ram_bytes,
            ram_pages: m.ram_pages,
            state_bytes: m.state_bytes,
            gpu_bytes: m.gpu_bytes,
            gpu_vram_bytes: gpu_report.map_or(0, |r| r.vram_bytes),
            gpu_preempted: gpu_report.map_or(0, |r| r.suspended),
            state: if resume { "running" } else { "paused" },
            paused_ms: report.rounds.last().map_or(0.0, |r| r.ms),
            live: Some(report),
        })
    }

    /// Keeps a pre-copy's report for `--stats`.
    pub(crate) fn record_live(&self, report: &Report) {
        crate::control::lock(&self.live_reports).push(report.clone());
    }
}
