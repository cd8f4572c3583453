//! Saved-context format of the sim engine (bytes a preempted job resumes from).
//!
//! Layout, little endian: magic `PGPUCTX1`, kind (u8: 1 copy, 2 launch), space id (u64), then
//! for a copy: src, dst, len, done (u64 each); for a launch: module id (u64), length (u64) and
//! the `ptx::Launch::save` bytes. Decoding treats the bytes as hostile.

use thiserror::Error;

use crate::engine::{ModuleId, SpaceId};

const MAGIC: &[u8; 8] = b"PGPUCTX1";
const KIND_COPY: u8 = 1;
const KIND_LAUNCH: u8 = 2;

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

/// A decoded context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Saved {
    /// A copy, `done` bytes in.
    Copy {
        space: SpaceId,
        src: u64,
        dst: u64,
        len: u64,
        done: u64,
    },
    /// A kernel launch with its interpreter state.
    Launch {
        space: SpaceId,
        module: ModuleId,
        state: Vec<u8>,
    },
}

impl Saved {
    /// Encodes to bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        match self {
            Saved::Copy {
                space,
                src,
                dst,
                len,
                done,
            } => {
                out.push(KIND_COPY);
                for v in [space.0, *src, *dst, *len, *done] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            Saved::Launch {
                space,
                module,
                state,
            } => {
                out.reserve(25 + state.len());
                out.push(KIND_LAUNCH);
                for v in [space.0, module.0, state.len() as u64] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(state);
            }
        }
        out
    }

    /// Decodes hostile bytes.
    pub fn decode(bytes: &[u8]) -> Result<Saved, ContextError> {
        let mut r = Reader(bytes);
        if r.take(8)? != MAGIC {
            return Err(ContextError::BadMagic);
        }
        let kind = r.take(1)?[0];
        let space = SpaceId(r.u64()?);
        let saved = match kind {
            KIND_COPY => {
                let (src, dst, len, done) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                if done > len {
                    return Err(ContextError::BadProgress { done, len });
                }
                Saved::Copy {
                    space,
                    src,
                    dst,
                    len,
                    done,
                }
            }
            KIND_LAUNCH => {
                let module = ModuleId(r.u64()?);
                let n = usize::try_from(r.u64()?).map_err(|_| ContextError::Truncated)?;
                Saved::Launch {
                    space,
                    module,
                    state: r.take(n)?.to_vec(),
                }
            }
            k => return Err(ContextError::BadKind(k)),
        };
        if !r.0.is_empty() {
            return Err(ContextError::Trailing);
        }
        Ok(saved)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ContextError> {
        if self.0.len() < n {
            return Err(ContextError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64, ContextError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile_bytes() {
        let c = Saved::Copy {
            space: SpaceId(3),
            src: 1,
            dst: 2,
            len: 10,
            done: 4,
        };
        let l = Saved::Launch {
            space: SpaceId(1),
            module: ModuleId(7),
            state: vec![1, 2, 3],
        };
        for s in [&c, &l] {
            let b = s.encode();
            assert_eq!(&Saved::decode(&b).unwrap(), s);
            for cut in 0..b.len() {
                assert!(Saved::decode(&b[..cut]).is_err(), "truncated at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert_eq!(Saved::decode(&long), Err(ContextError::Trailing));
        }
        let mut b = c.encode();
        b[0] ^= 1;
        assert_eq!(Saved::decode(&b), Err(ContextError::BadMagic));
        let mut b = c.encode();
        b[8] = 9;
        assert_eq!(Saved::decode(&b), Err(ContextError::BadKind(9)));
        let bad = Saved::Copy {
            space: SpaceId(3),
            src: 1,
            dst: 2,
            len: 10,
            done: 11,
        }
        .encode();
        assert_eq!(
            Saved::decode(&bad),
            Err(ContextError::BadProgress { done: 11, len: 10 })
        );
        let mut huge = l.encode();
        huge[25..33].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(Saved::decode(&huge), Err(ContextError::Truncated));
    }
}
