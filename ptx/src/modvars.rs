//! Module-scope `.global` and `.const` variables: parsing of their declarations and
//! initializers, layout, and the storage that backs them. The storage belongs to the
//! [`crate::Module`] (like a CUDA module instance: every launch of the module sees the same
//! variables, and changes persist across launches); kernels address it through the
//! [`crate::MODULE_WINDOW`] of the generic address space. It is not part of saved contexts.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use crate::error::{Pos, PtxError};
use crate::ir::{Space, Ty};
use crate::lexer::Tok;
use crate::load::{Meter, elems, str_bytes};
use crate::memory::{Access, FaultReason};
use crate::parser::Parser;

/// Largest total size of module variables.
const MAX_BYTES: u64 = 64 << 20;

type R<T> = Result<T, PtxError>;

/// A declared module variable (before layout).
#[derive(Debug, Clone)]
pub(crate) struct RawModVar {
    pub name: String,
    pub space: Space,
    pub ty: Ty,
    pub align: u64,
    pub size: u64,
    /// Initializer elements as raw bits of `ty`.
    pub init: Vec<u64>,
    pub pos: Pos,
}

/// A laid-out module variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModVar {
    pub name: String,
    pub space: Space,
    pub offset: u64,
    pub size: u64,
}

/// Storage of a module's variables: `.const` ones first (read-only), then `.global` ones.
#[derive(Debug, Default)]
pub(crate) struct ModMem {
    words: Box<[AtomicU64]>,
    size: u64,
    const_end: u64,
    pub vars: Vec<ModVar>,
    /// Initial contents (from the PTX initializers), for fresh instances.
    initial: Vec<u8>,
}

/// Bits of a numeric initializer token converted to `ty`.
fn bits(tok: &Tok, neg: bool, ty: Ty) -> Option<u64> {
    let v = match (tok, ty) {
        (Tok::Int(v), Ty::F32) => {
            let i = if neg {
                (*v as i64).wrapping_neg()
            } else {
                *v as i64
            };
            u64::from((i as f32).to_bits())
        }
        (Tok::Int(v), Ty::F64) => {
            let i = if neg {
                (*v as i64).wrapping_neg()
            } else {
                *v as i64
            };
            (i as f64).to_bits()
        }
        (Tok::Int(v), _) => {
            if neg {
                v.wrapping_neg()
            } else {
                *v
            }
        }
        (Tok::F32(b), Ty::F64) => {
            let f = f64::from(f32::from_bits(*b));
            (if neg { -f } else { f }).to_bits()
        }
        (Tok::F32(b), _) => u64::from(if neg { b ^ 0x8000_0000 } else { *b }),
        (Tok::F64(b), Ty::F32) => {
            let f = f64::from_bits(*b) as f32;
            u64::from((if neg { -f } else { f }).to_bits())
        }
        (Tok::F64(b), _) => {
            if neg {
                b ^ (1 << 63)
            } else {
                *b
            }
        }
        _ => return None,
    };
    Some(v & ty.mask())
}

/// Parse `[.align N] .type name[dims]... [= init];` after `.global` / `.const`.
pub(crate) fn parse_mod_var(p: &mut Parser, space: Space, pos: Pos) -> R<RawModVar> {
    let mut align = 0u64;
    let mut ty = None;
    let name = loop {
        let t = p.ident()?;
        if t == ".align" {
            align = p.int()?;
        } else if let Some(x) = t.strip_prefix('.').and_then(Ty::from_name) {
            ty = Some(x);
        } else if t.starts_with('.') {
            return Err(PtxError::UnsupportedDirective { pos, name: t });
        } else {
            break t;
        }
    };
    let ty = match ty {
        Some(t) if t != Ty::Pred => t,
        _ => return p.err("module variable without a storage type"),
    };
    let mut count = 1u64;
    let mut unsized_ = false;
    while p.eat_punct('[') {
        if p.eat_punct(']') {
            unsized_ = true;
            continue;
        }
        count = count.saturating_mul(p.int()?);
        p.expect_punct(']')?;
    }
    let mut init = Vec::new();
    if p.eat_punct('=') {
        let mut depth = 0u32;
        loop {
            let neg = p.eat_punct('-');
            let epos = p.pos();
            match p.next()? {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') if depth > 0 => depth -= 1,
                Tok::Punct(',') if depth > 0 => {}
                t @ (Tok::Int(_) | Tok::F32(_) | Tok::F64(_)) => {
                    p.meter.tick()?;
                    p.meter.alloc(elems::<u64>(1))?;
                    init.push(bits(&t, neg, ty).ok_or(PtxError::Syntax {
                        pos: epos,
                        msg: "bad initializer".into(),
                    })?)
                }
                _ => {
                    return Err(PtxError::UnsupportedDirective {
                        pos: epos,
                        name: "initializer (only numbers)".into(),
                    });
                }
            }
            if depth == 0 {
                break;
            }
            if init.len() as u64 > MAX_BYTES {
                return p.err("initializer too long");
            }
        }
    }
    p.expect_punct(';')?;
    p.meter.alloc(elems::<RawModVar>(1) + str_bytes(&name))?;
    if unsized_ {
        count = count.max(init.len() as u64);
    }
    let size = count.saturating_mul(u64::from(ty.bytes()));
    if init.len() as u64 > count || size > MAX_BYTES {
        return Err(PtxError::TooLarge {
            pos,
            what: format!("module variable `{name}`"),
        });
    }
    let align = if align == 0 {
        u64::from(ty.bytes())
    } else {
        align
    };
    if !align.is_power_of_two() || align > 4096 {
        return p.err(format!("bad alignment {align}"));
    }
    Ok(RawModVar {
        name,
        space,
        ty,
        align,
        size,
        init,
        pos,
    })
}

