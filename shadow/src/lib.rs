//! `shadow`: the hypervisor's view of the guest's GPU state. It validates everything a guest
//! hands the virtual GPU (instance blocks, page directories, page tables, channel ids), turns
//! the guest's page tables into shadow mappings of the VM's own VRAM partition and RAM, and keeps
//! one engine address space per guest page directory in sync with them.
//!
//! Flow for the device model: `Instance::read` when CHAN_INST is written (or the instance page
//! is written) → `plan` (walk + translate) on TLB_FLUSH / first bind → `ShadowSpace::sync`.
//! The spec is `docs/hardware.md`, section "The virtual GPU".
//!
//! Files: `fault` (fault kinds, rules, errors), `types` (apertures, PDB, guest mappings),
//! `layout` (GPU layout, partition, sysmem map), `mem` (guest memory access), `instance`,
//! `walk` (page-table walk), `watch` (watch set), `translate` (guest → engine mappings),
//! `plan` (walk + translate), `space` (shadow address spaces), `diff` (installed vs wanted),
//! `channel` (channel quota and shadow channels).

mod channel;
mod diff;
#[cfg(test)]
mod diff_tests;
mod fault;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod instance;
mod layout;
mod mem;
mod plan;
mod space;
mod translate;
mod types;
mod walk;
mod watch;

pub use channel::{ChannelQuota, MAX_CHANNELS, ShadowChannel};
pub use fault::{FaultKind, GuestFault, Rule, ShadowError};
pub use instance::{INSTANCE_BLOCK_SIZE, INSTANCE_BYTES, Instance};
pub use layout::{GpuLayout, PageSizes, Partition, RamRegion, SysmemEntry, SysmemMap};
pub use mem::{GuestMem, MemError, VecGuestMem};
pub use plan::{Plan, plan};
pub use space::{ShadowSpace, SpaceCounters, SyncStats, host_bytes_of};
pub use translate::{Translated, translate};
pub use types::{Aperture, GuestMapping, GuestTarget, PAGE_2M, PAGE_4K, Pdb};
pub use walk::{Walk, walk};
pub use watch::{WatchKey, WatchSet};
