//! Faults that end a job: what went wrong, where, on which address.

use std::fmt;

use thiserror::Error;

use super::types::AccessKind;

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
