//! Errors of the scheduler's event API: every bad event is refused with one of these, state unchanged.

use std::time::Duration;

use crate::types::VmId;

/// An event the scheduler refused. The scheduler's state is unchanged when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("unknown VM {0}")]
    UnknownVm(VmId),
    #[error("VM {0} is already registered")]
    AlreadyRegistered(VmId),
    #[error("weight {weight} out of range 1..={max}")]
    BadWeight { weight: u32, max: u32 },
    #[error("VM {vm} has {limit} jobs queued already (max_pending)")]
    TooManyJobs { vm: VmId, limit: u64 },
    #[error("too many VMs (limit {0})")]
    TooManyVms(usize),
    #[error("time went backwards: last event at {last:?}, this one at {now:?}")]
    TimeWentBackwards { last: Duration, now: Duration },
    #[error("VM {0} is not the running VM")]
    NotRunning(VmId),
    #[error("VM {0} holds the GPU: report the end of its run first")]
    Busy(VmId),
}
