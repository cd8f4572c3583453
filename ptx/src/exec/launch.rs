//! Launch API: configuration, limits, run control, outcomes, and the `Launch` object that owns
//! a kernel's execution state across preemptions.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::error::{LaunchError, Pos};
use crate::exec::cta::Cta;
use crate::memory::{Access, FaultReason, GlobalMemory};
use crate::module::Module;

/// Grid, block, dynamic shared memory and the parameter buffer of a launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    /// CTAs per dimension (x, y, z).
    pub grid: [u32; 3],
    /// Threads per CTA per dimension (x, y, z).
    pub block: [u32; 3],
    /// Bytes of dynamic (`.extern .shared`) shared memory per CTA.
    pub dynamic_shared: u32,
    /// Parameter buffer laid out as [`crate::EntryInfo::params`] says; its length must equal
    /// [`crate::EntryInfo::param_size`].
    pub params: Vec<u8>,
}

/// Runtime limits a launch is validated against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Threads per CTA (product of block dims).
    pub max_threads_per_block: u32,
    /// Per-dimension block limits.
    pub max_block: [u32; 3],
    /// Per-dimension grid limits.
    pub max_grid: [u32; 3],
    /// Static + dynamic shared memory per CTA.
    pub max_shared_bytes: u32,
    /// Local memory per thread.
    pub max_local_bytes_per_thread: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_threads_per_block: 1024,
            max_block: [1024, 1024, 64],
            max_grid: [i32::MAX as u32, 65535, 65535],
            max_shared_bytes: 48 * 1024,
            max_local_bytes_per_thread: 16 * 1024,
        }
    }
}

/// Controls one [`Launch::run`] call.
#[derive(Debug, Default)]
pub struct RunControl {
    /// Set (from any thread) to preempt: the run stops within a few hundred warp-instructions
    /// per worker and returns [`RunOutcome::Preempted`]; the launch keeps its exact state.
    pub preempt: AtomicBool,
    /// Worker threads executing independent CTAs (0 is treated as 1; 1 runs on the caller).
    pub threads: usize,
    /// Deterministic preemption for tests: stop after this many warp-instructions in this call
    /// (exact with one thread, per worker with several).
    pub step_limit: Option<u64>,
    /// Preempt at this instant (a time slice's end), checked at the same points as `preempt`:
    /// the run stops within one polling quantum of it, with no thread woken to ask.
    pub deadline: Option<std::time::Instant>,
}

impl RunControl {
    /// A control with `threads` workers, not preempted, no step limit.
    pub fn new(threads: usize) -> Self {
        Self {
            preempt: AtomicBool::new(false),
            threads,
            step_limit: None,
            deadline: None,
        }
    }

    /// Whether the run must stop now: a preemption request or a passed deadline.
    #[inline]
    pub(crate) fn stop_requested(&self) -> bool {
        self.preempt.load(std::sync::atomic::Ordering::Relaxed)
            || self
                .deadline
                .is_some_and(|d| std::time::Instant::now() >= d)
    }
}

/// Instruction counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Sum over executed warp-instructions of active threads.
    pub thread_instructions: u64,
    /// Executed warp-instructions (including ones whose guard disabled every lane).
    pub warp_instructions: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, o: Stats) {
        self.thread_instructions += o.thread_instructions;
        self.warp_instructions += o.warp_instructions;
    }
}

/// A fault that aborted a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFault {
    /// Faulting address (global VA, shared/local/param offset, module-window address), or 0
    /// for `trap` and SIMT stack overflow.
    pub va: u64,
    /// Access kind.
    pub access: Access,
    /// Reason.
    pub reason: FaultReason,
    /// Instruction index in the entry's decoded code.
    pub pc: u32,
    /// Source position of that instruction.
    pub pos: Pos,
    /// CTA index (x, y, z).
    pub cta: [u32; 3],
    /// Thread index in the CTA (x, y, z) of the first faulting lane.
    pub thread: [u32; 3],
}

impl std::fmt::Display for KernelFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} fault ({:?}) at {:#x}, pc {} ({}), cta {:?}, thread {:?}",
            self.access, self.reason, self.va, self.pc, self.pos, self.cta, self.thread
        )
    }
}

/// Result of [`Launch::run`]. Stats count the work of this call only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// Every CTA finished.
    Completed(Stats),
    /// Stopped by [`RunControl`]; call `run` again (or `save`) to continue.
    Preempted(Stats),
    /// Aborted; the launch stays faulted (later runs return the same fault).
    Faulted(KernelFault),
}

