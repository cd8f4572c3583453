//! The virtual GPU: a PCI device whose registers (BAR0), VRAM aperture (BAR1) and PRAMIN
//! window trap into [`device::VgpuDevice`] on vCPU threads, and a GPU worker thread
//! ([`worker::Worker`]) that runs the guest's channels on a physical GPU engine (`pgpu`) under
//! shadow page tables (`shadow`). The programming interface is docs/hardware.md, "The virtual
//! GPU"; the structure is explained in docs/architecture.md.
//!
//! Files: `config` (`--gpu` options), `regs` (offsets, methods, fault kinds), `device` (PCI
//! front end), `state` (shared registers, faults, interrupts), `pushbuf` (pushbuffer decoding),
//! `methods` (method state → commands), `shadowing` (instance blocks and shadow spaces over
//! the `shadow` crate), `worker` (the GPU thread), `watchdog` (per-job time limit), `para`
//! (para-managed address spaces and entry validation, `mode=para`), `para_bar` (its BAR3 and
//! the hypercall), `para_vram` (its VRAM allocation service), `snapshot` (pause, save,
//! restore), `bell` (the doorbell page of exitless submission), `budget` (the VM's host memory
//! budget, `hostmem=`), `modcache` (loaded modules), `direct` (the worker's direct access to
//! guest RAM), `remap` (BAR remap), `host` (the link to vgpud, `host=`), `gpu_move` (moving
//! the VM to another GPU of its vgpud), `prepared` (an engine made before its device: a
//! migration destination's during the pre-copy rounds, a standby's), `preloaded` (a GPU
//! image's modules loaded into such an engine before the restore: a standby's template).

pub mod bell;
pub mod budget;
pub mod config;
pub mod device;
mod direct;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gpu_move;
pub mod host;
pub mod methods;
mod modcache;
pub mod para;
pub mod para_bar;
pub mod para_vram;
mod preloaded;
mod prepared;
pub mod pushbuf;
pub mod regs;
pub mod remap;
pub mod shadowing;
pub mod snapshot;
pub mod state;
mod watchdog;
pub mod worker;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pgpu::EngineSnapshot;
use pgpu::sim::{SimConfig, SimEngine};
use serde::Serialize;

pub use config::{ConfigError, GpuConfig};
pub use gpu_move::{MoveError, MovePlan, MoveReport};
pub use preloaded::{PreloadError, Preloaded};
pub use prepared::{PreparedEngine, engine_misfit};
pub use state::{FaultRecord, GpuCounters, IrqSink};

