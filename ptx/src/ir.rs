//! The decoded instruction IR: dense register indices, resolved branch targets, typed operands
//! and pre-converted immediates. Produced once by the parser, executed by `exec`.

use crate::error::Pos;
use crate::module::EntryInfo;

/// Scalar PTX types the interpreter supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Ty {
    B8,
    B16,
    B32,
    B64,
    U8,
    U16,
    U32,
    U64,
    S8,
    S16,
    S32,
    S64,
    /// IEEE half: storage, moves, conversions and half arithmetic.
    F16,
    /// bfloat16: storage, moves and conversions to and from f32 only.
    Bf16,
    F32,
    F64,
    Pred,
}

impl Ty {
    pub(crate) fn from_name(s: &str) -> Option<Ty> {
        Some(match s {
            "b8" => Ty::B8,
            "b16" => Ty::B16,
            "b32" => Ty::B32,
            "b64" => Ty::B64,
            "u8" => Ty::U8,
            "u16" => Ty::U16,
            "u32" => Ty::U32,
            "u64" => Ty::U64,
            "s8" => Ty::S8,
            "s16" => Ty::S16,
            "s32" => Ty::S32,
            "s64" => Ty::S64,
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "pred" => Ty::Pred,
            _ => return None,
        })
    }

    /// Size in bytes (pred counts as 1).
    #[inline(always)]
    pub(crate) fn bytes(self) -> u32 {
        match self {
            Ty::B8 | Ty::U8 | Ty::S8 | Ty::Pred => 1,
            Ty::B16 | Ty::U16 | Ty::S16 | Ty::F16 | Ty::Bf16 => 2,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 => 4,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 8,
        }
    }

    #[inline(always)]
    pub(crate) fn bits(self) -> u32 {
        self.bytes() * 8
    }

    #[inline(always)]
    pub(crate) fn is_signed(self) -> bool {
        matches!(self, Ty::S8 | Ty::S16 | Ty::S32 | Ty::S64)
    }

    #[inline(always)]
    pub(crate) fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    pub(crate) fn is_int(self) -> bool {
        !self.is_float() && !matches!(self, Ty::Pred | Ty::F16 | Ty::Bf16)
    }

    /// Integer type of twice the width with the same signedness (for `.wide`).
    pub(crate) fn wide(self) -> Option<Ty> {
        Some(match self {
            Ty::U16 => Ty::U32,
            Ty::U32 => Ty::U64,
            Ty::S16 => Ty::S32,
            Ty::S32 => Ty::S64,
            _ => return None,
        })
    }

    /// Mask of the low `bits()` bits.
    #[inline(always)]
    pub(crate) fn mask(self) -> u64 {
        if self.bits() >= 64 {
            u64::MAX
        } else {
            (1u64 << self.bits()) - 1
        }
    }

    /// Sign- or zero-extend the low bits of `v` to 64 bits according to the type.
    #[inline(always)]
    pub(crate) fn extend(self, v: u64) -> u64 {
        let b = self.bits();
        if b >= 64 {
            return v;
        }
        if self.is_signed() {
            let sh = 64 - b;
            (((v << sh) as i64) >> sh) as u64
        } else {
            v & self.mask()
        }
    }
}

/// Special (read-only) registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Sreg {
    Tid(u8),
    Ntid(u8),
    Ctaid(u8),
    Nctaid(u8),
    LaneId,
    WarpId,
    NWarpId,
    Clock,
    Clock64,
    GlobalTimer,
    LaneMaskEq,
    LaneMaskLt,
    LaneMaskLe,
    LaneMaskGt,
    LaneMaskGe,
    SmId,
    NSmId,
    GridId,
}

/// A value source, already converted to the instruction's operand type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Src {
    Reg(u32),
    Imm(u64),
    Sreg(Sreg),
}

/// A predicate source (possibly negated) or a constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PSrc {
    Reg { idx: u32, neg: bool },
    Const(bool),
}

/// State spaces of memory instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Space {
    Global,
    /// `.const` module variables (read-only, module storage).
    Const,
    Shared,
    Local,
    Param,
    Generic,
}

