//! Saved contexts of the sim engine: the in-memory state of a preempted job (resumed without any
//! serialization on the same engine) and its byte format.
//!
//! Byte layout: the project's one container ([`snapfmt`], magic `PGPUCTX\0`, version 3), a `JOB\0`
//! section (kind u8, space u64; a copy adds src, dst, len, done, a launch its module id, u64
//! each), then for a launch a `PTX\0` section holding the `ptx::Launch` context (itself a
//! container, written in place so that the interpreter state is never copied), for a
//! checkpointed launch (`KIND_CKPT`) a `CKPT` section holding `super::ckpt::encode_body` (the
//! launch and its save area; `KIND_CKPT_SAVE` for a launch of a restarting entry running in
//! the entry's checkpoint form — escalated, see `pgpu::ckpt::stalled`, or not provably
//! idempotent, see `pgpu::ckpt::choose`: readers before it refuse that kind by number). Version 2 put the fields in a trailer ending in the magic
//! `PGPUCTX2`; such bytes are refused by their version. Decoding treats the bytes as hostile and
//! borrows the interpreter state.

use std::any::Any;

use thiserror::Error;

use crate::engine::{LiveContext, ModuleId, SpaceId};

const FORMAT: snapfmt::Format = snapfmt::Format {
    magic: *b"PGPUCTX\0",
    version: 3,
    name: "sim engine context",
};
/// The trailer that ended a version-2 context.
const OLD_MAGIC: &[u8; 8] = b"PGPUCTX2";
const JOB: snapfmt::Id = *b"JOB\0";
const PTX: snapfmt::Id = *b"PTX\0";
const CKPT: snapfmt::Id = *b"CKPT";
const SECTION_VERSION: u32 = 1;
const KIND_COPY: u8 = 1;
const KIND_LAUNCH: u8 = 2;
const KIND_CKPT: u8 = 3;
const KIND_CKPT_SAVE: u8 = 4;

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
    #[error("sim engine context format version {0}; this build reads version 3")]
    Version(u32),
    #[error("{0}")]
    Frame(snapfmt::FrameError),
}

impl From<snapfmt::FrameError> for ContextError {
    fn from(e: snapfmt::FrameError) -> Self {
        use snapfmt::FrameError as F;
        match e {
            F::Magic { .. } => ContextError::BadMagic,
            F::Version { found, .. } => ContextError::Version(found),
            F::Truncated { .. } => ContextError::Truncated,
            F::Trailing => ContextError::Trailing,
            e => ContextError::Frame(e),
        }
    }
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
    /// A checkpointed launch: the body for `super::ckpt` to decode; `escalated`: in the
    /// checkpoint form of a restarting entry.
    Ckpt {
        space: SpaceId,
        body: &'a [u8],
        escalated: bool,
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
            } => {
                let mut w = job(KIND_LAUNCH, *space, &[module.0]);
                let open = w.begin(PTX, SECTION_VERSION);
                let buf = std::mem::take(w.buf());
                *w.buf() = launch.save_into(buf);
                w.end(open);
                w.finish()
            }
            LiveJob::Ckpt(j) => encode_ckpt(
                j.launch.space,
                None,
                &super::ckpt::encode_body(j),
                j.from.is_some(),
            ),
        }
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A container with its job section.
fn job(kind: u8, space: SpaceId, fields: &[u64]) -> snapfmt::Writer {
    let mut e = snapfmt::Enc::default();
    e.u8(kind).u64(space.0);
    for &v in fields {
        e.u64(v);
    }
    let mut w = snapfmt::Writer::new(&FORMAT);
    w.section(JOB, SECTION_VERSION, &e.0);
    w
}

/// Bytes of a copy context.
pub fn encode_copy(c: &CopyState) -> Vec<u8> {
    job(KIND_COPY, c.space, &[c.src, c.dst, c.len, c.done]).finish()
}

/// A checkpointed launch's context bytes (`body` as `Decoded::Ckpt` gives it) moved to
/// `space`, and to `module` when given (the body starts with the module id); `escalated`: the
/// save area is in the checkpoint form of a restarting entry.
pub fn encode_ckpt(
    space: SpaceId,
    module: Option<ModuleId>,
    body: &[u8],
    escalated: bool,
) -> Vec<u8> {
    let kind = if escalated { KIND_CKPT_SAVE } else { KIND_CKPT };
    let mut w = job(kind, space, &[]);
    let open = w.begin(CKPT, SECTION_VERSION);
    let at = w.buf().len();
    w.buf().extend_from_slice(body);
    if let Some(m) = module
        && body.len() >= 8
    {
        w.buf()[at..at + 8].copy_from_slice(&m.0.to_le_bytes());
    }
    w.end(open);
    w.finish()
}