/// Errors creating a virtual GPU.
#[derive(Debug, thiserror::Error)]
pub enum VgpuError {
    #[error("create the GPU engine: {0}")]
    Engine(#[from] pgpu::EngineError),
    #[error("PCI: {0}")]
    Pci(#[from] mmio::pci::PciError),
    #[error("start the GPU worker: {0}")]
    Thread(#[from] std::io::Error),
    #[error("shadowing: {0}")]
    Shadow(String),
    #[error("{0}")]
    Host(#[from] host::HostError),
    #[error("map the VRAM partition: {0}")]
    Vram(String),
}

/// `--stats` of the virtual GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuStats {
    pub counters: GpuCounters,
    /// MMIO exits (`counters.mmio_traps`, initialisation included) per kernel launch.
    pub exits_per_launch: f64,
    pub fault: Option<FaultRecord>,
    /// Whether the sentinels around the partition and in the foreign host buffer are intact.
    pub guard_intact: bool,
    /// BAR remap state (`opt=remap|all` with a mapper): mapped ranges, trapped pages, maps.
    pub remap: Option<RemapStats>,
    /// Hypercall counters (`mode=para` only).
    pub para: Option<para::ParaCounters>,
    /// The checkpoint preemption method's counters (`preempt=checkpoint` only).
    pub checkpoint: Option<CheckpointStats>,
}

/// [`Vgpu::activity`]: the guest's GPU work so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Activity {
    pub launches: u64,
    pub copies: u64,
    pub gpu_ns: u64,
    /// The part of `gpu_ns` the copy jobs took.
    pub copy_gpu_ns: u64,
    pub mmio_traps: u64,
    /// The engine's split of the launches' GPU time (`pgpu::LaunchTiming`; cuda only, else
    /// zero; the whole engine's, which is the VM's own unless vgpud shares it): sub-launches,
    /// their device time (start to end event each, ns) and their driver calls' host time (ns).
    pub sub_launches: u64,
    pub kernel_ns: u64,
    pub launch_call_ns: u64,
    /// Host time from each launch's origin event to its first sub-launch (ns).
    pub origin_gap_ns: u64,
    /// The copy jobs' host time in their copy calls and in their waits for the copies (ns;
    /// cuda only, the whole engine's like the launches' split).
    pub copy_call_ns: u64,
    pub copy_wait_ns: u64,
}

/// `--stats` of the checkpoint preemption method (`pgpu::CkptStats`).
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointStats {
    pub modules_transformed: u64,
    /// Modules the transformation refused and launches over the save-area limit: they run
    /// with the slice method.
    pub fallback_modules: u64,
    pub fallback_launches: u64,
    pub fallback_reasons: Vec<String>,
    pub launches: u64,
    /// Of `launches`, those whose threads restart (idempotent kernels).
    pub restart_launches: u64,
    /// Launches `auto` (or a failed alias check of `restart`) ran sliced.
    pub sliced_launches: u64,
    /// Restarting launches that continued in the checkpoint form.
    pub escalated_launches: u64,
    /// Requests `auto` waited on (the launch was expected to end within `preempt_wait_us`),
    /// and of them the launches that outlasted their estimate (`pgpu::ckwait`).
    pub waited_preemptions: u64,
    pub wait_overruns: u64,
    pub preemptions: u64,
    pub saved_full_bytes: u64,
    pub saved_incremental_bytes: u64,
}

/// BAR remap figures for `--stats`.
#[derive(Debug, Clone, Serialize)]
pub struct RemapStats {
    /// Aperture ranges mapped into the guest now.
    pub ranges: usize,
    /// Guest VRAM pages kept trapping (instance blocks, page tables).
    pub trapped_pages: usize,
    /// Memory-slot mappings made so far.
    pub maps: u64,
}

/// The sentinel byte of the guard areas.
const SENTINEL: u8 = 0xa5;

/// Guard areas: physical VRAM around the partition and a host buffer registered with the
/// engine but never guest RAM, filled with [`SENTINEL`].
struct Guards {
    engine: Arc<dyn EngineSnapshot>,
    vram: Vec<(u64, u64)>,
    host: Option<(std::ptr::NonNull<u8>, usize)>,
}

// SAFETY: the host pointer is only read, through the engine-owned region that lives as long as
// the engine this struct holds.
unsafe impl Send for Guards {}
// SAFETY: as above; reads only.
unsafe impl Sync for Guards {}

impl Guards {
    fn new(
        engine: Arc<dyn EngineSnapshot>,
        partition: (u64, u64),
        guard: u64,
    ) -> Result<Self, VgpuError> {
        let mut g = Guards {
            engine,
            vram: Vec::new(),
            host: None,
        };
        if guard == 0 {
            return Ok(g);
        }
        g.vram = vec![(partition.0 + partition.1, guard)];
        if partition.0 >= guard {
            g.vram.insert(0, (partition.0 - guard, guard));
        }
        for (pa, len) in &g.vram {
            g.engine.vram_fill(*pa, *len, SENTINEL)?;
        }
        let (_, ptr) = g.engine.alloc_host_region(guard)?;
        // SAFETY: the engine just allocated `guard` bytes at `ptr` for us; nothing else uses them.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), SENTINEL, guard as usize) };
        g.host = Some((ptr, guard as usize));
        Ok(g)
    }

    fn intact(&self) -> bool {
        let mut buf = vec![0u8; 1 << 20];
        // Compared as slices (one memcmp, not a loop over bytes).
        let want = vec![SENTINEL; 1 << 20];
        for (pa, len) in &self.vram {
            let mut off = 0;
            while off < *len {
                let n = (len - off).min(buf.len() as u64) as usize;
                if self.engine.vram_read(pa + off, &mut buf[..n]).is_err() || buf[..n] != want[..n]
                {
                    log::error!("vgpu: VRAM guard at {:#x} changed", pa + off);
                    return false;
                }
                off += n as u64;
            }
        }
        if let Some((ptr, len)) = self.host {
            // SAFETY: the region is alive (owned by the engine we hold) and `len` bytes long.
            let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) };
            if bytes.chunks(want.len()).any(|c| c != &want[..c.len()]) {
                log::error!("vgpu: host guard buffer changed");
                return false;
            }
        }
        true
    }
}

