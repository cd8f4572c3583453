//! `ptx`: a parser for a documented subset of NVIDIA PTX and a SIMT interpreter that runs
//! grids of CTAs on host threads, with instruction-granular preemption and save/restore.
//!
//! Pipeline: [`parse`] turns PTX text into a [`Module`] (decoded once into a compact IR with
//! dense register indices, resolved labels and immediate post-dominators). A [`Launch`] binds
//! one entry of a module to a [`LaunchConfig`]; [`Launch::run`] executes it against a
//! caller-supplied [`GlobalMemory`] (the engine's MMU) until it completes, faults or is
//! preempted through [`RunControl`]. [`Launch::save`] / [`Launch::restore`] serialize the
//! complete execution state. The supported subset is described in `docs/ptx-subset.md`.

mod cfg;
mod context;
mod decode;
mod decode_ops;
mod error;
mod exec;
mod ir;
mod lexer;
mod memory;
mod module;
mod parser;

pub use error::{ContextError, LaunchError, Pos, PtxError};
pub use exec::launch::{KernelFault, Launch, LaunchConfig, Limits, RunControl, RunOutcome, Stats};
pub use memory::{
    Access, FaultReason, FlatMemory, GlobalMemory, HostSpan, LOCAL_WINDOW, MemFault, SHARED_WINDOW,
    WINDOW_SIZE,
};
pub use module::{EntryInfo, Module, ParamInfo};

/// Parse and decode PTX text into a [`Module`].
///
/// Every input is treated as hostile: anything outside the documented subset gives a typed
/// [`PtxError`] naming the construct and its `line:col`.
pub fn parse(text: &str) -> Result<Module, PtxError> {
    parser::parse_module(text)
}