/// Bytes of a launch context with the interpreter state `state` (`ptx::Launch::save` bytes).
pub fn encode_launch(space: SpaceId, module: ModuleId, state: &[u8]) -> Vec<u8> {
    let mut w = job(KIND_LAUNCH, space, &[module.0]);
    w.section(PTX, SECTION_VERSION, state);
    w.finish()
}

/// Decodes hostile bytes.
pub fn decode(bytes: &[u8]) -> Result<Decoded<'_>, ContextError> {
    if bytes.ends_with(OLD_MAGIC) {
        return Err(ContextError::Version(2));
    }
    let secs = snapfmt::read(&FORMAT, bytes, 2)?;
    let (head, rest) = secs.split_first().ok_or(ContextError::Truncated)?;
    if head.id != JOB {
        return Err(ContextError::BadMagic);
    }
    let mut d = snapfmt::Dec::new(head.payload_v(SECTION_VERSION)?, "job");
    let kind = d.u8()?;
    let space = SpaceId(d.u64()?);
    let second = |id: snapfmt::Id| -> Result<&[u8], ContextError> {
        match rest {
            [s] if s.id == id => Ok(s.payload_v(SECTION_VERSION)?),
            [] => Err(ContextError::Truncated),
            _ => Err(ContextError::Trailing),
        }
    };
    let decoded = match kind {
        KIND_COPY => {
            let (src, dst, len, done) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?);
            if !rest.is_empty() {
                return Err(ContextError::Trailing);
            }
            if done > len {
                return Err(ContextError::BadProgress { done, len });
            }
            Decoded::Copy(CopyState {
                space,
                src,
                dst,
                len,
                done,
            })
        }
        KIND_LAUNCH => Decoded::Launch {
            space,
            module: ModuleId(d.u64()?),
            state: second(PTX)?,
        },
        KIND_CKPT | KIND_CKPT_SAVE => Decoded::Ckpt {
            space,
            body: second(CKPT)?,
            escalated: kind == KIND_CKPT_SAVE,
        },
        k => return Err(ContextError::BadKind(k)),
    };
    if d.left() != 0 {
        return Err(ContextError::Trailing);
    }
    Ok(decoded)
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
            assert!(decode(&b[..cut]).is_err(), "cut {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(ContextError::Trailing));
        let mut long = vec![0u8];
        long.extend_from_slice(&b);
        assert_eq!(decode(&long), Err(ContextError::BadMagic));
        let l = encode_launch(SpaceId(1), ModuleId(7), &[1, 2, 3]);
        let want = Decoded::Launch {
            space: SpaceId(1),
            module: ModuleId(7),
            state: &[1, 2, 3],
        };
        assert_eq!(decode(&l), Ok(want));
        // A flipped byte fails the CRC-32; a forged kind (valid CRC) is refused by its value.
        let mut bad = b.clone();
        bad[snapfmt::HEADER + 16] ^= 1;
        assert!(matches!(decode(&bad), Err(ContextError::Frame(_))));
        assert_eq!(
            decode(&job(9, SpaceId(1), &[]).finish()),
            Err(ContextError::BadKind(9))
        );
        let over = CopyState { done: 11, ..c };
        assert_eq!(
            decode(&encode_copy(&over)),
            Err(ContextError::BadProgress { done: 11, len: 10 })
        );
        // A launch without its interpreter state, a copy with one.
        assert_eq!(
            decode(&job(KIND_LAUNCH, SpaceId(1), &[7]).finish()),
            Err(ContextError::Truncated)
        );
        let mut w = job(KIND_COPY, SpaceId(1), &[1, 2, 3, 0]);
        w.section(PTX, SECTION_VERSION, &[]);
        assert_eq!(decode(&w.finish()), Err(ContextError::Trailing));
        // A checkpointed body moved to another module keeps the rest of its bytes.
        for escalated in [false, true] {
            let body = [1, 0, 0, 0, 0, 0, 0, 0, 9];
            let k = encode_ckpt(SpaceId(2), Some(ModuleId(5)), &body, escalated);
            let want = Decoded::Ckpt {
                space: SpaceId(2),
                body: &[5, 0, 0, 0, 0, 0, 0, 0, 9],
                escalated,
            };
            assert_eq!(decode(&k), Ok(want));
        }
        // Version 2 (fields in a trailer ending in its magic) is refused by its number.
        let mut old = vec![0u8; 41];
        old.push(KIND_COPY);
        old.extend_from_slice(OLD_MAGIC);
        assert_eq!(decode(&old), Err(ContextError::Version(2)));
        assert_eq!(decode(b"PGPUCTX2"), Err(ContextError::Version(2)));
        assert_eq!(decode(&[]), Err(ContextError::Truncated));
    }
}
