//! Per-lane arithmetic: integer and float binary/unary/ternary ops and comparisons
//! (conversions are in `cvt`).
//! Values are raw bits (low `ty.bits()` of a u64); each op is applied over 32 lanes in a tight
//! loop after one dispatch on (op, type).

use crate::ir::{BinOp, Cmp, FFlags, SimdOp, TerOp, Ty, UnOp};

pub(crate) type Lanes = [u64; 32];

#[inline(always)]
fn map1(a: &Lanes, r: &mut Lanes, f: impl Fn(u64) -> u64) {
    for l in 0..32 {
        r[l] = f(a[l]);
    }
}

#[inline(always)]
fn map2(a: &Lanes, b: &Lanes, r: &mut Lanes, f: impl Fn(u64, u64) -> u64) {
    for l in 0..32 {
        r[l] = f(a[l], b[l]);
    }
}

#[inline(always)]
fn map3(a: &Lanes, b: &Lanes, c: &Lanes, r: &mut Lanes, f: impl Fn(u64, u64, u64) -> u64) {
    for l in 0..32 {
        r[l] = f(a[l], b[l], c[l]);
    }
}

#[inline(always)]
pub(crate) fn f32_in(x: u64, ftz: bool) -> f32 {
    let f = f32::from_bits(x as u32);
    if ftz && f.is_subnormal() {
        0.0f32.copysign(f)
    } else {
        f
    }
}

/// Canonical NaN produced by float arithmetic (measured on NVIDIA hardware for f32).
pub(crate) const CANON_NAN_F32: u32 = 0x7fff_ffff;
/// Canonical f64 NaN (chosen to match the f32 pattern: all payload bits set).
pub(crate) const CANON_NAN_F64: u64 = 0x7fff_ffff_ffff_ffff;

/// Round a float arithmetic result: `.sat` clamps to [+0, 1] (NaN and -0 give +0, as the
/// hardware does), `.ftz` flushes subnormals, NaN results are canonical.
#[inline(always)]
pub(crate) fn f32_out(f: f32, fl: FFlags) -> u64 {
    let mut f = f;
    if fl.sat {
        f = if f > 0.0 { f.min(1.0) } else { 0.0 };
    }
    if fl.ftz && f.is_subnormal() {
        f = 0.0f32.copysign(f);
    }
    if f.is_nan() {
        return u64::from(CANON_NAN_F32);
    }
    u64::from(f.to_bits())
}

#[inline(always)]
pub(crate) fn f64_out(f: f64, fl: FFlags) -> u64 {
    let f = if fl.sat {
        if f > 0.0 { f.min(1.0) } else { 0.0 }
    } else {
        f
    };
    if f.is_nan() {
        return CANON_NAN_F64;
    }
    f.to_bits()
}

/// Integer division with the documented divide-by-zero results.
#[inline(always)]
pub(crate) fn idiv(ty: Ty, x: u64, y: u64) -> u64 {
    let m = ty.mask();
    if ty.is_signed() {
        let (x, y) = (ty.extend(x) as i64, ty.extend(y) as i64);
        if y == 0 {
            m
        } else {
            (x.wrapping_div(y) as u64) & m
        }
    } else {
        (x & m).checked_div(y & m).unwrap_or(m)
    }
}

/// Integer remainder; `x rem 0 = x`.
#[inline(always)]
pub(crate) fn irem(ty: Ty, x: u64, y: u64) -> u64 {
    let m = ty.mask();
    if ty.is_signed() {
        let (x, y) = (ty.extend(x) as i64, ty.extend(y) as i64);
        if y == 0 {
            (x as u64) & m
        } else {
            (x.wrapping_rem(y) as u64) & m
        }
    } else if y & m == 0 {
        x & m
    } else {
        ((x & m) % (y & m)) & m
    }
}

#[inline(always)]
fn mul_hi(ty: Ty, x: u64, y: u64) -> u64 {
    let b = ty.bits();
    if ty.is_signed() {
        let p = i128::from(ty.extend(x) as i64) * i128::from(ty.extend(y) as i64);
        ((p >> b) as u64) & ty.mask()
    } else {
        let p = u128::from(x & ty.mask()) * u128::from(y & ty.mask());
        ((p >> b) as u64) & ty.mask()
    }
}

