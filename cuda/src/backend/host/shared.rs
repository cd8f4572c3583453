//! The process's one `pgpu` engine for the host backend (`sim` or `cuda`), what it reports as
//! the device, and its physical VRAM, handed to contexts in extents of whole 2 MiB pages.
//!
//! Settings (environment): `VGPU_CUDA_VRAM_MIB` (VRAM of the engine, default 4096),
//! `VGPU_CUDA_SIM_WORKERS` (sim interpreter threads, default: the CPUs), `VGPU_CUDA_DEVICE`
//! (cuda: the GPU's ordinal, default 0), `VGPU_CUDA_PREEMPT` (the preemption method:
//! `slice`, the default, `checkpoint`, `restart` or `auto`), `VGPU_CUDA_CKPT_POLL` (its poll
//! interval), `VGPU_CUDA_PREEMPT_TEST` (forced preemptions, [`super::forced`]),
//! `VGPU_CUDA_PREPARE_MODULES` (module loads prepare their runs; default under a method) and
//! `VGPU_CUDA_CK_PATH` (cuda: each checkpointed run's request path, `fixed` or `adaptive`).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use pgpu::Engine;

use super::alloc::RangeAlloc;
use super::forced::{self, Forced};
use crate::device::{DeviceError, DeviceInfo};

/// Which pgpu engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Sim,
    Cuda,
}

/// 2 MiB: the mapping granule of both engines.
pub const PAGE: u64 = 2 << 20;
/// GPU VA of the contexts' windows (every context has its own space over the same window;
/// a 64 GiB base that the cuda engine's reservation honoured on H100/H200).
pub const WINDOW_BASE: u64 = 0x10_0000_0000;
/// VA set aside after VRAM for host buffers (`cuMemHostAlloc`) mapped into the space.
pub const HOST_WINDOW: u64 = 16 << 30;

/// The engine and its VRAM.
pub struct Shared {
    pub engine: Arc<dyn Engine>,
    pub kind: EngineKind,
    pub info: DeviceInfo,
    pub vram_size: u64,
    /// The engine's preemption method (`VGPU_CUDA_PREEMPT`).
    pub preempt: pgpu::PreemptMethod,
    /// The transformation's poll interval (`VGPU_CUDA_CKPT_POLL`).
    pub ckpt_poll: u32,
    /// Forced preemptions of every launch (`VGPU_CUDA_PREEMPT_TEST`).
    pub forced: Option<Forced>,
    /// Whether a module load prepares its runs (`VGPU_CUDA_PREPARE_MODULES`).
    pub prepare_modules: bool,
    /// cuda: how each checkpointed run's request path is chosen (`VGPU_CUDA_CK_PATH`).
    pub ck_path: pgpu::cuda::CkPathChoice,
    /// Module loads the engine prepared (`Engine::prepare_module` succeeded).
    pub modules_prepared: AtomicU64,
    phys: Mutex<RangeAlloc>,
    /// The host-buffer part of the window, shared by the contexts: on sim a host buffer lives
    /// at the same address in the process as on the GPU, so two contexts must not pick the
    /// same one.
    host_va: Mutex<RangeAlloc>,
}

impl Shared {
    /// `len` bytes (a multiple of [`PAGE`]) of physical VRAM.
    pub fn take(&self, len: u64) -> Option<u64> {
        self.phys.lock().ok()?.alloc(len, PAGE)
    }

    /// Gives back what [`Shared::take`] gave.
    pub fn give(&self, pa: u64, len: u64) {
        if let Ok(mut p) = self.phys.lock() {
            p.free(pa, len);
        }
    }

    /// `len` bytes (a multiple of [`PAGE`]) of the host-buffer window.
    pub fn take_host_va(&self, len: u64) -> Option<u64> {
        self.host_va.lock().ok()?.alloc(len, PAGE)
    }

    /// Gives back what [`Shared::take_host_va`] gave.
    pub fn give_host_va(&self, va: u64, len: u64) {
        if let Ok(mut p) = self.host_va.lock() {
            p.free(va, len);
        }
    }

    /// Physical VRAM no context holds.
    pub fn free_bytes(&self) -> u64 {
        self.phys.lock().map(|p| p.free_bytes()).unwrap_or(0)
    }
}

static SHARED: Mutex<Option<Arc<Shared>>> = Mutex::new(None);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The process's engine, made on first use; one kind per process.
pub fn get(kind: EngineKind) -> Result<Arc<Shared>, DeviceError> {
    let mut slot = SHARED
        .lock()
        .map_err(|_| DeviceError::NoDevice("engine state poisoned".into()))?;
    if let Some(s) = slot.as_ref() {
        if s.kind != kind {
            return Err(DeviceError::NoDevice(format!(
                "this process already runs the {:?} engine",
                s.kind
            )));
        }
        return Ok(Arc::clone(s));
    }
    let vram_size = env_u64("VGPU_CUDA_VRAM_MIB")
        .unwrap_or(4096)
        .clamp(2, 1 << 20)
        .next_multiple_of(2)
        << 20;
    let preempt = forced::method_from_env().map_err(DeviceError::NoDevice)?;
    let poll = forced::poll_from_env()
        .map_err(DeviceError::NoDevice)?
        .unwrap_or_else(pgpu::ckpt::default_poll_interval);
    let forced = Forced::from_env().map_err(DeviceError::NoDevice)?;
    let prepare_modules = forced::prepare_from_env(preempt).map_err(DeviceError::NoDevice)?;
    let ck_path = forced::ck_path_from_env().map_err(DeviceError::NoDevice)?;
    let (engine, info): (Arc<dyn Engine>, DeviceInfo) = match kind {
        EngineKind::Sim => sim(vram_size, (preempt, poll))?,
        EngineKind::Cuda => cuda(vram_size, (preempt, poll), ck_path)?,
    };
    let s = Arc::new(Shared {
        engine,
        kind,
        info,
        vram_size,
        preempt,
        ckpt_poll: poll,
        forced,
        prepare_modules,
        ck_path,
        modules_prepared: AtomicU64::new(0),
        phys: Mutex::new(RangeAlloc::new(0, vram_size)),
        host_va: Mutex::new(RangeAlloc::new(WINDOW_BASE + vram_size, HOST_WINDOW)),
    });
    *slot = Some(Arc::clone(&s));
    Ok(s)
}

