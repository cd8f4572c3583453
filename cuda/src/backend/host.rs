//! The host backend: [`Device`] over a `pgpu` engine in-process (`sim`, the software GPU, by
//! default; `cuda`, an NVIDIA GPU through the real driver, with `VGPU_CUDA_BACKEND=cuda`).
//!
//! One engine per process ([`shared`]); each context is one address space over the same VA
//! window (`shared::WINDOW_BASE`): device memory at `WINDOW_BASE + pa` (extents of whole
//! 2 MiB pages of the engine's VRAM, taken on demand and sub-allocated per context, so a
//! context maps only its own VRAM), host buffers after VRAM. Work runs synchronously on the
//! caller's thread (`Engine::execute`): the queue is always drained when a call returns, so a
//! marker is complete when made. Module variables are placed in device memory
//! ([`crate::globals`]).

mod alloc;
pub mod forced;
pub mod real_gpu;
mod report;
mod shared;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use pgpu::{
    CopyJob, EngineError, FaultKind, HostRegionId, Job, LaunchJob, LoadLimits, MapTarget, Mapping,
    Outcome, PageSize, Perm, PreemptHandle, SavedContext, SpaceId, VaWindow,
};

use self::alloc::RangeAlloc;
pub use self::report::preempt_report;
pub use self::shared::EngineKind;
use self::shared::{HOST_WINDOW, PAGE, Shared, WINDOW_BASE};
use crate::device::{DevPtr, Device, DeviceError, DeviceInfo, HostBuf, Launch, Marker, ModuleId};

/// Device memory is handed out at this alignment.
const ALIGN: u64 = 256;
/// Markers remembered for `marker_time_ns` (older ones are forgotten: a polling loop of
/// `cuStreamQuery` must not grow memory).
const MARKERS_KEPT: usize = 4096;

struct HostMapping {
    region: HostRegionId,
    va: u64,
    len: u64,
    /// Memory this backend mapped itself at `va` (sim: unified addressing), unmapped at free.
    own: bool,
}

struct Loaded {
    engine: pgpu::ModuleId,
    vars: HashMap<String, (DevPtr, u64)>,
    block: Option<(DevPtr, u64)>,
}

/// One context's GPU on the process's engine.
pub struct HostDevice {
    shared: Arc<Shared>,
    space: SpaceId,
    /// Free device memory of this context, as physical offsets (VA = WINDOW_BASE + offset).
    vram: RangeAlloc,
    extents: Vec<(u64, u64)>,
    allocs: HashMap<DevPtr, u64>,
    host_bufs: HashMap<usize, HostMapping>,
    modules: HashMap<u64, Loaded>,
    next_module: u64,
    markers: BTreeMap<u64, u64>,
    next_marker: u64,
    origin: Instant,
    preempt: PreemptHandle,
}

/// Opens a context's device on the process's `kind` engine.
pub fn open(kind: EngineKind) -> Result<Box<dyn Device>, DeviceError> {
    let shared = shared::get(kind)?;
    let space = shared
        .engine
        .create_space(VaWindow {
            base: WINDOW_BASE,
            size: shared.vram_size + HOST_WINDOW,
        })
        .map_err(|e| DeviceError::NoDevice(e.to_string()))?;
    Ok(Box::new(HostDevice {
        space,
        vram: RangeAlloc::default(),
        extents: Vec::new(),
        allocs: HashMap::new(),
        host_bufs: HashMap::new(),
        modules: HashMap::new(),
        next_module: 1,
        markers: BTreeMap::new(),
        next_marker: 1,
        origin: Instant::now(),
        preempt: PreemptHandle::new(),
        shared,
    }))
}

fn engine_err(e: EngineError) -> DeviceError {
    match e {
        EngineError::CopyFault(f) => DeviceError::InvalidValue(format!("copy fault: {f:?}")),
        EngineError::ModuleLoad { .. } => DeviceError::InvalidPtx(e.to_string()),
        EngineError::HostBudget { .. } | EngineError::LoadDeadline => {
            DeviceError::InvalidPtx(e.to_string())
        }
        EngineError::BadLaunch(m) => DeviceError::LaunchFailed(m),
        EngineError::TooMany(what) => DeviceError::InvalidValue(format!("too many {what}")),
        other => DeviceError::Fault(other.to_string()),
    }
}

/// The sticky error a faulted job becomes.
fn fault_err(fault: &pgpu::JobFault) -> DeviceError {
    let text = format!("{fault:?}");
    match &fault.kind {
        FaultKind::Kernel(t) if t.contains("TIMEOUT") => DeviceError::Timeout(text),
        FaultKind::Kernel(t) if t.contains("ILLEGAL_ADDRESS") => DeviceError::IllegalAddress(text),
        FaultKind::Kernel(_) => DeviceError::Fault(text),
        _ => DeviceError::IllegalAddress(text),
    }
}