#[inline(always)]
fn mul_wide(ty: Ty, x: u64, y: u64) -> u64 {
    let w = ty.wide().unwrap_or(Ty::U64);
    if ty.is_signed() {
        ((ty.extend(x) as i64).wrapping_mul(ty.extend(y) as i64) as u64) & w.mask()
    } else {
        (x & ty.mask()).wrapping_mul(y & ty.mask()) & w.mask()
    }
}

#[inline(always)]
fn shr(ty: Ty, x: u64, y: u64) -> u64 {
    let b = u64::from(ty.bits());
    if ty.is_signed() {
        let s = y.min(b - 1);
        ((ty.extend(x) as i64 >> s) as u64) & ty.mask()
    } else if y >= b {
        0
    } else {
        (x & ty.mask()) >> y
    }
}

/// Binary op over lanes.
pub(crate) fn bin(op: BinOp, ty: Ty, f: FFlags, a: &Lanes, b: &Lanes, r: &mut Lanes) {
    if let BinOp::CvtF16x2 { rnd, relu } = op {
        let half = |x: u64| {
            let v = f32::from_bits(x as u32);
            // `.relu` clamps negative results to +0 (NaN stays NaN).
            let v = if relu && v < 0.0 { 0.0 } else { v };
            u64::from(crate::exec::cvt::f64_to_f16(f64::from(v), rnd))
        };
        map2(a, b, r, |x, y| (half(x) << 16) | half(y));
        return;
    }
    if let BinOp::Half { op, x2, sat } = op {
        map2(a, b, r, |x, y| crate::exec::half::bin(op, x2, sat, x, y));
        return;
    }
    if let BinOp::Simd16x2 { op, signed } = op {
        map2(a, b, r, |x, y| simd16x2(op, signed, x as u32, y as u32));
        return;
    }
    if let BinOp::Bmsk { clamp } = op {
        map2(a, b, r, |x, y| bmsk(clamp, x as u32, y as u32));
        return;
    }
    let m = ty.mask();
    match ty {
        Ty::F32 if f.dir != 0 => {
            let neg = op == BinOp::Sub;
            map2(a, b, r, |x, y| {
                let (x, y) = (f32_in(x, f.ftz), f32_in(y, f.ftz));
                let v = match op {
                    BinOp::MulLo => directed_mul(x, y, f.dir),
                    _ => directed_add(x, if neg { -y } else { y }, f.dir),
                };
                f32_out(v, f)
            })
        }
        Ty::F32 => {
            let g = |op: fn(f32, f32) -> f32| {
                move |x, y| f32_out(op(f32_in(x, f.ftz), f32_in(y, f.ftz)), f)
            };
            match op {
                BinOp::Add | BinOp::AddSat => map2(a, b, r, g(|x, y| x + y)),
                BinOp::Sub | BinOp::SubSat => map2(a, b, r, g(|x, y| x - y)),
                BinOp::MulLo | BinOp::MulHi | BinOp::MulWide => map2(a, b, r, g(|x, y| x * y)),
                BinOp::Div => map2(a, b, r, g(|x, y| x / y)),
                BinOp::Min => map2(
                    a,
                    b,
                    r,
                    g(|x, y| {
                        if x == y {
                            f32::from_bits(x.to_bits() | y.to_bits())
                        } else {
                            x.min(y)
                        }
                    }),
                ),
                BinOp::Max => map2(
                    a,
                    b,
                    r,
                    g(|x, y| {
                        if x == y {
                            f32::from_bits(x.to_bits() & y.to_bits())
                        } else {
                            x.max(y)
                        }
                    }),
                ),
                BinOp::Copysign => map2(a, b, r, g(|x, y| y.copysign(x))),
                _ => map2(a, b, r, |_, _| 0),
            }
        }
        Ty::F64 => {
            let g = |op: fn(f64, f64) -> f64| {
                move |x, y| f64_out(op(f64::from_bits(x), f64::from_bits(y)), f)
            };
            match op {
                BinOp::Add | BinOp::AddSat => map2(a, b, r, g(|x, y| x + y)),
                BinOp::Sub | BinOp::SubSat => map2(a, b, r, g(|x, y| x - y)),
                BinOp::MulLo | BinOp::MulHi | BinOp::MulWide => map2(a, b, r, g(|x, y| x * y)),
                BinOp::Div => map2(a, b, r, g(|x, y| x / y)),
                BinOp::Min => map2(
                    a,
                    b,
                    r,
                    g(|x, y| {
                        if x == y {
                            f64::from_bits(x.to_bits() | y.to_bits())
                        } else {
                            x.min(y)
                        }
                    }),
                ),
                BinOp::Max => map2(
                    a,
                    b,
                    r,
                    g(|x, y| {
                        if x == y {
                            f64::from_bits(x.to_bits() & y.to_bits())
                        } else {
                            x.max(y)
                        }
                    }),
                ),
                BinOp::Copysign => map2(a, b, r, g(|x, y| y.copysign(x))),
                _ => map2(a, b, r, |_, _| 0),
            }
        }
        _ => match op {
            BinOp::Add => map2(a, b, r, |x, y| x.wrapping_add(y) & m),
            BinOp::Sub => map2(a, b, r, |x, y| x.wrapping_sub(y) & m),
            BinOp::AddSat => map2(a, b, r, |x, y| {
                u64::from((x as i32).saturating_add(y as i32) as u32)
            }),
            BinOp::SubSat => map2(a, b, r, |x, y| {
                u64::from((x as i32).saturating_sub(y as i32) as u32)
            }),
            BinOp::MulLo => map2(a, b, r, |x, y| x.wrapping_mul(y) & m),
            BinOp::MulHi => map2(a, b, r, |x, y| mul_hi(ty, x, y)),
            BinOp::MulWide => map2(a, b, r, |x, y| mul_wide(ty, x, y)),
            BinOp::Div => map2(a, b, r, |x, y| idiv(ty, x, y)),
            BinOp::Rem => map2(a, b, r, |x, y| irem(ty, x, y)),
            BinOp::Min if ty.is_signed() => map2(a, b, r, |x, y| {
                (ty.extend(x) as i64).min(ty.extend(y) as i64) as u64 & m
            }),
            BinOp::Max if ty.is_signed() => map2(a, b, r, |x, y| {
                (ty.extend(x) as i64).max(ty.extend(y) as i64) as u64 & m
            }),
            BinOp::Min => map2(a, b, r, |x, y| (x & m).min(y & m)),
            BinOp::Max => map2(a, b, r, |x, y| (x & m).max(y & m)),
            BinOp::And => map2(a, b, r, |x, y| x & y & m),
            BinOp::Or => map2(a, b, r, |x, y| (x | y) & m),
            BinOp::Xor => map2(a, b, r, |x, y| (x ^ y) & m),
            BinOp::Shl => map2(a, b, r, |x, y| {
                let y = y & 0xffff_ffff;
                if y >= u64::from(ty.bits()) {
                    0
                } else {
                    (x << y) & m
                }
            }),
            BinOp::Shr => map2(a, b, r, |x, y| shr(ty, x, y & 0xffff_ffff)),
            BinOp::Copysign
            | BinOp::CvtF16x2 { .. }
            | BinOp::Bmsk { .. }
            | BinOp::Simd16x2 { .. }
            | BinOp::Half { .. } => map2(a, b, r, |_, _| 0),
        },
    }
}