/// A registration with vgpud made before the engine (`Vgpu::cuda_engine`): the link and what
/// the daemon answered, for `Vgpu::with_engine`.
pub struct HostRegistration {
    link: Arc<host::HostLink>,
    welcome: host::Welcome,
    /// The cuda engine behind the VM's switch engine (a move to another GPU makes a new one).
    cuda: Option<gpu_move::CudaShared>,
}

impl HostRegistration {
    /// Where the daemon placed the VM.
    pub fn placement(&self) -> vgpu_proto::proto::Placement {
        self.welcome.gpu
    }
}

/// The sim engine's configuration for `cfg` (its physical VRAM: guards and partition).
fn sim_config(cfg: &GpuConfig) -> SimConfig {
    let mut sim = SimConfig {
        vram_size: cfg.physical_vram(),
        workers: cfg.workers,
        preempt: cfg.preempt,
        preempt_wait: cfg.preempt_wait,
        ..SimConfig::default()
    };
    if cfg.sim_pages_2m_only {
        sim.page_sizes = vec![pgpu::PageSize::Size2M];
    }
    sim
}

/// An engine made by the caller (`with_engine`): the engine, its host regions backing guest
/// RAM, and the vgpud registration made before it.
type GivenEngine = (
    Arc<dyn EngineSnapshot>,
    Vec<pgpu::HostRegionId>,
    Option<HostRegistration>,
);

/// One virtual GPU: the device (to put on the PCI bus) and its worker.
pub struct Vgpu {
    device: Arc<Mutex<device::VgpuDevice>>,
    shared: Arc<state::Shared>,
    worker: Option<JoinHandle<()>>,
    guards: Guards,
    para: Option<para::SharedSpaces>,
    remap: Option<Arc<Mutex<remap::Remap>>>,
    /// The daemon link when the GPU is shared (`host=`).
    link: Option<Arc<host::HostLink>>,
    /// Stops a module load of the worker (set at teardown).
    cancel: Arc<std::sync::atomic::AtomicBool>,
    /// Stops the worker's running job (requested at teardown and by a pause).
    job: pgpu::PreemptHandle,
    /// The engine, configuration and partition base (snapshot).
    engine: Arc<dyn EngineSnapshot>,
    cfg: GpuConfig,
    vram_base: u64,
    /// Guest RAM → engine host regions, and the guest RAM the worker writes itself while a
    /// live snapshot logs it (`snapshot::live`).
    sysmem: shadow::SysmemMap,
    ram_log: Arc<snapshot::live::RamWriteLog>,
    /// Per-job write sets (live snapshots on engines without a dirty log).
    write_log: Arc<snapshot::writes::WriteSetLog>,
    /// multigpu: a shared sim VM's engine and VRAM object (moves to another GPU).
    moving: Mutex<Option<gpu_move::Shared>>,
}

impl Vgpu {
    /// Creates the engine, the device and the worker. `ram` is the VM's RAM (system-memory
    /// targets of GPU page tables must lie in it).
    pub fn new(
        cfg: GpuConfig,
        ram: vm_memory::GuestMemoryMmap,
        irq: Arc<dyn IrqSink>,
    ) -> Result<Self, VgpuError> {
        Self::with_mapper(cfg, ram, irq, None)
    }

    /// As [`Vgpu::new`], with a mapper that lets the device map its VRAM aperture straight
    /// into the guest (BAR remap, when `cfg.bar_remap`). Sim backend (the engine is made here).
    pub fn with_mapper(
        cfg: GpuConfig,
        ram: vm_memory::GuestMemoryMmap,
        irq: Arc<dyn IrqSink>,
        mapper: Option<Arc<dyn remap::ApertureMapper>>,
    ) -> Result<Self, VgpuError> {
        Self::build(cfg, None, None, ram, irq, mapper)
    }

