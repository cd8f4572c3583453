//! Property tests: the interpreter's integer and float arithmetic, shifts, min/max and setp,
//! each run as a small PTX kernel over one warp and compared with Rust computing the same inputs
//! (models written independently of the interpreter's code; conversions and rounding are in
//! `rounding.rs`).

mod common;
use common::model::*;

use proptest::prelude::*;

const INT32: &[(&str, St, Model)] = &[
    ("add.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a).wrapping_add(u32_(b)))
    }),
    ("sub.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a).wrapping_sub(u32_(b)))
    }),
    ("mul.lo.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a).wrapping_mul(u32_(b)))
    }),
    ("mul.hi.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(((i64::from(s32(a)) * i64::from(s32(b))) >> 32) as u32)
    }),
    ("mul.hi.u32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(((u64::from(u32_(a)) * u64::from(u32_(b))) >> 32) as u32)
    }),
    ("mul.wide.s32 %d64, %a32, %b32;", St::U64, |a, b, _| {
        (i64::from(s32(a)) * i64::from(s32(b))) as u64
    }),
    ("mul.wide.u32 %d64, %a32, %b32;", St::U64, |a, b, _| {
        u64::from(u32_(a)) * u64::from(u32_(b))
    }),
    ("mad.lo.s32 %d32, %a32, %b32, %c32;", St::U32, |a, b, c| {
        w32(u32_(a).wrapping_mul(u32_(b)).wrapping_add(u32_(c)))
    }),
    ("mad.hi.s32 %d32, %a32, %b32, %c32;", St::U32, |a, b, c| {
        w32((((i64::from(s32(a)) * i64::from(s32(b))) >> 32) as u32).wrapping_add(u32_(c)))
    }),
    (
        "mad.wide.u32 %d64, %a32, %b32, %c64;",
        St::U64,
        |a, b, c| (u64::from(u32_(a)) * u64::from(u32_(b))).wrapping_add(c),
    ),
    (
        "mad.wide.s32 %d64, %a32, %b32, %c64;",
        St::U64,
        |a, b, c| ((i64::from(s32(a)) * i64::from(s32(b))) as u64).wrapping_add(c),
    ),
    ("div.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(s32(a)
            .checked_div(s32(b))
            .map_or(if s32(b) == 0 { u32::MAX } else { 0x8000_0000 }, |q| {
                q as u32
            }))
    }),
    ("div.u32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a).checked_div(u32_(b)).unwrap_or(u32::MAX))
    }),
    ("rem.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(if s32(b) == 0 {
            u32_(a)
        } else {
            s32(a).wrapping_rem(s32(b)) as u32
        })
    }),
    ("rem.u32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a).checked_rem(u32_(b)).unwrap_or(u32_(a)))
    }),
    ("min.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(s32(a).min(s32(b)) as u32)
    }),
    ("max.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(s32(a).max(s32(b)) as u32)
    }),
    ("min.u32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a).min(u32_(b)))
    }),
    ("max.u32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a).max(u32_(b)))
    }),
    ("shl.b32 %d32, %a32, %c32;", St::U32, |a, _, c| {
        w32(u32_(a).checked_shl(u32_(c)).unwrap_or(0))
    }),
    ("shr.u32 %d32, %a32, %c32;", St::U32, |a, _, c| {
        w32(u32_(a).checked_shr(u32_(c)).unwrap_or(0))
    }),
    ("shr.s32 %d32, %a32, %c32;", St::U32, |a, _, c| {
        w32((s32(a) >> u32_(c).min(31)) as u32)
    }),
    ("add.sat.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(s32(a).saturating_add(s32(b)) as u32)
    }),
    ("sub.sat.s32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(s32(a).saturating_sub(s32(b)) as u32)
    }),
    ("abs.s32 %d32, %a32;", St::U32, |a, _, _| {
        w32(s32(a).wrapping_abs() as u32)
    }),
    ("neg.s32 %d32, %a32;", St::U32, |a, _, _| {
        w32(s32(a).wrapping_neg() as u32)
    }),
    ("not.b32 %d32, %a32;", St::U32, |a, _, _| w32(!u32_(a))),
    ("popc.b32 %d32, %a32;", St::U32, |a, _, _| {
        w32(u32_(a).count_ones())
    }),
    ("clz.b32 %d32, %a32;", St::U32, |a, _, _| {
        w32(u32_(a).leading_zeros())
    }),
    ("brev.b32 %d32, %a32;", St::U32, |a, _, _| {
        w32(u32_(a).reverse_bits())
    }),
    ("and.b32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a) & u32_(b))
    }),
    ("or.b32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a) | u32_(b))
    }),
    ("xor.b32 %d32, %a32, %b32;", St::U32, |a, b, _| {
        w32(u32_(a) ^ u32_(b))
    }),
    ("prmt.b32 %d32, %a32, %b32, %c32;", St::U32, |a, b, c| {
        let mut src = [0u8; 8];
        src[..4].copy_from_slice(&u32_(a).to_le_bytes());
        src[4..].copy_from_slice(&u32_(b).to_le_bytes());
        let mut out = [0u8; 4];
        for (i, o) in out.iter_mut().enumerate() {
            let sel = (u32_(c) >> (4 * i)) & 0xf;
            let byte = src[(sel & 7) as usize];
            *o = if sel & 8 == 0 {
                byte
            } else if byte >= 0x80 {
                0xff
            } else {
                0
            };
        }
        w32(u32::from_le_bytes(out))
    }),
    (
        "slct.u32.s32 %d32, %a32, %b32, %c32;",
        St::U32,
        |a, b, c| {
            if s32(c) >= 0 {
                a & 0xffff_ffff
            } else {
                b & 0xffff_ffff
            }
        },
    ),
    ("slct.b32.f32 %d32, %a32, %b32, %fc;", St::U32, |a, b, c| {
        if f32_(c) >= 0.0 {
            a & 0xffff_ffff
        } else {
            b & 0xffff_ffff
        }
    }),
    ("bfe.u32 %d32, %a32, %b32, %c32;", St::U32, |a, b, c| {
        let (pos, len) = (u32_(b) & 0xff, u32_(c) & 0xff);
        let mut d = 0u32;
        for i in 0..32 {
            if i < len && pos + i < 32 {
                d |= ((u32_(a) >> (pos + i)) & 1) << i;
            }
        }
        w32(d)
    }),
    ("bfe.s32 %d32, %a32, %b32, %c32;", St::U32, |a, b, c| {
        let (pos, len) = (u32_(b) & 0xff, u32_(c) & 0xff);
        if len == 0 {
            return 0;
        }
        let top = (pos + len - 1).min(31);
        let sign = (u32_(a) >> top) & 1;
        let mut d = 0u32;
        for i in 0..32 {
            let bit = if i < len && pos + i < 32 {
                (u32_(a) >> (pos + i)) & 1
            } else {
                sign
            };
            d |= bit << i;
        }
        w32(d)
    }),
    ("bfi.b32 %d32, %a32, %b32, %c32, 5;", St::U32, |a, b, c| {
        let pos = u32_(c) & 0xff;
        let mut d = u32_(b);
        for i in 0..5 {
            if pos + i < 32 {
                d = (d & !(1 << (pos + i))) | (((u32_(a) >> i) & 1) << (pos + i));
            }
        }
        w32(d)
    }),
];

