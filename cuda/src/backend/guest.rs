//! The `guest` backend: [`Device`] over the guest GPU driver (`gpu-driver`) on its Linux
//! platform, inside a vgpu-vmm VM (full, para or pass-through mode, alone or through vgpud).
//!
//! Each process (each [`Device`]) attaches to one slot of the virtual GPU
//! (`vgpu_linux_tools::session`: its own channel, its own GPU address space, its own VRAM range
//! and its own range of the `memmap=` DMA memory; docs/architecture.md, "CUDA programs in the
//! guest"), so several CUDA programs run in one VM at once and none can name another's memory.
//! Everything is submitted on the one channel, in order: launches, copies and fills are
//! pushbuffer methods; markers are semaphore releases with the device's timestamp; waits poll
//! the fence in DMA memory as the driver does. Pageable copies go through two staging buffers
//! in DMA memory (double-buffered, 1 MiB chunks); `host_alloc` memory is DMA memory mapped in
//! the GPU's space, so copies from and to it need no staging. A channel fault is the
//! process's sticky error; other processes' channels run on.

mod arena;
mod copy;
mod markers;
mod modules;

use std::collections::{BTreeMap, HashMap};

use gpu_driver::{Channel, Config, Fault, FaultKind, Fence, Gpu, PushBuf, SysAlloc, VramAlloc};
use vgpu_linux_tools::platform::LinuxGpu;
use vgpu_linux_tools::session::Session;

use crate::device::{DevPtr, Device, DeviceError, DeviceInfo, HostBuf, Launch, Marker, ModuleId};
use arena::Arena;
use markers::Markers;
use modules::Module;

/// Bytes of each of the two staging buffers for pageable copies.
const STAGE_BYTES: u64 = 1 << 20;
/// Bytes of the ring kernel parameters and fill patterns are placed in.
const ARENA_BYTES: u64 = 1 << 20;

/// Opens the virtual GPU for this process (one slot of it).
pub fn open() -> Result<Box<dyn Device>, DeviceError> {
    Ok(Box::new(GuestDevice::open()?))
}

/// The two staging buffers and the fence of the last copy that used each.
struct Staging {
    bufs: [SysAlloc; 2],
    last: [Option<Fence>; 2],
    next: usize,
}

/// One process's device: its slot of the virtual GPU and what it allocated there.
pub struct GuestDevice {
    s: Session,
    info: DeviceInfo,
    /// Device allocations by GPU VA.
    allocs: BTreeMap<u64, VramAlloc>,
    /// `host_alloc` buffers by host address, with their GPU VA.
    host: BTreeMap<usize, SysAlloc>,
    modules: HashMap<u64, Module>,
    next_module: u64,
    staging: Staging,
    arena: Arena,
    markers: Markers,
    pb: PushBuf,
    /// The first error executed work hit: the context is dead from then on.
    sticky: Option<DeviceError>,
}

impl std::fmt::Debug for GuestDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestDevice")
            .field("slot", &self.s.slot)
            .finish_non_exhaustive()
    }
}

/// A driver error from setting something up (not from executed work).
fn setup_error(e: gpu_driver::Error) -> DeviceError {
    use gpu_driver::Error as E;
    match e {
        E::NoVram(n) | E::NoSysmem(n) | E::NoVa(n) => DeviceError::OutOfMemory(n),
        E::Fault(_) | E::ChannelFaulted { .. } | E::Timeout { .. } => work_error(e),
        other => DeviceError::InvalidValue(other.to_string()),
    }
}

/// The sticky error for a fault of kind `kind` (`what` says where).
fn fault_error(kind: FaultKind, what: String) -> DeviceError {
    match kind {
        FaultKind::KernelFault | FaultKind::Unmapped | FaultKind::ReadOnly => {
            DeviceError::IllegalAddress(what)
        }
        FaultKind::Timeout => DeviceError::Timeout(what),
        _ => DeviceError::Fault(what),
    }
}

/// A driver error from executed work: the context's sticky error.
fn work_error(e: gpu_driver::Error) -> DeviceError {
    use gpu_driver::Error as E;
    match e {
        E::Fault(f) => fault_error(f.kind, describe(&f)),
        E::ChannelFaulted { channel, kind } => {
            let k = FaultKind::from_raw(kind);
            fault_error(
                k,
                format!("{} (fault kind {kind}) on channel {channel}", k.name()),
            )
        }
        E::Timeout { waited_ns } => DeviceError::Timeout(format!(
            "the GPU did not finish in {} ms (the driver's wait limit)",
            waited_ns / 1_000_000
        )),
        other => DeviceError::Fault(other.to_string()),
    }
}