    /// The engine of a `backend=cuda` GPU, made before guest RAM: the VMM backs guest RAM with
    /// `alloc_host_region` of this engine (CUDA cannot map other host memory at a chosen GPU VA)
    /// and passes it, with the region ids, to [`Vgpu::with_engine`].
    ///
    /// Shared (`host=`): the VM registers with vgpud first, and the engine opens the CUDA
    /// device the daemon placed it on (multigpu); the registration goes to `with_engine`.
    pub fn cuda_engine(
        cfg: &GpuConfig,
    ) -> Result<(Arc<dyn EngineSnapshot>, Option<HostRegistration>), VgpuError> {
        let reg = match &cfg.host {
            Some(h) => {
                let (link, welcome) =
                    host::HostLink::connect(h, cfg.physical_vram(), cfg.channels)?;
                Some(HostRegistration {
                    link: Arc::new(link),
                    welcome,
                    cuda: None,
                })
            }
            None => None,
        };
        let cuda = pgpu::cuda::CudaConfig {
            device: reg.as_ref().map_or(0, |r| r.welcome.gpu.device as i32),
            vram_size: cfg.physical_vram(),
            preempt: cfg.preempt,
            preempt_wait: cfg.preempt_wait,
            ck_path: cfg.ck_path,
            bulk_slot_bytes: cfg.copy_slots,
            ..pgpu::cuda::CudaConfig::default()
        };
        let engine = Arc::new(pgpu::cuda::CudaEngine::new(cuda.clone())?);
        match reg {
            // Shared: behind a switch engine, so that a move to another of the daemon's GPUs
            // can swap in an engine on that device (`gpu_move`).
            Some(mut r) => {
                let switch = Arc::new(pgpu::switch::SwitchEngine::new(engine.clone()));
                r.cuda = Some(gpu_move::CudaShared {
                    switch: switch.clone(),
                    cuda: engine,
                    cfg: cuda,
                    gpu: r.welcome.gpu,
                });
                Ok((switch, Some(r)))
            }
            None => Ok((engine, None)),
        }
    }

    /// A virtual GPU on an engine made by the caller (`cuda_engine`); `ram_regions` are the
    /// engine's host regions backing `ram`, region by region.
    /// `registered`: the registration `cuda_engine` made with vgpud (`host=`).
    pub fn with_engine(
        cfg: GpuConfig,
        engine: Arc<dyn EngineSnapshot>,
        ram: vm_memory::GuestMemoryMmap,
        ram_regions: Vec<pgpu::HostRegionId>,
        irq: Arc<dyn IrqSink>,
        registered: Option<HostRegistration>,
    ) -> Result<Self, VgpuError> {
        Self::build(
            cfg,
            Some((engine, ram_regions, registered)),
            None,
            ram,
            irq,
            None,
        )
    }

