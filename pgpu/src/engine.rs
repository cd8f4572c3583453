//! The `Engine` trait: the physical GPU as the hypervisor sees it, and the types it speaks.
//!
//! Shaped so that both the software GPU (`sim`) and a CUDA driver backend fit: the hypervisor owns
//! VRAM allocation and hands the engine physical ranges; the engine owns address spaces whose
//! mappings are the shadow page tables (it never sees a guest page table); jobs (copies, kernel
//! launches) run in one address space, can be preempted from another thread, and come back with a
//! saved context (bytes) that resumes later. See `pgpu/README.md` for the contract in prose.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use thiserror::Error;

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

/// Why a job faulted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FaultKind {
    /// No mapping at the address.
    #[error("unmapped address")]
    Unmapped,
    /// A write or atomic to a read-only mapping.
    #[error("write to read-only page")]
    ReadOnly,
    /// The address lies outside the address space's VA window.
    #[error("address outside the VA window")]
    OutOfWindow,
    /// A misaligned access.
    #[error("misaligned access")]
    Misaligned,
    /// Any other kernel error (trap, bad state space access, illegal instruction...).
    #[error("kernel error: {0}")]
    Kernel(String),
}

/// Where in a kernel a fault happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSite {
    /// Entry (kernel) name.
    pub entry: String,
    /// Instruction index in the entry.
    pub pc: u32,
    /// Source line of that instruction in the PTX text (0 when unknown).
    pub line: u32,
    /// CTA index (x, y, z).
    pub cta: [u32; 3],
    /// Thread index in the CTA (x, y, z) of the first faulting thread.
    pub thread: [u32; 3],
}

impl fmt::Display for KernelSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} pc {} (line {}) cta {:?} thread {:?}",
            self.entry, self.pc, self.line, self.cta, self.thread
        )
    }
}

/// A fault that ended a job. The engine stays usable for the next job and other spaces.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{kind} at va {va:#x} ({access:?}){}", site.as_ref().map(|s| format!(" in {s}")).unwrap_or_default())]
pub struct JobFault {
    /// What went wrong.
    pub kind: FaultKind,
    /// The faulting virtual address (0 when the fault is not about memory).
    pub va: u64,
    /// The access kind (`None` when the fault is not about memory).
    pub access: Option<AccessKind>,
    /// Where in the kernel; `None` for copies.
    pub site: Option<KernelSite>,
}

/// Engine-private in-memory state of a preempted job: resumed as is by the engine that made it,
/// serialized only when asked.
pub trait LiveContext: Send + fmt::Debug {
    /// The state as bytes (what `SavedContext::from_bytes` takes back).
    fn to_bytes(&self) -> Vec<u8>;
    /// For the engine to recover its own type.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// A preempted job's complete state. Either the engine's in-memory state (fast path: resuming
/// on the same engine needs no serialization) or bytes; [`SavedContext::to_bytes`] serializes the
/// former (store, send, migrate), [`SavedContext::from_bytes`] wraps the latter (validated when
/// resumed, never trusted before). Cloning and comparing serialize.
pub struct SavedContext(ContextRepr);

/// The two forms of a saved context.
pub(crate) enum ContextRepr {
    Bytes(Vec<u8>),
    Live(Box<dyn LiveContext>),
}

impl SavedContext {
    /// Wraps bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(ContextRepr::Bytes(bytes))
    }
    /// Wraps an engine's in-memory state.
    pub(crate) fn live(state: Box<dyn LiveContext>) -> Self {
        Self(ContextRepr::Live(state))
    }
    /// The state as bytes (serializes in-memory state; copies bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.0 {
            ContextRepr::Bytes(b) => b.clone(),
            ContextRepr::Live(l) => l.to_bytes(),
        }
    }
    /// Takes the state as bytes (serializes in-memory state).
    pub fn into_bytes(self) -> Vec<u8> {
        match self.0 {
            ContextRepr::Bytes(b) => b,
            ContextRepr::Live(l) => l.to_bytes(),
        }
    }
    /// Whether this is bytes (as opposed to in-memory state).
    pub fn is_bytes(&self) -> bool {
        matches!(self.0, ContextRepr::Bytes(_))
    }
    pub(crate) fn into_repr(self) -> ContextRepr {
        self.0
    }
}

