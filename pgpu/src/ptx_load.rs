//! Loading PTX text under the caller's [`LoadLimits`] (host bytes, deadline, cancel flag): the
//! adapter between the engine contract and the `ptx` crate's bounded loader, and the host bytes
//! a parsed module holds.

use std::collections::HashSet;

use crate::engine::{EngineError, LoadLimits};

// ---------------------------------------------------------------------------------------------
// SHIM (branch host-bounds, until the ptx crate's bounded loader lands on main): stands in for
// `ptx::LoadOptions`, `ptx::parse_with`, `Module::host_bytes`/`variable_bytes` and the new
// `PtxError::{Cancelled, DeadlineExceeded, Budget}` another helper adds to `ptx`. It checks the
// cancel flag, the deadline and the byte bound only before and after `ptx::parse` (which cannot
// be interrupted), and estimates the decoded code's bytes from the instruction count. When the
// real API lands: delete `mod shim`, use `ptx::LoadOptions`/`ptx::parse_with`, match
// `ptx::PtxError::{Cancelled, DeadlineExceeded, Budget { .. }}` in `parse` below and call
// `module.host_bytes()`; nothing else in pgpu changes.
mod shim {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::HashSet;

    /// Mirrors `ptx::LoadOptions`.
    #[derive(Debug, Clone)]
    pub struct LoadOptions {
        pub max_instructions: usize,
        pub max_host_bytes: u64,
        pub cancel: Option<Arc<AtomicBool>>,
        pub deadline: Option<Instant>,
    }

    impl Default for LoadOptions {
        fn default() -> Self {
            Self {
                max_instructions: 1 << 20,
                max_host_bytes: u64::MAX,
                cancel: None,
                deadline: None,
            }
        }
    }

    /// Mirrors the new variants of `ptx::PtxError` (the others come as `Ptx`).
    #[derive(Debug)]
    pub enum LoadError {
        Ptx(ptx::PtxError),
        Cancelled,
        DeadlineExceeded,
        Budget {
            what: &'static str,
            used: u64,
            limit: u64,
        },
    }

    /// Estimated host bytes of one decoded instruction (IR, operands, control-flow tables).
    const BYTES_PER_INSTRUCTION: u64 = 128;

    fn stop(o: &LoadOptions) -> Result<(), LoadError> {
        if o.cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst)) {
            return Err(LoadError::Cancelled);
        }
        if o.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(LoadError::DeadlineExceeded);
        }
        Ok(())
    }

    /// Mirrors `ptx::parse_with` (bounds checked before and after the parse only).
    pub fn parse_with(text: &str, o: &LoadOptions) -> Result<ptx::Module, LoadError> {
        stop(o)?;
        let m = ptx::parse(text).map_err(LoadError::Ptx)?;
        stop(o)?;
        let instructions: usize = m.entries().map(|e| e.instructions).sum();
        if instructions > o.max_instructions {
            return Err(LoadError::Budget {
                what: "instructions",
                used: instructions as u64,
                limit: o.max_instructions as u64,
            });
        }
        let used = host_bytes(&m, text);
        if used > o.max_host_bytes {
            return Err(LoadError::Budget {
                what: "module",
                used,
                limit: o.max_host_bytes,
            });
        }
        Ok(m)
    }

    /// Mirrors `Module::variable_bytes`: every module-scope variable is named in the text (at
    /// least by its declaration), so summing `Module::variable` over the distinct identifiers
    /// of the text finds each exactly once.
    pub fn variable_bytes(m: &ptx::Module, text: &str) -> u64 {
        let mut seen = HashSet::new();
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
            .filter(|t| !t.is_empty() && seen.insert(*t))
            .filter_map(|t| m.variable(t))
            .map(|(_, size)| size)
            .sum()
    }

    /// Mirrors `Module::host_bytes`: decoded code estimated from its instruction count, and
    /// the variables twice (their storage and the initial image kept for fresh instances).
    pub fn host_bytes(m: &ptx::Module, text: &str) -> u64 {
        let code: u64 = m
            .entries()
            .map(|e| e.instructions as u64 * BYTES_PER_INSTRUCTION + 1024)
            .sum();
        code + 2 * variable_bytes(m, text)
    }
}
// END SHIM ------------------------------------------------------------------------------------

/// Parses `text` within `limits`; returns the module and the host bytes it holds (decoded code,
/// variables; not the text). The text's own bytes are the caller's to count.
pub(crate) fn parse(text: &str, limits: &LoadLimits) -> Result<(ptx::Module, u64), EngineError> {
    limits.check()?;
    let opts = shim::LoadOptions {
        max_host_bytes: limits.max_host_bytes,
        cancel: limits.cancel.clone(),
        deadline: limits.deadline,
        ..shim::LoadOptions::default()
    };
    let module = shim::parse_with(text, &opts).map_err(|e| match e {
        shim::LoadError::Cancelled => EngineError::LoadCancelled,
        shim::LoadError::DeadlineExceeded => EngineError::LoadDeadline,
        shim::LoadError::Budget { what, used, limit } => {
            EngineError::HostBudget { what, used, limit }
        }
        shim::LoadError::Ptx(e) => EngineError::ModuleLoad { log: e.to_string() },
    })?;
    let bytes = shim::host_bytes(&module, text);
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
