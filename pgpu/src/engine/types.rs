//! Plain types of the engine contract: identifiers, page sizes, permissions, mappings, windows,
//! limits, engine info, module loads and jobs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Identifies an address space of one engine. Never reused within an engine's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpaceId(pub u64);

/// Identifies a loaded module of one engine. Never reused within an engine's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub u64);

/// Identifies a host memory region registered with the engine (e.g. a VM's guest RAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostRegionId(pub u64);

/// A page size the engine can map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// 4 KiB.
    Size4K,
    /// 2 MiB.
    Size2M,
}

impl PageSize {
    /// The page size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Size4K => 4 << 10,
            PageSize::Size2M => 2 << 20,
        }
    }
}

/// Access rights of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Perm {
    /// Loads only; stores and atomics fault.
    ReadOnly,
    /// Loads, stores and atomics.
    ReadWrite,
}

/// Kind of a memory access, as reported in faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// A load (or the source of a copy).
    Read,
    /// A store (or the destination of a copy).
    Write,
    /// A read-modify-write atomic.
    Atomic,
}

/// What a mapping points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapTarget {
    /// Physical VRAM at this physical address.
    Vram {
        /// Physical address (byte offset into VRAM).
        pa: u64,
    },
    /// A registered host region (system-memory PTEs: the VM's own RAM) at this byte offset.
    Host {
        /// The region.
        region: HostRegionId,
        /// Byte offset into the region.
        offset: u64,
    },
}

/// One VA → PA mapping request: `len` bytes at `va` onto `target`, in pages of `page_size`.
///
/// `va`, `len` and the target address must be multiples of `page_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First virtual address.
    pub va: u64,
    /// Length in bytes (a non-zero multiple of `page_size`).
    pub len: u64,
    /// Where the first byte lands; the rest follows contiguously.
    pub target: MapTarget,
    /// Access rights.
    pub perm: Perm,
    /// Page size used for the mapping.
    pub page_size: PageSize,
}

/// What one VA translates to (see [`Engine::lookup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Translation {
    /// The target of the byte at the VA (not of the page start).
    pub target: MapTarget,
    /// Access rights.
    pub perm: Perm,
    /// Page size of the mapping.
    pub page_size: PageSize,
}

/// The virtual address window of an address space: `[base, base + size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VaWindow {
    /// First address (aligned to the engine's largest page size).
    pub base: u64,
    /// Size in bytes (a non-zero multiple of the engine's largest page size).
    pub size: u64,
}

/// Limits the engine enforces on hostile requests (all runtime configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineLimits {
    /// Address spaces alive at once.
    pub max_spaces: usize,
    /// Largest VA window of one address space, bytes.
    pub max_window_size: u64,
    /// Host regions registered at once.
    pub max_host_regions: usize,
    /// Modules loaded at once.
    pub max_modules: usize,
    /// Largest PTX text accepted, bytes.
    pub max_ptx_bytes: usize,
    /// Largest total of PTX text held by loaded modules, bytes.
    pub max_ptx_bytes_total: usize,
    /// Largest entry name, bytes.
    pub max_entry_name: usize,
    /// Largest grid, per dimension.
    pub max_grid: [u32; 3],
    /// Largest block, per dimension.
    pub max_block: [u32; 3],
    /// Largest block, in threads.
    pub max_threads_per_block: u32,
    /// Largest shared memory per block (static + dynamic), bytes.
    pub max_shared_per_block: u32,
    /// Largest local memory per thread, bytes.
    pub max_local_per_thread: u32,
    /// Largest kernel parameter buffer, bytes.
    pub max_param_bytes: usize,
    /// Largest saved context accepted by `resume`, bytes.
    pub max_context_bytes: usize,
}

impl Default for EngineLimits {
    fn default() -> Self {
        Self {
            max_spaces: 256,
            max_window_size: 1 << 40,
            max_host_regions: 64,
            max_modules: 1024,
            max_ptx_bytes: 4 << 20,
            max_ptx_bytes_total: 64 << 20,
            max_entry_name: 1024,
            max_grid: [1 << 20, 65535, 65535],
            max_block: [1024, 1024, 64],
            max_threads_per_block: 1024,
            max_shared_per_block: 48 << 10,
            max_local_per_thread: 16 << 10,
            max_param_bytes: 4096,
            max_context_bytes: 1 << 30,
        }
    }
}

/// What an engine is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Backend name (`sim`, `cuda`).
    pub name: String,
    /// Physical VRAM size in bytes.
    pub vram_size: u64,
    /// Page sizes `map` accepts, smallest first.
    pub page_sizes: Vec<PageSize>,
    /// Limits on requests.
    pub limits: EngineLimits,
}

impl EngineInfo {
    /// The largest supported page size (VA windows must be aligned to it).
    pub fn largest_page(&self) -> PageSize {
        self.page_sizes
            .iter()
            .copied()
            .max()
            .unwrap_or(PageSize::Size2M)
    }
}

/// Bounds of one [`crate::Engine::load_module`] call, set by the caller per load (the VM's host
/// memory budget, the job's time limit, the device's shutdown flag).
#[derive(Debug, Clone)]
pub struct LoadLimits {
    /// Host bytes the new module may hold (decoded code, module variables, the text the engine
    /// keeps); a module that needs more is refused with `EngineError::HostBudget`. `u64::MAX`:
    /// no bound beyond the engine's own limits.
    pub max_host_bytes: u64,
    /// The load stops with `EngineError::LoadDeadline` once this instant passes.
    pub deadline: Option<Instant>,
    /// The load stops with `EngineError::LoadCancelled` once this flag is set (from any thread).
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Default for LoadLimits {
    fn default() -> Self {
        Self {
            max_host_bytes: u64::MAX,
            deadline: None,
            cancel: None,
        }
    }
}

impl LoadLimits {
    /// `Err` if the load must stop now (cancelled, or past its deadline).
    pub fn check(&self) -> Result<(), crate::EngineError> {
        if self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::SeqCst))
        {
            return Err(crate::EngineError::LoadCancelled);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(crate::EngineError::LoadDeadline);
        }
        Ok(())
    }
}

/// A module as `load_module` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedModule {
    /// The module (the same for identical text while it stays loaded).
    pub id: ModuleId,
    /// Host bytes the engine holds for it (decoded code, module variables, its copy of the
    /// text), what a caller charges the VM for it.
    pub host_bytes: u64,
}

/// A VA → VA copy inside one address space (the copy engine). Source and destination go through
/// the MMU and fault like kernel accesses do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyJob {
    /// The address space.
    pub space: SpaceId,
    /// Source VA.
    pub src: u64,
    /// Destination VA.
    pub dst: u64,
    /// Bytes to copy.
    pub len: u64,
}

/// A kernel launch in one address space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchJob {
    /// The address space the kernel's global accesses are translated in.
    pub space: SpaceId,
    /// The module (from `load_module`).
    pub module: ModuleId,
    /// Entry name.
    pub entry: String,
    /// Grid size in blocks.
    pub grid: [u32; 3],
    /// Block size in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub dynamic_shared: u32,
    /// Parameter buffer, laid out as the entry declares (pointers are VAs of `space`).
    pub params: Vec<u8>,
}

/// A unit of work for the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Copy engine.
    Copy(CopyJob),
    /// Compute engine.
    Launch(LaunchJob),
}

impl Job {
    /// The address space the job runs in.
    pub fn space(&self) -> SpaceId {
        match self {
            Job::Copy(c) => c.space,
            Job::Launch(l) => l.space,
        }
    }
}
