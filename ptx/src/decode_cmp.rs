//! Decoding of comparisons (`setp`, `set`), conversions (`cvt`, with the PTX rules on
//! rounding modifiers), carry-chain arithmetic and barriers (`bar`/`barrier` `.sync`/`.red`).

use crate::decode::{Ctx, ROp};
use crate::decode_ops::{Mods, nops, one_type};
use crate::error::PtxError;
use crate::ir::{BarRedOp, BinOp, BoolOp, CarryOp, Cmp, FFlags, Inst, Rnd, Src, Ty};

type R<T> = Result<T, PtxError>;

pub(crate) fn dec_bar(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    if m.take("warp") {
        m.take("sync");
        return Ok(Inst::Nop);
    }
    let kind = m.take_any(&["sync", "red", "arrive"]);
    m.take("aligned");
    // Barrier id (and optional thread count): every barrier is CTA-wide.
    let id_ok = |o: &ROp| matches!(o, ROp::Int(_) | ROp::Name(..));
    match kind {
        Some("sync") => {
            if ops.is_empty() || ops.len() > 2 || !ops.iter().all(id_ok) {
                return c.operr("expected barrier id [, thread count]");
            }
            if ops.len() == 1 && !matches!(ops[0], ROp::Int(0)) {
                return c.unsupported();
            }
            Ok(Inst::Bar)
        }
        Some("red") => {
            let op = match m.take_any(&["popc", "and", "or"]) {
                Some("popc") if m.take("u32") => BarRedOp::Popc,
                Some("and") if m.take("pred") => BarRedOp::And,
                Some("or") if m.take("pred") => BarRedOp::Or,
                _ => return c.unsupported(),
            };
            if !(3..=4).contains(&ops.len()) || !id_ok(&ops[1]) {
                return c.operr("expected d, barrier id, [count,] predicate");
            }
            let d = if op == BarRedOp::Popc {
                c.dst(&ops[0])?
            } else {
                c.pdst(&ops[0])?
            };
            let p = c.psrc(&ops[ops.len() - 1])?;
            Ok(Inst::BarRed { op, d, p })
        }
        _ => c.unsupported(),
    }
}

pub(crate) fn dec_carry(c: &mut Ctx, base: &str, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let cout = m.take("cc");
    let cin = base.ends_with('c');
    let mode = m.take_any(&["lo", "hi"]);
    let ty = one_type(c, m)?;
    if !matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64) {
        return c.unsupported();
    }
    let op = match (base, mode) {
        ("add" | "addc", None) => CarryOp::Add,
        ("sub" | "subc", None) => CarryOp::Sub,
        ("mad" | "madc", Some("lo")) => CarryOp::MadLo,
        ("mad" | "madc", Some("hi")) => CarryOp::MadHi,
        _ => return c.unsupported(),
    };
    let mad = matches!(op, CarryOp::MadLo | CarryOp::MadHi);
    nops(c, ops, if mad { 4 } else { 3 })?;
    Ok(Inst::Carry {
        op,
        cin,
        cout,
        ty,
        flag: c.carry_flag()?,
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], ty)?,
        b: c.src(&ops[2], ty)?,
        c: if mad {
            c.src(&ops[3], ty)?
        } else {
            Src::Imm(0)
        },
    })
}

