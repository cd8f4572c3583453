//! Errors of engine calls and of map requests.

use thiserror::Error;

use super::fault::JobFault;
use super::types::{HostRegionId, ModuleId, PageSize, SpaceId};

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
    #[error("module load cancelled")]
    LoadCancelled,
    #[error("module load ran past its deadline")]
    LoadDeadline,
    #[error("host memory budget: {what} needs {used} bytes, {limit} allowed")]
    HostBudget {
        /// What outgrew the budget (e.g. "module variables").
        what: &'static str,
        /// Bytes it had reached when it was stopped (a lower bound of what it needs).
        used: u64,
        /// Bytes it was allowed.
        limit: u64,
    },
    #[error("bad launch: {0}")]
    BadLaunch(String),
    #[error("bad saved context: {0}")]
    BadContext(String),
    #[error("engine failure: {0}")]
    Backend(String),
}
