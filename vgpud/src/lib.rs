//! `vgpud`: the host daemon that shares the host's physical GPUs among VM processes. It owns
//! each GPU's VRAM (for the sim backend one shared memory object per GPU, partitioned), its
//! channel quota and its scheduler (`scheduler` crate), and places each VM on one GPU; each `vgpu-vmm --gpu host=SOCKET` registers over a Unix
//! socket, gets its partition, and asks for, is granted and yields GPU time. The protocol is
//! `proto` (documented in docs/architecture.md, "Sharing one GPU: vgpud").
//!
//! Files: `background` (the daemon on a thread, for tests and tools), `discover` (`--gpus
//! all`: the host's CUDA devices), `gpus` (per-GPU state,
//! placement), `moving` (a VM moved to another GPU), `partition` (VRAM pool), `session` (one
//! connection), `daemon` (the poll loop, grants, slice ends, revocation, reclaim), `handle`
//! (message handling), `kept` (a grant taken back through the VM's grant word: kept between two jobs, or not taken yet), `status` (`vgpud status`: the live report on the socket), `adopt` (a restart: the VMs of an earlier instance re-register, each on
//! the GPU it claims), `report` (what was measured).

mod adopt;
mod background;
pub mod daemon;
pub mod discover;
pub mod gpus;
mod handle;
mod kept;
mod moving;
pub mod partition;
pub mod report;
mod session;
pub mod status;

/// The protocol, its socket layer and command-line sizes live in `vgpu-proto` (shared with the
/// device model); re-exported here under their old paths.
pub use vgpu_proto::{proto, units, wire, word};

pub use background::Background;
pub use daemon::{Daemon, DaemonConfig, DaemonError};
pub use kept::SPARE_AFTER;
pub use report::Report;
