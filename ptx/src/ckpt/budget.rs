//! Why a kernel cannot be made preemptible ([`Unsupported`]), and the work and memory budget
//! that bounds the transformation of hostile PTX ([`Budget`]), on top of the loading budgets
//! of [`crate::LoadOptions`] (whose cancel flag and deadline it also honours).

use thiserror::Error;

use crate::error::PtxError;
use crate::load::Meter;

/// A kernel the transformation refuses, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Unsupported {
    /// The text is not in the subset (or over a loading budget).
    #[error("not loadable: {0}")]
    Parse(#[from] PtxError),
    /// A branch whose target is not a label of the entry.
    #[error("line {line}: branch target is not a label (indirect branch)")]
    IndirectBranch { line: u32 },
    /// Shared memory without `bar.sync`: the CTA's threads never meet, so no point exists
    /// where they could agree to save the shared memory.
    #[error("entry `{entry}` uses shared memory but has no bar.sync to save it at")]
    SharedWithoutBarrier { entry: String },
    /// A barrier that cannot become a CTA-uniform point (guarded, with a thread count, or a
    /// named barrier other than 0) or a barrier kind the rules do not cover.
    #[error("entry `{entry}` line {line}: barrier `{what}` cannot be a CTA-uniform point")]
    Barrier {
        entry: String,
        line: u32,
        what: String,
    },
    /// More `.local` memory (variables and call-site `.param` buffers of inlined calls, which
    /// every save copies whole) than [`super::Options::max_local_bytes`].
    #[error(
        "entry `{entry}`: {bytes} bytes of local memory (`{name}`, ...) exceed the limit {limit}"
    )]
    LocalMemory {
        entry: String,
        name: String,
        bytes: u64,
        limit: u64,
    },
    /// A name in the transformation's reserved prefix (`__ck`).
    #[error("entry `{entry}`: name `{name}` uses the reserved prefix `__ck`")]
    ReservedName { entry: String, name: String },
    /// The per-thread record would exceed [`super::Options::max_record_bytes`].
    #[error(
        "entry `{entry}`: a {bytes}-byte record per thread (live registers, local memory) exceeds the limit {limit}"
    )]
    TooManyLiveBytes {
        entry: String,
        bytes: u64,
        limit: u64,
    },
    /// More preemption points than [`super::Options::max_points`].
    #[error("entry `{entry}`: {points} preemption points exceed the limit {limit}")]
    TooManyPoints {
        entry: String,
        points: u64,
        limit: u64,
    },
    /// The analysis would exceed its work or memory budget.
    #[error("analysis budget exceeded: {what} ({limit})")]
    Budget { what: &'static str, limit: u64 },
    /// The transformed text failed to load (a bug in the transformation, never a panic).
    #[error("internal error: the transformed PTX does not load: {0}")]
    Internal(String),
}

/// Work and memory spent by the analyses of one transformation.
pub(crate) struct Budget {
    pub meter: Meter,
    work: u64,
    max_work: u64,
    memory: u64,
    max_memory: u64,
}

impl Budget {
    pub(crate) fn new(meter: Meter, max_work: u64, max_memory: u64) -> Budget {
        Budget {
            meter,
            work: 0,
            max_work,
            memory: 0,
            max_memory,
        }
    }

    /// `n` units of work (also checks the load's cancel flag and deadline).
    pub(crate) fn work(&mut self, n: u64) -> Result<(), Unsupported> {
        self.work = self.work.saturating_add(n);
        if self.work > self.max_work {
            return Err(Unsupported::Budget {
                what: "analysis work units",
                limit: self.max_work,
            });
        }
        self.meter.ticks(n)?;
        Ok(())
    }

    /// `bytes` of analysis tables about to be allocated (held until the transformation ends).
    pub(crate) fn memory(&mut self, bytes: u64) -> Result<(), Unsupported> {
        self.memory = self.memory.saturating_add(bytes);
        if self.memory > self.max_memory {
            return Err(Unsupported::Budget {
                what: "analysis bytes",
                limit: self.max_memory,
            });
        }
        Ok(())
    }
}
