//! The running VM's control operations, callable from any thread (the API socket's): pause,
//! resume, stats and snapshot. One operation at a time. The vCPU threads' handles are shared
//! with the VM's main thread, which takes them at exit; a kick is sent only while holding them,
//! so it never reaches a thread that was joined.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::VmFd;
use serde::Serialize;
use vm_memory::GuestMemoryMmap;

use crate::devices::serial::SerialDevice;
use crate::exit::ExitLatch;
use crate::memory;
use crate::pause::{PauseError, PauseGate};
use crate::persist::DeviceSnapshot;
use crate::snapshot::manifest::Manifest;
use crate::snapshot::ram::Backing;
use crate::snapshot::save::{OutputDir, SaveError};
use crate::snapshot::state::MachineState;
use crate::snapshot::transport::Endpoint;
use crate::snapshot::{cpu::CpuStateError, stream, vmstate};
use crate::vcpu::{ExitCounters, ExitCounts};

/// How long a pause may take to park every vCPU.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of control operations.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("pause: {0}")]
    Pause(#[from] PauseError),
    #[error("the VM is already paused")]
    AlreadyPaused,
    #[error("the VM is not paused")]
    NotPaused,
    #[error("the VM is ending")]
    Ending,
    #[error("the virtual GPU: {0}")]
    Gpu(#[from] vgpu::snapshot::SnapshotError),
    #[error("snapshot: {0}")]
    Save(#[from] SaveError),
    #[error("snapshot: {0}")]
    VmState(#[from] vmstate::VmStateError),
    #[error("snapshot: {0}")]
    Cpu(#[from] CpuStateError),
    #[error("migrate: connect: {0}")]
    Connect(crate::snapshot::transport::EndpointError),
    #[error("migrate: {0}")]
    Stream(#[from] crate::snapshot::stream::StreamError),
    #[error("migrate: dirty logging: {0}")]
    Memory(#[from] crate::memory::MemoryError),
    #[error("migrate: KVM_GET_DIRTY_LOG of slot {slot}: {err}")]
    DirtyLog { slot: usize, err: kvm_ioctls::Error },
    #[error("pre-copy: {0}")]
    Ram(#[from] crate::snapshot::ram::RamError),
    #[error("{0}")]
    Disk(#[from] crate::disk::DiskError),
    // multigpu:
    #[error("move-gpu: {0}")]
    Move(#[from] vgpu::MoveError),
}

/// Most pre-copy rounds after the first full pass.
pub const MAX_ROUNDS: usize = 8;
/// A round that sent at most this many pages ends pre-copy (1 MiB).
pub const SMALL_ROUND_PAGES: u64 = 256;

/// Everything the operations reach.
pub struct Controller {
    pub(crate) op: Mutex<()>,
    pub gate: Arc<PauseGate>,
    pub threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    pub latch: Arc<ExitLatch>,
    pub vm: Arc<VmFd>,
    pub mem: GuestMemoryMmap,
    pub backing: Backing,
    /// The UART (its console output is flushed at a pause).
    pub serial: Arc<Mutex<SerialDevice>>,
    /// Every device with state in the state file, saved in a loop ([`DeviceSnapshot`]).
    pub devices: Vec<Arc<dyn DeviceSnapshot>>,
    /// The disks (snapshots need them all read-only; their device state is in `devices`).
    pub disks: crate::disk::Disks,
    pub counters: Vec<Arc<ExitCounters>>,
    /// The manifest's fixed part (file fields filled in by a save).
    pub manifest: Manifest,
    /// MSRs saved per vCPU.
    pub msrs: Vec<u32>,
    /// The virtual GPU, paused (after the vCPUs) for a snapshot. Weak: the VM's main thread
    /// owns it and drops it at the end, whoever still holds the controller.
    pub gpu: Option<std::sync::Weak<vgpu::Vgpu>>,
    pub started: Instant,
    /// Reports of the live snapshots and migrations made (for `--stats`).
    pub live_reports: Arc<Mutex<Vec<crate::snapshot::precopy::Report>>>,
    /// The VM's own certificate files for `tls:` migrations (a request may give others).
    pub tls: Option<crate::snapshot::tls::TlsFiles>,
}

/// The `stats` answer.
#[derive(Debug, Serialize)]
pub struct ControlStats {
    pub state: &'static str,
    pub uptime_ms: f64,
    pub memory_mib: u64,
    pub cpus: u8,
    pub vcpus: Vec<ExitCounts>,
    /// The virtual GPU's totals (none without a GPU): kernel launches, GPU time of the
    /// guest's jobs (ns), trapped register and aperture accesses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<vgpu::Activity>,
}

/// The `migrate` answer (the source VM ends right after it).
#[derive(Debug, Serialize)]
pub struct MigrateDone {
    pub to: String,
    /// Time from the request to the destination's `ok`, in ms.
    pub ms: f64,
    /// Of which the VM was paused (the last round, the state and the destination's set-up).
    pub paused_ms: f64,
    /// Pages sent, resends included.
    pub ram_pages: u64,
    /// RAM pages sent per pre-copy round (the last one with the VM paused); empty for
    /// stop-and-copy.
    pub rounds: Vec<u64>,
    /// With `live`: every round's RAM and VRAM bytes, and how many were sent more than once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precopy: Option<crate::snapshot::precopy::Report>,
    /// The source's parts of the downtime (`src_*`).
    pub downtime: crate::snapshot::source_report::SrcDowntime,
}

/// The `snapshot` answer.
#[derive(Debug, Serialize)]
pub struct SnapshotDone {
    pub dir: String,
    /// Time from the request to the files being written, in ms (the VM is paused for it).
    pub ms: f64,
    pub ram_bytes: u64,
    pub ram_pages: u64,
    pub state_bytes: u64,
    /// Bytes of the GPU image (`gpu.bin`; 0 without a GPU), of which VRAM, and the jobs the
    /// GPU's pause preempted mid-run (their contexts are in the image).
    pub gpu_bytes: u64,
    pub gpu_vram_bytes: u64,
    pub gpu_preempted: usize,
    /// The VM's state after the snapshot: "running" or "paused".
    pub state: &'static str,
    /// How long the VM was paused for it, in ms (all of `ms` unless live).
    pub paused_ms: f64,
    /// A live snapshot's rounds (RAM and VRAM bytes, and how many were sent more than once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<crate::snapshot::precopy::Report>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Controller {
    pub(crate) fn pause_now(&self) -> Result<(), ControlError> {
        let threads = lock(&self.threads);
        let kick = || threads.iter().for_each(crate::vcpu::kick);
        self.gate
            .pause(self.counters.len(), &self.latch, &kick, PAUSE_TIMEOUT)?;
        lock(&self.serial).flush_output();
        Ok(())
    }

    /// Parks every vCPU.
    pub fn pause(&self) -> Result<(), ControlError> {
        let _op = lock(&self.op);
        if self.gate.is_paused() {
            return Err(ControlError::AlreadyPaused);
        }
        self.pause_now()?;
        log::info!("VM paused");
        Ok(())
    }

    /// Releases paused vCPUs (and the GPU, if a snapshot left it paused with them).
    pub fn resume(&self) -> Result<(), ControlError> {
        let _op = lock(&self.op);
        if !self.gate.is_paused() {
            return Err(ControlError::NotPaused);
        }
        self.resume_gpu();
        self.gate.resume();
        log::info!("VM resumed");
        Ok(())
    }

    /// The VM's state and counters.
    pub fn stats(&self) -> ControlStats {
        ControlStats {
            state: if self.gate.is_paused() {
                "paused"
            } else {
                "running"
            },
            uptime_ms: self.started.elapsed().as_secs_f64() * 1e3,
            memory_mib: self.manifest.memory_mib,
            cpus: self.manifest.cpus,
            vcpus: self.counters.iter().map(|c| c.snapshot()).collect(),
            gpu: self.gpu().ok().flatten().map(|g| g.activity()),
        }
    }

    /// The virtual GPU, if the VM has one.
    pub(crate) fn gpu(&self) -> Result<Option<Arc<vgpu::Vgpu>>, ControlError> {
        match &self.gpu {
            Some(w) => w.upgrade().map(Some).ok_or(ControlError::Ending),
            None => Ok(None),
        }
    }

    pub(crate) fn resume_gpu(&self) {
        if let Ok(Some(gpu)) = self.gpu()
            && gpu.is_paused()
        {
            gpu.resume();
        }
    }

    /// Writes a snapshot to `dir` (checked first). A running VM is paused for it (the vCPUs,
    /// then the GPU) and resumed after unless `resume` is false; a paused one stays paused
    /// (its GPU too, until `resume`). `drain`: a job the GPU is running finishes first instead
    /// of being preempted (no engine context in the image: restorable on any backend).
    pub fn snapshot(
        &self,
        dir: &Path,
        resume: bool,
        drain: bool,
    ) -> Result<SnapshotDone, ControlError> {
        let _op = lock(&self.op);
        self.disks.check_snapshot()?;
        let start = Instant::now();
        let mut out = OutputDir::prepare(dir)?;
        let was_paused = self.gate.is_paused();
        if !was_paused {
            self.pause_now()?;
        }
        let result = self.save(&mut out, drain);
        let stay_paused = was_paused || !resume;
        if !stay_paused {
            self.resume_gpu();
            self.gate.resume();
        }
        let manifest = result?;
        let report = out.gpu_report;
        out.keep();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        log::info!(
            "snapshot to {} in {ms:.1} ms: {} pages of RAM, {} bytes of state",
            dir.display(),
            manifest.ram_pages,
            manifest.state_bytes
        );
        Ok(SnapshotDone {
            dir: dir.display().to_string(),
            ms,
            ram_bytes: manifest.ram_bytes,
            ram_pages: manifest.ram_pages,
            state_bytes: manifest.state_bytes,
            gpu_bytes: manifest.gpu_bytes,
            gpu_vram_bytes: report.map_or(0, |r| r.vram_bytes),
            gpu_preempted: report.map_or(0, |r| r.suspended),
            state: if stay_paused { "paused" } else { "running" },
            paused_ms: ms,
            live: None,
        })
    }

    /// Migration to the `--incoming` endpoint `to` (unix socket, loopback TCP, or TLS with
    /// `tls`, else the VM's own files): connects (before pausing; for TLS, the handshake and
    /// the destination's acceptance too), then either
    /// stop-and-copy (pause, send everything) or, with `live`, pre-copy: KVM's dirty log on,
    /// all RAM sent while the guest runs, then rounds of the pages it dirtied meanwhile until
    /// a round is small or [`MAX_ROUNDS`] passed (and, with VRAM pre-copy, until the
    /// destination says its GPU engine is ready, at most 5 s), then pause and send the last
    /// dirty pages with the state. On the destination's `ok` this VM ends
    /// ([`ExitReason::Migrated`](crate::exit::ExitReason::Migrated)); on any failure it runs
    /// on here (or stays paused if it was).
    pub fn migrate(
        &self,
        to: &Endpoint,
        live: bool,
        tls: Option<&crate::snapshot::tls::TlsFiles>,
    ) -> Result<MigrateDone, ControlError> {
        let _op = lock(&self.op);
        self.disks.check_snapshot()?;
        let start = Instant::now();
        let tls = match to {
            Endpoint::Tls(_) => tls.or(self.tls.as_ref()),
            _ => tls,
        };
        let conn = to.connect(tls).map_err(ControlError::Connect)?;
        let was_paused = self.gate.is_paused();
        let live = live && !was_paused;
        let mut paused_at = None;
        let gpu = self.gpu()?;
        let mut pre = None;
        let mut down = crate::snapshot::source_report::SrcDowntime::default();
        let result = (|| -> Result<u64, ControlError> {
            let mut manifest = stream::stream_manifest(self.manifest.clone(), &self.mem);
            // Pre-copy: the GPU's VRAM in rounds too while it runs (an engine with an exact
            // dirty log), else the GPU paused from here on (KVM's log misses its RAM writes).
            let l = if live {
                Some(pre.insert(self.live_start(gpu.as_deref())?))
            } else {
                None
            };
            manifest.gpu_live = l.as_ref().is_some_and(|l| l.vram.is_some());
            let mut tx = stream::Sender::start(&conn, &manifest)?;
            if let Some(l) = l {
                let t = Instant::now();
                memory::set_dirty_logging(&self.vm, &self.mem, true)?;
                l.report.kvm_log_on_ms = t.elapsed().as_secs_f64() * 1e3;
                self.live_rounds(l, &mut tx)?;
                self.live_window_end(l, gpu.as_deref());
            }
            let mut laps = crate::snapshot::source_report::Laps::start();
            if !was_paused {
                self.pause_now()?;
            }
            down.src_pause_vcpus_ms = laps.lap();
            paused_at = Some(Instant::now());
            if let Some(gpu) = &gpu {
                gpu.pause()?;
            }
            down.src_pause_gpu_ms = laps.lap();
            let mut last = None;
            match pre.as_mut() {
                Some(l) => last = Some(self.live_last_ram(l, &mut tx, &mut down)?),
                None => {
                    tx.all_ram(&self.mem, self.backing)?;
                    down.src_ram_ms = laps.lap();
                }
            }
            laps.lap();
            let state = self.capture()?.encode();
            down.src_state_ms = laps.lap();
            let mut image_ms = 0.0;
            let vram = pre.as_mut().and_then(|l| l.vram.as_mut());
            let pages = match (&gpu, vram) {
                (Some(_), Some(v)) => tx.finish(
                    &state,
                    Some(&mut |w| {
                        let t = Instant::now();
                        let (_, r) = v.save_delta(w)?;
                        if let Some(last) = &mut last {
                            last.vram_bytes = r.pages * 4096;
                            last.vram_resent_bytes = r.resent * 4096;
                            last.vram_find_ms = r.find_us as f64 / 1e3;
                            last.vram_read_ms = r.read_us as f64 / 1e3;
                        }
                        image_ms = t.elapsed().as_secs_f64() * 1e3;
                        Ok(())
                    }),
                )?,
                (Some(gpu), None) => tx.finish(
                    &state,
                    Some(&mut |w| {
                        let t = Instant::now();
                        let report = gpu.save_report(w)?;
                        if let Some(last) = &mut last {
                            last.vram_bytes = report.vram_bytes;
                        }
                        image_ms = t.elapsed().as_secs_f64() * 1e3;
                        Ok(())
                    }),
                )?,
                (None, _) => tx.finish(&state, None)?,
            };
            down.src_gpu_image_ms = image_ms;
            down.src_end_ms = laps.lap() - image_ms;
            if let (Some(l), Some(mut last)) = (pre.as_mut(), last) {
                last.ms = paused_at.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
                last.gpu_blocked_ms = last.ms;
                l.note_validation();
                l.report.push(last);
                l.report.downtime = Some(down.clone());
            }
            Ok(pages)
        })();
        if live && let Err(e) = memory::set_dirty_logging(&self.vm, &self.mem, false) {
            log::warn!("migrate: turn dirty logging off: {e}");
        }
        // Stops the GPU's dirty log (and maps its aperture again) whatever happened.
        let report = pre.take().map(|l| l.report);
        match result {
            Ok(pages) => {
                let ms = start.elapsed().as_secs_f64() * 1e3;
                let paused_ms = paused_at.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
                let rounds: Vec<u64> = report
                    .iter()
                    .flat_map(|r| &r.rounds)
                    .map(|r| r.ram_bytes / 4096)
                    .collect();
                log::info!(
                    "migrated to {} in {ms:.1} ms, paused for {paused_ms:.1} ms ({pages} pages \
                     sent, rounds {rounds:?})",
                    to
                );
                if let Some(r) = &report {
                    self.record_live(r);
                }
                self.latch.request(crate::exit::ExitReason::Migrated);
                Ok(MigrateDone {
                    to: to.to_string(),
                    ms,
                    paused_ms,
                    ram_pages: pages,
                    rounds,
                    precopy: report,
                    downtime: down,
                })
            }
            Err(e) => {
                if !was_paused {
                    self.resume_gpu();
                    if self.gate.is_paused() {
                        self.gate.resume();
                    }
                }
                // A destination that refused the VM at its manifest (a standby it does not
                // fit) said why before closing: that, rather than the broken pipe.
                if !matches!(&e, ControlError::Stream(stream::StreamError::Refused(_)))
                    && let Some(why) = crate::snapshot::ready::refusal(&conn)
                {
                    log::warn!("migrate: {e}; the destination refused the VM: {why}");
                    return Err(stream::StreamError::Refused(why).into());
                }
                Err(e)
            }
        }
    }

    /// KVM's dirty log of each RAM slot (and clears it).
    pub(crate) fn dirty_log(&self) -> Result<Vec<Vec<u64>>, ControlError> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        self.mem
            .iter()
            .enumerate()
            .map(|(slot, r)| {
                self.vm
                    .get_dirty_log(slot as u32, r.len() as usize)
                    .map_err(|err| ControlError::DirtyLog { slot, err })
            })
            .collect()
    }

    pub(crate) fn capture(&self) -> Result<MachineState, ControlError> {
        // Disk contents are not saved: a writable disk would not match the saved RAM.
        self.disks.check_snapshot()?;
        let vcpus =
            self.gate
                .capture(self.counters.len(), &self.msrs, &self.latch, PAUSE_TIMEOUT)?;
        let vm = vmstate::capture(&self.vm)?;
        let devices = self.devices.iter().map(|d| d.save_section()).collect();
        Ok(MachineState { vm, vcpus, devices })
    }

    fn save(&self, out: &mut OutputDir, drain: bool) -> Result<Manifest, ControlError> {
        // The GPU pauses after the vCPUs (no register access races it) and before their state
        // and the interrupt controllers' are read: from then on it raises no interrupt and
        // writes no guest RAM, so what is saved next matches its state.
        let gpu = self.gpu()?;
        if let Some(gpu) = &gpu {
            let t = Instant::now();
            gpu.pause_with(if drain {
                vgpu::snapshot::PauseMode::Drain
            } else {
                vgpu::snapshot::PauseMode::Preempt
            })?;
            log::debug!(
                "snapshot: GPU paused in {:.2} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        let state = self.capture()?;
        Ok(out.write(
            self.manifest.clone(),
            &state,
            &self.mem,
            self.backing,
            gpu.as_deref(),
        )?)
    }
}