impl RawModVar {
    /// Host bytes charged for this declaration while loading (see `parse_mod_var`).
    pub(crate) fn bytes(&self) -> u64 {
        elems::<RawModVar>(1) + str_bytes(&self.name) + elems::<u64>(self.init.len())
    }
}

impl ModMem {
    /// Lay out and initialize the variables (`.const` first, then `.global`); the storage and
    /// its initial image are charged to `meter` before they are allocated.
    pub(crate) fn build(raw: &[RawModVar], meter: &mut Meter) -> R<ModMem> {
        let mut vars = Vec::new();
        let mut off = 0u64;
        let mut const_end = 0u64;
        let mut placed = Vec::new();
        let mut names = std::collections::HashSet::new();
        for pass in [Space::Const, Space::Global] {
            for v in raw.iter().filter(|v| v.space == pass) {
                if !names.insert(v.name.as_str()) {
                    return Err(PtxError::Duplicate {
                        pos: v.pos,
                        name: v.name.clone(),
                    });
                }
                off = off.div_ceil(v.align) * v.align;
                vars.push(ModVar {
                    name: v.name.clone(),
                    space: v.space,
                    offset: off,
                    size: v.size,
                });
                placed.push((off, v));
                meter.alloc(elems::<ModVar>(1) + str_bytes(&v.name))?;
                off += v.size;
                if off > MAX_BYTES {
                    return Err(PtxError::TooLarge {
                        pos: v.pos,
                        what: "module variables".into(),
                    });
                }
            }
            if pass == Space::Const {
                const_end = off;
            }
        }
        vars.shrink_to_fit();
        // Storage and initial image.
        meter.alloc(Self::storage_bytes(off))?;
        meter.check()?;
        let words: Box<[AtomicU64]> = (0..off.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        let mut m = ModMem {
            words,
            size: off,
            const_end,
            vars,
            initial: Vec::new(),
        };
        for (base, v) in placed {
            let eb = u64::from(v.ty.bytes());
            for (k, b) in v.init.iter().enumerate() {
                meter.tick()?;
                let at = base + k as u64 * eb;
                for i in 0..eb {
                    m.byte(at + i).store((b >> (8 * i)) as u8, Relaxed);
                }
            }
        }
        m.initial = m.read(0, m.size);
        Ok(m)
    }

    /// Host bytes of the storage and the initial image of `size` bytes of variables.
    fn storage_bytes(size: u64) -> u64 {
        2 * size.next_multiple_of(8)
    }

    /// Host bytes this storage holds: the variables, their initial image and the name table.
    pub(crate) fn host_bytes(&self) -> u64 {
        elems::<AtomicU64>(self.words.len())
            + self.initial.capacity() as u64
            + elems::<ModVar>(self.vars.capacity())
            + self.vars.iter().map(|v| str_bytes(&v.name)).sum::<u64>()
    }

    /// The initial contents of the whole storage (from the PTX initializers).
    pub(crate) fn initial(&self) -> &[u8] {
        &self.initial
    }

    /// A new storage with the same layout and the initial contents.
    pub(crate) fn fresh(&self) -> ModMem {
        let words: Box<[AtomicU64]> = (0..self.size.div_ceil(8))
            .map(|_| AtomicU64::new(0))
            .collect();
        let m = ModMem {
            words,
            size: self.size,
            const_end: self.const_end,
            vars: self.vars.clone(),
            initial: self.initial.clone(),
        };
        m.write(0, &self.initial);
        m
    }

    fn byte(&self, off: u64) -> &AtomicU8 {
        let p = self
            .words
            .as_ptr()
            .cast::<u8>()
            .cast_mut()
            .wrapping_add(off as usize);
        // SAFETY: callers pass `off < size <= 8 * words.len()`, so `p` is inside the live
        // allocation; AtomicU64 is interior-mutable, so byte-wise atomic access is allowed.
        unsafe { AtomicU8::from_ptr(p) }
    }

    /// Host pointer for `size` bytes at offset `off`, checked for bounds, natural alignment and
    /// (for writes and atomics) the read-only `.const` segment. The pointer stays valid as long
    /// as `self`; every access through it must be atomic.
    pub(crate) fn ptr(&self, off: u64, size: u64, access: Access) -> Result<*mut u8, FaultReason> {
        if !off.is_multiple_of(size) {
            return Err(FaultReason::Misaligned);
        }
        if off.checked_add(size).is_none_or(|e| e > self.size) {
            return Err(FaultReason::Unmapped);
        }
        if access != Access::Read && off < self.const_end {
            return Err(FaultReason::ReadOnly);
        }
        Ok(self
            .words
            .as_ptr()
            .cast::<u8>()
            .cast_mut()
            .wrapping_add(off as usize))
    }

    /// The variable `name`.
    pub(crate) fn var(&self, name: &str) -> Option<&ModVar> {
        self.vars.iter().find(|v| v.name == name)
    }

    /// Copy of `len` bytes at `off`.
    pub(crate) fn read(&self, off: u64, len: u64) -> Vec<u8> {
        (off..off + len)
            .map(|i| self.byte(i).load(Relaxed))
            .collect()
    }

    /// Overwrite bytes at `off` (bounds checked by the caller).
    pub(crate) fn write(&self, off: u64, data: &[u8]) {
        for (i, b) in data.iter().enumerate() {
            self.byte(off + i as u64).store(*b, Relaxed);
        }
    }
}