/// Rounding modes of cvt and float arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Rnd {
    /// Round to nearest even (float result).
    Rn,
    /// Toward zero.
    Rz,
    /// Toward -inf.
    Rm,
    /// Toward +inf.
    Rp,
    /// Round to integral, nearest even.
    Rni,
    /// Round to integral toward zero.
    Rzi,
    /// Round to integral toward -inf.
    Rmi,
    /// Round to integral toward +inf.
    Rpi,
    /// No modifier given.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnOp {
    Mov,
    Neg,
    Abs,
    Not,
    Cnot,
    Popc,
    Clz,
    Brev,
    /// `bfind` (`shiftamt`: distance from the top instead of the bit index).
    Bfind {
        shiftamt: bool,
    },
    Sqrt,
    Rsqrt,
    Rcp,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Tanh,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    AddSat,
    SubSat,
    MulLo,
    MulHi,
    MulWide,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Copysign,
    /// `{add,sub,min,max}.{u16x2,s16x2}` (sm_90 SIMD, what `__vadd2` and friends compile
    /// to): the operation on each 16-bit half.
    Simd16x2 {
        op: SimdOp,
        signed: bool,
    },
    /// `{add,sub,mul,min,max}[.rn][.sat].{f16,f16x2}`: half-precision arithmetic (each half of
    /// an `f16x2` on its own), computed in f64 and rounded to nearest even once.
    Half {
        op: HalfOp,
        x2: bool,
        sat: bool,
    },
    /// `bmsk.{clamp,wrap}.b32 d, a, b`: a mask of b bits starting at bit a.
    Bmsk {
        clamp: bool,
    },
    /// `cvt.{rn,rz,rm,rp}[.relu].f16x2.f32 d, a, b`: a to the upper half, b to the lower.
    CvtF16x2 {
        rnd: Rnd,
        relu: bool,
    },
}

/// The operation of a half-precision instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HalfOp {
    Add,
    Sub,
    Mul,
    Min,
    Max,
}