/// One kernel launch and its complete execution state.
#[derive(Debug)]
pub struct Launch {
    pub(crate) module: Arc<Module>,
    pub(crate) entry: usize,
    pub(crate) cfg: LaunchConfig,
    pub(crate) shared_bytes: u32,
    pub(crate) total_ctas: u64,
    /// Next CTA (linear index) never started.
    pub(crate) next_cta: u64,
    /// CTAs started and preempted, with their exact state.
    pub(crate) pending: Vec<Cta>,
    pub(crate) fault: Option<KernelFault>,
    pub(crate) stats: Stats,
    /// Output of the kernel's `printf` calls not yet taken (not part of saved contexts).
    pub(crate) printf: Vec<u8>,
}

impl Launch {
    /// Validate `cfg` for `entry` of `module` against `limits` and prepare the launch.
    pub fn new(
        module: Arc<Module>,
        entry: &str,
        cfg: LaunchConfig,
        limits: &Limits,
    ) -> Result<Launch, LaunchError> {
        crate::exec::setup::new_launch(module, entry, cfg, limits)
    }

    /// The text the kernel's `printf` calls wrote since the last call (whole lines in the order
    /// the lanes ran them, as CUDA prints them at the next synchronisation). At most
    /// [`crate::PRINTF_BUFFER`] bytes are kept, like CUDA's printf FIFO: later output is dropped. A
    /// saved context does not carry it: take it before saving.
    pub fn take_printf_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.printf)
    }

    /// Execute until every CTA completes, a fault, or preemption through `ctl`.
    pub fn run(&mut self, mem: &dyn GlobalMemory, ctl: &RunControl) -> RunOutcome {
        crate::exec::sched::run(self, mem, ctl)
    }

    /// Serialize the complete execution state (versioned, bound to the module hash).
    pub fn save(&self) -> Vec<u8> {
        crate::context::save_into(self, Vec::new())
    }

    /// [`Launch::save`], appended to `out` (a container that nests the context writes it in
    /// place instead of copying it).
    pub fn save_into(&self, out: Vec<u8>) -> Vec<u8> {
        crate::context::save_into(self, out)
    }

    /// Rebuild a launch from [`Launch::save`] bytes. The bytes are hostile: everything is
    /// validated against `module` and `limits`; errors never panic.
    pub fn restore(
        module: Arc<Module>,
        bytes: &[u8],
        limits: &Limits,
    ) -> Result<Launch, crate::error::ContextError> {
        crate::context::restore(module, bytes, limits)
    }

    /// The module this launch runs.
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }

    /// Entry name.
    pub fn entry_name(&self) -> &str {
        &self.module.entries[self.entry].info.name
    }

    /// The launch configuration.
    pub fn config(&self) -> &LaunchConfig {
        &self.cfg
    }

    /// Sets the `.u64` parameter at byte `offset` to `value`; `false` (nothing changed) when
    /// the eight bytes are not inside the parameters. When it is a bounds-checked twin's flag
    /// parameter (`ckpt::bounds`), the threads already started get it too in the registers
    /// that hold it (a warp the interpreter stopped between the flag's load and its store),
    /// and with 0 their flag store's guard is cleared (a warp stopped after the zero test):
    /// a suspended twin re-pointed at another engine's flag word, or at none, stores nothing
    /// at the old one. Both are dead outside that window.
    pub fn patch_param_u64(&mut self, offset: usize, value: u64) -> bool {
        let Some(b) = self.cfg.params.get_mut(offset..offset.saturating_add(8)) else {
            return false;
        };
        if b.len() != 8 {
            return false;
        }
        b.copy_from_slice(&value.to_le_bytes());
        let entry = &self.module.entries[self.entry];
        if let Some(f) = &entry.flag_regs
            && f.param as usize == offset
        {
            for w in self.pending.iter_mut().flat_map(|c| c.warps.iter_mut()) {
                for &r in &f.regs {
                    let lanes = (r as usize * 32)..(r as usize * 32 + 32);
                    if let Some(v) = w.regs.get_mut(lanes) {
                        v.fill(value);
                    }
                }
                if value == 0
                    && let Some(p) = f.pred.and_then(|p| w.preds.get_mut(p as usize))
                {
                    *p = 0;
                }
            }
        }
        true
    }

    /// True when every CTA has finished.
    pub fn is_complete(&self) -> bool {
        self.fault.is_none() && self.next_cta >= self.total_ctas && self.pending.is_empty()
    }

    /// The fault that aborted this launch, if any.
    pub fn fault(&self) -> Option<&KernelFault> {
        self.fault.as_ref()
    }

    /// (CTAs finished, total CTAs).
    pub fn progress(&self) -> (u64, u64) {
        let started_unfinished = self.pending.len() as u64;
        (
            self.next_cta.saturating_sub(started_unfinished),
            self.total_ctas,
        )
    }

    /// Cumulative counts over all runs (including those before a save/restore).
    pub fn stats(&self) -> Stats {
        self.stats
    }
}
