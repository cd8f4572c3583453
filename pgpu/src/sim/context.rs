//! Saved contexts of the sim engine: the in-memory state of a preempted job (resumed without any
//! serialization on the same engine) and its byte format.
//!
//! Byte layout, little endian, trailer last so that a kernel's interpreter state is never copied:
//! `body ++ space (u64) ++ kind (u8) ++ magic "PGPUCTX2"`. For a launch, body = the
//! `ptx::Launch::save` bytes ++ module id (u64); for a copy, body = src, dst, len, done (u64 each).
//! For a checkpointed launch (`KIND_CKPT`), body = `super::ckpt::encode_body` (the launch and its
//! save area). Decoding treats the bytes as hostile and borrows the interpreter state.

use std::any::Any;

use thiserror::Error;

use crate::engine::{LiveContext, ModuleId, SpaceId};

const MAGIC: &[u8; 8] = b"PGPUCTX2";
const KIND_COPY: u8 = 1;
const KIND_LAUNCH: u8 = 2;
const KIND_CKPT: u8 = 3;

/// Errors decoding a saved context.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ContextError {
    #[error("not a pgpu sim context")]
    BadMagic,
    #[error("context truncated")]
    Truncated,
    #[error("unknown job kind {0}")]
    BadKind(u8),
    #[error("copy progress {done:#x} beyond length {len:#x}")]
    BadProgress { done: u64, len: u64 },
    #[error("trailing bytes")]
    Trailing,
}

/// A copy's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyState {
    pub space: SpaceId,
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    pub done: u64,
}

/// A decoded context, borrowing the interpreter state from the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    Copy(CopyState),
    Launch {
        space: SpaceId,
        module: ModuleId,
        state: &'a [u8],
    },
    /// A checkpointed launch: the body for `super::ckpt` to decode.
    Ckpt {
        space: SpaceId,
        body: &'a [u8],
    },
}

/// The in-memory state of a preempted job of one sim engine.
pub struct Live {
    /// Identity of the engine that may resume it without serialization.
    pub engine: u64,
    pub job: LiveJob,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.job {
            LiveJob::Copy(c) => write!(f, "copy in {:?}, {:#x}/{:#x} done", c.space, c.done, c.len),
            LiveJob::Launch { space, launch, .. } => {
                let (done, total) = launch.progress();
                write!(
                    f,
                    "{} in {space:?}, {done}/{total} CTAs done",
                    launch.entry_name()
                )
            }
            LiveJob::Ckpt(j) => write!(f, "{j:?}"),
        }
    }
}

/// What was preempted.
pub enum LiveJob {
    Copy(CopyState),
    Launch {
        space: SpaceId,
        module: ModuleId,
        launch: Box<ptx::Launch>,
    },
    /// A checkpointed launch between runs (its state is in its save area).
    Ckpt(super::ckpt::CkJob),
}