/// Unary op over lanes.
pub(crate) fn un(op: UnOp, ty: Ty, f: FFlags, a: &Lanes, r: &mut Lanes) {
    let m = ty.mask();
    match ty {
        Ty::F32 => {
            let g = |op: fn(f32) -> f32| move |x| f32_out(op(f32_in(x, f.ftz)), f);
            match op {
                UnOp::Mov => map1(a, r, |x| x & m),
                // Sign-bit operations: NaN payloads are kept.
                UnOp::Neg => map1(a, r, |x| u64::from((-f32_in(x, f.ftz)).to_bits())),
                UnOp::Abs => map1(a, r, |x| u64::from(f32_in(x, f.ftz).abs().to_bits())),
                UnOp::Sqrt => map1(a, r, g(f32::sqrt)),
                UnOp::Rsqrt => map1(a, r, g(|x| 1.0 / x.sqrt())),
                UnOp::Rcp => map1(a, r, g(|x| 1.0 / x)),
                UnOp::Ex2 => map1(a, r, g(f32::exp2)),
                UnOp::Lg2 => map1(a, r, g(f32::log2)),
                UnOp::Sin => map1(a, r, g(f32::sin)),
                UnOp::Cos => map1(a, r, g(f32::cos)),
                UnOp::Tanh => map1(a, r, g(f32::tanh)),
                _ => map1(a, r, |_| 0),
            }
        }
        Ty::F64 => {
            let g = |op: fn(f64) -> f64| move |x| f64_out(op(f64::from_bits(x)), f);
            match op {
                UnOp::Mov => map1(a, r, |x| x),
                UnOp::Neg => map1(a, r, |x| x ^ (1 << 63)),
                UnOp::Abs => map1(a, r, |x| x & !(1 << 63)),
                UnOp::Sqrt => map1(a, r, g(f64::sqrt)),
                UnOp::Rsqrt => map1(a, r, g(|x| 1.0 / x.sqrt())),
                UnOp::Rcp => map1(a, r, g(|x| 1.0 / x)),
                _ => map1(a, r, |_| 0),
            }
        }
        _ => match op {
            UnOp::Mov => map1(a, r, |x| x & m),
            UnOp::Neg => map1(a, r, |x| x.wrapping_neg() & m),
            UnOp::Abs => map1(a, r, |x| (ty.extend(x) as i64).wrapping_abs() as u64 & m),
            UnOp::Not => map1(a, r, |x| !x & m),
            UnOp::Cnot => map1(a, r, |x| u64::from(x & m == 0)),
            UnOp::Popc => map1(a, r, |x| u64::from((x & m).count_ones())),
            UnOp::Clz if ty.bits() == 32 => map1(a, r, |x| u64::from((x as u32).leading_zeros())),
            UnOp::Clz => map1(a, r, |x| u64::from(x.leading_zeros())),
            UnOp::Brev if ty.bits() == 32 => map1(a, r, |x| u64::from((x as u32).reverse_bits())),
            UnOp::Bfind { shiftamt } => map1(a, r, |x| bfind(ty, x, shiftamt)),
            UnOp::Brev => map1(a, r, u64::reverse_bits),
            _ => map1(a, r, |_| 0),
        },
    }
}

