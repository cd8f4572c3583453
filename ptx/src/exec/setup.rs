//! Launch validation: entry lookup, parameter size, grid/block/shared/local limits.

use std::sync::Arc;

use crate::error::LaunchError;
use crate::exec::launch::{Launch, LaunchConfig, Limits, Stats};
use crate::module::Module;

/// Validate and build a fresh launch.
pub(crate) fn new_launch(
    module: Arc<Module>,
    entry: &str,
    cfg: LaunchConfig,
    limits: &Limits,
) -> Result<Launch, LaunchError> {
    let idx = module
        .entry_index(entry)
        .ok_or_else(|| LaunchError::UnknownEntry(entry.chars().take(200).collect()))?;
    let shared_bytes = validate(&module, idx, &cfg, limits)?;
    let total_ctas = cfg.grid.iter().map(|&g| u64::from(g)).product();
    Ok(Launch {
        module,
        entry: idx,
        cfg,
        shared_bytes,
        total_ctas,
        next_cta: 0,
        pending: Vec::new(),
        fault: None,
        stats: Stats::default(),
        printf: Vec::new(),
    })
}

/// Check a configuration; returns the CTA's total shared-memory size.
pub(crate) fn validate(
    module: &Module,
    idx: usize,
    cfg: &LaunchConfig,
    limits: &Limits,
) -> Result<u32, LaunchError> {
    let info = &module.entries[idx].info;
    if cfg.params.len() != info.param_size as usize {
        return Err(LaunchError::ParamSize {
            expected: info.param_size,
            got: cfg.params.len(),
        });
    }
    if cfg.grid.contains(&0) || cfg.grid.iter().zip(limits.max_grid).any(|(g, m)| *g > m) {
        return Err(LaunchError::BadGrid(cfg.grid));
    }
    let threads: u64 = cfg.block.iter().map(|&b| u64::from(b)).product();
    let block_ok = !cfg.block.contains(&0)
        && cfg.block.iter().zip(limits.max_block).all(|(b, m)| *b <= m)
        && threads <= u64::from(limits.max_threads_per_block)
        && threads <= 1024 * 1024
        && info.reqntid.is_none_or(|r| r == cfg.block)
        && info
            .maxntid
            .is_none_or(|m| threads <= m.iter().map(|&x| u64::from(x.max(1))).product());
    if !block_ok {
        return Err(LaunchError::BadBlock(cfg.block));
    }
    let align = u64::from(info.dynamic_shared_align.max(1));
    let dyn_start = u64::from(info.static_shared_bytes).div_ceil(align) * align;
    let needed = dyn_start + u64::from(cfg.dynamic_shared);
    if needed > u64::from(limits.max_shared_bytes) {
        return Err(LaunchError::SharedTooLarge {
            needed,
            max: limits.max_shared_bytes,
        });
    }
    if info.local_bytes_per_thread > limits.max_local_bytes_per_thread {
        return Err(LaunchError::LocalTooLarge {
            needed: info.local_bytes_per_thread,
            max: limits.max_local_bytes_per_thread,
        });
    }
    // Registers (8 bytes per lane), predicates and local memory of every warp of a CTA.
    let entry = &module.entries[idx];
    let warps = threads.div_ceil(32);
    let state = warps
        * (u64::from(entry.nregs) * 32 * 8
            + u64::from(entry.npreds) * 4
            + u64::from(info.local_bytes_per_thread) * 32);
    if state > MAX_CTA_STATE {
        return Err(LaunchError::CtaStateTooLarge {
            needed: state,
            max: MAX_CTA_STATE,
        });
    }
    Ok(needed as u32)
}

/// Bound on one CTA's interpreter state (each worker holds one CTA at a time).
pub(crate) const MAX_CTA_STATE: u64 = 256 << 20;