impl HostDevice {
    fn run(&mut self, job: &Job) -> Result<(), DeviceError> {
        // The test knob (VGPU_CUDA_PREEMPT_TEST) arms the first runs of every launch.
        let forced = self
            .shared
            .forced
            .as_ref()
            .filter(|_| matches!(job, Job::Launch(_)));
        let mut runs = 0u32;
        if let Some(f) = forced {
            f.arm(&self.preempt, runs);
        }
        // Timed only under the knob (it learns the runs' length); the plain path adds nothing.
        let t = forced.map(|_| Instant::now());
        let outcome = self.shared.engine.execute(job, &self.preempt);
        if let (Some(f), Some(t)) = (forced, t) {
            f.disarm(&self.preempt, t.elapsed());
        }
        let mut outcome = outcome.map_err(engine_err)?;
        loop {
            match outcome {
                Outcome::Completed { .. } => return Ok(()),
                Outcome::Faulted { fault, .. } => return Err(fault_err(&fault)),
                Outcome::Preempted { mut context, .. } => {
                    self.preempt.clear();
                    runs += 1;
                    if let Some(f) = forced {
                        let n = f.counters.preempted.fetch_add(1, Ordering::Relaxed) + 1;
                        if forced::Forced::through_bytes(n) {
                            f.counters.from_bytes.fetch_add(1, Ordering::Relaxed);
                            context = SavedContext::from_bytes(context.into_bytes());
                        }
                        f.arm(&self.preempt, runs);
                    }
                    let t = forced.map(|_| Instant::now());
                    let next = self.shared.engine.resume(context, &self.preempt);
                    if let (Some(f), Some(t)) = (forced, t) {
                        f.disarm(&self.preempt, t.elapsed());
                    }
                    outcome = next.map_err(engine_err)?;
                }
            }
        }
    }

    /// Takes and maps a new extent of at least `bytes` from the engine's VRAM.
    fn grow(&mut self, bytes: u64) -> Result<(), DeviceError> {
        let len = bytes.max(1).next_multiple_of(PAGE);
        let pa = self
            .shared
            .take(len)
            .ok_or(DeviceError::OutOfMemory(bytes))?;
        let map = Mapping {
            va: WINDOW_BASE + pa,
            len,
            target: MapTarget::Vram { pa },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        };
        if let Err(e) = self.shared.engine.map(self.space, &map) {
            self.shared.give(pa, len);
            return Err(DeviceError::Fault(format!("mapping device memory: {e}")));
        }
        self.extents.push((pa, len));
        self.vram.free(pa, len);
        Ok(())
    }

    /// Host memory of `len` bytes mapped into the space at `va`: on sim, anonymous memory
    /// placed at `va` in the process too (the host pointer is the device pointer: unified
    /// addressing, managed memory), else (cuda, or `va` taken in the process) engine-owned
    /// memory wherever the engine puts it.
    fn host_map(&mut self, va: u64, len: u64) -> Result<(HostMapping, *mut u8), DeviceError> {
        let engine = &self.shared.engine;
        if self.shared.kind == EngineKind::Sim
            && let Some(ptr) = map_own(va, len)
        {
            // SAFETY: `ptr..ptr+len` is memory this backend mapped and keeps mapped until
            // host_free unregisters it first.
            match unsafe { engine.register_host_region(ptr, len as usize) } {
                Ok(region) => {
                    let m = HostMapping {
                        region,
                        va,
                        len,
                        own: true,
                    };
                    if let Err(e) = self.map_host(&m) {
                        let _ = engine.unregister_host_region(region);
                        unmap_own(ptr, len);
                        return Err(e);
                    }
                    return Ok((m, ptr));
                }
                Err(e) => {
                    log::warn!("host buffer at {va:#x}: {e}");
                    unmap_own(ptr, len);
                }
            }
        }
        let (region, ptr) = engine.alloc_host_region(len).map_err(|e| {
            log::warn!("host buffer of {len} bytes: {e}");
            DeviceError::OutOfMemory(len)
        })?;
        let m = HostMapping {
            region,
            va,
            len,
            own: false,
        };
        if let Err(e) = self.map_host(&m) {
            let _ = engine.unregister_host_region(region);
            return Err(e);
        }
        Ok((m, ptr.as_ptr()))
    }

    fn map_host(&self, m: &HostMapping) -> Result<(), DeviceError> {
        let map = Mapping {
            va: m.va,
            len: m.len,
            target: MapTarget::Host {
                region: m.region,
                offset: 0,
            },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        };
        self.shared
            .engine
            .map(self.space, &map)
            .map_err(|e| DeviceError::Fault(format!("mapping host memory: {e}")))
    }

