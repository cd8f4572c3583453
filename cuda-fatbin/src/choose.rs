//! The choice of the PTX a backend runs: the highest `compute_XX` at most the backend's arch
//! whose PTX ISA version the backend accepts. When none fits, the error lists what the fat
//! binary holds, so the library can print one line naming the program, that, and the fix.

use std::fmt;

use thiserror::Error;

use crate::{Entry, EntryKind, Fatbin, FatbinError, PtxIsa, ptx_text};

/// What the backend can run: the highest virtual arch (e.g. 90 for `compute_90`) and the
/// newest PTX ISA version (e.g. 9.0 for a CUDA 13.0 driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_arch: u32,
    pub max_isa: PtxIsa,
}

/// The PTX chosen, decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChosenPtx {
    pub arch: u32,
    pub isa: PtxIsa,
    pub text: String,
}

/// One entry a fat binary holds, for the error message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// PTX the backend cannot take (arch above its own, or ISA newer than it accepts).
    Ptx { arch: u32, isa: PtxIsa },
    /// SASS for `sm_XX` (never runnable by this project's backends).
    Sass { arch: u32 },
    /// Another kind of entry.
    Other { kind: u16, arch: u32 },
}

/// The fix to print with [`ChooseError::NoUsablePtx`].
pub const FIX: &str =
    "rebuild with PTX for a supported arch, e.g. nvcc -gencode arch=compute_80,code=compute_80";

/// Why no PTX was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChooseError {
    /// Nothing runnable. Display: "no PTX this GPU can run (found: sm_90 SASS; PTX 9.5 for
    /// compute_100, newer than 9.0); rebuild with ...".
    #[error("no PTX this GPU can run (found: {}); {FIX}", FoundList { found, limits })]
    NoUsablePtx { found: Vec<Found>, limits: Limits },
    /// The chosen entry was malformed (bad compression, sizes, text).
    #[error(transparent)]
    Entry(#[from] FatbinError),
}

struct FoundList<'a> {
    found: &'a [Found],
    limits: &'a Limits,
}

impl fmt::Display for FoundList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.found.is_empty() {
            return f.write_str("no entries");
        }
        let only = self.found.len() == 1;
        for (i, item) in self.found.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match *item {
                Found::Sass { arch } => write!(f, "sm_{arch} SASS")?,
                Found::Other { kind, arch } => write!(f, "entry of kind {kind} for arch {arch}")?,
                Found::Ptx { arch, isa } => {
                    write!(f, "PTX {isa} for compute_{arch}")?;
                    let l = self.limits;
                    if isa > l.max_isa {
                        write!(f, ", newer than {}", l.max_isa)?;
                    }
                    if arch > l.max_arch {
                        write!(f, ", above compute_{}", l.max_arch)?;
                    }
                }
            }
            if only && !matches!(item, Found::Ptx { .. }) {
                f.write_str(" only")?;
            }
        }
        Ok(())
    }
}

/// Chooses among the PTX entries of a fat binary: highest arch within `limits.max_arch`, then
/// highest ISA within `limits.max_isa`, and decompresses it.
pub fn choose_ptx(fatbin: &Fatbin<'_>, limits: Limits) -> Result<ChosenPtx, ChooseError> {
    choose_ptx_in(&fatbin.entries, limits)
}

/// [`choose_ptx`] over entries gathered from several fat binaries (e.g. a wrapper's and its
/// prelinked ones).
pub fn choose_ptx_in(entries: &[Entry<'_>], limits: Limits) -> Result<ChosenPtx, ChooseError> {
    let best = entries
        .iter()
        .filter(|e| {
            e.kind == EntryKind::Ptx && e.arch <= limits.max_arch && e.isa <= limits.max_isa
        })
        .max_by_key(|e| (e.arch, e.isa));
    match best {
        Some(e) => Ok(ChosenPtx {
            arch: e.arch,
            isa: e.isa,
            text: ptx_text(e)?,
        }),
        None => Err(ChooseError::NoUsablePtx {
            found: entries
                .iter()
                .map(|e| match e.kind {
                    EntryKind::Ptx => Found::Ptx {
                        arch: e.arch,
                        isa: e.isa,
                    },
                    EntryKind::Elf => Found::Sass { arch: e.arch },
                    EntryKind::Other(kind) => Found::Other { kind, arch: e.arch },
                })
                .collect(),
            limits,
        }),
    }
}
