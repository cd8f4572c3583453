//! Error types of the crate: parse errors, launch validation errors and saved-context errors.

use thiserror::Error;

/// A source position (1-based line and column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Pos {
    /// 1-based line.
    pub line: u32,
    /// 1-based column (in characters).
    pub col: u32,
}

impl std::fmt::Display for Pos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// Errors from [`crate::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PtxError {
    /// Malformed text.
    #[error("{pos}: syntax error: {msg}")]
    Syntax {
        /// Where.
        pos: Pos,
        /// What was expected or found.
        msg: String,
    },
    /// An instruction (opcode with modifiers) outside the supported subset.
    #[error("{pos}: unsupported instruction `{name}`")]
    UnsupportedInstruction {
        /// Where.
        pos: Pos,
        /// The full opcode as written.
        name: String,
    },
    /// A directive outside the supported subset.
    #[error("{pos}: unsupported directive `{name}`")]
    UnsupportedDirective {
        /// Where.
        pos: Pos,
        /// The directive.
        name: String,
    },
    /// A register, symbol or label that is not declared.
    #[error("{pos}: undefined name `{name}`")]
    Undefined {
        /// Where.
        pos: Pos,
        /// The name.
        name: String,
    },
    /// A name declared twice in one scope.
    #[error("{pos}: duplicate name `{name}`")]
    Duplicate {
        /// Where.
        pos: Pos,
        /// The name.
        name: String,
    },
    /// Operands that do not fit the instruction (count, kind or type).
    #[error("{pos}: bad operands for `{inst}`: {msg}")]
    Operand {
        /// Where.
        pos: Pos,
        /// The instruction.
        inst: String,
        /// What is wrong.
        msg: String,
    },
    /// A size or count beyond the interpreter's fixed limits.
    #[error("{pos}: too large: {what}")]
    TooLarge {
        /// Where.
        pos: Pos,
        /// What overflowed.
        what: String,
    },
    /// Loading was cancelled through [`crate::LoadOptions::cancel`].
    #[error("module load cancelled")]
    Cancelled,
    /// Loading ran past [`crate::LoadOptions::deadline`].
    #[error("module load deadline exceeded")]
    DeadlineExceeded,
    /// A module-wide load budget ([`crate::LoadOptions`]) would be exceeded; the load stops
    /// before the work or memory is spent.
    #[error("module load budget exceeded: {what} {used} > {limit}")]
    Budget {
        /// What is counted: `"instructions"`, `"labels"`, `"registers"` or `"host bytes"`.
        what: &'static str,
        /// The amount the load would have reached.
        used: u64,
        /// The limit.
        limit: u64,
    },
}

/// Errors from [`crate::Launch::new`] (and the launch part of a restore).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// No `.entry` of this name in the module.
    #[error("unknown entry `{0}`")]
    UnknownEntry(String),
    /// The parameter buffer does not have the entry's exact parameter size.
    #[error("parameter buffer is {got} bytes, entry expects {expected}")]
    ParamSize {
        /// Entry's parameter size.
        expected: u32,
        /// Supplied size.
        got: usize,
    },
    /// A grid dimension is zero or beyond the limits.
    #[error("bad grid {0:?}")]
    BadGrid([u32; 3]),
    /// A block dimension is zero, beyond the limits, or violates `.reqntid`/`.maxntid`.
    #[error("bad block {0:?}")]
    BadBlock([u32; 3]),
    /// Static + dynamic shared memory exceeds the limit.
    #[error("shared memory {needed} bytes exceeds limit {max}")]
    SharedTooLarge {
        /// Bytes needed.
        needed: u64,
        /// Limit.
        max: u32,
    },
    /// Local memory per thread exceeds the limit.
    #[error("local memory {needed} bytes per thread exceeds limit {max}")]
    LocalTooLarge {
        /// Bytes needed.
        needed: u32,
        /// Limit.
        max: u32,
    },
    /// The interpreter state of one CTA (registers and local memory of all its threads) would
    /// exceed the interpreter's fixed bound.
    #[error("CTA state of {needed} bytes exceeds the interpreter bound of {max}")]
    CtaStateTooLarge {
        /// Bytes needed.
        needed: u64,
        /// Bound.
        max: u64,
    },
}

/// Errors from [`crate::Launch::restore`]: saved context bytes are hostile and fully validated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ContextError {
    /// The bytes end before the structure does.
    #[error("context truncated")]
    Truncated,
    /// Not a saved context of this crate.
    #[error("bad context magic")]
    BadMagic,
    /// Unsupported format version.
    #[error("unsupported context version {0}")]
    Version(u32),
    /// Saved for a different module text.
    #[error("context belongs to another module")]
    ModuleMismatch,
    /// A field is out of range or inconsistent.
    #[error("invalid context: {0}")]
    Invalid(&'static str),
    /// Extra bytes after the structure.
    #[error("trailing bytes in context")]
    Trailing,
    /// The saved launch configuration is not valid for this module/limits.
    #[error("saved launch is invalid: {0}")]
    Launch(#[from] LaunchError),
}
