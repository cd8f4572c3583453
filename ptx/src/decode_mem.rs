//! Decoding of memory and warp-level instructions: `ld`/`st` (spaces, vectors, cache and
//! ordering qualifiers), `atom`/`red`, `shfl`, `vote`.

use crate::decode::{Ctx, ROp};
use crate::decode_ops::{Mods, nops, one_storage_type, one_type, space_of};
use crate::error::PtxError;
use crate::ir::{AtomOp, Inst, ShflMode, Space, Src, Ty, VoteMode};

type R<T> = Result<T, PtxError>;

fn vec_n(m: &mut Mods) -> u8 {
    match m.take_any(&["v2", "v4"]) {
        Some("v2") => 2,
        Some("v4") => 4,
        _ => 1,
    }
}

pub(crate) fn dec_ldst(c: &mut Ctx, base: &str, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    m.take_any(&["weak", "volatile", "relaxed", "acquire", "release"]);
    m.take_any(&["cta", "gpu", "sys"]);
    let mut space = space_of(m);
    m.take("nc");
    m.take_any(&["ca", "cg", "cs", "lu", "cv", "wb", "wt"]);
    for hint in [
        "L1::evict_last",
        "L1::evict_first",
        "L1::no_allocate",
        "L1::evict_normal",
        "L2::evict_last",
        "L2::evict_first",
        "L2::cache_hint",
        "L2::64B",
        "L2::128B",
        "L2::256B",
    ] {
        m.take(hint);
    }
    let n = vec_n(m);
    let ty = one_storage_type(c, m)?;
    if ty == Ty::Pred {
        return c.unsupported();
    }
    nops(c, ops, 2)?;
    let (vals, addr) = if base == "st" {
        (&ops[1], &ops[0])
    } else {
        (&ops[0], &ops[1])
    };
    let (bsrc, off, sym_space) = c.addr(addr)?;
    if let Some(ss) = sym_space {
        if space == Space::Generic || (space == Space::Param && ss == Space::Local) {
            // `.param` accesses to call-site parameters (inlined calls) live in local memory.
            space = ss;
        } else if space != ss {
            return c.operr("symbol used in another state space");
        }
    }
    if base == "st" && space == Space::Const {
        return c.unsupported();
    }
    let list: Vec<ROp> = match vals {
        ROp::Vec(v) if v.len() == n as usize && n > 1 => v.clone(),
        v if n == 1 && !matches!(v, ROp::Vec(_)) => vec![v.clone()],
        _ => return c.operr("vector width does not match operands"),
    };
    if base == "st" {
        let mut a = [Src::Imm(0); 4];
        for (k, v) in list.iter().enumerate() {
            a[k] = c.src(v, ty)?;
        }
        Ok(Inst::St {
            space,
            ty,
            n,
            a,
            base: bsrc,
            off,
        })
    } else {
        let mut d = [0u32; 4];
        let mut dwidth = 64;
        for (k, v) in list.iter().enumerate() {
            d[k] = c.dst(v)?;
            dwidth = c.dst_bits(v);
        }
        Ok(Inst::Ld {
            space,
            ty,
            dwidth,
            n,
            d,
            base: bsrc,
            off,
        })
    }
}

pub(crate) fn dec_atom(c: &mut Ctx, base: &str, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    m.take_any(&["relaxed", "acquire", "release", "acq_rel"]);
    m.take_any(&["cta", "gpu", "sys"]);
    let mut space = space_of(m);
    let op = match m.take_any(&[
        "add", "min", "max", "and", "or", "xor", "exch", "cas", "inc", "dec",
    ]) {
        Some("add") => AtomOp::Add,
        Some("min") => AtomOp::Min,
        Some("max") => AtomOp::Max,
        Some("and") => AtomOp::And,
        Some("or") => AtomOp::Or,
        Some("xor") => AtomOp::Xor,
        Some("exch") => AtomOp::Exch,
        Some("cas") => AtomOp::Cas,
        Some("inc") => AtomOp::Inc,
        Some("dec") => AtomOp::Dec,
        _ => return c.unsupported(),
    };
    let ty = one_type(c, m)?;
    let ok = match op {
        AtomOp::Add => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::F32 | Ty::F64),
        AtomOp::Min | AtomOp::Max => matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64),
        AtomOp::And | AtomOp::Or | AtomOp::Xor => matches!(ty, Ty::B32 | Ty::B64),
        AtomOp::Exch | AtomOp::Cas => matches!(ty, Ty::B32 | Ty::B64),
        AtomOp::Inc | AtomOp::Dec => ty == Ty::U32,
    };
    if !ok || matches!(space, Space::Param | Space::Local | Space::Const) {
        return c.unsupported();
    }
    let red = base == "red";
    let want = usize::from(!red) + 2 + usize::from(op == AtomOp::Cas);
    nops(c, ops, want)?;
    let k = usize::from(!red);
    let d = if red { None } else { Some(c.dst(&ops[0])?) };
    let (bsrc, off, sym_space) = c.addr(&ops[k])?;
    if let Some(ss) = sym_space {
        if space == Space::Generic || (space == Space::Param && ss == Space::Local) {
            // `.param` accesses to call-site parameters (inlined calls) live in local memory.
            space = ss;
        } else if space != ss {
            return c.operr("symbol used in another state space");
        }
    }
    let b = c.src(&ops[k + 1], ty)?;
    let cc = if op == AtomOp::Cas {
        c.src(&ops[k + 2], ty)?
    } else {
        Src::Imm(0)
    };
    Ok(Inst::Atom {
        space,
        op,
        ty,
        d,
        base: bsrc,
        off,
        b,
        c: cc,
    })
}