impl Clone for SavedContext {
    fn clone(&self) -> Self {
        Self::from_bytes(self.to_bytes())
    }
}

impl PartialEq for SavedContext {
    fn eq(&self, other: &Self) -> bool {
        self.to_bytes() == other.to_bytes()
    }
}

impl Eq for SavedContext {}

impl fmt::Debug for SavedContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            ContextRepr::Bytes(b) => write!(f, "SavedContext({} bytes)", b.len()),
            ContextRepr::Live(l) => write!(f, "SavedContext(live {l:?})"),
        }
    }
}

/// How a job's execution ended. `gpu_time` is the wall time the engine spent on this call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job finished.
    Completed {
        /// Engine time used.
        gpu_time: Duration,
    },
    /// The job stopped at a preemption request; `context` resumes it.
    Preempted {
        /// Saved state.
        context: SavedContext,
        /// Engine time used.
        gpu_time: Duration,
    },
    /// The job faulted and is over.
    Faulted {
        /// The fault.
        fault: JobFault,
        /// Engine time used.
        gpu_time: Duration,
    },
}

impl Outcome {
    /// Engine time the call used.
    pub fn gpu_time(&self) -> Duration {
        match self {
            Outcome::Completed { gpu_time }
            | Outcome::Preempted { gpu_time, .. }
            | Outcome::Faulted { gpu_time, .. } => *gpu_time,
        }
    }
}

/// Asks a running job to stop at its next preemption point, from any thread.
///
/// Cloning shares the flag; one handle may cover several jobs running at once (a request stops
/// them all). The flag stays set until [`PreemptHandle::clear`]; a job started
/// with the flag set is preempted at its first preemption point. The time of the latest request
/// is kept so that preemption latency can be measured.
#[derive(Debug, Clone, Default)]
pub struct PreemptHandle {
    inner: Arc<PreemptInner>,
}

/// Called on a preemption request, for engines whose inner loop polls a flag of its own.
pub(crate) type PreemptHook = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct PreemptInner {
    flag: AtomicBool,
    requested_at: Mutex<Option<Instant>>,
    running_since: Mutex<Option<Instant>>,
    /// Hooks of the jobs running under this handle, by attach number.
    hooks: Mutex<Vec<(u64, PreemptHook)>>,
    next_hook: AtomicU64,
}

impl fmt::Debug for PreemptInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreemptInner")
            .field("flag", &self.flag)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PreemptHandle {
    /// A new handle with the flag clear.
    pub fn new() -> Self {
        Self::default()
    }
    /// Requests preemption (idempotent) and returns the time of the request.
    pub fn request(&self) -> Instant {
        let now = Instant::now();
        *lock(&self.inner.requested_at) = Some(now);
        self.inner.flag.store(true, Ordering::SeqCst);
        for (_, hook) in lock(&self.inner.hooks).iter() {
            hook();
        }
        now
    }
    /// Clears a request (before reusing the handle for the next job).
    pub fn clear(&self) {
        self.inner.flag.store(false, Ordering::SeqCst);
        *lock(&self.inner.requested_at) = None;
    }
    /// Whether preemption is requested.
    pub fn is_requested(&self) -> bool {
        self.inner.flag.load(Ordering::Acquire)
    }
    /// When the latest request was made, if the flag is set.
    pub fn requested_at(&self) -> Option<Instant> {
        *lock(&self.inner.requested_at)
    }
    /// When the engine last started (or resumed) running a job under this handle: for
    /// measuring restore latency (`resume` called → job running).
    pub fn running_since(&self) -> Option<Instant> {
        *lock(&self.inner.running_since)
    }
    /// Records that the job is now running (engines call this once state is restored).
    pub(crate) fn mark_running(&self) {
        *lock(&self.inner.running_since) = Some(Instant::now());
    }
    /// Installs `hook` to be called on every request until the returned guard drops; calls it
    /// at once if a request is already pending (no request is lost in between).
    pub(crate) fn attach(&self, hook: PreemptHook) -> HookGuard<'_> {
        let id = self.inner.next_hook.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.hooks).push((id, hook.clone()));
        if self.inner.flag.load(Ordering::SeqCst) {
            hook();
        }
        HookGuard { handle: self, id }
    }
    /// The flag itself, for engines that poll it in an inner loop.
    pub fn flag(&self) -> &AtomicBool {
        &self.inner.flag
    }
}

