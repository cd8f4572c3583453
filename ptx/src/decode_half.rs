//! Decoding of half-precision arithmetic (`.f16` and packed `.f16x2`): what `__hadd`,
//! `__hmul2`, `__hfma` and cuda_fp16.hpp's operators compile to. `neg`/`abs` become sign-bit
//! logic; the rest are `BinOp::Half` / `TerOp::HalfFma`; `setp.f16` is decoded with `setp`.

use crate::decode::{Ctx, ROp};
use crate::decode_ops::{Mods, nops};
use crate::error::PtxError;
use crate::ir::{BinOp, FFlags, HalfOp, Inst, Src, TerOp, Ty};

type R<T> = Result<T, PtxError>;

/// Whether `m` names a half-precision type (the instruction goes to [`dec_half`]).
pub(crate) fn is_half(m: &Mods) -> bool {
    m.list.iter().any(|t| matches!(*t, "f16" | "f16x2"))
}

/// `add sub mul min max fma neg abs` on `.f16` / `.f16x2`.
pub(crate) fn dec_half(c: &mut Ctx, base: &str, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let x2 = m.take("f16x2");
    if !x2 && !m.take("f16") {
        return c.unsupported();
    }
    let rn = m.take("rn");
    let sat = m.take("sat");
    if !m.done() {
        // .ftz, .relu, .NaN, .xorsign, directed rounding: not in the subset.
        return c.unsupported();
    }
    let ty = if x2 { Ty::B32 } else { Ty::B16 };
    let sign = if x2 { 0x8000_8000 } else { 0x8000 };
    let (op, half) = match base {
        "add" => (None, HalfOp::Add),
        "sub" => (None, HalfOp::Sub),
        "mul" => (None, HalfOp::Mul),
        "min" if !sat && !rn => (None, HalfOp::Min),
        "max" if !sat && !rn => (None, HalfOp::Max),
        "neg" if !sat && !rn => (Some(BinOp::Xor), HalfOp::Add),
        "abs" if !sat && !rn => (Some(BinOp::And), HalfOp::Add),
        "fma" if rn => {
            nops(c, ops, 4)?;
            return Ok(Inst::Ter {
                op: TerOp::HalfFma { x2, sat },
                ty,
                f: FFlags::default(),
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], ty)?,
                b: c.src(&ops[2], ty)?,
                c: c.src(&ops[3], ty)?,
            });
        }
        _ => return c.unsupported(),
    };
    if let Some(logic) = op {
        nops(c, ops, 2)?;
        let imm = if logic == BinOp::Xor {
            sign
        } else {
            !sign & ty.mask()
        };
        return Ok(Inst::Bin {
            op: logic,
            ty,
            f: FFlags::default(),
            d: c.dst(&ops[0])?,
            a: c.src(&ops[1], ty)?,
            b: Src::Imm(imm),
        });
    }
    nops(c, ops, 3)?;
    Ok(Inst::Bin {
        op: BinOp::Half { op: half, x2, sat },
        ty,
        f: FFlags::default(),
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], ty)?,
        b: c.src(&ops[2], ty)?,
    })
}