impl LiveContext for Live {
    fn to_bytes(&self) -> Vec<u8> {
        match &self.job {
            LiveJob::Copy(c) => encode_copy(c),
            LiveJob::Launch {
                space,
                module,
                launch,
            } => encode_launch(*space, *module, launch.save()),
            LiveJob::Ckpt(j) => {
                let mut b = super::ckpt::encode_body(j);
                trailer(&mut b, j.launch.space, KIND_CKPT);
                b
            }
        }
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

fn trailer(out: &mut Vec<u8>, space: SpaceId, kind: u8) {
    out.extend_from_slice(&space.0.to_le_bytes());
    out.push(kind);
    out.extend_from_slice(MAGIC);
}

/// Bytes of a copy context.
pub fn encode_copy(c: &CopyState) -> Vec<u8> {
    let mut out = Vec::with_capacity(49);
    for v in [c.src, c.dst, c.len, c.done] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    trailer(&mut out, c.space, KIND_COPY);
    out
}

/// Bytes of a launch context, reusing `state`'s allocation.
/// A checkpointed launch's context bytes (`body` as `Decoded::Ckpt` gives it) moved to
/// `space`, and to `module` when given (the body starts with the module id).
pub fn encode_ckpt(space: SpaceId, module: Option<ModuleId>, body: &[u8]) -> Vec<u8> {
    let mut b = body.to_vec();
    if let Some(m) = module
        && b.len() >= 8
    {
        b[..8].copy_from_slice(&m.0.to_le_bytes());
    }
    trailer(&mut b, space, KIND_CKPT);
    b
}

pub fn encode_launch(space: SpaceId, module: ModuleId, mut state: Vec<u8>) -> Vec<u8> {
    state.reserve_exact(25);
    state.extend_from_slice(&module.0.to_le_bytes());
    trailer(&mut state, space, KIND_LAUNCH);
    state
}

fn split_u64(b: &[u8]) -> Result<(&[u8], u64), ContextError> {
    let at = b.len().checked_sub(8).ok_or(ContextError::Truncated)?;
    let (rest, v) = b.split_at(at);
    let mut a = [0u8; 8];
    a.copy_from_slice(v);
    Ok((rest, u64::from_le_bytes(a)))
}

/// Decodes hostile bytes.
pub fn decode(bytes: &[u8]) -> Result<Decoded<'_>, ContextError> {
    let at = bytes
        .len()
        .checked_sub(MAGIC.len())
        .ok_or(ContextError::Truncated)?;
    let (rest, magic) = bytes.split_at(at);
    if magic != MAGIC {
        return Err(ContextError::BadMagic);
    }
    let (&kind, rest) = rest.split_last().ok_or(ContextError::Truncated)?;
    let (rest, space) = split_u64(rest)?;
    let space = SpaceId(space);
    match kind {
        KIND_COPY => {
            let (rest, done) = split_u64(rest)?;
            let (rest, len) = split_u64(rest)?;
            let (rest, dst) = split_u64(rest)?;
            let (rest, src) = split_u64(rest)?;
            if !rest.is_empty() {
                return Err(ContextError::Trailing);
            }
            if done > len {
                return Err(ContextError::BadProgress { done, len });
            }
            Ok(Decoded::Copy(CopyState {
                space,
                src,
                dst,
                len,
                done,
            }))
        }
        KIND_LAUNCH => {
            let (state, module) = split_u64(rest)?;
            Ok(Decoded::Launch {
                space,
                module: ModuleId(module),
                state,
            })
        }
        KIND_CKPT => Ok(Decoded::Ckpt { space, body: rest }),
        k => Err(ContextError::BadKind(k)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile_bytes() {
        let c = CopyState {
            space: SpaceId(3),
            src: 1,
            dst: 2,
            len: 10,
            done: 4,
        };
        let b = encode_copy(&c);
        assert_eq!(decode(&b), Ok(Decoded::Copy(c)));
        for cut in 0..b.len() {
            assert!(decode(&b[cut + 1..]).is_err(), "cut {cut}");
        }
        let mut long = vec![0u8];
        long.extend_from_slice(&b);
        assert_eq!(decode(&long), Err(ContextError::Trailing));
        let l = encode_launch(SpaceId(1), ModuleId(7), vec![1, 2, 3]);
        let want = Decoded::Launch {
            space: SpaceId(1),
            module: ModuleId(7),
            state: &[1, 2, 3],
        };
        assert_eq!(decode(&l), Ok(want));
        let mut bad = b.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(decode(&bad), Err(ContextError::BadMagic));
        let mut bad = b.clone();
        let k = bad.len() - 9;
        bad[k] = 9;
        assert_eq!(decode(&bad), Err(ContextError::BadKind(9)));
        let over = CopyState { done: 11, ..c };
        assert_eq!(
            decode(&encode_copy(&over)),
            Err(ContextError::BadProgress { done: 11, len: 10 })
        );
        assert_eq!(decode(b"PGPUCTX2"), Err(ContextError::Truncated));
        assert_eq!(decode(&[]), Err(ContextError::Truncated));
    }
}
