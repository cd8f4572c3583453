//! `cvt`: conversions between every integer and float type with PTX rounding modes
//! (`.rn/.rz/.rm/.rp` exact directed rounding, `.rni/.rzi/.rmi/.rpi` to integral), saturation
//! and the hardware's NaN results.

use crate::exec::alu::{CANON_NAN_F64, f32_in, f32_out, f64_out};
use crate::ir::{FFlags, Rnd, Ty};

/// Integer value of a source as i128 (sign- or zero-extended).
fn int_val(ty: Ty, x: u64) -> i128 {
    if ty.is_signed() {
        i128::from(ty.extend(x) as i64)
    } else {
        i128::from(x & ty.mask())
    }
}

fn int_range(ty: Ty) -> (i128, i128) {
    let b = ty.bits();
    if ty.is_signed() {
        (-(1i128 << (b - 1)), (1i128 << (b - 1)) - 1)
    } else {
        (0, (1i128 << b) - 1)
    }
}

fn round_int(x: f64, rnd: Rnd) -> f64 {
    match rnd {
        Rnd::Rni | Rnd::Rn => x.round_ties_even(),
        Rnd::Rzi | Rnd::Rz => x.trunc(),
        Rnd::Rmi | Rnd::Rm => x.floor(),
        Rnd::Rpi | Rnd::Rp => x.ceil(),
        Rnd::None => x,
    }
}

/// Directed rounding of an exact value `v` to f32 given its nearest rounding `r`; `cmp` tells
/// how `r` compares to the exact value.
fn direct_f32(r: f32, cmp: std::cmp::Ordering, neg: bool, rnd: Rnd) -> f32 {
    use std::cmp::Ordering::*;
    let down = matches!(rnd, Rnd::Rm) || (matches!(rnd, Rnd::Rz) && !neg);
    let up = matches!(rnd, Rnd::Rp) || (matches!(rnd, Rnd::Rz) && neg);
    match cmp {
        Greater if down => r.next_down(),
        Less if up => r.next_up(),
        _ => r,
    }
}

fn direct_f64(r: f64, cmp: std::cmp::Ordering, neg: bool, rnd: Rnd) -> f64 {
    use std::cmp::Ordering::*;
    let down = matches!(rnd, Rnd::Rm) || (matches!(rnd, Rnd::Rz) && !neg);
    let up = matches!(rnd, Rnd::Rp) || (matches!(rnd, Rnd::Rz) && neg);
    match cmp {
        Greater if down => r.next_down(),
        Less if up => r.next_up(),
        _ => r,
    }
}

/// `cvt` of one value.
pub(crate) fn cvt(dty: Ty, sty: Ty, rnd: Rnd, sat: bool, ftz: bool, x: u64) -> u64 {
    if sty == Ty::Bf16 {
        // bf16 -> f32 (the only form decoded): the upper half of an f32, exactly.
        let v = f32::from_bits((x as u32 & 0xffff) << 16);
        return f32_out(
            v,
            FFlags {
                ftz,
                sat: false,
                dir: 0,
            },
        );
    }
    if dty == Ty::Bf16 {
        return u64::from(f32_to_bf16(f32_in(x, ftz), rnd));
    }
    if dty == Ty::F16 || sty == Ty::F16 {
        return cvt_f16(dty, sty, rnd, sat, ftz, x);
    }
    let fl = FFlags { ftz, sat, dir: 0 };
    match (dty.is_float(), sty.is_float()) {
        (false, false) => {
            let mut v = int_val(sty, x);
            if sat {
                let (lo, hi) = int_range(dty);
                v = v.clamp(lo, hi);
            }
            (v as u64) & dty.mask()
        }
        (false, true) => {
            let f = if sty == Ty::F32 {
                f64::from(f32_in(x, ftz))
            } else {
                f64::from_bits(x)
            };
            if f.is_nan() {
                // Hardware: NaN converts to 0 for 32-bit and narrower targets and to
                // 0x8000_0000_0000_0000 for s64 (measured); u64 is taken to behave the same.
                return if dty.bits() == 64 { 1 << 63 } else { 0 };
            }
            let (lo, hi) = int_range(dty);
            let v = (round_int(f, rnd) as i128).clamp(lo, hi);
            (v as u64) & dty.mask()
        }
        (true, false) => {
            let v = int_val(sty, x);
            if dty == Ty::F32 {
                let r = v as f32;
                let r = direct_f32(r, (r as i128).cmp(&v), v < 0, rnd);
                f32_out(r, fl)
            } else {
                let r = v as f64;
                let r = direct_f64(r, (r as i128).cmp(&v), v < 0, rnd);
                f64_out(r, fl)
            }
        }
        (true, true) => match (dty, sty) {
            (Ty::F32, Ty::F32) => f32_out(round_int(f64::from(f32_in(x, ftz)), rnd) as f32, fl),
            (Ty::F64, Ty::F64) => f64_out(round_int(f64::from_bits(x), rnd), fl),
            (Ty::F64, _) => f64_out(round_int(f64::from(f32_in(x, ftz)), rnd), fl),
            _ => {
                let v = f64::from_bits(x);
                let r = v as f32;
                let r = if v.is_nan() {
                    r
                } else {
                    let c = f64::from(r)
                        .partial_cmp(&v)
                        .unwrap_or(std::cmp::Ordering::Equal);
                    direct_f32(r, c, v < 0.0, rnd)
                };
                f32_out(r, fl)
            }
        },
    }
}

