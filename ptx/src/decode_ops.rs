//! Per-instruction decoding: opcode + modifiers + raw operands → one IR instruction
//! (dispatch, arithmetic, logic, bit operations, moves and control flow; comparisons,
//! conversions, carry chains and barriers are in `decode_cmp`, memory and warp-level
//! instructions in `decode_mem`).
//! Every opcode or modifier outside the documented subset is an `UnsupportedInstruction`.

use crate::decode::{Ctx, ROp};
use crate::error::PtxError;
use crate::ir::{BinOp, BoolOp, FFlags, Inst, PSrc, SimdOp, Space, TerOp, TestpOp, Ty, UnOp};
use crate::{decode_cmp, decode_mem};

type R<T> = Result<T, PtxError>;

/// Modifier list of an opcode with use tracking.
pub(crate) struct Mods<'a> {
    pub(crate) list: Vec<&'a str>,
    pub(crate) used: Vec<bool>,
}

impl<'a> Mods<'a> {
    pub(crate) fn new(list: Vec<&'a str>) -> Self {
        let used = vec![false; list.len()];
        Self { list, used }
    }

    pub(crate) fn take(&mut self, m: &str) -> bool {
        for (i, x) in self.list.iter().enumerate() {
            if !self.used[i] && *x == m {
                self.used[i] = true;
                return true;
            }
        }
        false
    }