fn cmp_of(s: &str) -> Option<Cmp> {
    Some(match s {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" | "lo" => Cmp::Lt,
        "le" | "ls" => Cmp::Le,
        "gt" | "hi" => Cmp::Gt,
        "ge" | "hs" => Cmp::Ge,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

pub(crate) fn dec_setp(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let Some(cmp) = m.list.first().and_then(|s| cmp_of(s)) else {
        return c.unsupported();
    };
    m.used[0] = true;
    let comb = match m.take_any(&["and", "or", "xor"]) {
        Some("and") => Some(BoolOp::And),
        Some("or") => Some(BoolOp::Or),
        Some("xor") => Some(BoolOp::Xor),
        _ => None,
    };
    let ftz = m.take("ftz");
    // `.f16` compares halves (`__hgt`...); `.f16x2` (two predicates) is not in the subset.
    let ty = crate::decode_ops::one_storage_type(c, m)?;
    let float_only = !matches!(
        cmp,
        Cmp::Eq | Cmp::Ne | Cmp::Lt | Cmp::Le | Cmp::Gt | Cmp::Ge
    );
    if matches!(ty, Ty::Pred | Ty::Bf16) || (float_only && !(ty.is_float() || ty == Ty::F16)) {
        return c.unsupported();
    }
    let want = if comb.is_some() { 4 } else { 3 };
    nops(c, ops, want)?;
    let (p, q) = match &ops[0] {
        ROp::Pair(a, b, pos) => (c.pred(a, *pos)?, Some(c.pred(b, *pos)?)),
        o => (c.pdst(o)?, None),
    };
    let comb = match comb {
        Some(op) => Some((op, c.psrc(&ops[3])?)),
        None => None,
    };
    Ok(Inst::Setp {
        cmp,
        ty,
        ftz,
        p,
        q,
        a: c.src(&ops[1], ty)?,
        b: c.src(&ops[2], ty)?,
        comb,
    })
}

pub(crate) fn dec_set(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let Some(cmp) = m.list.first().and_then(|s| cmp_of(s)) else {
        return c.unsupported();
    };
    m.used[0] = true;
    let comb = match m.take_any(&["and", "or", "xor"]) {
        Some("and") => Some(BoolOp::And),
        Some("or") => Some(BoolOp::Or),
        Some("xor") => Some(BoolOp::Xor),
        _ => None,
    };
    let ftz = m.take("ftz");
    let tys = m.types();
    let [dty, ty] = tys.as_slice() else {
        return c.unsupported();
    };
    let (dty, ty) = (*dty, *ty);
    let float_only = !matches!(
        cmp,
        Cmp::Eq | Cmp::Ne | Cmp::Lt | Cmp::Le | Cmp::Gt | Cmp::Ge
    );
    if !matches!(dty, Ty::U32 | Ty::S32 | Ty::F32)
        || matches!(ty, Ty::Pred | Ty::F16 | Ty::Bf16)
        || (float_only && !ty.is_float())
    {
        return c.unsupported();
    }
    nops(c, ops, if comb.is_some() { 4 } else { 3 })?;
    let comb = match comb {
        Some(op) => Some((op, c.psrc(&ops[3])?)),
        None => None,
    };
    Ok(Inst::Set {
        cmp,
        ty,
        float_out: dty == Ty::F32,
        ftz,
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], ty)?,
        b: c.src(&ops[2], ty)?,
        comb,
    })
}

pub(crate) fn dec_cvt(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let rnd = match m.take_any(&["rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi"]) {
        Some("rn") => Rnd::Rn,
        Some("rz") => Rnd::Rz,
        Some("rm") => Rnd::Rm,
        Some("rp") => Rnd::Rp,
        Some("rni") => Rnd::Rni,
        Some("rzi") => Rnd::Rzi,
        Some("rmi") => Rnd::Rmi,
        Some("rpi") => Rnd::Rpi,
        _ => Rnd::None,
    };
    let ftz = m.take("ftz");
    let sat = m.take("sat");
    if m.take("f16x2") {
        return dec_cvt_f16x2(c, m, ops, rnd);
    }
    let tys = m.types();
    let [dty, sty] = tys.as_slice() else {
        return c.unsupported();
    };
    let (dty, sty) = (*dty, *sty);
    if dty == Ty::Pred || sty == Ty::Pred {
        return c.unsupported();
    }
    // bfloat16: only `cvt.{rn,rz}.bf16.f32` and `cvt.f32.bf16` (what __float2bfloat16 and
    // __bfloat162float compile to).
    let bf16_ok = match (dty, sty) {
        (Ty::Bf16, Ty::F32) => matches!(rnd, Rnd::Rn | Rnd::Rz) && !sat,
        (Ty::F32, Ty::Bf16) => rnd == Rnd::None && !sat,
        (Ty::Bf16, _) | (_, Ty::Bf16) => false,
        _ => true,
    };
    if !bf16_ok {
        return c.unsupported();
    }
    // Rounding-mode rules of the PTX ISA.
    let int_rnd = matches!(rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi);
    let flt_rnd = matches!(rnd, Rnd::Rn | Rnd::Rz | Rnd::Rm | Rnd::Rp);
    let fl = |t: Ty| t.is_float() || matches!(t, Ty::F16 | Ty::Bf16);
    let ok = match (fl(dty), fl(sty)) {
        (false, true) => int_rnd,
        (true, false) => !int_rnd,
        (true, true) => {
            if dty.bits() < sty.bits() {
                flt_rnd
            } else {
                !flt_rnd
            }
        }
        (false, false) => rnd == Rnd::None,
    };
    if !ok {
        return c.unsupported();
    }
    nops(c, ops, 2)?;
    Ok(Inst::Cvt {
        dty,
        sty,
        rnd,
        sat,
        ftz,
        dbits: c.dst_bits(&ops[0]),
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], sty)?,
    })
}

/// `cvt.frnd[.relu].f16x2.f32 d, a, b` (what `__floats2half2_rn` compiles to): two f32 to
/// one packed pair of halves, `a` in the upper half.
fn dec_cvt_f16x2(c: &mut Ctx, m: &mut Mods, ops: &[ROp], rnd: Rnd) -> R<Inst> {
    let relu = m.take("relu");
    if !matches!(rnd, Rnd::Rn | Rnd::Rz | Rnd::Rm | Rnd::Rp) || m.types() != [Ty::F32] {
        return c.unsupported();
    }
    nops(c, ops, 3)?;
    Ok(Inst::Bin {
        op: BinOp::CvtF16x2 { rnd, relu },
        ty: Ty::B32,
        f: FFlags::default(),
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], Ty::F32)?,
        b: c.src(&ops[2], Ty::F32)?,
    })
}