/// Conversions to or from `.f16`: the source value is taken exactly as f64 (every f16, f32
/// and f64 is; integers beyond 2^53 overflow f16 anyway), then rounded once.
fn cvt_f16(dty: Ty, sty: Ty, rnd: Rnd, sat: bool, ftz: bool, x: u64) -> u64 {
    let v = match sty {
        Ty::F16 => f16_to_f64(x as u16),
        Ty::F32 => f64::from(f32_in(x, ftz)),
        Ty::F64 => f64::from_bits(x),
        _ => int_val(sty, x) as f64,
    };
    if dty != Ty::F16 {
        return cvt(dty, Ty::F64, rnd, sat, false, v.to_bits());
    }
    let v = if sat {
        if v > 0.0 { v.min(1.0) } else { 0.0 }
    } else {
        v
    };
    let v = match rnd {
        Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi => round_int(v, rnd),
        _ => v,
    };
    u64::from(f64_to_f16(v, rnd))
}

/// f32 -> bfloat16, to nearest even (`Rnd::Rn`) or toward zero; NaN -> `0x7fff`.
pub(crate) fn f32_to_bf16(v: f32, rnd: Rnd) -> u16 {
    if v.is_nan() {
        return 0x7fff;
    }
    let b = v.to_bits();
    let r = if rnd == Rnd::Rz {
        b >> 16
    } else {
        // Round half to even on the 16 dropped bits (overflow to infinity carries naturally).
        (b + 0x7fff + ((b >> 16) & 1)) >> 16
    };
    r as u16
}

/// Exact value of an IEEE half.
pub(crate) fn f16_to_f64(h: u16) -> f64 {
    let e = i32::from((h >> 10) & 0x1f);
    let m = f64::from(h & 0x3ff);
    let mag = match e {
        0 => m * 2f64.powi(-24),
        31 if m == 0.0 => f64::INFINITY,
        31 => return f64::from_bits(CANON_NAN_F64),
        _ => (1024.0 + m) * 2f64.powi(e - 25),
    };
    if h & 0x8000 != 0 { -mag } else { mag }
}

/// Round `x` to an IEEE half (NaN → canonical 0x7fff).
pub(crate) fn f64_to_f16(x: f64, rnd: Rnd) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let neg = x.is_sign_negative();
    let sign: u16 = if neg { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_infinite() {
        return sign | 0x7c00;
    }
    // Rounding of the magnitude: 0 = toward zero, 1 = away from zero, 2 = nearest even.
    let mode = match rnd {
        Rnd::Rz | Rnd::Rzi => 0,
        Rnd::Rm | Rnd::Rmi => u8::from(neg),
        Rnd::Rp | Rnd::Rpi => u8::from(!neg),
        _ => 2,
    };
    let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(-14);
    if e > 15 {
        return sign | if mode == 0 { 0x7bff } else { 0x7c00 };
    }
    let q = a / 2f64.powi(e - 10); // exact: a power-of-two scaling
    let qi = match mode {
        0 => q.floor(),
        1 => q.ceil(),
        _ => q.round_ties_even(),
    } as u32;
    // Subnormals (e = -14, qi < 1024) and normals share this formula; a carry into the
    // exponent (qi = 2048) is handled by the addition, up to infinity.
    let bits = ((e + 15) as u32) * 1024 + qi - 1024;
    sign | bits.min(0x7c00) as u16
}