/// The process's engine, if one was made and its slot is free now (the report is written at
/// exit too, where waiting on a lock another thread holds could hang the process).
pub fn current() -> Option<Arc<Shared>> {
    SHARED.try_lock().ok()?.clone()
}

/// The engine's limits for a program in its own process (the bounds protect the program from
/// itself only): more host buffers and modules than a VM gets, CUDA 12.1's 32 764 bytes of
/// kernel parameters, large nvcc modules.
fn limits() -> pgpu::EngineLimits {
    pgpu::EngineLimits {
        max_host_regions: 4096,
        max_modules: 4096,
        max_ptx_bytes: 64 << 20,
        max_ptx_bytes_total: 512 << 20,
        max_param_bytes: 32764,
        ..Default::default()
    }
}

fn no_device(e: pgpu::EngineError) -> DeviceError {
    DeviceError::NoDevice(e.to_string())
}

fn sim(
    vram_size: u64,
    (preempt, ckpt_poll_interval): (pgpu::PreemptMethod, u32),
) -> Result<(Arc<dyn Engine>, DeviceInfo), DeviceError> {
    let workers = env_u64("VGPU_CUDA_SIM_WORKERS")
        .map(|w| w.clamp(1, 256) as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cfg = pgpu::sim::SimConfig {
        vram_size,
        workers,
        limits: limits(),
        preempt,
        ckpt_poll_interval,
        ..Default::default()
    };
    let limits = cfg.limits.clone();
    let engine = pgpu::sim::SimEngine::new(cfg).map_err(no_device)?;
    let info = DeviceInfo {
        name: "vgpu-vmm software GPU (pgpu sim)".into(),
        total_mem: vram_size,
        compute_capability: (8, 0),
        max_ptx_arch: 90,
        max_ptx_isa: 90,
        multiprocessor_count: workers as u32,
        clock_rate_khz: 1_000_000,
        memory_clock_rate_khz: 1_000_000,
        global_memory_bus_width: 256,
        l2_cache_size: 4 << 20,
        max_threads_per_block: limits.max_threads_per_block,
        max_block_dim: limits.max_block,
        max_grid_dim: limits.max_grid,
        warp_size: 32,
        shared_mem_per_block: limits.max_shared_per_block,
        shared_mem_per_multiprocessor: 2 * limits.max_shared_per_block,
        max_threads_per_multiprocessor: 2048,
        regs_per_block: 65536,
        total_constant_memory: 65536,
    };
    Ok((Arc::new(engine), info))
}

fn cuda(
    vram_size: u64,
    (preempt, ckpt_poll_interval): (pgpu::PreemptMethod, u32),
    ck_path: pgpu::cuda::CkPathChoice,
) -> Result<(Arc<dyn Engine>, DeviceInfo), DeviceError> {
    let device = env_u64("VGPU_CUDA_DEVICE").unwrap_or(0).min(64) as i32;
    // In-process nothing preempts a kernel (no scheduler, no snapshot): a grid runs whole
    // unless VGPU_CUDA_SLICE_US asks for the engine's sliced sub-launches (the VM default is
    // 200 us, which cost the H200 2-10x of the apps' GPU time here).
    let slice_us = env_u64("VGPU_CUDA_SLICE_US").unwrap_or(3_600_000_000);
    let cfg = pgpu::cuda::CudaConfig {
        device,
        vram_size,
        limits: limits(),
        sub_launch_target: std::time::Duration::from_micros(slice_us.max(1)),
        preempt,
        ckpt_poll_interval,
        ck_path,
        ..Default::default()
    };
    let limits = cfg.limits.clone();
    let engine = pgpu::cuda::CudaEngine::new(cfg).map_err(no_device)?;
    let real = super::real_gpu::query(device);
    let info = DeviceInfo {
        name: real.name,
        total_mem: vram_size,
        compute_capability: real.cc,
        max_ptx_arch: real.cc.0 * 10 + real.cc.1,
        max_ptx_isa: 90,
        multiprocessor_count: real.sms,
        clock_rate_khz: real.clock_khz,
        memory_clock_rate_khz: real.mem_clock_khz,
        global_memory_bus_width: real.bus_width,
        l2_cache_size: real.l2,
        max_threads_per_block: limits.max_threads_per_block,
        max_block_dim: limits.max_block,
        max_grid_dim: limits.max_grid,
        warp_size: 32,
        shared_mem_per_block: limits.max_shared_per_block,
        shared_mem_per_multiprocessor: real.smem_per_sm,
        max_threads_per_multiprocessor: real.threads_per_sm,
        regs_per_block: 65536,
        total_constant_memory: 65536,
    };
    Ok((Arc::new(engine), info))
}
