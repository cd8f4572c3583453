//! Running one VM: [`run_with`] builds it ([`crate::builder`]: for boot, or from a snapshot
//! when [`Start::restore`] is given, either way a paused VM), then [`PausedVm::run`] sets up the
//! event loop (console input, signals, timeout), the control API (`--api-socket`,
//! [`Start::api`]), starts the vCPU threads and waits until something asks the VM to stop;
//! then it tears the VM down and reports why it ended and its counters.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};

use crate::api::server::{ApiServer, ApiSocket};
use crate::builder::{self, BuildError, PausedVm, RestoreError};
use crate::control::Controller;
use crate::devices::serial;
use crate::exit::ExitReason;
use crate::layout;
use crate::lifecycle::Lifecycle;
use crate::loader::Image;
use crate::pause::PauseGate;
use crate::snapshot::cpu;
use crate::snapshot::load::Loaded;
use crate::snapshot::manifest::Manifest;
use crate::snapshot::restore_report::RestoreReport;
use crate::stats::{Stats, VcpuStats};
use crate::vcpu::{self, ExitCounters, Vcpu};

/// What to run and how.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub image: Image,
    pub cmdline: String,
    pub memory_mib: u64,
    pub cpus: u8,
    pub testdev: bool,
    pub timeout: Option<Duration>,
    /// Boot the image as a Linux kernel (automatic for a bzImage).
    pub linux: bool,
    /// Initramfs for a Linux kernel.
    pub initramfs: Option<std::path::PathBuf>,
    /// Attach a virtual GPU with this configuration.
    pub gpu: Option<vgpu::GpuConfig>,
    /// Prefix of every line of console output (`--console-prefix`).
    pub console_prefix: Option<String>,
    /// Disks (`--disk`, `--run`'s image), opened and checked; Linux guests only.
    pub disks: Vec<crate::disk::Disk>,
    /// The certificate files of this VM's `tls:` migrations (`--tls-cert`, `--tls-key`,
    /// `--tls-ca`; read again at each migration, so renewed files are used).
    pub tls: Option<crate::snapshot::tls::TlsFiles>,
}

/// Errors setting up or running a VM, by phase.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Run(#[from] RunError),
}

impl VmError {
    /// A usage error found once KVM is open (more vCPUs than it allows).
    pub fn is_usage(&self) -> bool {
        matches!(self, VmError::Build(BuildError::Cpus { .. }))
    }
}

/// Errors running a built VM.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{what}: {err}")]
    Io {
        what: &'static str,
        err: std::io::Error,
    },
    #[error("event loop: {0:?}")]
    EventLoop(event_manager::Error),
    #[error("the MSRs snapshots save: {0}")]
    Msrs(#[from] cpu::CpuStateError),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> RunError {
    move |err| RunError::Io { what, err }
}

/// The outcome of a run.
#[derive(Debug)]
pub struct RunOutcome {
    pub reason: ExitReason,
    pub stats: Stats,
}

/// How a VM starts besides its configuration.
#[derive(Debug, Default)]
pub struct Start {
    /// Restore this snapshot instead of booting the image (`cfg` then comes from its manifest).
    pub restore: Option<Loaded>,
    /// Serve control requests on this socket.
    pub api: Option<ApiSocket>,
    /// When the restore began (for the restore-to-running time).
    pub since: Option<Instant>,
    /// A migration source waiting for `ok` once the restored VM is about to run (`--incoming`;
    /// if the VM fails before, the connection closes and the source resumes its VM).
    pub ack: Option<crate::snapshot::transport::Link>,
    /// A standby's `restore` request, answered with the restore's figures once the vCPUs run.
    pub reply: Option<crate::standby::serve::Reply>,
}

/// Builds the VM described by `cfg`, runs it to its end, and reports why it ended.
pub fn run(cfg: &VmConfig) -> Result<RunOutcome, VmError> {
    run_with(cfg, Start::default())
}

/// [`run`], restoring a snapshot and/or serving the API socket as `start` says.
pub fn run_with(cfg: &VmConfig, mut start: Start) -> Result<RunOutcome, VmError> {
    let building = Instant::now();
    let mut vm = match start.restore.as_mut() {
        Some(r) => builder::build_from_snapshot(cfg, r)?,
        None => builder::build_for_boot(cfg)?,
    };
    // `--restore`: what came before the build (reading and checking the snapshot).
    if let (Some(rep), Some(since)) = (vm.restore.as_mut(), start.since) {
        rep.check_ms = (building - since).as_secs_f64() * 1e3;
    }
    Ok(vm.run(cfg, start)?)
}

/// What the vCPU threads, the API and the end of the run share.
struct Shared {
    counters: Vec<Arc<ExitCounters>>,
    gate: Arc<PauseGate>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    live_reports: Arc<Mutex<Vec<crate::snapshot::precopy::Report>>>,
    /// A migration's destination: what it did (`--stats`' `incoming`).
    incoming: Option<crate::snapshot::incoming::IncomingReport>,
    /// A restored VM: the restore's parts (`--stats`' `restore`).
    restore: Option<RestoreReport>,
}