    pub(crate) fn take_any(&mut self, opts: &[&'a str]) -> Option<&'a str> {
        opts.iter().copied().find(|o| self.take(o))
    }

    /// Take every type modifier, in order.
    pub(crate) fn types(&mut self) -> Vec<Ty> {
        let mut v = Vec::new();
        for (i, x) in self.list.iter().enumerate() {
            if !self.used[i]
                && let Some(t) = Ty::from_name(x)
            {
                self.used[i] = true;
                v.push(t);
            }
        }
        v
    }

    pub(crate) fn done(&self) -> bool {
        self.used.iter().all(|u| *u)
    }
}

/// The single type modifier of an arithmetic instruction (`.f16` is storage-only).
pub(crate) fn one_type(c: &Ctx, m: &mut Mods) -> R<Ty> {
    match one_storage_type(c, m)? {
        Ty::F16 | Ty::Bf16 => c.unsupported(),
        t => Ok(t),
    }
}

/// The single type modifier of a move, load or store (`.f16` allowed).
pub(crate) fn one_storage_type(c: &Ctx, m: &mut Mods) -> R<Ty> {
    match m.types().as_slice() {
        [t] => Ok(*t),
        _ => c.unsupported(),
    }
}

pub(crate) fn nops(c: &Ctx, ops: &[ROp], n: usize) -> R<()> {
    if ops.len() == n {
        Ok(())
    } else {
        c.operr(format!("expected {n} operands, got {}", ops.len()))
    }
}

pub(crate) fn space_of(m: &mut Mods) -> Space {
    match m.take_any(&["global", "shared", "local", "param", "const"]) {
        Some("global") => Space::Global,
        Some("const") => Space::Const,
        Some("shared") => Space::Shared,
        Some("local") => Space::Local,
        Some("param") => Space::Param,
        _ => Space::Generic,
    }
}

/// Float rounding for arithmetic: only round-to-nearest (and approx/full) are supported.
pub(crate) fn float_mods(m: &mut Mods, ty: Ty) -> R<FFlags> {
    let mut f = FFlags::default();
    if ty.is_float() {
        m.take_any(&["rn", "approx", "full"]);
        f.ftz = m.take("ftz");
        f.sat = m.take("sat");
        f.dir = match m.take_any(&["rz", "rm", "rp"]) {
            None => 0,
            Some("rz") => 1,
            Some("rm") => 2,
            _ => 3,
        };
    }
    Ok(f)
}

/// Directed rounding is supported for f32 add/sub/mul/fma only.
fn check_dir(c: &Ctx, f: FFlags, ty: Ty, op_ok: bool) -> R<()> {
    if f.dir != 0 && (ty != Ty::F32 || !op_ok) {
        return c.unsupported();
    }
    Ok(())
}

/// Decode one instruction.
pub(crate) fn decode_inst(c: &mut Ctx, opcode: &str, ops: &[ROp]) -> R<Inst> {
    let mut parts = opcode.split('.');
    let base = parts.next().unwrap_or("");
    let mut m = Mods::new(parts.collect());
    let inst = match base {
        "add" | "sub" | "mul" | "min" | "max" | "fma" | "neg" | "abs"
            if crate::decode_half::is_half(&m) =>
        {
            crate::decode_half::dec_half(c, base, &mut m, ops)?
        }
        "mov" => dec_mov(c, &mut m, ops)?,
        // Only the inliner writes this opcode (for a call of `vprintf`).
        "__vprintf" => {
            let local = |c: &Ctx, o: &ROp| match o {
                ROp::Name(n, _) => match c.sym(n) {
                    Some((Space::Local, off)) => Ok(off),
                    _ => c.operr("vprintf parameters must be call-site .param variables"),
                },
                _ => c.operr("vprintf parameters must be call-site .param variables"),
            };
            match ops {
                [f, a] => Inst::Printf {
                    fmt: local(c, f)?,
                    args: local(c, a)?,
                    ret: None,
                },
                [f, a, r] => Inst::Printf {
                    fmt: local(c, f)?,
                    args: local(c, a)?,
                    ret: Some(local(c, r)?),
                },
                _ => return c.operr("vprintf takes two parameters"),
            }
        }
        "add" | "sub" | "addc" | "subc" | "mad" | "madc"
            if matches!(base, "addc" | "subc" | "madc") || m.list.contains(&"cc") =>
        {
            decode_cmp::dec_carry(c, base, &mut m, ops)?
        }
        "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor" | "shl"
        | "shr" | "copysign" => dec_bin(c, base, &mut m, ops)?,
        "mad" | "fma" => dec_mad(c, base, &mut m, ops)?,
        "neg" | "abs" | "not" | "cnot" | "popc" | "clz" | "brev" | "sqrt" | "rsqrt" | "rcp"
        | "ex2" | "lg2" | "sin" | "cos" | "tanh" | "bfind" => dec_un(c, base, &mut m, ops)?,
        "testp" => {
            let op = match m.take_any(&[
                "finite",
                "infinite",
                "number",
                "notanumber",
                "normal",
                "subnormal",
            ]) {
                Some("finite") => TestpOp::Finite,
                Some("infinite") => TestpOp::Infinite,
                Some("number") => TestpOp::Number,
                Some("notanumber") => TestpOp::NotANumber,
                Some("normal") => TestpOp::Normal,
                Some("subnormal") => TestpOp::Subnormal,
                _ => return c.unsupported(),
            };
            let ty = one_type(c, &mut m)?;
            if !ty.is_float() {
                return c.unsupported();
            }
            nops(c, ops, 2)?;
            Inst::Testp {
                op,
                ty,
                p: c.pdst(&ops[0])?,
                a: c.src(&ops[1], ty)?,
            }
        }
        "bfe" => {
            let ty = one_type(c, &mut m)?;
            if !matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64) {
                return c.unsupported();
            }
            nops(c, ops, 4)?;
            Inst::Ter {
                op: TerOp::Bfe,
                ty,
                f: FFlags::default(),
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], ty)?,
                b: c.src(&ops[2], Ty::U32)?,
                c: c.src(&ops[3], Ty::U32)?,
            }
        }
        "bfi" => {
            let ty = one_type(c, &mut m)?;
            if !matches!(ty, Ty::B32 | Ty::B64) {
                return c.unsupported();
            }
            nops(c, ops, 5)?;
            Inst::Bfi {
                ty,
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], ty)?,
                b: c.src(&ops[2], ty)?,
                c: c.src(&ops[3], Ty::U32)?,
                e: c.src(&ops[4], Ty::U32)?,
            }
        }
        "setp" => decode_cmp::dec_setp(c, &mut m, ops)?,
        "set" => decode_cmp::dec_set(c, &mut m, ops)?,
        "selp" => {
            let ty = one_type(c, &mut m)?;
            nops(c, ops, 4)?;
            if ty == Ty::Pred {
                return c.unsupported();
            }
            Inst::Selp {
                ty,
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], ty)?,
                b: c.src(&ops[2], ty)?,
                p: c.psrc(&ops[3])?,
            }
        }
        "cvt" => decode_cmp::dec_cvt(c, &mut m, ops)?,
        "cvta" => {
            let to = m.take("to");
            let space = space_of(&mut m);
            let ty = one_type(c, &mut m)?;
            if ty != Ty::U64 || matches!(space, Space::Param | Space::Generic) {
                return c.unsupported();
            }
            nops(c, ops, 2)?;
            Inst::Cvta {
                space,
                to,
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], Ty::U64)?,
            }
        }
        "ld" | "ldu" | "st" => decode_mem::dec_ldst(c, base, &mut m, ops)?,
        "atom" | "red" => decode_mem::dec_atom(c, base, &mut m, ops)?,
        "bra" => {
            m.take("uni");
            nops(c, ops, 1)?;
            Inst::Bra {
                target: c.label(&ops[0])?,
            }
        }
        "bar" | "barrier" => decode_cmp::dec_bar(c, &mut m, ops)?,
        "membar" | "fence" => {
            m.take_any(&["gl", "cta", "sys"]);
            m.take_any(&["sc", "acq_rel"]);
            m.take_any(&["gpu", "cta", "sys"]);
            nops(c, ops, 0)?;
            Inst::Nop
        }
        "ret" | "exit" => {
            m.take("uni");
            nops(c, ops, 0)?;
            Inst::Exit
        }
        "trap" => Inst::Trap,
        "nanosleep" | "prefetch" | "prefetchu" => {
            // Hints without architectural effect in the interpreter.
            m.take("u32");
            m.take_any(&["global", "local"]);
            m.take_any(&["L1", "L2"]);
            if ops.len() != 1 {
                return c.operr("expected 1 operand");
            }
            if base == "nanosleep" {
                c.src(&ops[0], Ty::U32)?;
            } else {
                c.addr(&ops[0])?;
            }
            Inst::Nop
        }
        "shf" => {
            let left = match m.take_any(&["l", "r"]) {
                Some("l") => true,
                Some("r") => false,
                _ => return c.unsupported(),
            };
            let clamp = match m.take_any(&["wrap", "clamp"]) {
                Some("clamp") => true,
                Some("wrap") => false,
                _ => return c.unsupported(),
            };
            if !m.take("b32") {
                return c.unsupported();
            }
            nops(c, ops, 4)?;
            Inst::Ter {
                op: if left {
                    TerOp::ShfL { clamp }
                } else {
                    TerOp::ShfR { clamp }
                },
                ty: Ty::B32,
                f: FFlags::default(),
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], Ty::B32)?,
                b: c.src(&ops[2], Ty::B32)?,
                c: c.src(&ops[3], Ty::U32)?,
            }
        }
        "sad" => {
            let ty = one_type(c, &mut m)?;
            if !matches!(
                ty,
                Ty::U16 | Ty::U32 | Ty::U64 | Ty::S16 | Ty::S32 | Ty::S64
            ) {
                return c.unsupported();
            }
            nops(c, ops, 4)?;
            Inst::Ter {
                op: TerOp::Sad,
                ty,
                f: FFlags::default(),
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], ty)?,
                b: c.src(&ops[2], ty)?,
                c: c.src(&ops[3], ty)?,
            }
        }
        "bmsk" => {
            let clamp = match m.take_any(&["clamp", "wrap"]) {
                Some("clamp") => true,
                Some(_) => false,
                None => return c.unsupported(),
            };
            if !m.take("b32") {
                return c.unsupported();
            }
            nops(c, ops, 3)?;
            Inst::Bin {
                op: BinOp::Bmsk { clamp },
                ty: Ty::B32,
                f: FFlags::default(),
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], Ty::U32)?,
                b: c.src(&ops[2], Ty::U32)?,
            }
        }
        "lop3" => {
            if !m.take("b32") {
                return c.unsupported();
            }
            nops(c, ops, 5)?;
            let lut = match ops[4] {
                ROp::Int(v) if v <= 0xff => v as u8,
                _ => return c.operr("lop3 truth table must be an immediate 0..255"),
            };
            Inst::Ter {
                op: TerOp::Lop3 { lut },
                ty: Ty::B32,
                f: FFlags::default(),
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], Ty::B32)?,
                b: c.src(&ops[2], Ty::B32)?,
                c: c.src(&ops[3], Ty::B32)?,
            }
        }
        "prmt" => {
            if !m.take("b32") {
                return c.unsupported();
            }
            nops(c, ops, 4)?;
            Inst::Prmt {
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], Ty::B32)?,
                b: c.src(&ops[2], Ty::B32)?,
                c: c.src(&ops[3], Ty::B32)?,
            }
        }
        "slct" => {
            let ftz = m.take("ftz");
            let tys = m.types();
            let [ty, cty] = tys.as_slice() else {
                return c.unsupported();
            };
            let (ty, cty) = (*ty, *cty);
            if ty == Ty::Pred || !matches!(cty, Ty::S32 | Ty::F32) {
                return c.unsupported();
            }
            nops(c, ops, 4)?;
            Inst::Slct {
                ty,
                cty,
                ftz,
                d: c.dst(&ops[0])?,
                a: c.src(&ops[1], ty)?,
                b: c.src(&ops[2], ty)?,
                c: c.src(&ops[3], cty)?,
            }
        }
        "nop" => Inst::Nop,
        "shfl" => decode_mem::dec_shfl(c, &mut m, ops)?,
        "redux" => decode_mem::dec_redux(c, &mut m, ops)?,
        "match" => decode_mem::dec_match(c, &mut m, ops)?,
        "vote" => decode_mem::dec_vote(c, &mut m, ops)?,
        "activemask" => {
            if !m.take("b32") {
                return c.unsupported();
            }
            nops(c, ops, 1)?;
            Inst::Activemask { d: c.dst(&ops[0])? }
        }
        _ => return c.unsupported(),
    };
    if !m.done() {
        return c.unsupported();
    }
    Ok(inst)
}