    /// `sim_given`: a sim engine made before the device ([`PreparedEngine`]; not with
    /// `host=`, whose sim VRAM is the daemon's).
    fn build(
        mut cfg: GpuConfig,
        given: Option<GivenEngine>,
        sim_given: Option<Arc<SimEngine>>,
        ram: vm_memory::GuestMemoryMmap,
        irq: Arc<dyn IrqSink>,
        mapper: Option<Arc<dyn remap::ApertureMapper>>,
    ) -> Result<Self, VgpuError> {
        // Physical VRAM: guard, the VM's partition, guard (`mode=pt`: the partition at 0).
        let vram_base = cfg.partition_base();
        let vram_size = cfg.physical_vram();
        if cfg.mode == config::Mode::Pt {
            // Pass-through: the aperture is mapped whole where it can be (no page keeps
            // trapping), and the guest's tables are read again at the first run after a flush.
            cfg.bar_remap = true;
            cfg.lazy_shadowing = true;
        }
        let sim = sim_config(&cfg);
        // Shared (`host=`): register with the daemon (scheduling, VRAM and channel quota). The
        // sim engine maps only our partition of the daemon's VRAM object; a cuda engine has
        // VRAM of its own (the driver keeps processes apart).
        let pre = given.as_ref().and_then(|g| g.2.as_ref()).is_some();
        let (link, welcome) = match &cfg.host {
            Some(h) if !pre => {
                let (link, w) = host::HostLink::connect(h, vram_size, cfg.channels)?;
                (Some(Arc::new(link)), Some(w))
            }
            _ => (None, None),
        };
        let mut cuda_shared = None;
        let (engine, ram_regions, sim_engine, link): (Arc<dyn EngineSnapshot>, _, _, _) =
            match given {
                Some((e, regions, reg)) => {
                    let link = reg
                        .map(|r| {
                            cuda_shared = r.cuda;
                            r.link
                        })
                        .or(link);
                    // No CPU pointer to a cuda engine's VRAM: the aperture keeps trapping.
                    cfg.bar_remap = false;
                    (e, Some(regions), None, link)
                }
                None => {
                    let e = match (&welcome, sim_given) {
                        (None, Some(e)) => e,
                        (Some(w), _) => {
                            let region = pgpu::sim::vram::VramRegion::from_fd(
                                std::os::fd::AsFd::as_fd(&w.vram_fd),
                                w.vram_offset,
                                vram_size,
                            )
                            .map_err(|e| VgpuError::Vram(e.to_string()))?;
                            Arc::new(SimEngine::with_vram(sim, region)?)
                        }
                        (None, None) => Arc::new(SimEngine::new(sim)?),
                    };
                    (e.clone() as Arc<dyn EngineSnapshot>, None, Some(e), link)
                }
            };
        // multigpu: what a move to another of the daemon's GPUs switches: a sim VM's VRAM
        // object, a cuda VM's engine.
        let moving = match (welcome, &sim_engine) {
            (Some(w), Some(e)) => Some(gpu_move::Shared::Sim(gpu_move::SharedVram {
                engine: e.clone(),
                fd: w.vram_fd,
                offset: w.vram_offset,
                gpu: w.gpu,
            })),
            _ => cuda_shared.map(|c| gpu_move::Shared::Cuda(Box::new(c))),
        };
        let remap = match (mapper.filter(|_| cfg.bar_remap), &sim_engine) {
            (Some(m), Some(sim_engine)) => {
                let host = sim_engine
                    .vram()
                    .host_ptr(vram_base, cfg.vram)
                    .map_err(|e| VgpuError::Shadow(format!("VRAM host mapping: {e}")))?;
                Some(Arc::new(Mutex::new(remap::Remap::new(m, host, cfg.vram))))
            }
            _ => None,
        };
        let guards = Guards::new(engine.clone(), (vram_base, cfg.vram), cfg.guard)?;
        let shadows =
            shadowing::Shadows::new(engine.clone(), &cfg, vram_base, ram.clone(), ram_regions)?;
        let layout = shadows.layout().clone();
        let sysmem = shadows.sysmem().clone();
        let ram_log = Arc::new(snapshot::live::RamWriteLog::default());
        let write_log = Arc::new(snapshot::writes::WriteSetLog::new(
            vram_base,
            cfg.vram,
            sysmem.clone(),
        ));
        let shared = Arc::new(state::Shared::new(cfg.channels, irq));
        let mut dev = device::VgpuDevice::new(
            cfg.clone(),
            engine.clone(),
            vram_base,
            shared.clone(),
            layout.clone(),
        )?;
        dev.attach_write_log(write_log.clone());
        if cfg.doorbell == config::Doorbell::Poll {
            dev.attach_bell(ram.clone());
        }
        let (cfg_direct, ram_for_worker) = (cfg.direct, ram.clone());
        let para = (cfg.mode == config::Mode::Para).then(|| {
            Arc::new(Mutex::new(para::ParaSpaces::new(
                engine.clone(),
                layout,
                shadows.partition(),
                shadows.sysmem().clone(),
            )))
        });
        if let Some(spaces) = &para {
            dev.attach_para(para_bar::Para::new(spaces.clone(), ram, shared.clone()))?;
        }
        if let Some(r) = &remap {
            dev.attach_remap(r.clone());
        }
        let device = Arc::new(Mutex::new(dev));
        let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let job = pgpu::PreemptHandle::new();
        let snap_cfg = cfg.clone();
        let mut w = worker::Worker::new(
            shared.clone(),
            engine.clone(),
            cfg,
            shadows,
            job.clone(),
            cancel.clone(),
        )?;
        if let Some(l) = &link {
            w.set_host(l.clone());
        }
        // `mode=pt`: table pages found by a walk do not trap (the whole aperture stays mapped).
        if let Some(r) = remap.as_ref().filter(|_| snap_cfg.mode != config::Mode::Pt) {
            w.set_remap(r.clone());
        }
        if let Some(spaces) = &para {
            w.set_para(spaces.clone());
        }
        if cfg_direct {
            w.set_direct(ram_for_worker, ram_log.clone());
        }
        w.set_write_log(write_log.clone());
        let worker = std::thread::Builder::new()
            .name("vgpu".into())
            .spawn(move || w.run())?;
        Ok(Vgpu {
            device,
            shared,
            worker: Some(worker),
            guards,
            para,
            remap,
            link,
            cancel,
            job,
            engine,
            cfg: snap_cfg,
            vram_base,
            sysmem,
            ram_log,
            write_log,
            moving: Mutex::new(moving),
        })
    }

