//! `ptx`: a parser for a documented subset of NVIDIA PTX and a SIMT interpreter that runs
//! grids of CTAs on host threads, with instruction-granular preemption and save/restore.
//!
//! Pipeline: [`parse`] turns PTX text into a [`Module`] (decoded once into a compact IR with
//! dense register indices, resolved labels and immediate post-dominators). A [`Launch`] binds
//! one entry of a module to a [`LaunchConfig`]; [`Launch::run`] executes it against a
//! caller-supplied [`GlobalMemory`] (the engine's MMU) until it completes, faults or is
//! preempted through [`RunControl`]. [`Launch::save`] / [`Launch::restore`] serialize the
//! complete execution state. The supported subset is described in `docs/ptx-subset.md`.
//!
//! ```
//! use std::sync::Arc;
//! use ptx::{FlatMemory, Launch, LaunchConfig, Limits, RunControl, RunOutcome};
//!
//! let text = r#"
//! .version 8.0
//! .target sm_80
//! .address_size 64
//! .visible .entry twice(.param .u64 buf, .param .u32 n)
//! {
//!     .reg .pred %p<2>;
//!     .reg .b32 %r<6>;
//!     .reg .b64 %rd<4>;
//!     ld.param.u64 %rd1, [buf];
//!     ld.param.u32 %r1, [n];
//!     mov.u32 %r2, %ctaid.x;
//!     mov.u32 %r3, %ntid.x;
//!     mov.u32 %r4, %tid.x;
//!     mad.lo.s32 %r5, %r2, %r3, %r4;
//!     setp.ge.u32 %p1, %r5, %r1;
//!     @%p1 bra $L_end;
//!     mul.wide.u32 %rd2, %r5, 4;
//!     add.s64 %rd3, %rd1, %rd2;
//!     ld.global.u32 %r4, [%rd3];
//!     shl.b32 %r4, %r4, 1;
//!     st.global.u32 [%rd3], %r4;
//! $L_end:
//!     ret;
//! }
//! "#;
//! let module = Arc::new(ptx::parse(text)?);
//! let mem = FlatMemory::new(0x10_0000, 4096);
//! mem.write_u32s(0x10_0000, &[1, 2, 3]);
//! let mut params = 0x10_0000u64.to_le_bytes().to_vec();
//! params.extend_from_slice(&3u32.to_le_bytes());
//! let cfg = LaunchConfig { grid: [1, 1, 1], block: [32, 1, 1], dynamic_shared: 0, params };
//! let mut launch = Launch::new(module, "twice", cfg, &Limits::default())?;
//! assert!(matches!(launch.run(&mem, &RunControl::new(1)), RunOutcome::Completed(_)));
//! assert_eq!(mem.read_u32s(0x10_0000, 3), Some(vec![2, 4, 6]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Notes for engines:
//! - [`HostSpan::new`] is `unsafe`: spans returned by a translation must stay valid for the
//!   whole [`Launch::run`] call (the interpreter caches them in a per-worker TLB for that long)
//!   and must only be accessed atomically by others while the kernel runs.
//! - [`Stats`] in a [`RunOutcome`] count the work of that call; [`Launch::stats`] is
//!   cumulative (saved with the context).
//! - `RunControl::step_limit` counts warp-instructions per worker (exact with one worker).
//! - A faulted launch stays faulted; drop it. Dropping a preempted launch cancels it.
//! - Generic addresses at and above [`MODULE_WINDOW`] (module variables), [`SHARED_WINDOW`]
//!   and [`LOCAL_WINDOW`] never reach [`GlobalMemory`]; guest VAs must stay below them.
//! - A module with `.global`/`.const` variables ([`Module::has_variables`]) holds state shared
//!   by all its launches: give each isolation domain (VM) its own [`Module::instantiate`].

mod cfg;
pub mod ckpt;
mod context;
mod decode;
mod decode_cmp;
mod decode_half;
mod decode_mem;
mod decode_ops;
mod error;
mod exec;
mod inline;
mod ir;
mod lexer;
mod load;
mod memory;
mod module;
mod modvars;
mod parse_body;
mod parser;
mod writeset;

pub use error::{ContextError, LaunchError, Pos, PtxError};
pub use exec::launch::{KernelFault, Launch, LaunchConfig, Limits, RunControl, RunOutcome, Stats};
pub use exec::printf::PRINTF_BUFFER;
pub use load::LoadOptions;
pub use memory::{
    Access, FaultReason, FlatMemory, GlobalMemory, HostSpan, LOCAL_WINDOW, MODULE_WINDOW, MemFault,
    SHARED_WINDOW, WINDOW_SIZE,
};
pub use module::{EntryInfo, Module, ParamInfo};
pub use writeset::WriteSet;

/// Parse and decode PTX text into a [`Module`] within the default [`LoadOptions`]
/// (`parse_with(text, &LoadOptions::default())`).
///
/// Every input is treated as hostile: anything outside the documented subset gives a typed
/// [`PtxError`] naming the construct and its `line:col`.
pub fn parse(text: &str) -> Result<Module, PtxError> {
    parse_with(text, &LoadOptions::default())
}

/// Parse and decode PTX text into a [`Module`] within the budgets of `opts`: loading costs
/// time linear in the text's length plus the decoded module's size, and stops with
/// [`PtxError::Budget`] before a module-wide budget would be exceeded, with
/// [`PtxError::Cancelled`] soon after `opts.cancel` is set and with
/// [`PtxError::DeadlineExceeded`] once `opts.deadline` has passed.
pub fn parse_with(text: &str, opts: &LoadOptions) -> Result<Module, PtxError> {
    parser::parse_module(text, opts)
}