/// Bit-field extract (PTX `bfe`).
pub(crate) fn bfe(ty: Ty, a: u64, pos: u64, len: u64) -> u64 {
    let bits = u64::from(ty.bits());
    let (pos, len) = (pos & 0xff, len & 0xff);
    let sbit = if ty.is_signed() && len > 0 {
        let i = (pos + len - 1).min(bits - 1);
        (a >> i) & 1
    } else {
        0
    };
    let mut d = 0u64;
    for i in 0..bits {
        let bit = if i < len && pos + i < bits {
            (a >> (pos + i)) & 1
        } else {
            sbit
        };
        d |= bit << i;
    }
    d & ty.mask()
}

/// Bit-field insert (PTX `bfi`): insert `len` bits of `f` into `b` at `pos`.
pub(crate) fn bfi(ty: Ty, f: u64, b: u64, pos: u64, len: u64) -> u64 {
    let bits = u64::from(ty.bits());
    let (pos, len) = (pos & 0xff, len & 0xff);
    let mut d = b;
    for i in 0..len {
        if pos + i >= bits {
            break;
        }
        let bit = (f >> i) & 1;
        d = (d & !(1 << (pos + i))) | (bit << (pos + i));
    }
    d & ty.mask()
}

/// Ternary op over lanes.
pub(crate) fn ter(op: TerOp, ty: Ty, f: FFlags, a: &Lanes, b: &Lanes, c: &Lanes, r: &mut Lanes) {
    let m = ty.mask();
    match (op, ty) {
        (TerOp::HalfFma { x2, sat }, _) => map3(a, b, c, r, |x, y, z| {
            crate::exec::half::fma(x2, sat, x, y, z)
        }),
        (TerOp::Fma, Ty::F32) if f.dir != 0 => map3(a, b, c, r, |x, y, z| {
            let (x, y, z) = (f32_in(x, f.ftz), f32_in(y, f.ftz), f32_in(z, f.ftz));
            f32_out(directed_fma(x, y, z, f.dir), f)
        }),
        (TerOp::Fma, Ty::F32) => map3(a, b, c, r, |x, y, z| {
            f32_out(
                f32_in(x, f.ftz).mul_add(f32_in(y, f.ftz), f32_in(z, f.ftz)),
                f,
            )
        }),
        (TerOp::Fma, _) => map3(a, b, c, r, |x, y, z| {
            f64_out(
                f64::from_bits(x).mul_add(f64::from_bits(y), f64::from_bits(z)),
                f,
            )
        }),
        (TerOp::MadLo, _) => map3(a, b, c, r, |x, y, z| x.wrapping_mul(y).wrapping_add(z) & m),
        (TerOp::MadHi, _) => map3(a, b, c, r, |x, y, z| mul_hi(ty, x, y).wrapping_add(z) & m),
        (TerOp::MadWide, _) => {
            let wm = ty.wide().unwrap_or(Ty::U64).mask();
            map3(a, b, c, r, |x, y, z| {
                mul_wide(ty, x, y).wrapping_add(z) & wm
            })
        }
        (TerOp::Bfe, _) => map3(a, b, c, r, |x, y, z| bfe(ty, x, y, z)),
        (TerOp::Selp, _) => map3(a, b, c, r, |x, y, z| if z != 0 { x } else { y }),
        (TerOp::ShfL { clamp }, _) => map3(a, b, c, r, |x, y, z| {
            let n = if clamp {
                (z as u32).min(32)
            } else {
                z as u32 & 31
            };
            let v = (y << 32) | (x & 0xffff_ffff);
            ((v << n) >> 32) & 0xffff_ffff
        }),
        (TerOp::ShfR { clamp }, _) => map3(a, b, c, r, |x, y, z| {
            let n = if clamp {
                (z as u32).min(32)
            } else {
                z as u32 & 31
            };
            let v = ((y & 0xffff_ffff) << 32) | (x & 0xffff_ffff);
            (v >> n) & 0xffff_ffff
        }),
        (TerOp::Lop3 { lut }, _) => map3(a, b, c, r, |x, y, z| lop3(x, y, z, lut) & m),
        (TerOp::Sad, _) => map3(a, b, c, r, |x, y, z| {
            let diff = if ty.is_signed() {
                (ty.extend(x) as i64).abs_diff(ty.extend(y) as i64)
            } else {
                (x & m).abs_diff(y & m)
            };
            diff.wrapping_add(z) & m
        }),
    }
}