impl PausedVm {
    /// Runs the VM until it stops: event loop, API, vCPU threads; then the teardown and the
    /// stats.
    pub fn run(mut self, cfg: &VmConfig, mut start: Start) -> Result<RunOutcome, RunError> {
        let run_start = Instant::now();
        let mut em: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
            EventManager::new().map_err(RunError::EventLoop)?;
        let interactive = std::io::stdin().is_terminal();
        let (rx, evt) = serial::spawn_stdin_reader().map_err(io("start the stdin reader"))?;
        let console = Arc::new(Mutex::new(serial::ConsoleInput::new(
            self.devices.serial.clone(),
            rx,
            evt,
            self.latch.clone(),
            interactive,
        )));
        em.add_subscriber(console.clone());
        let lifecycle = Lifecycle::new(self.latch.clone(), cfg.timeout, Some(console))
            .map_err(io("set up signals and timers"))?;
        em.add_subscriber(Arc::new(Mutex::new(lifecycle)));
        let _raw = interactive.then(RawTerminal::enter);
        vcpu::install_kick_handler().map_err(|e| RunError::Io {
            what: "install the vCPU kick handler",
            err: e.into(),
        })?;
        let mut shared = Shared {
            counters: (0..cfg.cpus).map(|_| Arc::default()).collect(),
            gate: Arc::new(PauseGate::default()),
            threads: Arc::new(Mutex::new(Vec::new())),
            live_reports: Arc::new(Mutex::new(Vec::new())),
            incoming: None,
            restore: self.restore.take(),
        };
        let api_server = match start.api {
            Some(api) => Some(
                api.serve(self.controller(cfg, &shared)?)
                    .map_err(io("start the API socket"))?,
            ),
            None => None,
        };
        log::debug!("devices and vCPUs ready; starting");
        let started = Instant::now();
        let vcpus = std::mem::take(&mut self.vcpus);
        self.spawn_vcpus(vcpus, &shared);
        if let Some(mut conn) = start.ack {
            crate::snapshot::stream::answer(&mut conn, Ok(()));
        }
        let answered = Instant::now();
        if let Some(rep) = shared.restore.as_mut() {
            rep.start_ms = (answered - run_start).as_secs_f64() * 1e3;
            if let Some(since) = start.since {
                rep.restore_to_running_ms = (answered - since).as_secs_f64() * 1e3;
            }
            log::info!(
                "restore: {} ({})",
                if rep.standby { "standby" } else { "cold" },
                rep.parts()
            );
        }
        if let Some(since) = start.since {
            log::debug!(
                "restore to running: {:.1} ms",
                (answered - since).as_secs_f64() * 1e3
            );
        }
        if let Some(reply) = start.reply.take() {
            reply.send(Ok(serde_json::to_value(&shared.restore).unwrap_or_default()));
        }
        // The snapshot's files (a migration's memfds: freeing them takes a while) go only
        // after the times are taken.
        if let Some((mut rep, end)) = start.restore.as_mut().and_then(|r| r.incoming.take()) {
            rep.dest_switch_ms = (answered - end).as_secs_f64() * 1e3;
            log::info!(
                "migration destination: {}",
                serde_json::to_string(&rep).unwrap_or_default()
            );
            shared.incoming = Some(rep);
        }
        drop(start.restore);
        while !self.latch.stopping() {
            em.run_with_timeout(100).map_err(RunError::EventLoop)?;
        }
        Ok(self.teardown(shared, api_server, started))
    }

    /// The controller the API serves, with the manifest's fixed part.
    fn controller(&self, cfg: &VmConfig, s: &Shared) -> Result<Arc<Controller>, RunError> {
        let msrs = match &self.msrs {
            Some(m) => m.clone(),
            None => {
                let (msrs, refused) = cpu::saveable_msrs(&self.kvm, &self.vcpus[0])?;
                log::debug!(
                    "snapshots save {} MSRs; KVM lists but refuses to read {:x?}",
                    msrs.len(),
                    refused
                );
                msrs
            }
        };
        let manifest = Manifest {
            format: crate::snapshot::manifest::FORMAT.into(),
            version: crate::snapshot::format::VERSION,
            vmm_version: env!("CARGO_PKG_VERSION").into(),
            memory_mib: cfg.memory_mib,
            cpus: cfg.cpus,
            boot: self.boot,
            image: self.image.clone(),
            testdev: cfg.testdev,
            gpu: cfg.gpu.as_ref().map(crate::snapshot::gpu::spec),
            tsc_khz: self.tsc_khz,
            msrs: msrs.len(),
            state_bytes: 0,
            state_crc32: 0,
            ram_bytes: 0,
            ram_pages: 0,
            gpu_bytes: 0,
            gpu_crc32: 0,
            gpu_live: false,
            disks: self.devices.disks.specs(),
        };
        Ok(Arc::new(Controller {
            op: Mutex::default(),
            gate: s.gate.clone(),
            threads: s.threads.clone(),
            latch: self.latch.clone(),
            vm: self.vm.clone(),
            mem: self.mem.clone(),
            backing: self.backing,
            serial: self.devices.serial.clone(),
            devices: self.devices.saved.clone(),
            disks: self.devices.disks.clone(),
            counters: s.counters.clone(),
            manifest,
            msrs,
            gpu: self.gpu.as_ref().map(Arc::downgrade),
            started: Instant::now(),
            live_reports: s.live_reports.clone(),
            tls: cfg.tls.clone(),
        }))
    }

