//! Compiler-directed, incremental checkpoints in PTX (TripleC-style): a PTX-to-PTX
//! transformation that makes a kernel preemptible at compiler-chosen points, with save and
//! restore of the live registers (and the CTA's shared memory) in a save area, so that one
//! long CTA can be stopped and resumed by relaunching the same kernel.
//!
//! Pipeline, on the parser's own statement-level IR (never on text): [`module`] loads and
//! inlines, [`flow`] builds the CFG and liveness, [`points`] classifies the kernel and picks
//! the preemption points, [`layout`] fixes the per-thread record, [`incremental`] finds the
//! registers whose saved copy is still valid, [`emit`] rewrites the body and [`print`] prints
//! PTX. The contract (parameters, save area, flag, resume, the barrier/warp rules) is in
//! `docs/ptx-subset.md`, "Preemptible kernels".

mod module;
mod names;
mod print;

use crate::error::PtxError;
use crate::load::LoadOptions;

/// Parse `text` (within the budgets of `opts`), inline its `.func` calls and print it back as
/// PTX: the same kernels, accepted by this crate's parser and by `ptxas`.
pub fn print_module(text: &str, opts: &LoadOptions) -> Result<String, PtxError> {
    let m = module::load(text, opts)?;
    Ok(print::module(&m))
}
