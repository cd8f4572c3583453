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
use crate::snapshot::precopy::{self, DestReadyWait, RamSent, Readiness, Report, Round, Sink};
use crate::snapshot::save::OutputDir;
use crate::snapshot::source_report::{GuestMark, Laps, SrcDowntime};

const PAGE: u64 = 4096;

/// A pre-copy in progress: the GPU's side (if it runs on), the RAM pages sent, the rounds.
pub struct Live<'g> {
    pub vram: Option<Precopy<'g>>,
    pub ram: RamSent,
    pub report: Report,
    /// The guest's counters when the pre-copy started, and the pages KVM logged since.
    start: GuestMark,
    kvm_dirty_pages: u64,
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
                worker_ms: s.worker_ns as f64 / 1e6,
                worker_jobs: s.worker_jobs,
                twins_prepared: s.twins_prepared,
                prepare_ms: s.prepare_ns as f64 / 1e6,
                twin_loads_ready: s.twin_loads_ready,
                twin_loads_cold: s.twin_loads_cold,
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
        let start = self.guest_mark(gpu);
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
                gpu_start_preempted: vram.as_ref().is_some_and(|v| v.start_preempted()),
                gpu_dirty_log: log.into(),
                ..Report::default()
            },
            vram,
            ram: RamSent::new(&self.mem),
            start,
            kvm_dirty_pages: 0,
        })
    }

    /// The guest's counters now (the GPU's and the vCPUs').
    fn guest_mark(&self, gpu: Option<&vgpu::Vgpu>) -> GuestMark {
        let vcpus: Vec<_> = self.counters.iter().map(|c| c.snapshot()).collect();
        GuestMark::now(gpu, &vcpus)
    }

    /// Closes the live window (the VM about to be paused): the guest's counters since the
    /// pre-copy started, into the report.
    pub(crate) fn live_window_end(&self, live: &mut Live<'_>, gpu: Option<&vgpu::Vgpu>) {
        let end = self.guest_mark(gpu);
        live.report.guest = Some(live.start.window(&end, live.kvm_dirty_pages));
    }

    /// The rounds with the VM running (KVM's dirty log must be on): the first sends every
    /// non-zero page of RAM and VRAM, the next ones what was dirtied since, until a round
    /// sends at most [`SMALL_ROUND_PAGES`] pages or [`MAX_ROUNDS`] passed; then, if the sink
    /// asked its other end (a migration's destination making its GPU engine,
    /// [`crate::snapshot::ready`]), more rounds until it says it is ready, bounded by
    /// `READY_WAIT` (`HELLO_WAIT` for a destination that never answers), into the report's
    /// `dest_ready`.
    pub(crate) fn live_rounds(
        &self,
        live: &mut Live<'_>,
        sink: &mut dyn Sink,
    ) -> Result<(), ControlError> {
        let mut wait: Option<(Instant, u32)> = None;
        for round in 0.. {
            let t = Instant::now();
            let mut laps = Laps::start();
            let (mut dirty, kvm) = if round == 0 {
                (precopy::first_round(&self.mem, self.backing), 0)
            } else {
                let d = self.dirty_log()?;
                let n = precopy::count(&d);
                (d, n)
            };
            live.kvm_dirty_pages += kvm;
            if let Some(v) = &live.vram {
                precopy::add_pages(&self.mem, &mut dirty, &v.ram_dirty()?);
            }
            let harvest_ms = laps.lap();
            let (ram, ram_resent) = live.ram.send(&self.mem, &dirty, round == 0, sink)?;
            let ram_ms = laps.lap();
            let vram = match &mut live.vram {
                Some(v) => v.round(&mut |page, b| sink.vram(round, page, b))?,
                None => Default::default(),
            };
            live.note_validation();
            let gpu_blocked_ms = match (&live.vram, round) {
                (Some(v), 0) => v.start_blocked().as_secs_f64() * 1e3,
                _ => 0.0,
            };
            live.report.push(Round {
                round,
                paused: false,
                ms: t.elapsed().as_secs_f64() * 1e3,
                ram_bytes: ram * PAGE,
                ram_resent_bytes: ram_resent * PAGE,
                vram_bytes: vram.pages * PAGE,
                vram_resent_bytes: vram.resent * PAGE,
                harvest_ms,
                ram_ms,
                vram_find_ms: vram.find_us as f64 / 1e3,
                vram_read_ms: vram.read_us as f64 / 1e3,
                kvm_dirty_pages: kvm,
                gpu_blocked_ms,
            });
            if (round == 0 || ram + vram.pages > SMALL_ROUND_PAGES) && round < MAX_ROUNDS as u32 {
                continue;
            }
            // Converged: the paused round only once the destination is ready (a round more
            // while it is not, bounded).
            let (since, first) = *wait.get_or_insert((Instant::now(), round));
            let readiness = sink
                .readiness(crate::snapshot::ready::POLL_SLICE)
                .map_err(crate::snapshot::stream::StreamError::Io)?;
            let outcome = match readiness {
                Readiness::NotAsked => break,
                Readiness::Ready {
                    prepared,
                    engine_us,
                } => Some((if prepared { "prepared" } else { "fallback" }, engine_us)),
                Readiness::Waiting { hello } => {
                    let (limit, what) = if hello {
                        (crate::snapshot::ready::READY_WAIT, "timeout")
                    } else {
                        (crate::snapshot::ready::HELLO_WAIT, "no hello")
                    };
                    if since.elapsed() < limit {
                        continue;
                    }
                    log::warn!(
                        "migration: the destination did not say its GPU engine is ready within \
                         {limit:?} ({what}); pausing the guest anyway"
                    );
                    Some((what, 0))
                }
            };
            if let Some((outcome, engine_us)) = outcome {
                let w = DestReadyWait {
                    before_paused_round: matches!(outcome, "prepared" | "fallback"),
                    outcome: outcome.into(),
                    src_wait_dest_ready_ms: since.elapsed().as_secs_f64() * 1e3,
                    rounds_while_waiting: round - first,
                    dest_engine_ms: engine_us as f64 / 1e3,
                };
                log::info!("migration: destination ready: {w:?}");
                live.report.dest_ready = Some(w);
            }
            break;
        }
        Ok(())
    }

    /// The last round's RAM, the VM and its GPU paused: what KVM and the GPU logged since the
    /// previous round (its harvest and send timed into `down`). Its VRAM part (the GPU image)
    /// is added by the caller.
    pub(crate) fn live_last_ram(
        &self,
        live: &mut Live<'_>,
        sink: &mut dyn Sink,
        down: &mut SrcDowntime,
    ) -> Result<Round, ControlError> {
        let t = Instant::now();
        let mut laps = Laps::start();
        let mut dirty = self.dirty_log()?;
        let kvm = precopy::count(&dirty);
        if let Some(v) = &live.vram {
            precopy::add_pages(&self.mem, &mut dirty, &v.ram_dirty()?);
        }
        let harvest_ms = laps.lap();
        let (ram, resent) = live.ram.send(&self.mem, &dirty, false, sink)?;
        let ram_ms = laps.lap();
        down.src_harvest_ms = harvest_ms;
        down.src_ram_ms = ram_ms;
        Ok(Round {
            round: live.report.rounds.len() as u32,
            paused: true,
            ms: t.elapsed().as_secs_f64() * 1e3,
            ram_bytes: ram * PAGE,
            ram_resent_bytes: resent * PAGE,
            harvest_ms,
            ram_ms,
            kvm_dirty_pages: kvm,
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
            let t = Instant::now();
            memory::set_dirty_logging(&self.vm, &self.mem, true)?;
            l.report.kvm_log_on_ms = t.elapsed().as_secs_f64() * 1e3;
            self.live_rounds(l, &mut sink)?;
            self.live_window_end(l, gpu.as_deref());
            let mut down = SrcDowntime::default();
            let mut laps = Laps::start();
            self.pause_now()?;
            down.src_pause_vcpus_ms = laps.lap();
            let paused_at = Instant::now();
            if let Some(gpu) = &gpu {
                gpu.pause_with(if drain {
                    vgpu::snapshot::PauseMode::Drain
                } else {
                    vgpu::snapshot::PauseMode::Preempt
                })?;
            }
            down.src_pause_gpu_ms = laps.lap();
            let mut last = self.live_last_ram(l, &mut sink, &mut down)?;
            laps.lap();
            let state = self.capture()?;
            down.src_state_ms = laps.lap();
            let mut image_ms = 0.0;
            let mut m = self.manifest.clone();
            m.ram_bytes = ram_bytes;
            m.ram_pages = l.ram.pages();
            m.gpu_live = l.vram.is_some();
            // Only the GPU image needs the VM paused: it goes into `gpu.bin` unsynced, and every
            // file is synced (then the state and the manifest written) once the VM runs again.
            let gpu_file = match (&gpu, &mut l.vram) {
                (Some(_), Some(v)) => Some(out.gpu_image(&mut m, &mut |w| {
                    let t = Instant::now();
                    let (report, r) = v.save_delta(w)?;
                    last.vram_bytes = r.pages * PAGE;
                    last.vram_resent_bytes = r.resent * PAGE;
                    last.vram_find_ms = r.find_us as f64 / 1e3;
                    last.vram_read_ms = r.read_us as f64 / 1e3;
                    image_ms = t.elapsed().as_secs_f64() * 1e3;
                    Ok(report)
                })?),
                (Some(gpu), None) => Some(out.gpu_image(&mut m, &mut |w| {
                    let t = Instant::now();
                    let report = gpu.save_report(w)?;
                    last.vram_bytes = report.vram_bytes;
                    image_ms = t.elapsed().as_secs_f64() * 1e3;
                    Ok(report)
                })?),
                (None, _) => None,
            };
            down.src_gpu_image_ms = image_ms;
            l.note_validation();
            if resume {
                // The GPU's logs off (the aperture mapped again) before it runs on; KVM's
                // after the vCPUs do (it is switched with them running, as at the start).
                l.vram = None;
                self.resume_gpu();
                if self.gate.is_paused() {
                    self.gate.resume();
                }
            }
            down.src_end_ms = laps.lap() - image_ms;
            last.ms = paused_at.elapsed().as_secs_f64() * 1e3;
            last.gpu_blocked_ms = last.ms;
            // The tail: the work after the resume, with the guest running (counted).
            let resumed = resume.then(|| self.guest_mark(gpu.as_deref()));
            let t = Instant::now();
            memory::set_dirty_logging(&self.vm, &self.mem, false)?;
            l.report.kvm_log_off_ms = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            out.sync(manifest::RAM_FILE, &sink.ram)?;
            if let Some(f) = &sink.vram {
                out.sync(manifest::VRAM_FILE, f)?;
            }
            if let Some(f) = &gpu_file {
                out.sync(manifest::GPU_FILE, f)?;
            }
            let m = out.finish_state(m, &state)?;
            l.report.sync_ms = t.elapsed().as_secs_f64() * 1e3;
            if let Some(r) = resumed {
                l.report.guest_tail = Some(r.window(&self.guest_mark(gpu.as_deref()), 0));
            }
            l.report.push(last);
            l.report.downtime = Some(down);
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
