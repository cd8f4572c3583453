//! Budgets and cancellation for loading one module: [`LoadOptions`] (the caller's bounds) and
//! the `Meter` that every loading stage (lexing, parsing, inlining, decoding, variable
//! initialisation) charges as its work and memory grow, so that a hostile text is refused
//! before the work is done or the memory allocated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

use crate::error::PtxError;

/// Budgets and cancellation for loading one module (all hostile-input bounds in one place).
///
/// Besides these, fixed bounds of the interpreter apply (see `docs/ptx-subset.md`, "Load
/// limits"): 4 Mi tokens; 2^18 registers per module, declared or copied by inlining; 65536
/// registers used per entry; call depth 8; 64 MiB of module variables.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Most decoded instructions in the whole module after inlining, all entries together.
    /// Labels after inlining are bounded by the same number. Default 2^17 (131072).
    pub max_instructions: usize,
    /// Most host bytes the loaded module may hold (decoded code, register/label tables,
    /// module variables); see Module::host_bytes. Checked while loading against a running
    /// estimate of everything the load holds at that moment (the text's tokens, parsed
    /// statements, register/label tables, decoded code, module variables), so it bounds the
    /// peak memory of loading as well as [`crate::Module::host_bytes`]. Default 256 MiB.
    pub max_host_bytes: u64,
    /// Loading stops with PtxError::Cancelled soon after this flag becomes true.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Loading stops with PtxError::DeadlineExceeded once this instant has passed.
    pub deadline: Option<Instant>,
}

impl Default for LoadOptions {
    /// `max_instructions` 2^17 (the largest suite or nvcc test module has under 2000),
    /// `max_host_bytes` 256 MiB (room for the 64 MiB of module variables the interpreter
    /// accepts, which take twice their size: storage and initial image), no cancel flag, no
    /// deadline.
    fn default() -> Self {
        LoadOptions {
            max_instructions: 1 << 17,
            max_host_bytes: 256 << 20,
            cancel: None,
            deadline: None,
        }
    }
}

/// Most registers (declared in the text, plus their copies made by inlining) in a module.
pub(crate) const MAX_MODULE_REGS: u64 = 1 << 18;

/// The cancel flag and deadline are looked at once per this many ticks.
const CHECK_EVERY: u32 = 1024;

type R<T> = Result<T, PtxError>;

/// Running counts of one load, checked against its [`LoadOptions`].
#[derive(Debug)]
pub(crate) struct Meter {
    max_instructions: u64,
    max_host_bytes: u64,
    cancel: Option<Arc<AtomicBool>>,
    deadline: Option<Instant>,
    instructions: u64,
    labels: u64,
    registers: u64,
    /// Estimated host bytes the load holds now.
    live: u64,
    /// Most `live` has been.
    peak: u64,
    ticks: u32,
    /// Cancel/deadline checks done (for tests).
    pub(crate) checks: u64,
}

fn budget(what: &'static str, used: u64, limit: u64) -> PtxError {
    PtxError::Budget { what, used, limit }
}

impl Meter {
    pub(crate) fn new(opts: &LoadOptions) -> Meter {
        Meter {
            max_instructions: opts.max_instructions as u64,
            max_host_bytes: opts.max_host_bytes,
            cancel: opts.cancel.clone(),
            deadline: opts.deadline,
            instructions: 0,
            labels: 0,
            registers: 0,
            live: 0,
            peak: 0,
            ticks: 0,
            checks: 0,
        }
    }

    /// One unit of work (a character run, token, statement, instruction, element): checks the
    /// cancel flag and the deadline every [`CHECK_EVERY`] ticks.
    #[inline]
    pub(crate) fn tick(&mut self) -> R<()> {
        self.ticks = self.ticks.wrapping_add(1);
        if self.ticks.is_multiple_of(CHECK_EVERY) {
            self.check()
        } else {
            Ok(())
        }
    }

    /// `n` units of work at once.
    pub(crate) fn ticks(&mut self, n: u64) -> R<()> {
        let before = self.ticks;
        self.ticks = self.ticks.wrapping_add(n.min(u64::from(u32::MAX)) as u32);
        if n >= u64::from(CHECK_EVERY) || self.ticks / CHECK_EVERY != before / CHECK_EVERY {
            self.check()
        } else {
            Ok(())
        }
    }

    /// Check the cancel flag and the deadline now.
    pub(crate) fn check(&mut self) -> R<()> {
        self.checks += 1;
        if self.cancel.as_ref().is_some_and(|c| c.load(Relaxed)) {
            return Err(PtxError::Cancelled);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(PtxError::DeadlineExceeded);
        }
        Ok(())
    }

    /// Charge `n` decoded instructions (after inlining) to the module.
    pub(crate) fn instructions(&mut self, n: u64) -> R<()> {
        let used = self.instructions.saturating_add(n);
        if used > self.max_instructions {
            return Err(budget("instructions", used, self.max_instructions));
        }
        self.instructions = used;
        Ok(())
    }

    /// Charge `n` labels (after inlining) to the module.
    pub(crate) fn labels(&mut self, n: u64) -> R<()> {
        let used = self.labels.saturating_add(n);
        if used > self.max_instructions {
            return Err(budget("labels", used, self.max_instructions));
        }
        self.labels = used;
        Ok(())
    }

    /// Charge `n` registers (declared, or copied by inlining) to the module.
    pub(crate) fn registers(&mut self, n: u64) -> R<()> {
        let used = self.registers.saturating_add(n);
        if used > MAX_MODULE_REGS {
            return Err(budget("registers", used, MAX_MODULE_REGS));
        }
        self.registers = used;
        Ok(())
    }

    /// Charge `bytes` the load is about to hold; refused (nothing charged) over the budget.
    pub(crate) fn alloc(&mut self, bytes: u64) -> R<()> {
        let used = self.live.saturating_add(bytes);
        if used > self.max_host_bytes {
            return Err(budget("host bytes", used, self.max_host_bytes));
        }
        self.live = used;
        self.peak = self.peak.max(used);
        Ok(())
    }

    /// Give back `bytes` charged earlier whose memory the load has dropped.
    pub(crate) fn free(&mut self, bytes: u64) {
        self.live = self.live.saturating_sub(bytes);
    }

    /// Most host bytes the load held at once (estimate).
    pub(crate) fn peak(&self) -> u64 {
        self.peak
    }
}

/// Estimated heap bytes of a string (allocator rounding included).
pub(crate) fn str_bytes(s: &str) -> u64 {
    if s.is_empty() {
        0
    } else {
        (s.len() as u64).next_multiple_of(8) + 8
    }
}

/// Estimated bytes of one hash-map entry of `(K, V)` (table slack of up to half included),
/// not counting what the key and value point to.
pub(crate) fn map_entry<K, V>() -> u64 {
    2 * (std::mem::size_of::<(K, V)>() as u64 + 1)
}

/// Bytes of `n` elements of `T`.
pub(crate) fn elems<T>(n: usize) -> u64 {
    (n as u64).saturating_mul(std::mem::size_of::<T>() as u64)
}