const INT64: &[(&str, St, Model)] = &[
    (
        "mov.b64 {%r1, %r2}, %a64;\nmov.b64 {%r3, %s32}, %b64;\nadd.cc.u32 %r1, %r1, %r3;\naddc.u32 %r2, %r2, %s32;\nmov.b64 %d64, {%r1, %r2};",
        St::U64,
        |a, b, _| a.wrapping_add(b),
    ),
    (
        "mov.b64 {%r1, %r2}, %a64;\nmov.b64 {%r3, %s32}, %b64;\nsub.cc.u32 %r1, %r1, %r3;\nsubc.u32 %r2, %r2, %s32;\nmov.b64 %d64, {%r1, %r2};",
        St::U64,
        |a, b, _| a.wrapping_sub(b),
    ),
    (
        "add.cc.u64 %d64, %a64, %b64;\naddc.u64 %d64, 0, 0;",
        St::U64,
        |a, b, _| ((u128::from(a) + u128::from(b)) >> 64) as u64,
    ),
    (
        "add.cc.s64 %d64, %a64, %b64;\naddc.cc.u64 %d64, %c64, %a64;\naddc.u64 %d64, 0, 0;",
        St::U64,
        |a, b, c| {
            let c1 = (u128::from(a) + u128::from(b)) >> 64;
            ((u128::from(c) + u128::from(a) + c1) >> 64) as u64
        },
    ),
    (
        "sub.cc.u64 %d64, %a64, %b64;\nsubc.u64 %d64, 0, 0;",
        St::U64,
        |a, b, _| {
            if a < b { u64::MAX } else { 0 }
        },
    ),
    (
        "mad.lo.cc.u32 %d32, %a32, %b32, %c32;\nmadc.hi.u32 %d32, %a32, %b32, 0;",
        St::U32,
        |a, b, c| {
            let p = u64::from(u32_(a)) * u64::from(u32_(b));
            let carry = ((p & 0xffff_ffff) + u64::from(u32_(c))) >> 32;
            w32(((p >> 32) + carry) as u32)
        },
    ),
    ("add.s64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        a.wrapping_add(b)
    }),
    ("sub.s64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        a.wrapping_sub(b)
    }),
    ("mul.lo.s64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        a.wrapping_mul(b)
    }),
    ("mul.hi.u64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        ((u128::from(a) * u128::from(b)) >> 64) as u64
    }),
    ("mul.hi.s64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        ((i128::from(a as i64) * i128::from(b as i64)) >> 64) as u64
    }),
    ("mad.lo.s64 %d64, %a64, %b64, %c64;", St::U64, |a, b, c| {
        a.wrapping_mul(b).wrapping_add(c)
    }),
    ("div.u64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        a.checked_div(b).unwrap_or(u64::MAX)
    }),
    ("div.s64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        if b == 0 {
            u64::MAX
        } else {
            (a as i64).wrapping_div(b as i64) as u64
        }
    }),
    ("rem.u64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        a.checked_rem(b).unwrap_or(a)
    }),
    ("rem.s64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        if b == 0 {
            a
        } else {
            (a as i64).wrapping_rem(b as i64) as u64
        }
    }),
    ("min.s64 %d64, %a64, %b64;", St::U64, |a, b, _| {
        (a as i64).min(b as i64) as u64
    }),
    ("max.u64 %d64, %a64, %b64;", St::U64, |a, b, _| a.max(b)),
    ("shl.b64 %d64, %a64, %c32;", St::U64, |a, _, c| {
        a.checked_shl(c as u32).unwrap_or(0)
    }),
    ("shr.u64 %d64, %a64, %c32;", St::U64, |a, _, c| {
        a.checked_shr(c as u32).unwrap_or(0)
    }),
    ("shr.s64 %d64, %a64, %c32;", St::U64, |a, _, c| {
        ((a as i64) >> (c as u32).min(63)) as u64
    }),
    ("popc.b64 %d32, %a64;", St::U32, |a, _, _| {
        u64::from(a.count_ones())
    }),
    ("clz.b64 %d32, %a64;", St::U32, |a, _, _| {
        u64::from(a.leading_zeros())
    }),
    ("neg.s64 %d64, %a64;", St::U64, |a, _, _| a.wrapping_neg()),
];

