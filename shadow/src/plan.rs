//! `plan`: walk a guest page directory and translate the result into the engine mappings a
//! `ShadowSpace` should hold (what the device model runs on TLB_FLUSH or first bind).

use pgpu::{Mapping, PageSize};

use crate::fault::GuestFault;
use crate::layout::{GpuLayout, Partition, SysmemMap};
use crate::mem::GuestMem;
use crate::translate::translate;
use crate::types::{GuestMapping, Pdb};
use crate::walk::walk;
use crate::watch::WatchSet;

/// The shadow of one page directory, ready for `ShadowSpace::sync`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The page directory.
    pub pdb: Pdb,
    /// Validated guest mappings (merged runs).
    pub guest: Vec<GuestMapping>,
    /// Engine mappings for `guest`.
    pub mappings: Vec<Mapping>,
    /// Faults of the walk and of the translation, sorted by address, at most
    /// `GpuLayout::max_faults`.
    pub faults: Vec<GuestFault>,
    /// All faults found.
    pub fault_count: u64,
    /// Guest pages holding the page directory and its page tables.
    pub watch: WatchSet,
}

/// Walks the page directory at `pdb` and translates it for an engine offering `engine_pages`.
/// Fails (kind 6) only when the page directory itself is out of range or unreadable.
pub fn plan<M: GuestMem + ?Sized>(
    mem: &M,
    layout: &GpuLayout,
    partition: &Partition,
    sysmem: &SysmemMap,
    engine_pages: &[PageSize],
    pdb: Pdb,
) -> Result<Plan, GuestFault> {
    let w = walk(mem, layout, pdb)?;
    let t = translate(&w.mappings, partition, sysmem, engine_pages);
    let fault_count = w.fault_count + t.faults.len() as u64;
    let mut faults = w.faults;
    faults.extend(t.faults);
    faults.sort_by_key(|f| f.addr);
    faults.truncate(layout.max_faults);
    Ok(Plan {
        pdb,
        guest: w.mappings,
        mappings: t.mappings,
        faults,
        fault_count,
        watch: w.watch,
    })
}