pub(crate) fn dec_shfl(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let sync = m.take("sync");
    let mode = match m.take_any(&["up", "down", "bfly", "idx"]) {
        Some("up") => ShflMode::Up,
        Some("down") => ShflMode::Down,
        Some("bfly") => ShflMode::Bfly,
        Some("idx") => ShflMode::Idx,
        _ => return c.unsupported(),
    };
    if !m.take("b32") {
        return c.unsupported();
    }
    nops(c, ops, if sync { 5 } else { 4 })?;
    let (d, p) = match &ops[0] {
        ROp::Pair(a, b, pos) => (c.reg(a, *pos)?, Some(c.pred(b, *pos)?)),
        o => (c.dst(o)?, None),
    };
    if sync {
        c.src(&ops[4], Ty::B32)?;
    }
    Ok(Inst::Shfl {
        mode,
        d,
        p,
        a: c.src(&ops[1], Ty::B32)?,
        b: c.src(&ops[2], Ty::U32)?,
        c: c.src(&ops[3], Ty::U32)?,
    })
}

pub(crate) fn dec_vote(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let sync = m.take("sync");
    let mode = match m.take_any(&["all", "any", "uni", "ballot"]) {
        Some("all") => VoteMode::All,
        Some("any") => VoteMode::Any,
        Some("uni") => VoteMode::Uni,
        Some("ballot") => VoteMode::Ballot,
        _ => return c.unsupported(),
    };
    let want_ty = if mode == VoteMode::Ballot {
        "b32"
    } else {
        "pred"
    };
    if !m.take(want_ty) {
        return c.unsupported();
    }
    nops(c, ops, if sync { 3 } else { 2 })?;
    let mask = if sync {
        Some(c.src(&ops[2], Ty::B32)?)
    } else {
        None
    };
    let d = if mode == VoteMode::Ballot {
        c.dst(&ops[0])?
    } else {
        c.pdst(&ops[0])?
    };
    Ok(Inst::Vote {
        mode,
        d,
        a: c.psrc(&ops[1])?,
        mask,
    })
}

pub(crate) fn dec_redux(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    if !m.take("sync") {
        return c.unsupported();
    }
    let op = match m.take_any(&["add", "min", "max", "and", "or", "xor"]) {
        Some("add") => AtomOp::Add,
        Some("min") => AtomOp::Min,
        Some("max") => AtomOp::Max,
        Some("and") => AtomOp::And,
        Some("or") => AtomOp::Or,
        Some("xor") => AtomOp::Xor,
        _ => return c.unsupported(),
    };
    let ty = one_type(c, m)?;
    let ok = match op {
        AtomOp::Add | AtomOp::Min | AtomOp::Max => matches!(ty, Ty::U32 | Ty::S32),
        _ => ty == Ty::B32,
    };
    if !ok {
        return c.unsupported();
    }
    nops(c, ops, 3)?;
    let mask = c.src(&ops[2], Ty::B32)?;
    Ok(Inst::Redux {
        op,
        ty,
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], ty)?,
        mask,
    })
}

pub(crate) fn dec_match(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let all = match m.take_any(&["any", "all"]) {
        Some("any") => false,
        Some("all") => true,
        _ => return c.unsupported(),
    };
    if !m.take("sync") {
        return c.unsupported();
    }
    let ty = one_type(c, m)?;
    if !matches!(ty, Ty::B32 | Ty::B64) {
        return c.unsupported();
    }
    nops(c, ops, 3)?;
    let mask = c.src(&ops[2], Ty::B32)?;
    let (d, p) = match &ops[0] {
        ROp::Pair(a, b, pos) if all => (c.reg(a, *pos)?, Some(c.pred(b, *pos)?)),
        o => (c.dst(o)?, None),
    };
    Ok(Inst::Match {
        all,
        ty,
        d,
        p,
        a: c.src(&ops[1], ty)?,
        mask,
    })
}
