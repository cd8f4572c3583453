//! `cuda`: the physical GPU through the CUDA driver API (cudarc, libcuda loaded at run time).
//!
//! One engine per process on the device's primary context. VRAM is 2 MiB `cuMemCreate` chunks;
//! an address space is a `cuMemAddressReserve` of its window at its base (guest GPU VA = host GPU
//! VA, checked) realised with `cuMemMap`/`cuMemSetAccess`; kernels are rewritten PTX run as
//! sliced launches (preemptible between sub-launches). `pgpu/README.md` ("The cuda engine")
//! describes what works and what does not.
//!
//! Files: `driver` (loading, context, errors), `vmm` (chunks, reservations, mappings), `vram`,
//! `hostmem`, `spaces` (page model), `rewrite` (PTX for sliced launches), `modules`, `stream`,
//! `context` (saved contexts), `engine` (construction, state), `api` (the trait), `jobs`,
//! `bulk` (bulk VRAM calls for snapshots: kernels in `bulk.ptx`, pinned staging slots), `ckpt`
//! / `ckmem` / `ckpath` / `ckchoice` / `ckqueue` / `ckstatus` / `notice` / `ckevents` (checkpointed launches:
//! memory, flag writes, end waits, status reads, each run's choice of them, breakdowns, the signal stream, host flag
//! words and pooled events), `hostcost` (the host work of a launch no request reaches: flag
//! clears only when raised, driver calls counted), `prepare` (a job's one-time driver work
//! done before its run).

mod api;
mod bulk;
mod ckchoice;
mod ckevents;
mod cklaunch;
mod ckmem;
mod ckpath;
mod ckpt;
mod ckqueue;
mod ckstatus;
mod config;
mod context;
mod driver;
mod engine;
mod escalate;
mod flags;
mod hostcost;
mod hostmem;
mod jobs;
mod modules;
mod notice;
mod prepare;
pub mod rewrite;
mod spaces;
mod stream;
pub mod sys;
mod vmm;
mod vram;

pub use bulk::PTX as BULK_PTX;
pub use ckchoice::{DEFAULT_CK_PATH, DEFAULT_FAST_FROM, MAX_FAST_FROM_US};
pub use ckpath::CkBreakdown;
pub use config::{
    CUDA_ATOMIC_WEIGHT, CkPath, CkPathChoice, CudaConfig, EndWait, FlagWrite, StatusRead,
};
pub use driver::{DeviceInfo, devices};
pub use engine::CudaEngine;