    fn fill(&mut self, dst: DevPtr, pattern: &[u8], bytes: u64) -> Result<(), DeviceError> {
        const CHUNK: u64 = 1 << 20;
        let chunk: Vec<u8> = pattern
            .iter()
            .copied()
            .cycle()
            .take(bytes.min(CHUNK) as usize)
            .collect();
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(CHUNK);
            self.shared
                .engine
                .copy_to_space(self.space, dst + done, &chunk[..n as usize])
                .map_err(engine_err)?;
            done += n;
        }
        Ok(())
    }
}

/// Anonymous zeroed memory at exactly `va` in the process, or `None` if that range is taken.
fn map_own(va: u64, len: u64) -> Option<*mut u8> {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping: the call fails if any
    // page of the range is in use.
    let p = unsafe {
        libc::mmap(
            va as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_FIXED_NOREPLACE
                | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    if p as u64 != va {
        // An old kernel without MAP_FIXED_NOREPLACE treats it as a hint.
        unmap_own(p.cast(), len);
        return None;
    }
    Some(p.cast())
}

fn unmap_own(p: *mut u8, len: u64) {
    // SAFETY: a mapping made by map_own, unregistered from the engine before.
    unsafe { libc::munmap(p.cast(), len as usize) };
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        let engine = &self.shared.engine;
        for (_, m) in self.modules.drain() {
            let _ = engine.unload_module(m.engine);
        }
        for (host, h) in self.host_bufs.drain() {
            let _ = engine.unmap(self.space, h.va, h.len);
            let _ = engine.unregister_host_region(h.region);
            if h.own {
                unmap_own(host as *mut u8, h.len);
            }
            self.shared.give_host_va(h.va, h.len);
        }
        let _ = engine.destroy_space(self.space);
        for (pa, len) in self.extents.drain(..) {
            self.shared.give(pa, len);
        }
    }
}

impl Device for HostDevice {
    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn mem_alloc(&mut self, bytes: u64) -> Result<DevPtr, DeviceError> {
        if bytes == 0 || bytes > self.shared.vram_size {
            return Err(DeviceError::OutOfMemory(bytes));
        }
        let len = bytes.next_multiple_of(ALIGN);
        let pa = match self.vram.alloc(len, ALIGN) {
            Some(pa) => pa,
            None => {
                self.grow(len)?;
                self.vram
                    .alloc(len, ALIGN)
                    .ok_or(DeviceError::OutOfMemory(bytes))?
            }
        };
        let va = WINDOW_BASE + pa;
        self.allocs.insert(va, len);
        Ok(va)
    }

    fn mem_free(&mut self, ptr: DevPtr) -> Result<(), DeviceError> {
        let len = self
            .allocs
            .remove(&ptr)
            .ok_or_else(|| DeviceError::InvalidValue(format!("{ptr:#x} is not an allocation")))?;
        self.vram.free(ptr - WINDOW_BASE, len);
        Ok(())
    }

    fn mem_info(&self) -> (u64, u64) {
        (
            self.shared.free_bytes() + self.vram.free_bytes(),
            self.shared.vram_size,
        )
    }

    fn host_alloc(&mut self, bytes: u64) -> Result<HostBuf, DeviceError> {
        if bytes == 0 || bytes > HOST_WINDOW {
            return Err(DeviceError::OutOfMemory(bytes));
        }
        let len = bytes.next_multiple_of(PAGE);
        let va = self
            .shared
            .take_host_va(len)
            .ok_or(DeviceError::OutOfMemory(bytes))?;
        let (mapping, host) = match self.host_map(va, len) {
            Ok(m) => m,
            Err(e) => {
                self.shared.give_host_va(va, len);
                return Err(e);
            }
        };
        self.host_bufs.insert(host as usize, mapping);
        Ok(HostBuf {
            host,
            dev: va,
            len: bytes,
        })
    }

    fn host_free(&mut self, host: *mut u8) -> Result<(), DeviceError> {
        let h = self
            .host_bufs
            .remove(&(host as usize))
            .ok_or_else(|| DeviceError::InvalidValue(format!("{host:?} is not a host buffer")))?;
        let engine = &self.shared.engine;
        engine.unmap(self.space, h.va, h.len).map_err(engine_err)?;
        engine
            .unregister_host_region(h.region)
            .map_err(engine_err)?;
        if h.own {
            unmap_own(host, h.len);
        }
        self.shared.give_host_va(h.va, h.len);
        Ok(())
    }

    fn copy_htod(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
        self.shared
            .engine
            .copy_to_space(self.space, dst, src)
            .map_err(engine_err)
    }

    fn copy_dtoh(&mut self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
        self.shared
            .engine
            .copy_from_space(self.space, src, dst)
            .map_err(engine_err)
    }

    fn copy_dtod(&mut self, dst: DevPtr, src: DevPtr, bytes: u64) -> Result<(), DeviceError> {
        if bytes == 0 {
            return Ok(());
        }
        self.run(&Job::Copy(CopyJob {
            space: self.space,
            src,
            dst,
            len: bytes,
        }))
    }

    fn memset(&mut self, dst: DevPtr, value: u32, elem: u8, count: u64) -> Result<(), DeviceError> {
        let pattern = match elem {
            1 => vec![value as u8],
            2 => (value as u16).to_le_bytes().to_vec(),
            4 => value.to_le_bytes().to_vec(),
            _ => return Err(DeviceError::InvalidValue(format!("memset element {elem}"))),
        };
        let bytes = count
            .checked_mul(u64::from(elem))
            .ok_or_else(|| DeviceError::InvalidValue("memset size".into()))?;
        self.fill(dst, &pattern, bytes)
    }

    fn module_load(&mut self, ptx: &str) -> Result<ModuleId, DeviceError> {
        let layout = crate::globals::layout(ptx);
        let mut block = None;
        let mut vars = HashMap::new();
        let text = match &layout {
            Some(l) => {
                let size = (l.image.len() as u64).max(1);
                let base = self.mem_alloc(size)?;
                block = Some((base, size));
                if let Err(e) = self.copy_htod(base, &l.image) {
                    let _ = self.mem_free(base);
                    return Err(e);
                }
                for (name, off, size) in &l.vars {
                    vars.insert(name.clone(), (base + off, *size));
                }
                std::borrow::Cow::Owned(crate::globals::rewrite(ptx, l, base))
            }
            None => std::borrow::Cow::Borrowed(ptx),
        };
        let loaded = match self
            .shared
            .engine
            .load_module(&text, &LoadLimits::default())
        {
            Ok(m) => m,
            Err(e) => {
                if let Some((base, _)) = block {
                    let _ = self.mem_free(base);
                }
                return Err(engine_err(e));
            }
        };
        if self.shared.prepare_modules {
            // Before the program's timed section (the runtime loads its modules eagerly): else
            // the first launch of each kernel would load it onto the device and, under a
            // checkpoint method, make the signal stream. An error leaves it to that launch.
            match self.shared.engine.prepare_module(loaded.id) {
                Ok(()) => {
                    self.shared.modules_prepared.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => log::debug!("module not prepared at load: {e}"),
            }
        }
        let id = self.next_module;
        self.next_module += 1;
        self.modules.insert(
            id,
            Loaded {
                engine: loaded.id,
                vars,
                block,
            },
        );
        Ok(ModuleId(id))
    }

    fn module_unload(&mut self, module: ModuleId) -> Result<(), DeviceError> {
        let m = self
            .modules
            .remove(&module.0)
            .ok_or_else(|| DeviceError::InvalidValue("unknown module".into()))?;
        if let Some((base, _)) = m.block {
            let _ = self.mem_free(base);
        }
        self.shared
            .engine
            .unload_module(m.engine)
            .map_err(engine_err)
    }

    fn module_global(
        &mut self,
        module: ModuleId,
        name: &str,
    ) -> Result<(DevPtr, u64), DeviceError> {
        let m = self
            .modules
            .get(&module.0)
            .ok_or_else(|| DeviceError::InvalidValue("unknown module".into()))?;
        m.vars
            .get(name)
            .copied()
            .ok_or_else(|| DeviceError::NotFound(name.to_string()))
    }

    fn launch(&mut self, launch: &Launch<'_>) -> Result<(), DeviceError> {
        let module = self
            .modules
            .get(&launch.module.0)
            .ok_or_else(|| DeviceError::InvalidValue("unknown module".into()))?
            .engine;
        self.run(&Job::Launch(LaunchJob {
            space: self.space,
            module,
            entry: launch.entry.to_string(),
            grid: launch.grid,
            block: launch.block,
            dynamic_shared: launch.shared_bytes,
            params: launch.params.to_vec(),
        }))
    }

    fn marker(&mut self) -> Result<Marker, DeviceError> {
        let id = self.next_marker;
        self.next_marker += 1;
        self.markers
            .insert(id, self.origin.elapsed().as_nanos() as u64);
        while self.markers.len() > MARKERS_KEPT {
            self.markers.pop_first();
        }
        Ok(Marker(id))
    }

    fn query(&mut self, marker: Marker) -> Result<bool, DeviceError> {
        if marker.0 == 0 || marker.0 >= self.next_marker {
            return Err(DeviceError::InvalidValue("unknown marker".into()));
        }
        Ok(true)
    }

    fn wait(&mut self, marker: Marker) -> Result<(), DeviceError> {
        self.query(marker).map(|_| ())
    }

    fn marker_time_ns(&mut self, marker: Marker) -> Result<u64, DeviceError> {
        self.markers
            .get(&marker.0)
            .copied()
            .ok_or_else(|| DeviceError::InvalidValue("marker forgotten or unknown".into()))
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
}