fn dec_mov(c: &mut Ctx, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let ty = one_storage_type(c, m)?;
    nops(c, ops, 2)?;
    if ty == Ty::Pred {
        return Ok(Inst::PLogic {
            op: None,
            not: false,
            d: c.pdst(&ops[0])?,
            a: c.psrc(&ops[1])?,
            b: PSrc::Const(false),
        });
    }
    match (&ops[0], &ops[1]) {
        (ROp::Vec(parts), src) => {
            let n = parts.len() as u32;
            if n < 2 || ty.bits() % n != 0 || ty.bits() / n < 8 {
                return c.operr("bad vector unpack");
            }
            let ds = parts.iter().map(|p| c.dst(p)).collect::<R<Vec<_>>>()?;
            Ok(Inst::Unpack {
                elem_bits: ty.bits() / n,
                ds,
                a: c.src(src, ty)?,
            })
        }
        (d, ROp::Vec(parts)) => {
            let n = parts.len() as u32;
            if n < 2 || ty.bits() % n != 0 || ty.bits() / n < 8 {
                return c.operr("bad vector pack");
            }
            let et = match ty.bits() / n {
                8 => Ty::B8,
                16 => Ty::B16,
                _ => Ty::B32,
            };
            let parts = parts.iter().map(|p| c.src(p, et)).collect::<R<Vec<_>>>()?;
            Ok(Inst::Pack {
                elem_bits: ty.bits() / n,
                d: c.dst(d)?,
                parts,
            })
        }
        (d, a) => Ok(Inst::Un {
            op: UnOp::Mov,
            ty,
            f: FFlags::default(),
            d: c.dst(d)?,
            a: c.src(a, ty)?,
        }),
    }
}