    /// Starts a thread per vCPU (a failure asks the VM to stop).
    fn spawn_vcpus(&self, vcpus: Vec<kvm_ioctls::VcpuFd>, s: &Shared) {
        for (id, fd) in vcpus.into_iter().enumerate() {
            let v = Vcpu {
                id: id as u8,
                fd,
                pio: self.devices.pio.clone(),
                mmio: self.devices.mmio.clone(),
                latch: self.latch.clone(),
                counters: s.counters[id].clone(),
                gate: s.gate.clone(),
            };
            match v.spawn() {
                Ok(t) => s
                    .threads
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(t),
                Err(err) => {
                    self.latch.request(ExitReason::VcpuError {
                        vcpu: id as u8,
                        what: format!("spawn thread: {err}"),
                    });
                    break;
                }
            }
        }
    }

    /// Stops the vCPUs and the API, and collects the stats (the GPU, then RAM, then the cuda
    /// engine that backs it are dropped last, in that order).
    fn teardown(self, s: Shared, api: Option<ApiServer>, started: Instant) -> RunOutcome {
        let threads =
            std::mem::take(&mut *s.threads.lock().unwrap_or_else(PoisonError::into_inner));
        s.gate.resume();
        vcpu::stop_all(threads, Duration::from_secs(2));
        self.devices.disks.log_counters();
        drop(api);
        let run_ms = started.elapsed().as_secs_f64() * 1e3;
        let reason = self.latch.reason().unwrap_or(ExitReason::VcpuError {
            vcpu: 0,
            what: "stopped without a reason".into(),
        });
        let stats = Stats {
            exit_reason: reason.to_string(),
            exit_code: reason.code(),
            run_ms,
            vcpus: (s.counters.iter().enumerate())
                .map(|(i, c)| VcpuStats {
                    id: i as u8,
                    exits: c.snapshot(),
                })
                .collect(),
            pio: self.devices.pio.stats(),
            mmio: self.devices.mmio.stats(),
            gpu: self.gpu.as_deref().map(vgpu::Vgpu::stats),
            live: std::mem::take(
                &mut *s
                    .live_reports
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            ),
            incoming: s.incoming,
            restore: s.restore,
        };
        let PausedVm {
            gpu,
            mem,
            cuda_engine,
            ram_owner,
            ..
        } = self;
        // Timed: a cuda VM's teardown (its context destroyed, its pinned RAM freed) runs on
        // the GPU beside the VMs still running (docs/performance.md, session 14).
        let t = Instant::now();
        drop(gpu);
        let gpu_ms = t.elapsed().as_secs_f64() * 1e3;
        drop(mem);
        drop(ram_owner);
        let ram_ms = t.elapsed().as_secs_f64() * 1e3 - gpu_ms;
        let engine = cuda_engine.is_some();
        drop(cuda_engine);
        let all_ms = t.elapsed().as_secs_f64() * 1e3;
        if engine {
            log::info!(
                "vmm: teardown: GPU device {gpu_ms:.1} ms, guest RAM {ram_ms:.1} ms, cuda engine \
                 {:.1} ms",
                all_ms - gpu_ms - ram_ms
            );
        }
        RunOutcome { reason, stats }
    }
}

/// Delivers the virtual GPU's interrupts through KVM: MSI messages, or its INTA line.
pub(crate) struct GpuIrq(pub(crate) Arc<kvm_ioctls::VmFd>);

impl vgpu::IrqSink for GpuIrq {
    fn msi(&self, msg: mmio::pci::MsiMessage) {
        let m = kvm_bindings::kvm_msi {
            address_lo: msg.address as u32,
            address_hi: (msg.address >> 32) as u32,
            data: msg.data,
            ..Default::default()
        };
        if let Err(e) = self.0.signal_msi(m) {
            log::warn!(
                "vgpu: MSI {:#x}/{:#x} not delivered: {e}",
                msg.address,
                msg.data
            );
        }
    }

    fn intx(&self, level: bool) {
        if let Err(e) = self.0.set_irq_line(layout::GPU_INTX_IRQ, level) {
            log::warn!("vgpu: INTA line {level}: {e}");
        }
    }
}

/// Puts the terminal in raw mode for an interactive console and restores it when dropped.
struct RawTerminal;

impl RawTerminal {
    fn enter() -> Self {
        use vmm_sys_util::terminal::Terminal;
        if let Err(e) = std::io::stdin().lock().set_raw_mode() {
            log::warn!("console: cannot set raw mode: {e}");
        }
        RawTerminal
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        use vmm_sys_util::terminal::Terminal;
        let _ = std::io::stdin().lock().set_canon_mode();
    }
}
