//! Half-precision arithmetic (`.f16`, and `.f16x2` half by half): exact in f64, then one
//! rounding to nearest even (`.sat` clamps to [0, 1], NaN to 0). `fma` is computed as
//! `a * b + c` in f64 (the product is exact; the sum is exact unless the operands' magnitudes
//! are about 2^50 apart), then rounded once.

use crate::exec::cvt::{f16_to_f64, f64_to_f16};
use crate::ir::{HalfOp, Rnd};

fn finish(v: f64, sat: bool) -> u64 {
    let v = if !sat {
        v
    } else if v.is_nan() {
        0.0
    } else {
        v.clamp(0.0, 1.0)
    };
    u64::from(f64_to_f16(v, Rnd::Rn))
}

fn one(op: HalfOp, sat: bool, p: u16, q: u16) -> u64 {
    let (a, b) = (f16_to_f64(p), f16_to_f64(q));
    let v = match op {
        HalfOp::Add => a + b,
        HalfOp::Sub => a - b,
        HalfOp::Mul => a * b,
        // IEEE minNum/maxNum: a NaN operand gives the other; -0 orders below +0.
        HalfOp::Min | HalfOp::Max => {
            let pick_a = match (a.is_nan(), b.is_nan()) {
                (true, true) => return 0x7fff,
                (true, false) => false,
                (false, true) => true,
                _ if a == b => (op == HalfOp::Min) == a.is_sign_negative(),
                _ => (a < b) == (op == HalfOp::Min),
            };
            return u64::from(if pick_a { p } else { q });
        }
    };
    finish(v, sat)
}

/// `op` on one half (`x2` false) or on both halves of a packed pair.
pub(crate) fn bin(op: HalfOp, x2: bool, sat: bool, x: u64, y: u64) -> u64 {
    let lo = one(op, sat, x as u16, y as u16);
    if !x2 {
        return lo;
    }
    lo | one(op, sat, (x >> 16) as u16, (y >> 16) as u16) << 16
}

/// `fma.rn[.sat].f16[x2]`.
pub(crate) fn fma(x2: bool, sat: bool, x: u64, y: u64, z: u64) -> u64 {
    let f = |k: u32| {
        let h = |v: u64| f16_to_f64((v >> k) as u16);
        finish(h(x) * h(y) + h(z), sat) << k
    };
    if x2 { f(0) | f(16) } else { f(0) }
}