fn pred_logic(c: &mut Ctx, base: &str, ops: &[ROp]) -> R<Inst> {
    let op = match base {
        "and" => Some(BoolOp::And),
        "or" => Some(BoolOp::Or),
        "xor" => Some(BoolOp::Xor),
        "not" => None,
        _ => return c.unsupported(),
    };
    nops(c, ops, if op.is_some() { 3 } else { 2 })?;
    Ok(Inst::PLogic {
        op,
        not: op.is_none(),
        d: c.pdst(&ops[0])?,
        a: c.psrc(&ops[1])?,
        b: if op.is_some() {
            c.psrc(&ops[2])?
        } else {
            PSrc::Const(false)
        },
    })
}

fn dec_bin(c: &mut Ctx, base: &str, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    if let Some(packed) = m.take_any(&["u16x2", "s16x2"]) {
        let op = match base {
            "add" => SimdOp::Add,
            "sub" => SimdOp::Sub,
            "min" => SimdOp::Min,
            "max" => SimdOp::Max,
            _ => return c.unsupported(),
        };
        nops(c, ops, 3)?;
        return Ok(Inst::Bin {
            op: BinOp::Simd16x2 {
                op,
                signed: packed == "s16x2",
            },
            ty: Ty::B32,
            f: FFlags::default(),
            d: c.dst(&ops[0])?,
            a: c.src(&ops[1], Ty::B32)?,
            b: c.src(&ops[2], Ty::B32)?,
        });
    }
    let mode = m.take_any(&["lo", "hi", "wide"]);
    let sat = m.take("sat");
    let ty = one_type(c, m)?;
    if ty == Ty::Pred {
        return pred_logic(c, base, ops);
    }
    let mut f = float_mods(m, ty)?;
    nops(c, ops, 3)?;
    let int = ty.is_int();
    let op = match (base, mode) {
        ("add", None) if sat && ty == Ty::S32 => BinOp::AddSat,
        ("sub", None) if sat && ty == Ty::S32 => BinOp::SubSat,
        ("add", None) => BinOp::Add,
        ("sub", None) => BinOp::Sub,
        ("mul", Some("lo")) if int => BinOp::MulLo,
        ("mul", Some("hi")) if int => BinOp::MulHi,
        ("mul", Some("wide")) if ty.wide().is_some() => BinOp::MulWide,
        ("mul", None) if !int => BinOp::MulLo,
        ("div", None) => BinOp::Div,
        ("rem", None) if int => BinOp::Rem,
        ("min", None) => BinOp::Min,
        ("max", None) => BinOp::Max,
        ("and", None) if int => BinOp::And,
        ("or", None) if int => BinOp::Or,
        ("xor", None) if int => BinOp::Xor,
        ("shl", None) if int => BinOp::Shl,
        ("shr", None) if int => BinOp::Shr,
        ("copysign", None) if !int => BinOp::Copysign,
        _ => return c.unsupported(),
    };
    check_dir(
        c,
        f,
        ty,
        matches!(op, BinOp::Add | BinOp::Sub | BinOp::MulLo),
    )?;
    if sat && int && !matches!(op, BinOp::AddSat | BinOp::SubSat) {
        return c.unsupported();
    }
    if sat && !int {
        f.sat = true;
    }
    let bty = if matches!(op, BinOp::Shl | BinOp::Shr) {
        Ty::U32
    } else {
        ty
    };
    Ok(Inst::Bin {
        op,
        ty,
        f,
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], ty)?,
        b: c.src(&ops[2], bty)?,
    })
}