/// The operation of a packed 16x2 integer instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SimdOp {
    Add,
    Sub,
    Min,
    Max,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TerOp {
    MadLo,
    MadHi,
    MadWide,
    Fma,
    Bfe,
    Selp,
    /// Funnel shifts `shf.{l,r}.{wrap,clamp}.b32` of the 64-bit value {b, a} by c.
    ShfL {
        clamp: bool,
    },
    ShfR {
        clamp: bool,
    },
    /// `sad`: c + |a - b|.
    Sad,
    /// `fma.rn[.sat].{f16,f16x2}`.
    HalfFma {
        x2: bool,
        sat: bool,
    },
    /// `lop3.b32` with its 8-bit truth table.
    Lop3 {
        lut: u8,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoolOp {
    And,
    Or,
    Xor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
    Exch,
    Cas,
    Inc,
    Dec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CarryOp {
    Add,
    Sub,
    MadLo,
    MadHi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TestpOp {
    Finite,
    Infinite,
    Number,
    NotANumber,
    Normal,
    Subnormal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BarRedOp {
    Popc,
    And,
    Or,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VoteMode {
    All,
    Any,
    Uni,
    Ballot,
}

/// Float arithmetic flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct FFlags {
    pub ftz: bool,
    pub sat: bool,
    /// Directed rounding of f32 add/sub/mul/fma: 0 nearest, 1 `.rz`, 2 `.rm`, 3 `.rp`.
    pub dir: u8,
}

/// A decoded instruction.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Inst {
    Un {
        op: UnOp,
        ty: Ty,
        f: FFlags,
        d: u32,
        a: Src,
    },
    Bin {
        op: BinOp,
        ty: Ty,
        f: FFlags,
        d: u32,
        a: Src,
        b: Src,
    },
    Ter {
        op: TerOp,
        ty: Ty,
        f: FFlags,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `selp`: d = p ? a : b.
    Selp {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        p: PSrc,
    },
    /// bfi.b32/b64 d, a(insert), b(base), c(pos), e(len).
    /// Extended-precision arithmetic with the carry flag (`add.cc`, `addc[.cc]`, `sub.cc`,
    /// `subc[.cc]`, `mad.lo.cc`, `madc.{lo,hi}[.cc]`); `flag` is the hidden predicate holding
    /// CC.CF (carry for add/mad, borrow for sub).
    Carry {
        op: CarryOp,
        cin: bool,
        cout: bool,
        ty: Ty,
        flag: u32,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `set.cmp[.bool].dty.sty d, a, b[, c]`: d = all ones (u32/s32) or 1.0 (f32) when true.
    Set {
        cmp: Cmp,
        ty: Ty,
        float_out: bool,
        ftz: bool,
        d: u32,
        a: Src,
        b: Src,
        comb: Option<(BoolOp, PSrc)>,
    },
    /// `testp.op.{f32,f64} p, a`.
    Testp {
        op: TestpOp,
        ty: Ty,
        p: u32,
        a: Src,
    },
    /// `prmt.b32` (default mode): byte permute of {b, a} by selector c.
    Prmt {
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `slct.dty.s32/f32`: d = c >= 0 ? a : b.
    Slct {
        ty: Ty,
        cty: Ty,
        ftz: bool,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
    },
    Bfi {
        ty: Ty,
        d: u32,
        a: Src,
        b: Src,
        c: Src,
        e: Src,
    },
    /// Logic on predicates (`and/or/xor/not/mov.pred`); `b` unused for not/mov.
    PLogic {
        op: Option<BoolOp>,
        not: bool,
        d: u32,
        a: PSrc,
        b: PSrc,
    },
    Setp {
        cmp: Cmp,
        ty: Ty,
        ftz: bool,
        p: u32,
        q: Option<u32>,
        a: Src,
        b: Src,
        comb: Option<(BoolOp, PSrc)>,
    },
    Cvt {
        dty: Ty,
        sty: Ty,
        rnd: Rnd,
        sat: bool,
        ftz: bool,
        /// Width of the destination register (narrow signed results are sign-extended to it).
        dbits: u32,
        d: u32,
        a: Src,
    },
    /// `cvta` to generic (`to=false`) or from generic (`to=true`).
    Cvta {
        space: Space,
        to: bool,
        d: u32,
        a: Src,
    },
    /// Pack scalars into one wider register (`mov.b64 %rd, {%r1,%r2}`).
    Pack {
        elem_bits: u32,
        d: u32,
        parts: Vec<Src>,
    },
    /// Unpack a wide value into scalars.
    Unpack {
        elem_bits: u32,
        ds: Vec<u32>,
        a: Src,
    },
    Ld {
        space: Space,
        ty: Ty,
        dwidth: u32,
        n: u8,
        d: [u32; 4],
        base: Src,
        off: i64,
    },
    St {
        space: Space,
        ty: Ty,
        n: u8,
        a: [Src; 4],
        base: Src,
        off: i64,
    },
    /// atom/red. `d` is None for red. `c` is the swap value of cas.
    Atom {
        space: Space,
        op: AtomOp,
        ty: Ty,
        d: Option<u32>,
        base: Src,
        off: i64,
        b: Src,
        c: Src,
    },
    Bra {
        target: u32,
    },
    Bar,
    /// `bar.red.popc.u32 d` / `bar.red.{and,or}.pred d`: CTA barrier reducing predicate `p`.
    BarRed {
        op: BarRedOp,
        d: u32,
        p: PSrc,
    },
    Exit,
    Trap,
    Nop,
    Shfl {
        mode: ShflMode,
        d: u32,
        p: Option<u32>,
        a: Src,
        b: Src,
        c: Src,
    },
    /// `vote[.sync]`: over the active lanes, and with `.sync` only those in each lane's
    /// membermask (cooperative groups' tiles vote with a mask per tile).
    Vote {
        mode: VoteMode,
        d: u32,
        a: PSrc,
        mask: Option<Src>,
    },
    /// `match.{any,all}.sync.{b32,b64} d[|p], a, membermask`.
    Match {
        all: bool,
        ty: Ty,
        d: u32,
        p: Option<u32>,
        a: Src,
        mask: Src,
    },
    /// `redux.sync`: reduce `a` over the active lanes in the membermask with `op`
    /// (Add/Min/Max/And/Or/Xor).
    Redux {
        op: AtomOp,
        ty: Ty,
        d: u32,
        a: Src,
        mask: Src,
    },
    Activemask {
        d: u32,
    },
    /// Device `printf` (a call of the runtime's `vprintf(format, args)`): `fmt` and `args` are
    /// the local-memory offsets of the call's two parameters, `ret` that of its return value.
    Printf {
        fmt: u64,
        args: u64,
        ret: Option<u64>,
    },
}

/// One instruction with its guard predicate (`@p` / `@!p`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Op {
    pub inst: Inst,
    pub guard: Option<(u32, bool)>,
}

/// Where a bounds-checked twin (`ckpt::bounds`) keeps its flag word's address.
#[derive(Debug, Clone)]
pub(crate) struct FlagRegs {
    /// Offset of the `__ws_flag` parameter.
    pub param: u32,
    /// Registers that hold the address: `%__ws_f` (loaded before each flag store), and
    /// `%__ws_flag` of twins made before it was (loaded once, at the start).
    pub regs: Vec<u32>,
    /// The predicate the flag store is guarded by (`%__ws_p`), already true for a store the
    /// interpreter stopped a warp before.
    pub pred: Option<u32>,
}

/// A decoded kernel entry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub info: EntryInfo,
    pub code: Vec<Op>,
    /// Source position of each instruction.
    pub pos: Vec<Pos>,
    /// Immediate post-dominator (reconvergence pc) of each instruction; `code.len()` = exit.
    pub ipdom: Vec<u32>,
    /// Number of 64-bit registers per thread.
    pub nregs: u32,
    /// Number of predicate registers per thread.
    pub npreds: u32,
    /// A bounds-checked twin's flag state (`ckpt::bounds`); `None` for other entries.
    pub flag_regs: Option<FlagRegs>,
}