    /// The PCI device.
    pub fn device(&self) -> Arc<Mutex<device::VgpuDevice>> {
        self.device.clone()
    }

    /// Kernel launches, copies, GPU time of the guest's jobs (ns) and trapped accesses so far:
    /// the cheap part of [`Vgpu::stats`] (no guard check), for windows of a live snapshot.
    pub fn activity(&self) -> Activity {
        let t = self.engine.launch_timing();
        let r = self.shared.lock();
        Activity {
            launches: r.counters.launches,
            copies: r.counters.copies,
            gpu_ns: r.counters.gpu_ns,
            copy_gpu_ns: r.counters.copy_gpu_ns,
            mmio_traps: self.shared.traps.load(std::sync::atomic::Ordering::Relaxed),
            sub_launches: t.sub_launches,
            kernel_ns: t.kernel_ns,
            launch_call_ns: t.launch_call_ns,
            origin_gap_ns: t.origin_gap_ns,
            copy_call_ns: t.copy_call_ns,
            copy_wait_ns: t.copy_wait_ns,
        }
    }

    /// Counters, the pending fault, and the guard check.
    pub fn stats(&self) -> GpuStats {
        let (mut counters, fault) = {
            let r = self.shared.lock();
            (r.counters.clone(), r.fault)
        };
        counters.mmio_traps = self.shared.traps.load(std::sync::atomic::Ordering::Relaxed);
        let exits_per_launch = if counters.launches == 0 {
            0.0
        } else {
            counters.mmio_traps as f64 / counters.launches as f64
        };
        GpuStats {
            counters,
            exits_per_launch,
            fault,
            guard_intact: self.guards.intact(),
            para: self.para.as_ref().map(|p| para::lock(p).counters.clone()),
            checkpoint: self
                .guards
                .engine
                .checkpoint_stats()
                .map(|c| CheckpointStats {
                    modules_transformed: c.modules_transformed,
                    fallback_modules: c.fallback_modules,
                    fallback_launches: c.fallback_launches,
                    fallback_reasons: c.fallback_reasons,
                    launches: c.launches,
                    restart_launches: c.restart_launches,
                    sliced_launches: c.sliced_launches,
                    escalated_launches: c.escalated_launches,
                    waited_preemptions: c.waited_preemptions,
                    wait_overruns: c.wait_overruns,
                    preemptions: c.preemptions,
                    saved_full_bytes: c.saved_full_bytes,
                    saved_incremental_bytes: c.saved_incremental_bytes,
                }),
            remap: self.remap.as_ref().map(|r| {
                let r = r.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                RemapStats {
                    ranges: r.ranges().len(),
                    trapped_pages: r.trapped_pages(),
                    maps: r.maps,
                }
            }),
        }
    }
}

impl Drop for Vgpu {
    fn drop(&mut self) {
        let t = std::time::Instant::now();
        self.shared.lock().shutdown = true;
        // A module load or a job of the worker stops now, not at the job's time limit.
        self.cancel.store(true, std::sync::atomic::Ordering::SeqCst);
        self.job.request();
        self.shared.wake.notify_all();
        if let Some(l) = &self.link {
            l.close();
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        self.write_log.release(&*self.engine);
        log::info!(
            "vgpu: teardown: worker stopped in {:.1} ms (the engine's own teardown follows \
             when its last user lets it go)",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}