fn dec_mad(c: &mut Ctx, base: &str, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let mode = m.take_any(&["lo", "hi", "wide"]);
    let ty = one_type(c, m)?;
    let f = float_mods(m, ty)?;
    nops(c, ops, 4)?;
    let op = match (base, mode, ty.is_float()) {
        ("mad", Some("lo"), false) => TerOp::MadLo,
        ("mad", Some("hi"), false) => TerOp::MadHi,
        ("mad", Some("wide"), false) if ty.wide().is_some() => TerOp::MadWide,
        ("mad" | "fma", None, true) => TerOp::Fma,
        _ => return c.unsupported(),
    };
    check_dir(c, f, ty, op == TerOp::Fma)?;
    let cty = if op == TerOp::MadWide {
        ty.wide().unwrap_or(ty)
    } else {
        ty
    };
    Ok(Inst::Ter {
        op,
        ty,
        f,
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], ty)?,
        b: c.src(&ops[2], ty)?,
        c: c.src(&ops[3], cty)?,
    })
}

fn dec_un(c: &mut Ctx, base: &str, m: &mut Mods, ops: &[ROp]) -> R<Inst> {
    let shiftamt = base == "bfind" && m.take("shiftamt");
    let ty = one_type(c, m)?;
    if ty == Ty::Pred {
        return pred_logic(c, base, ops);
    }
    let f = float_mods(m, ty)?;
    nops(c, ops, 2)?;
    check_dir(c, f, ty, false)?;
    let int = ty.is_int();
    let op = match base {
        "neg" if ty.is_signed() || !int => UnOp::Neg,
        "abs" if ty.is_signed() || !int => UnOp::Abs,
        "not" if int => UnOp::Not,
        "cnot" if int => UnOp::Cnot,
        "popc" if matches!(ty, Ty::B32 | Ty::B64) => UnOp::Popc,
        "clz" if matches!(ty, Ty::B32 | Ty::B64) => UnOp::Clz,
        "brev" if matches!(ty, Ty::B32 | Ty::B64) => UnOp::Brev,
        "bfind" if matches!(ty, Ty::U32 | Ty::S32 | Ty::U64 | Ty::S64) => UnOp::Bfind { shiftamt },
        "sqrt" if !int => UnOp::Sqrt,
        "rsqrt" if !int => UnOp::Rsqrt,
        "rcp" if !int => UnOp::Rcp,
        "ex2" if ty == Ty::F32 => UnOp::Ex2,
        "lg2" if ty == Ty::F32 => UnOp::Lg2,
        "sin" if ty == Ty::F32 => UnOp::Sin,
        "cos" if ty == Ty::F32 => UnOp::Cos,
        "tanh" if ty == Ty::F32 => UnOp::Tanh,
        _ => return c.unsupported(),
    };
    Ok(Inst::Un {
        op,
        ty,
        f,
        d: c.dst(&ops[0])?,
        a: c.src(&ops[1], ty)?,
    })
}