/// A packed 16x2 integer operation, half by half (add/sub wrap).
fn simd16x2(op: SimdOp, signed: bool, x: u32, y: u32) -> u64 {
    let half = |k: u32| {
        let (p, q) = ((x >> k) as u16, (y >> k) as u16);
        let v = match (op, signed) {
            (SimdOp::Add, _) => p.wrapping_add(q),
            (SimdOp::Sub, _) => p.wrapping_sub(q),
            (SimdOp::Min, false) => p.min(q),
            (SimdOp::Max, false) => p.max(q),
            (SimdOp::Min, true) => (p as i16).min(q as i16) as u16,
            (SimdOp::Max, true) => (p as i16).max(q as i16) as u16,
        };
        u64::from(v) << k
    };
    half(0) | half(16)
}

/// `bmsk.{clamp,wrap}.b32`: `b` ones starting at bit `a` (PTX ISA: clamp limits both to 32,
/// wrap takes them modulo 32; bits past 31 are dropped).
fn bmsk(clamp: bool, a: u32, b: u32) -> u64 {
    let (a, b) = if clamp {
        (a.min(32), b.min(32))
    } else {
        (a & 31, b & 31)
    };
    let ones = if b == 0 {
        0u64
    } else {
        u64::from(u32::MAX >> (32 - b))
    };
    (ones << a) & 0xffff_ffff
}