/// Removes a preemption hook when dropped.
pub(crate) struct HookGuard<'a> {
    handle: &'a PreemptHandle,
    id: u64,
}

impl Drop for HookGuard<'_> {
    fn drop(&mut self) {
        lock(&self.handle.inner.hooks).retain(|(id, _)| *id != self.id);
    }
}

/// Why a `map` or `unmap` was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MapError {
    #[error("length is zero")]
    ZeroLength,
    #[error("page size {0:?} not supported")]
    UnsupportedPageSize(PageSize),
    #[error("{what} {value:#x} is not aligned to the page size {page:#x}")]
    Misaligned {
        what: &'static str,
        value: u64,
        page: u64,
    },
    #[error("VA range {va:#x}+{len:#x} is outside the window")]
    OutOfWindow { va: u64, len: u64 },
    #[error("target range {offset:#x}+{len:#x} is outside its memory ({size:#x} bytes)")]
    TargetRange { offset: u64, len: u64, size: u64 },
    #[error("VA {0:#x} is already mapped")]
    Overlap(u64),
    #[error("unmap range splits the 2 MiB page at {0:#x}")]
    SplitsLargePage(u64),
}

/// Errors of engine calls (requests the engine refuses; faults of jobs are `Outcome::Faulted`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EngineError {
    #[error("unknown address space {0:?}")]
    UnknownSpace(SpaceId),
    #[error("unknown module {0:?}")]
    UnknownModule(ModuleId),
    #[error("unknown host region {0:?}")]
    UnknownHostRegion(HostRegionId),
    #[error("address space {0:?} is running a job")]
    SpaceBusy(SpaceId),
    #[error("host region {0:?} is still mapped")]
    HostRegionInUse(HostRegionId),
    #[error("too many {0}")]
    TooMany(&'static str),
    #[error("bad VA window {base:#x}+{size:#x}: {why}")]
    BadWindow {
        base: u64,
        size: u64,
        why: &'static str,
    },
    #[error("bad host region: {0}")]
    BadHostRegion(&'static str),
    #[error("bad mapping: {0}")]
    BadMapping(#[from] MapError),
    #[error("bad copy: {0}")]
    BadCopy(&'static str),
    #[error("batch entry {index}: {source}")]
    BatchEntry {
        index: usize,
        source: Box<EngineError>,
    },
    #[error("physical range {pa:#x}+{len:#x} outside VRAM")]
    VramRange { pa: u64, len: u64 },
    #[error("copy fault: {0}")]
    CopyFault(JobFault),
    #[error("module load failed: {log}")]
    ModuleLoad {
        /// The loader's error text, to give back to the guest.
        log: String,
    },
    #[error("bad launch: {0}")]
    BadLaunch(String),
    #[error("bad saved context: {0}")]
    BadContext(String),
    #[error("engine failure: {0}")]
    Backend(String),
}

/// The physical GPU as the hypervisor sees it.
///
/// All methods take `&self` and are callable from several threads: one job per call of
/// [`Engine::execute`]/[`Engine::resume`] runs on the calling thread (plus the engine's workers),
/// and [`PreemptHandle::request`] from any other thread makes it return
/// [`Outcome::Preempted`] at its next preemption point.
pub trait Engine: Send + Sync {
    /// Name, VRAM size, page sizes and limits.
    fn info(&self) -> &EngineInfo;

    /// Reads physical VRAM for the hypervisor's own use (shadow structures, BAR1 aperture).
    fn vram_read(&self, pa: u64, buf: &mut [u8]) -> Result<(), EngineError>;
    /// Writes physical VRAM for the hypervisor's own use.
    fn vram_write(&self, pa: u64, data: &[u8]) -> Result<(), EngineError>;

    /// Registers host memory (a VM's guest RAM) so that mappings can point at it.
    ///
    /// # Safety
    /// `base..base+len` must be readable and writable memory that stays valid, and is not freed or
    /// remapped, until `unregister_host_region` succeeds for the returned id. The engine's kernels
    /// and copies access it concurrently with other users (as DMA would).
    unsafe fn register_host_region(
        &self,
        base: *mut u8,
        len: usize,
    ) -> Result<HostRegionId, EngineError>;
    /// Unregisters a host region; refused while any address space maps it.
    fn unregister_host_region(&self, region: HostRegionId) -> Result<(), EngineError>;

    /// Creates an address space over a VA window.
    fn create_space(&self, window: VaWindow) -> Result<SpaceId, EngineError>;
    /// Destroys an address space; refused while a job runs in it.
    fn destroy_space(&self, space: SpaceId) -> Result<(), EngineError>;
    /// Maps a range. Overlaps with existing mappings are rejected (unmap first); refused while
    /// a job runs in the space. All-or-nothing.
    fn map(&self, space: SpaceId, mapping: &Mapping) -> Result<(), EngineError>;
    /// Maps several ranges, all or nothing (a shadow-table rebuild, a para-virt MAP_BATCH): on
    /// error nothing of the batch stays mapped and `EngineError::BatchEntry` names the entry.
    fn map_batch(&self, space: SpaceId, mappings: &[Mapping]) -> Result<(), EngineError>;
    /// Unmaps every page inside `va..va+len`, returning the bytes unmapped (holes are skipped).
    /// A large page that straddles an end of the range is an error and nothing changes.
    fn unmap(&self, space: SpaceId, va: u64, len: u64) -> Result<u64, EngineError>;
    /// What `va` maps to in `space` (target address of that byte, permission, page size).
    fn lookup(&self, space: SpaceId, va: u64) -> Result<Option<Translation>, EngineError>;

    /// Copies host bytes to `va` through the space's MMU (synchronous; faults come back as
    /// `EngineError::CopyFault`, with nothing written past the fault).
    fn copy_to_space(&self, space: SpaceId, va: u64, data: &[u8]) -> Result<(), EngineError>;
    /// Copies from `va` through the space's MMU into a host buffer (synchronous).
    fn copy_from_space(&self, space: SpaceId, va: u64, buf: &mut [u8]) -> Result<(), EngineError>;

    /// Loads PTX text. Identical text gives the same id (content cache; loads are counted and
    /// each needs an `unload_module`). Errors carry the loader's text for the guest.
    fn load_module(&self, ptx: &str) -> Result<ModuleId, EngineError>;
    /// Drops one load of a module; the module goes when the last load is dropped. Jobs already
    /// running keep it alive; saved contexts referring to it can no longer be resumed.
    fn unload_module(&self, module: ModuleId) -> Result<(), EngineError>;

    /// Runs a job until it completes, faults or is preempted.
    fn execute(&self, job: &Job, preempt: &PreemptHandle) -> Result<Outcome, EngineError>;
    /// Resumes a preempted job from its saved context (in the space it was saved from). The
    /// context is consumed; on `Err` nothing ran and the job is lost (its space or module is
    /// gone, or the bytes are invalid).
    fn resume(
        &self,
        context: SavedContext,
        preempt: &PreemptHandle,
    ) -> Result<Outcome, EngineError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn preempt_hooks_fire_for_every_attached_job_and_late_attach() {
        let h = PreemptHandle::new();
        let n = Arc::new(AtomicU32::new(0));
        let hook = |n: &Arc<AtomicU32>| -> PreemptHook {
            let n = n.clone();
            Arc::new(move || {
                n.fetch_add(1, Ordering::SeqCst);
            })
        };
        let g1 = h.attach(hook(&n));
        let g2 = h.attach(hook(&n));
        assert!(h.requested_at().is_none());
        h.request();
        assert_eq!(n.load(Ordering::SeqCst), 2);
        drop(g1);
        h.request();
        assert_eq!(
            n.load(Ordering::SeqCst),
            3,
            "the second job's hook survives the first's end"
        );
        drop(g2);
        // Attaching while a request is pending fires at once.
        let _g3 = h.attach(hook(&n));
        assert_eq!(n.load(Ordering::SeqCst), 4);
        h.clear();
        assert!(!h.is_requested() && h.requested_at().is_none());
        let _g4 = h.attach(hook(&n));
        assert_eq!(n.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn engine_is_object_safe() {
        fn takes(_: Option<&dyn Engine>) {}
        takes(None);
        assert_eq!(PageSize::Size2M.bytes(), 2 << 20);
        assert_eq!(PageSize::Size4K.bytes(), 4096);
    }
}
