//! Saved contexts of preempted jobs (in memory or bytes) and how a job's execution ends.

use std::any::Any;
use std::fmt;
use std::time::Duration;

use super::fault::JobFault;

/// Engine-private in-memory state of a preempted job: resumed as is by the engine that made it,
/// serialized only when asked.
pub trait LiveContext: Send + fmt::Debug {
    /// The state as bytes (what `SavedContext::from_bytes` takes back).
    fn to_bytes(&self) -> Vec<u8>;
    /// For the engine to recover its own type.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
    /// Whether this is a `switch::SwitchEngine` context (its own tag around an engine's
    /// context); every engine's own contexts keep the default.
    fn is_switch_tagged(&self) -> bool {
        false
    }
}

/// Eight bytes of a suspended launch's parameter buffer that change when its context is
/// re-targeted (`EngineSnapshot::retarget_context`): a bounds-checked twin's flag parameter
/// (vgpu's write sets, `ptx::ckpt::bounds::flag_offset`), whose word belongs to the engine
/// that ran it and means nothing to the one that resumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamPatch {
    /// Byte offset in the launch's parameter buffer.
    pub offset: u32,
    /// The new value (little-endian, as a `.u64` parameter).
    pub value: u64,
}

impl ParamPatch {
    /// Applies the patch to `params`; an error when the eight bytes are not all inside.
    pub fn apply(&self, params: &mut [u8]) -> Result<(), super::EngineError> {
        let at = self.offset as usize;
        match params.get_mut(at..at.saturating_add(8)) {
            Some(b) if b.len() == 8 => {
                b.copy_from_slice(&self.value.to_le_bytes());
                Ok(())
            }
            _ => Err(super::EngineError::BadContext(format!(
                "parameter patch at {at} outside the launch's {} parameter bytes",
                params.len()
            ))),
        }
    }
}

/// A preempted job's complete state. Either the engine's in-memory state (fast path: resuming
/// on the same engine needs no serialization) or bytes; [`SavedContext::to_bytes`] serializes the
/// former (store, send, migrate), [`SavedContext::from_bytes`] wraps the latter (validated when
/// resumed, never trusted before). Cloning and comparing serialize.
pub struct SavedContext(ContextRepr);

/// The two forms of a saved context.
pub(crate) enum ContextRepr {
    Bytes(Vec<u8>),
    Live(Box<dyn LiveContext>),
}

impl SavedContext {
    /// Wraps bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(ContextRepr::Bytes(bytes))
    }
    /// Wraps an engine's in-memory state.
    pub(crate) fn live(state: Box<dyn LiveContext>) -> Self {
        Self(ContextRepr::Live(state))
    }
    /// The state as bytes (serializes in-memory state; copies bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.0 {
            ContextRepr::Bytes(b) => b.clone(),
            ContextRepr::Live(l) => l.to_bytes(),
        }
    }
    /// Takes the state as bytes (serializes in-memory state).
    pub fn into_bytes(self) -> Vec<u8> {
        match self.0 {
            ContextRepr::Bytes(b) => b,
            ContextRepr::Live(l) => l.to_bytes(),
        }
    }
    /// Whether this is bytes (as opposed to in-memory state).
    pub fn is_bytes(&self) -> bool {
        matches!(self.0, ContextRepr::Bytes(_))
    }
    pub(crate) fn into_repr(self) -> ContextRepr {
        self.0
    }
}

impl Clone for SavedContext {
    fn clone(&self) -> Self {
        Self::from_bytes(self.to_bytes())
    }
}

impl PartialEq for SavedContext {
    fn eq(&self, other: &Self) -> bool {
        self.to_bytes() == other.to_bytes()
    }
}

impl Eq for SavedContext {}

impl fmt::Debug for SavedContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            ContextRepr::Bytes(b) => write!(f, "SavedContext({} bytes)", b.len()),
            ContextRepr::Live(l) => write!(f, "SavedContext(live {l:?})"),
        }
    }
}

/// How a job's execution ended. `gpu_time` is the wall time the engine spent on this call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The job finished.
    Completed {
        /// Engine time used.
        gpu_time: Duration,
    },
    /// The job stopped at a preemption request; `context` resumes it.
    Preempted {
        /// Saved state.
        context: SavedContext,
        /// Engine time used.
        gpu_time: Duration,
    },
    /// The job faulted and is over.
    Faulted {
        /// The fault.
        fault: JobFault,
        /// Engine time used.
        gpu_time: Duration,
    },
}

impl Outcome {
    /// Engine time the call used.
    pub fn gpu_time(&self) -> Duration {
        match self {
            Outcome::Completed { gpu_time }
            | Outcome::Preempted { gpu_time, .. }
            | Outcome::Faulted { gpu_time, .. } => *gpu_time,
        }
    }
}
