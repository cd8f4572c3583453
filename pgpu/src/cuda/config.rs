//! Runtime configuration of the cuda engine.

use std::time::Duration;

pub use super::ckchoice::{CkPath, CkPathChoice};
pub use super::ckmem::FlagWrite;
pub use super::ckpath::{EndWait, StatusRead};
use crate::ckpt::PreemptMethod;
use crate::engine::EngineLimits;

/// [`CudaConfig::ckpt_atomic_weight`]'s default. On an H200 `long_atomic` (8 CTAs of 256
/// threads, one contended `atom.global.add` per iteration) ran its chunk of 34 iterations
/// (weight 8: 512 / (7 + 8)) in about 33 µs between the flag's write and the kernel's end, the
/// largest part of its 90 µs request→context p99 (session 12). A weight of 64 makes that
/// chunk 7 iterations (about 7 µs), and the poll a chunk adds stays small beside seven
/// contended atomics.
pub const CUDA_ATOMIC_WEIGHT: u32 = 64;

/// How a [`super::CudaEngine`] is set up (all runtime values, `Default` for tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaConfig {
    /// CUDA device ordinal.
    pub device: i32,
    /// Physical VRAM of this engine in bytes (a multiple of 2 MiB): allocated eagerly at
    /// construction as 2 MiB `cuMemCreate` chunks, zeroed. A VM process sizes it to its partition.
    pub vram_size: u64,
    /// Target duration of one sub-launch of a sliced kernel (about a tenth of a scheduler slice):
    /// the preemption latency of a kernel is about this long.
    pub sub_launch_target: Duration,
    /// Blocks of the first sub-launch of an entry never measured before (0: one full wave,
    /// i.e. the blocks the device runs at once). Sub-launches never go below one wave unless
    /// this is set lower (tests use 1 to force many tiny sub-launches).
    pub initial_blocks: u32,
    /// Sub-launches in flight at once, on as many streams (1: each waits for the previous;
    /// 2: the next one's blocks fill the SMs the previous one's tail leaves idle). A preemption
    /// request waits for every sub-launch in flight: latency up to `pipeline_depth` sub-launches.
    pub pipeline_depth: usize,
    /// Largest chunk of a copy job between two preemption checks, bytes.
    pub copy_chunk: u64,
    /// Limits on requests.
    pub limits: EngineLimits,
    /// How kernels are preempted: `Slice` (default: sliced sub-launches, see above) or
    /// `Checkpoint` (modules transformed by `ptx::ckpt`; one launch of the whole grid, stopped
    /// at the kernel's next preemption point by a flag in device memory; kernels the
    /// transformation refuses, or whose save area exceeds `max_save_area_bytes`, are sliced).
    pub preempt: PreemptMethod,
    /// Largest save area (device memory, bytes) of one checkpointed launch.
    pub max_save_area_bytes: u64,
    /// How a request writes the checkpoint flag while the kernel runs (the fixed path's;
    /// with `flag_write` also the signal stream's priority).
    pub flag_write: FlagWrite,
    /// How the engine waits for a checkpointed kernel's end (the fixed path's).
    pub end_wait: EndWait,
    /// How a preempted launch's status words are read back (the fixed path's).
    pub status_read: StatusRead,
    /// How each checkpointed run's request path is chosen (`ckchoice`): `Fixed` (the three
    /// fields above for every run, the default) or `Adaptive` (the fast `armed` / `notice` /
    /// `mirror` path for kernels expected to run at least a threshold or not yet measured,
    /// the three fields above for the others).
    pub ck_path: CkPathChoice,
    /// `ptx::ckpt::Options::chunk_instructions`: instructions of a strip-mined loop between
    /// two polls (0: counted polls in every loop). Default: the transformation's (512).
    pub ckpt_chunk_instructions: u32,
    /// `ptx::ckpt::Options::atomic_weight`: what a global atomic or reduction counts as when a
    /// strip-mined loop's chunk is sized. Default [`CUDA_ATOMIC_WEIGHT`].
    pub ckpt_atomic_weight: u32,
    /// `ptx::ckpt::Options::fast_chunks`: whole chunks as constant-trip copies. Default on.
    pub ckpt_fast_chunks: bool,
    /// `ptx::ckpt::Options::poll_interval`: a thread reads the flag at every this many point
    /// crossings. Default: the transformation's (64).
    pub ckpt_poll_interval: u32,
    /// Load modules unmodified and run every launch whole (one `cuLaunchKernel` of the
    /// guest's grid, not preemptible inside it): the untransformed baseline that
    /// `vgpu-bench preempt` measures the methods' steady-state cost against. Default false.
    pub whole_launches: bool,
    /// `Auto`'s wait budget (`crate::ckwait`): a request for a launch expected to end within
    /// it is not acted on (the launch completes). Zero: never waited. Default
    /// [`crate::ckwait::DEFAULT_WAIT_BUDGET`].
    pub preempt_wait: Duration,
    /// Bytes of each of the bulk calls' two staging slots to make with the engine, kept at
    /// that size (rounded up to a power of two within 1 MiB..64 MiB; `bulk.rs`). 0 (the
    /// default): the slots come with the first snapshot, live copy or restore, sized to it,
    /// and that allocation (2 × slot of pinned host memory and of device memory) stalls the
    /// guest's copy jobs while it runs: their GPU time per launch 6-14 µs higher over a 1 GiB
    /// live migration on an H200 than with the slots made here (docs/performance.md, session
    /// 19). A VM that will be migrated or snapshotted live reserves them here (`--gpu
    /// copy_slots=`); fixed slots also serve `vram_reserve_writes` as they are. Slots that
    /// cannot be made at creation are logged, and come with the first call.
    pub bulk_slot_bytes: u64,
}

impl Default for CudaConfig {
    fn default() -> Self {
        Self {
            device: 0,
            vram_size: 64 << 20,
            sub_launch_target: Duration::from_micros(200),
            initial_blocks: 0,
            pipeline_depth: 2,
            copy_chunk: 64 << 20,
            limits: EngineLimits::default(),
            preempt: PreemptMethod::Slice,
            max_save_area_bytes: 256 << 20,
            flag_write: FlagWrite::WriteValue,
            end_wait: EndWait::Sync,
            status_read: StatusRead::Strided,
            ck_path: super::ckchoice::DEFAULT_CK_PATH,
            ckpt_chunk_instructions: ptx::ckpt::Options::default().chunk_instructions,
            ckpt_atomic_weight: CUDA_ATOMIC_WEIGHT,
            ckpt_fast_chunks: ptx::ckpt::Options::default().fast_chunks,
            ckpt_poll_interval: crate::ckpt::default_poll_interval(),
            whole_launches: false,
            preempt_wait: crate::ckwait::DEFAULT_WAIT_BUDGET,
            bulk_slot_bytes: 0,
        }
    }
}

impl CudaConfig {
    /// The request path of a run that does not take the fast one (`ck_path`).
    pub fn fixed_path(&self) -> CkPath {
        CkPath {
            flag_write: self.flag_write,
            end_wait: self.end_wait,
            status_read: self.status_read,
        }
    }

    /// Whether some run may take `pred`'s path part (what preparing must make ready).
    pub(crate) fn may_use(&self, pred: impl Fn(&CkPath) -> bool) -> bool {
        self.ck_path.paths(self.fixed_path()).any(|p| pred(&p))
    }
}