const FLOAT: &[(&str, St, Model)] = &[
    ("add.rn.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        wf32(f32_(a) + f32_(b))
    }),
    ("sub.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        wf32(f32_(a) - f32_(b))
    }),
    ("mul.rn.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        wf32(f32_(a) * f32_(b))
    }),
    ("div.rn.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        wf32(f32_(a) / f32_(b))
    }),
    ("fma.rn.f32 %fd, %fa, %fb, %fc;", St::F32, |a, b, c| {
        wf32(f32_(a).mul_add(f32_(b), f32_(c)))
    }),
    ("mad.rn.f32 %fd, %fa, %fb, %fc;", St::F32, |a, b, c| {
        wf32(f32_(a).mul_add(f32_(b), f32_(c)))
    }),
    ("min.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        // NaN-ignoring; -0 is below +0
        let (x, y) = (f32_(a), f32_(b));
        wf32(match x.partial_cmp(&y) {
            None if x.is_nan() => y,
            None => x,
            Some(std::cmp::Ordering::Less) => x,
            Some(std::cmp::Ordering::Greater) => y,
            Some(_) => {
                if x.is_sign_negative() {
                    x
                } else {
                    y
                }
            }
        })
    }),
    ("max.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        let (x, y) = (f32_(a), f32_(b));
        wf32(match x.partial_cmp(&y) {
            None if x.is_nan() => y,
            None => x,
            Some(std::cmp::Ordering::Less) => y,
            Some(std::cmp::Ordering::Greater) => x,
            Some(_) => {
                if x.is_sign_positive() {
                    x
                } else {
                    y
                }
            }
        })
    }),
    ("neg.f32 %fd, %fa;", St::F32, |a, _, _| wf32(-f32_(a))),
    ("abs.f32 %fd, %fa;", St::F32, |a, _, _| wf32(f32_(a).abs())),
    ("sqrt.rn.f32 %fd, %fa;", St::F32, |a, _, _| {
        wf32(f32_(a).sqrt())
    }),
    ("add.sat.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        // hardware: NaN and -0 saturate to +0
        let s = f32_(a) + f32_(b);
        wf32(if s > 0.0 { s.min(1.0) } else { 0.0 })
    }),
    ("mul.ftz.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        let ftz = |x: f32| {
            if x.is_subnormal() {
                0.0f32.copysign(x)
            } else {
                x
            }
        };
        wf32(ftz(ftz(f32_(a)) * ftz(f32_(b))))
    }),
    ("add.f64 %dd, %da, %db;", St::F64, |a, b, _| {
        (f64_(a) + f64_(b)).to_bits()
    }),
    ("mul.f64 %dd, %da, %db;", St::F64, |a, b, _| {
        (f64_(a) * f64_(b)).to_bits()
    }),
    ("div.rn.f64 %dd, %da, %db;", St::F64, |a, b, _| {
        (f64_(a) / f64_(b)).to_bits()
    }),
    ("fma.rn.f64 %dd, %da, %db, %dc;", St::F64, |a, b, c| {
        f64_(a).mul_add(f64_(b), f64_(c)).to_bits()
    }),
    ("sqrt.rn.f64 %dd, %da;", St::F64, |a, _, _| {
        f64_(a).sqrt().to_bits()
    }),
];

