//! Loading PTX text under the caller's [`LoadLimits`] (host bytes, deadline, cancel flag): the
//! adapter between the engine contract and the `ptx` crate's bounded loader, and the host bytes
//! a parsed module holds.

use crate::engine::{EngineError, LoadLimits};

/// Parses `text` within `limits`; returns the module and the host bytes it holds (decoded code,
/// variables; not the text). The text's own bytes are the caller's to count.
pub(crate) fn parse(text: &str, limits: &LoadLimits) -> Result<(ptx::Module, u64), EngineError> {
    limits.check()?;
    let opts = ptx::LoadOptions {
        max_host_bytes: limits.max_host_bytes,
        cancel: limits.cancel.clone(),
        deadline: limits.deadline,
        ..ptx::LoadOptions::default()
    };
    let module = ptx::parse_with(text, &opts).map_err(|e| match e {
        ptx::PtxError::Cancelled => EngineError::LoadCancelled,
        ptx::PtxError::DeadlineExceeded => EngineError::LoadDeadline,
        ptx::PtxError::Budget { what, used, limit } => {
            EngineError::HostBudget { what, used, limit }
        }
        e => EngineError::ModuleLoad { log: e.to_string() },
    })?;
    let bytes = module.host_bytes();
    Ok((module, bytes))
}

/// The host-byte bound a load gets once `held` bytes (e.g. the text the engine keeps) are set
/// aside: `Err` if even those do not fit.
pub(crate) fn remaining(limits: &LoadLimits, held: u64) -> Result<u64, EngineError> {
    limits
        .max_host_bytes
        .checked_sub(held)
        .ok_or(EngineError::HostBudget {
            what: "PTX text",
            used: held,
            limit: limits.max_host_bytes,
        })
}