fn describe(f: &Fault) -> String {
    format!(
        "{} (fault kind {}) at {:#x}, info {:#x}, access {:?}",
        f.kind.name(),
        f.kind.raw(),
        f.addr,
        f.info,
        f.access
    )
}

/// What the guest reports of the virtual GPU: its own VRAM, and an A100-like shape (the PTX
/// it takes is compute_80; `VGPU_CUDA_ARCH=90` offers compute_90 where the host runs it).
fn device_info(mem: u64) -> DeviceInfo {
    let arch = std::env::var("VGPU_CUDA_ARCH")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|a| (50..=120).contains(a))
        .unwrap_or(80);
    DeviceInfo {
        name: "vgpu-vmm virtual GPU".into(),
        total_mem: mem,
        compute_capability: (arch / 10, arch % 10),
        max_ptx_arch: arch,
        max_ptx_isa: 90,
        multiprocessor_count: 8,
        clock_rate_khz: 1_410_000,
        memory_clock_rate_khz: 1_215_000,
        global_memory_bus_width: 5120,
        l2_cache_size: 40 << 20,
        max_threads_per_block: 1024,
        max_block_dim: [1024, 1024, 64],
        max_grid_dim: [0x7fff_ffff, 65535, 65535],
        warp_size: 32,
        shared_mem_per_block: 48 << 10,
        shared_mem_per_multiprocessor: 164 << 10,
        max_threads_per_multiprocessor: 2048,
        regs_per_block: 65536,
        total_constant_memory: 64 << 10,
    }
}

impl GuestDevice {
    /// Attaches to a slot of the virtual GPU and sets up the staging buffers, the parameter
    /// ring and the marker slots. `VGPU_CUDA_MODE=full` keeps the driver off the para-virtual
    /// interface where the device offers it.
    pub fn open() -> Result<Self, DeviceError> {
        let cfg = Config {
            para: std::env::var("VGPU_CUDA_MODE").map_or(true, |m| m != "full"),
            ..Config::default()
        };
        let mut s = Session::attach(cfg).map_err(|e| DeviceError::NoDevice(e.to_string()))?;
        let gpu = &mut s.gpu;
        let bufs = [
            gpu.sys_alloc_aligned(STAGE_BYTES, 4096)
                .map_err(setup_error)?,
            gpu.sys_alloc_aligned(STAGE_BYTES, 4096)
                .map_err(setup_error)?,
        ];
        let arena = Arena::new(gpu, ARENA_BYTES).map_err(setup_error)?;
        let markers = Markers::new(gpu).map_err(setup_error)?;
        let mem = gpu.vram_pool_bytes().1;
        log::info!(
            "guest backend: slot {} (first={}, reclaimed {:?}), para={}, {} MiB VRAM",
            s.slot,
            s.first,
            s.reclaimed,
            s.gpu.is_para(),
            mem >> 20
        );
        Ok(Self {
            s,
            info: device_info(mem),
            allocs: BTreeMap::new(),
            host: BTreeMap::new(),
            modules: HashMap::new(),
            next_module: 1,
            staging: Staging {
                bufs,
                last: [None, None],
                next: 0,
            },
            arena,
            markers,
            pb: PushBuf::new(),
            sticky: None,
        })
    }

    /// The slot (= channel id) this process holds.
    pub fn slot(&self) -> u32 {
        self.s.slot
    }

    /// `first=.. reclaimed=[..]`: whether this process set the device up, and the slots it
    /// took back from processes that were gone.
    pub fn describe(&self) -> String {
        format!("first={} reclaimed={:?}", self.s.first, self.s.reclaimed)
    }

    /// Whether the driver uses the para-virtual interface.
    pub fn is_para(&self) -> bool {
        self.s.gpu.is_para()
    }

    /// The bare guest driver's launch path, for measuring this backend against it: `n`
    /// launches of `entry` as `vgpu-run FILE.ptx` issues one (a fresh pushbuffer, the
    /// parameters staged in the channel's stream, one submission each), not waited for.
    pub fn bare_launches(
        &mut self,
        module: ModuleId,
        entry: &str,
        params: &[u8],
        n: u64,
    ) -> Result<(), DeviceError> {
        self.alive()?;
        let m = self
            .modules
            .get(&module.0)
            .ok_or_else(|| DeviceError::InvalidValue(format!("no module {}", module.0)))?;
        let mut desc = m.launch_desc(&Launch {
            module,
            entry,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            params,
        })?;
        let (gpu, ch) = self.parts()?;
        let r = (|| {
            for _ in 0..n {
                let mut pb = PushBuf::new();
                desc.param_va = ch.stage(gpu, params, 16)?;
                pb.launch(&desc);
                ch.submit(gpu, &mut pb)?;
            }
            Ok(())
        })();
        r.map_err(|e| self.fail(e))
    }