const SETP: &[(&str, St, Model)] = &[
    ("setp.lt.s32 %p, %a32, %b32;", St::Pred, |a, b, _| {
        u64::from(s32(a) < s32(b))
    }),
    ("setp.le.u32 %p, %a32, %b32;", St::Pred, |a, b, _| {
        u64::from(u32_(a) <= u32_(b))
    }),
    ("setp.hi.u32 %p, %a32, %b32;", St::Pred, |a, b, _| {
        u64::from(u32_(a) > u32_(b))
    }),
    ("setp.ge.s64 %p, %a64, %b64;", St::Pred, |a, b, _| {
        u64::from(a as i64 >= b as i64)
    }),
    ("setp.ne.b32 %p, %a32, %b32;", St::Pred, |a, b, _| {
        u64::from(u32_(a) != u32_(b))
    }),
    ("setp.eq.f32 %p, %fa, %fb;", St::Pred, |a, b, _| {
        u64::from(f32_(a) == f32_(b))
    }),
    ("setp.ne.f32 %p, %fa, %fb;", St::Pred, |a, b, _| {
        u64::from(!f32_(a).is_nan() && !f32_(b).is_nan() && f32_(a) != f32_(b))
    }),
    ("setp.neu.f32 %p, %fa, %fb;", St::Pred, |a, b, _| {
        u64::from(f32_(a) != f32_(b))
    }),
    ("setp.ltu.f32 %p, %fa, %fb;", St::Pred, |a, b, _| {
        u64::from(f32_(a).partial_cmp(&f32_(b)).is_none_or(|o| o.is_lt()))
    }),
    ("setp.gt.f32 %p, %fa, %fb;", St::Pred, |a, b, _| {
        u64::from(f32_(a) > f32_(b))
    }),
    ("setp.geu.f64 %p, %da, %db;", St::Pred, |a, b, _| {
        u64::from(f64_(a).partial_cmp(&f64_(b)).is_none_or(|o| o.is_ge()))
    }),
    ("setp.nan.f32 %p, %fa, %fb;", St::Pred, |a, b, _| {
        u64::from(f32_(a).is_nan() || f32_(b).is_nan())
    }),
    ("setp.num.f64 %p, %da, %db;", St::Pred, |a, b, _| {
        u64::from(!f64_(a).is_nan() && !f64_(b).is_nan())
    }),
    (
        "setp.lt.and.s32 %p|%q, %a32, %b32, %pc;",
        St::Pred,
        |a, b, c| u64::from(s32(a) < s32(b) && c & 1 == 1),
    ),
    (
        "setp.lt.or.s32 %q|%p, %a32, %b32, !%pc;",
        St::Pred,
        |a, b, c| u64::from(s32(a) >= s32(b) || c & 1 == 0),
    ),
    (
        "setp.eq.xor.u32 %p, %a32, %b32, %pc;",
        St::Pred,
        |a, b, c| u64::from((u32_(a) == u32_(b)) ^ (c & 1 == 1)),
    ),
    ("selp.b32 %d32, %a32, %b32, %pc;", St::U32, |a, b, c| {
        if c & 1 == 1 {
            a & 0xffff_ffff
        } else {
            b & 0xffff_ffff
        }
    }),
    (
        "setp.lt.u32 %p, %a32, %b32;\nnot.pred %p, %p;",
        St::Pred,
        |a, b, _| u64::from(u32_(a) >= u32_(b)),
    ),
    (
        "setp.lt.u32 %p, %a32, %b32;\nand.pred %p, %p, %pc;",
        St::Pred,
        |a, b, c| u64::from(u32_(a) < u32_(b) && c & 1 == 1),
    ),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn int32_ops(inputs in warp_inputs()) {
        check(INT32, &inputs)?;
    }

    #[test]
    fn int64_ops(inputs in warp_inputs()) {
        check(INT64, &inputs)?;
    }

    #[test]
    fn float_ops(inputs in warp_inputs()) {
        check(FLOAT, &inputs)?;
    }

    #[test]
    fn setp_ops(inputs in warp_inputs()) {
        check(SETP, &inputs)?;
    }
}
