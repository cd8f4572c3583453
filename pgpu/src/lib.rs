//! `pgpu`: the physical GPU as the hypervisor sees it.
//!
//! [`Engine`] is the contract between the hypervisor (virtual GPU device, shadow page tables,
//! scheduler) and a physical GPU backend; [`sim::SimEngine`] is the built-in software GPU.
//! `pgpu/README.md` describes the design.
//!
//! The flow a virtual GPU drives, end to end (the shadow page table is the space's mappings):
//!
//! ```
//! use pgpu::sim::{SimConfig, SimEngine};
//! use pgpu::*;
//!
//! let engine = SimEngine::new(SimConfig { vram_size: 4 << 20, workers: 1, ..Default::default() })?;
//! // One address space per VM (or per guest page directory), over the VM's GPU VA window.
//! let space = engine.create_space(VaWindow { base: 0x4_0000_0000, size: 1 << 30 })?;
//! // The shadow builder maps guest VAs onto the VM's own VRAM partition.
//! engine.map_batch(space, &[Mapping {
//!     va: 0x4_0000_0000,
//!     len: 2 << 20,
//!     target: MapTarget::Vram { pa: 0 },
//!     perm: Perm::ReadWrite,
//!     page_size: PageSize::Size2M,
//! }])?;
//! let n: u32 = 1000;
//! let (a, b, c) = (0x4_0000_0000u64, 0x4_0000_1000u64, 0x4_0000_2000u64);
//! let ones: Vec<u8> = (0..n).flat_map(|_| 1f32.to_le_bytes()).collect();
//! engine.copy_to_space(space, a, &ones)?;
//! engine.copy_to_space(space, b, &ones)?;
//! // PTX text comes from guest memory; load errors carry the text to hand back to the guest.
//! // Bounded by the VM's host memory budget, the job's time limit and a cancel flag.
//! let limits = LoadLimits { max_host_bytes: 64 << 20, ..LoadLimits::default() };
//! let module = engine.load_module(suite::find("vecadd").unwrap().ptx, &limits)?.id;
//! let mut params = Vec::new();
//! for p in [a, b, c] {
//!     params.extend_from_slice(&p.to_le_bytes());
//! }
//! params.extend_from_slice(&n.to_le_bytes());
//! let job = Job::Launch(LaunchJob {
//!     space,
//!     module,
//!     entry: "vecadd".into(),
//!     grid: [n.div_ceil(256), 1, 1],
//!     block: [256, 1, 1],
//!     dynamic_shared: 0,
//!     params,
//! });
//! // The scheduler holds a handle per running job and calls `request()` from its timer thread;
//! // here the request is made up front, so the job stops at its first preemption point.
//! let handle = PreemptHandle::new();
//! handle.request();
//! let Outcome::Preempted { context, gpu_time } = engine.execute(&job, &handle)? else {
//!     panic!("expected a preemption")
//! };
//! handle.clear();
//! // Resume later: from the in-memory context, or from `context.into_bytes()` stored away.
//! let resumed = engine.resume(SavedContext::from_bytes(context.into_bytes()), &handle)?;
//! assert!(matches!(resumed, Outcome::Completed { .. }));
//! let charged = gpu_time + resumed.gpu_time(); // what the scheduler charges the VM
//! assert!(charged > std::time::Duration::ZERO);
//! let mut out = vec![0u8; 4];
//! engine.copy_from_space(space, c + 4 * 999, &mut out)?;
//! assert_eq!(f32::from_le_bytes([out[0], out[1], out[2], out[3]]), 2.0);
//! # Ok::<(), EngineError>(())
//! ```

pub mod bulk_check;
pub mod ckpt;
pub mod ckwait;
pub mod conformance;
pub mod cuda;
pub mod dirty;
pub mod engine;
mod ptx_load;
pub mod sim;
pub mod switch;
mod sync;

pub use ckpt::{CkptStats, PreemptMethod};
pub use dirty::DirtyLogKind;
pub use engine::*;