    /// The driver and the channel.
    fn parts(&mut self) -> Result<(&mut Gpu<LinuxGpu>, &mut Channel), DeviceError> {
        self.s
            .parts()
            .ok_or_else(|| DeviceError::Fault("the channel is gone".into()))
    }

    /// `Err` with the sticky error once executed work failed.
    fn alive(&self) -> Result<(), DeviceError> {
        match &self.sticky {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Records a work error as the sticky one (the first stays) and returns it.
    fn fail(&mut self, e: gpu_driver::Error) -> DeviceError {
        let d = work_error(e);
        self.sticky.get_or_insert(d.clone());
        d
    }

    /// Submits the pushbuffer built in `self.pb`.
    fn submit(&mut self) -> Result<Fence, DeviceError> {
        self.alive()?;
        let mut pb = std::mem::take(&mut self.pb);
        let r = match self.s.parts() {
            Some((gpu, ch)) => ch.submit(gpu, &mut pb),
            None => Err(gpu_driver::Error::BadChannel(self.s.slot)),
        };
        pb.clear();
        self.pb = pb;
        r.map_err(|e| self.fail(e))
    }

    /// Waits for `fence` (polling, as the driver does).
    fn wait_fence(&mut self, fence: Fence) -> Result<(), DeviceError> {
        self.alive()?;
        let (gpu, ch) = self.parts()?;
        let r = ch.wait(gpu, fence);
        r.map_err(|e| self.fail(e))
    }

    /// Waits for everything submitted.
    fn idle(&mut self) -> Result<(), DeviceError> {
        self.alive()?;
        let (gpu, ch) = self.parts()?;
        let r = ch.wait_idle(gpu);
        r.map_err(|e| self.fail(e))
    }

    /// The GPU VA range `[ptr, ptr + len)` if it lies inside one device allocation or one
    /// `host_alloc` buffer of this process (what a copy or fill may touch).
    fn check_range(&self, ptr: DevPtr, len: u64) -> Result<(), DeviceError> {
        let end = ptr
            .checked_add(len)
            .ok_or_else(|| DeviceError::InvalidValue(format!("{ptr:#x} + {len} wraps")))?;
        let in_alloc = self
            .allocs
            .range(..=ptr)
            .next_back()
            .is_some_and(|(_, a)| end <= a.va + a.len);
        let in_host = self
            .host
            .values()
            .any(|a| ptr >= a.va && end <= a.va + a.len);
        let in_module = || {
            self.modules
                .values()
                .filter_map(|m| m.block)
                .any(|b| ptr >= b.va && end <= b.va + b.len)
        };
        if in_alloc || in_host || in_module() {
            Ok(())
        } else {
            Err(DeviceError::InvalidValue(format!(
                "[{ptr:#x}, {end:#x}) is not inside one allocation of this context"
            )))
        }
    }

    /// The GPU VA of host memory `[p, p + len)` when it lies in one `host_alloc` buffer.
    fn host_va(&self, p: *const u8, len: usize) -> Option<u64> {
        let p = p as usize;
        let (&base, a) = self.host.range(..=p).next_back()?;
        let off = (p - base) as u64;
        (off + len as u64 <= a.len).then_some(a.va + off)
    }
}

impl Device for GuestDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_alloc(&mut self, bytes: u64) -> Result<DevPtr, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::InvalidValue("allocation of 0 bytes".into()));
        }
        let a = self
            .s
            .gpu
            .vram_alloc(bytes)
            .map_err(|_| DeviceError::OutOfMemory(bytes))?;
        self.allocs.insert(a.va, a);
        Ok(a.va)
    }

    fn mem_free(&mut self, ptr: DevPtr) -> Result<(), DeviceError> {
        let Some(a) = self.allocs.remove(&ptr) else {
            return Err(DeviceError::InvalidValue(format!(
                "{ptr:#x} is not an allocation of this context"
            )));
        };
        // Work still using it finishes first (after a fault nothing runs any more).
        if self.sticky.is_none()
            && let Err(e) = self.idle()
        {
            self.allocs.insert(ptr, a);
            return Err(e);
        }
        self.s.gpu.vram_free(a);
        Ok(())
    }

    fn mem_info(&self) -> (u64, u64) {
        self.s.gpu.vram_pool_bytes()
    }

    fn host_alloc(&mut self, bytes: u64) -> Result<HostBuf, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::InvalidValue("allocation of 0 bytes".into()));
        }
        let gpu = &mut self.s.gpu;
        let a = gpu
            .sys_alloc_aligned(bytes, 4096)
            .map_err(|_| DeviceError::OutOfMemory(bytes))?;
        let host = gpu.sys_host_ptr(&a).map_err(setup_error)?;
        self.host.insert(host as usize, a);
        Ok(HostBuf {
            host,
            dev: a.va,
            len: a.len,
        })
    }

    fn host_free(&mut self, host: *mut u8) -> Result<(), DeviceError> {
        let key = host as usize;
        if !self.host.contains_key(&key) {
            return Err(DeviceError::InvalidValue(format!(
                "{host:p} is not host memory of this context"
            )));
        }
        if self.sticky.is_none() {
            self.idle()?;
        }
        if let Some(a) = self.host.remove(&key) {
            self.s.gpu.sys_free(a);
        }
        Ok(())
    }

    fn copy_htod(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
        copy::htod(self, dst, src)
    }

    fn copy_dtoh(&mut self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
        copy::dtoh(self, dst, src)
    }

    fn copy_dtod(&mut self, dst: DevPtr, src: DevPtr, bytes: u64) -> Result<(), DeviceError> {
        copy::dtod(self, dst, src, bytes)
    }

    fn memset(&mut self, dst: DevPtr, value: u32, elem: u8, count: u64) -> Result<(), DeviceError> {
        copy::memset(self, dst, value, elem, count)
    }

    fn module_load(&mut self, ptx: &str) -> Result<ModuleId, DeviceError> {
        self.alive()?;
        let id = self.next_module;
        let (m, images) = Module::load(&mut self.s.gpu, ptx, id)?;
        self.next_module += 1;
        self.modules.insert(id, m);
        // The variables' initial values, in order before any launch of the module.
        for (va, bytes) in images {
            if let Err(e) = copy::htod(self, va, &bytes) {
                if let Some(m) = self.modules.remove(&id) {
                    m.free(&mut self.s.gpu);
                }
                return Err(e);
            }
        }
        Ok(ModuleId(id))
    }

    fn module_unload(&mut self, module: ModuleId) -> Result<(), DeviceError> {
        if !self.modules.contains_key(&module.0) {
            return Err(DeviceError::InvalidValue(format!("no module {}", module.0)));
        }
        // Launches in flight read its text.
        if self.sticky.is_none() {
            self.idle()?;
        }
        if let Some(m) = self.modules.remove(&module.0) {
            m.free(&mut self.s.gpu);
        }
        Ok(())
    }

    fn module_global(
        &mut self,
        module: ModuleId,
        name: &str,
    ) -> Result<(DevPtr, u64), DeviceError> {
        let m = self
            .modules
            .get(&module.0)
            .ok_or_else(|| DeviceError::InvalidValue(format!("no module {}", module.0)))?;
        m.global(name)
    }

    fn launch(&mut self, l: &Launch<'_>) -> Result<(), DeviceError> {
        self.alive()?;
        let m = self
            .modules
            .get(&l.module.0)
            .ok_or_else(|| DeviceError::InvalidValue(format!("no module {}", l.module.0)))?;
        let desc = m.launch_desc(l)?;
        let param_va = match self.arena.place(&mut self.s, l.params, 16) {
            Ok(va) => va,
            Err(e) => return Err(self.fail(e)),
        };
        let mut desc = desc;
        if !l.params.is_empty() {
            desc.param_va = param_va;
        }
        self.pb.launch(&desc);
        let f = self.submit()?;
        self.arena.used_by(f);
        Ok(())
    }

    fn marker(&mut self) -> Result<Marker, DeviceError> {
        self.alive()?;
        let (id, va) = self
            .markers
            .next_slot(&mut self.s)
            .map_err(|e| self.fail(e))?;
        self.pb.release(va, id as u32, false, true);
        let f = self.submit()?;
        self.markers.issued(id, f);
        Ok(Marker(id))
    }

    fn query(&mut self, marker: Marker) -> Result<bool, DeviceError> {
        self.alive()?;
        if !self.markers.known(marker.0) {
            return Err(DeviceError::InvalidValue(format!(
                "unknown marker {}",
                marker.0
            )));
        }
        let r = self.markers.done(&mut self.s, marker.0);
        r.map_err(|e| self.fail(e))
    }

    fn wait(&mut self, marker: Marker) -> Result<(), DeviceError> {
        let f = self.markers.fence_of(marker.0)?;
        match f {
            Some(f) => self.wait_fence(f),
            None => self.alive(),
        }
    }

    fn marker_time_ns(&mut self, marker: Marker) -> Result<u64, DeviceError> {
        self.markers.time(&mut self.s, marker.0)
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.idle()
    }
}