/// Comparison of one lane's operands.
#[inline(always)]
pub(crate) fn compare(cmp: Cmp, ty: Ty, ftz: bool, x: u64, y: u64) -> bool {
    match ty {
        Ty::F16 | Ty::F32 | Ty::F64 => {
            let (x, y) = if ty == Ty::F32 {
                (f64::from(f32_in(x, ftz)), f64::from(f32_in(y, ftz)))
            } else if ty == Ty::F16 {
                use crate::exec::cvt::f16_to_f64;
                (f16_to_f64(x as u16), f16_to_f64(y as u16))
            } else {
                (f64::from_bits(x), f64::from_bits(y))
            };
            let un = x.is_nan() || y.is_nan();
            match cmp {
                Cmp::Eq => x == y,
                Cmp::Ne => !un && x != y,
                Cmp::Lt => x < y,
                Cmp::Le => x <= y,
                Cmp::Gt => x > y,
                Cmp::Ge => x >= y,
                Cmp::Equ => un || x == y,
                Cmp::Neu => x != y,
                Cmp::Ltu => un || x < y,
                Cmp::Leu => un || x <= y,
                Cmp::Gtu => un || x > y,
                Cmp::Geu => un || x >= y,
                Cmp::Num => !un,
                Cmp::Nan => un,
            }
        }
        _ if ty.is_signed() => {
            let (x, y) = (ty.extend(x) as i64, ty.extend(y) as i64);
            int_cmp(cmp, x.cmp(&y))
        }
        _ => {
            let m = ty.mask();
            int_cmp(cmp, (x & m).cmp(&(y & m)))
        }
    }
}

fn int_cmp(cmp: Cmp, o: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match cmp {
        Cmp::Eq => o == Equal,
        Cmp::Ne => o != Equal,
        Cmp::Lt => o == Less,
        Cmp::Le => o != Greater,
        Cmp::Gt => o == Greater,
        Cmp::Ge => o != Less,
        _ => false,
    }
}

#[inline(always)]
fn build_mask(f: impl Fn(usize) -> bool) -> u32 {
    let mut m = 0u32;
    for l in 0..32 {
        m |= u32::from(f(l)) << l;
    }
    m
}

/// `setp` over lanes: bit `l` of the result is the comparison of lane `l`.
pub(crate) fn setp_mask(cmp: Cmp, ty: Ty, ftz: bool, a: &Lanes, b: &Lanes) -> u32 {
    if ty.is_float() || ty == Ty::F16 {
        return build_mask(|l| compare(cmp, ty, ftz, a[l], b[l]));
    }
    if ty.is_signed() {
        let sh = 64 - ty.bits();
        let e = |x: u64| ((x << sh) as i64) >> sh;
        match cmp {
            Cmp::Eq => build_mask(|l| e(a[l]) == e(b[l])),
            Cmp::Ne => build_mask(|l| e(a[l]) != e(b[l])),
            Cmp::Lt => build_mask(|l| e(a[l]) < e(b[l])),
            Cmp::Le => build_mask(|l| e(a[l]) <= e(b[l])),
            Cmp::Gt => build_mask(|l| e(a[l]) > e(b[l])),
            Cmp::Ge => build_mask(|l| e(a[l]) >= e(b[l])),
            _ => 0,
        }
    } else {
        let m = ty.mask();
        match cmp {
            Cmp::Eq => build_mask(|l| a[l] & m == b[l] & m),
            Cmp::Ne => build_mask(|l| a[l] & m != b[l] & m),
            Cmp::Lt => build_mask(|l| a[l] & m < b[l] & m),
            Cmp::Le => build_mask(|l| a[l] & m <= b[l] & m),
            Cmp::Gt => build_mask(|l| a[l] & m > b[l] & m),
            Cmp::Ge => build_mask(|l| a[l] & m >= b[l] & m),
            _ => 0,
        }
    }
}

/// `prmt.b32` default mode.
pub(crate) fn prmt(a: u64, b: u64, c: u64) -> u64 {
    let bytes = (b & 0xffff_ffff) << 32 | (a & 0xffff_ffff);
    let mut d = 0u64;
    for i in 0..4 {
        let sel = (c >> (4 * i)) & 0xf;
        let byte = (bytes >> (8 * (sel & 7))) & 0xff;
        let v = if sel & 8 != 0 {
            if byte & 0x80 != 0 { 0xff } else { 0 }
        } else {
            byte
        };
        d |= v << (8 * i);
    }
    d
}

/// `slct` condition: c >= 0 (s32) or c >= 0.0 (f32, NaN false).
pub(crate) fn slct_cond(cty: Ty, ftz: bool, c: u64) -> bool {
    if cty == Ty::F32 {
        f32_in(c, ftz) >= 0.0
    } else {
        (c as u32 as i32) >= 0
    }
}

/// `lop3`: bit i of the result is `lut[(a_i << 2) | (b_i << 1) | c_i]`, as the sum of the
/// minterms selected by the truth table (ta = 0xF0, tb = 0xCC, tc = 0xAA).
pub(crate) fn lop3(a: u64, b: u64, c: u64, lut: u8) -> u64 {
    let mut d = 0u64;
    for k in 0..8u8 {
        if lut >> k & 1 != 0 {
            let fa = if k & 4 != 0 { a } else { !a };
            let fb = if k & 2 != 0 { b } else { !b };
            let fc = if k & 1 != 0 { c } else { !c };
            d |= fa & fb & fc;
        }
    }
    d
}

/// `bfind`: index of the most significant non-sign bit (0xffffffff when none); with
/// `shiftamt`, the left shift that would bring it to the top.
pub(crate) fn bfind(ty: Ty, x: u64, shiftamt: bool) -> u64 {
    let bits = ty.bits();
    let v = x & ty.mask();
    // For signed types, search for the first bit that differs from the sign.
    let v = if ty.is_signed() && (v >> (bits - 1)) & 1 == 1 {
        !v & ty.mask()
    } else {
        v
    };
    if v == 0 {
        return 0xffff_ffff;
    }
    let pos = 63 - v.leading_zeros();
    u64::from(if shiftamt { bits - 1 - pos } else { pos })
}

/// One lane of carry-chain arithmetic on the low `bits` bits: returns (result, flag out).
/// For add/mad the flag is the carry, for sub the borrow (PTX CC.CF semantics).
pub(crate) fn carry_op(
    op: crate::ir::CarryOp,
    bits: u32,
    a: u64,
    b: u64,
    c: u64,
    cf: bool,
) -> (u64, bool) {
    use crate::ir::CarryOp;
    let m: u128 = if bits >= 64 {
        u128::from(u64::MAX)
    } else {
        (1u128 << bits) - 1
    };
    let (a, b, c, cf) = (
        u128::from(a) & m,
        u128::from(b) & m,
        u128::from(c) & m,
        u128::from(cf),
    );
    let wide = match op {
        CarryOp::Add => a + b + cf,
        CarryOp::MadLo => ((a * b) & m) + c + cf,
        CarryOp::MadHi => ((a * b) >> bits) + c + cf,
        CarryOp::Sub => {
            let sub = b + cf;
            return (((a.wrapping_sub(sub)) & m) as u64, sub > a);
        }
    };
    ((wide & m) as u64, wide > m)
}

/// Error-free sum: `a + b == s + e` exactly (f64, no overflow for f32-sized inputs).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// Move the round-to-nearest result `r` to the directed result, given `d` = exact − r (its
/// sign is exact: see the callers). `dir`: 1 toward zero, 2 toward −∞, 3 toward +∞.
fn direct(r: f32, d: f64, dir: u8) -> f32 {
    if r.is_nan() || d == 0.0 || d.is_nan() {
        return r;
    }
    let exact_pos = r > 0.0 || (r == 0.0 && d > 0.0);
    let down = dir == 2 || (dir == 1 && exact_pos);
    if d > 0.0 && !down {
        r.next_up()
    } else if d < 0.0 && down {
        r.next_down()
    } else {
        r
    }
}

/// f32 `a + b` with directed rounding.
pub(crate) fn directed_add(a: f32, b: f32, dir: u8) -> f32 {
    let r = a + b;
    let (s, e) = two_sum(f64::from(a), f64::from(b));
    direct(r, (s - f64::from(r)) + e, dir)
}

/// f32 `a * b` with directed rounding (the f64 product is exact).
pub(crate) fn directed_mul(a: f32, b: f32, dir: u8) -> f32 {
    let r = a * b;
    direct(r, f64::from(a) * f64::from(b) - f64::from(r), dir)
}

/// f32 `a * b + c` with directed rounding.
pub(crate) fn directed_fma(a: f32, b: f32, c: f32, dir: u8) -> f32 {
    let r = a.mul_add(b, c);
    let (s, e) = two_sum(f64::from(a) * f64::from(b), f64::from(c));
    direct(r, (s - f64::from(r)) + e, dir)
}
