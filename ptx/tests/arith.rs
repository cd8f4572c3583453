//! Property tests: the interpreter's integer/float arithmetic, shifts, min/max, cvt rounding
//! and saturation, and setp, each run as a small PTX kernel over one warp and compared with
//! Rust computing the same inputs (models written independently of the interpreter's code).

mod common;
use common::*;

use proptest::prelude::*;

#[derive(Clone, Copy)]
enum St {
    U32,
    U64,
    F32,
    F64,
    Pred,
}

type Model = fn(u64, u64, u64) -> u64;

/// Build a kernel: per lane load a, b, c (u64 slots; 32-bit and f32 views read the low half),
/// run each line, store slot k at out[k * 32 + lane].
fn kernel(slots: &[(&str, St, Model)]) -> String {
    let mut body = String::new();
    for (k, (line, st, _)) in slots.iter().enumerate() {
        let off = k * 256;
        body.push_str(line);
        body.push('\n');
        body.push_str(&match st {
            St::U32 => format!("st.global.u32 [%rd5+{off}], %d32;\n"),
            St::U64 => format!("st.global.u64 [%rd5+{off}], %d64;\n"),
            St::F32 => format!("st.global.f32 [%rd5+{off}], %fd;\n"),
            St::F64 => format!("st.global.f64 [%rd5+{off}], %dd;\n"),
            St::Pred => format!("selp.u32 %d32, 1, 0, %p;\nst.global.u32 [%rd5+{off}], %d32;\n"),
        });
    }
    format!(
        r#".version 7.8
.target sm_80
.address_size 64
.visible .entry k(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pout)
{{
.reg .b64 %rd<8>;
.reg .b32 %r<4>;
.reg .b32 %a32, %b32, %c32, %d32, %s32;
.reg .b64 %a64, %b64, %c64, %d64;
.reg .f32 %fa, %fb, %fc, %fd;
.reg .f64 %da, %db, %dc, %dd;
.reg .pred %p, %q, %pc;
.reg .b16 %h;
mov.u32 %r1, %tid.x;
mul.wide.u32 %rd1, %r1, 8;
ld.param.u64 %rd2, [pa];
add.s64 %rd2, %rd2, %rd1;
ld.param.u64 %rd3, [pb];
add.s64 %rd3, %rd3, %rd1;
ld.param.u64 %rd4, [pc];
add.s64 %rd4, %rd4, %rd1;
ld.param.u64 %rd5, [pout];
add.s64 %rd5, %rd5, %rd1;
ld.global.u64 %a64, [%rd2];
ld.global.u64 %b64, [%rd3];
ld.global.u64 %c64, [%rd4];
ld.global.u32 %a32, [%rd2];
ld.global.u32 %b32, [%rd3];
ld.global.u32 %c32, [%rd4];
ld.global.f32 %fa, [%rd2];
ld.global.f32 %fb, [%rd3];
ld.global.f32 %fc, [%rd4];
ld.global.f64 %da, [%rd2];
ld.global.f64 %db, [%rd3];
ld.global.f64 %dc, [%rd4];
and.b32 %s32, %c32, 1;
setp.ne.u32 %pc, %s32, 0;
{body}
ret;
}}
"#
    )
}

fn check(slots: &[(&str, St, Model)], inputs: &[(u64, u64, u64)]) -> Result<(), TestCaseError> {
    let m = module(&kernel(slots));
    let mut mem = Mem::new(1 << 20);
    let va = mem.put_u64(&inputs.iter().map(|x| x.0).collect::<Vec<_>>());
    let vb = mem.put_u64(&inputs.iter().map(|x| x.1).collect::<Vec<_>>());
    let vc = mem.put_u64(&inputs.iter().map(|x| x.2).collect::<Vec<_>>());
    let out = mem.put_u64(&vec![0; 32 * slots.len()]);
    let p = Params::default().u64(va).u64(vb).u64(vc).u64(out);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [inputs.len() as u32, 1, 1], 0, p),
        &mem,
        1,
    );
    let got = mem.u64s(out, 32 * slots.len());
    for (k, (line, st, model)) in slots.iter().enumerate() {
        for (l, &(a, b, c)) in inputs.iter().enumerate() {
            let want = model(a, b, c);
            let g = got[k * 32 + l];
            let nan_ok = match st {
                St::F32 => {
                    f32::from_bits(want as u32).is_nan() && f32::from_bits(g as u32).is_nan()
                }
                St::F64 => f64::from_bits(want).is_nan() && f64::from_bits(g).is_nan(),
                _ => false,
            };
            prop_assert!(
                nan_ok || g == want,
                "`{}` a={:#x} b={:#x} c={:#x}: got {:#x} want {:#x}",
                line,
                a,
                b,
                c,
                g,
                want
            );
        }
    }
    Ok(())
}

fn operand() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..70,
        Just(0u64),
        Just(u64::MAX),
        Just(0x8000_0000),
        Just(0xFFFF_FFFF),
        Just(0x8000_0000_0000_0000),
        (-1000i64..1000).prop_map(|x| x as u64),
        (-1000i32..1000).prop_map(|x| u64::from(x as u32)),
        (-100.0f32..100.0).prop_map(|f| u64::from(f.to_bits())),
        (-1e10f64..1e10).prop_map(f64::to_bits),
        Just(u64::from(f32::NAN.to_bits())),
        Just(u64::from(f32::INFINITY.to_bits())),
        Just(u64::from(2.5f32.to_bits())),
        Just(u64::from((-0.5f32).to_bits())),
        Just(u64::from((-0.0f32).to_bits())),
        // exact midpoints between neighbouring halves (round-to-nearest-even ties)
        (0u16..0x7bff, any::<bool>()).prop_map(|(h, neg)| {
            let mid = ((half_value(h) + half_value(h + 1)) / 2.0) as f32;
            u64::from((if neg { -mid } else { mid }).to_bits())
        }),
        Just(u64::from(1e-40f32.to_bits())),
    ]
}

fn warp_inputs() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    prop::collection::vec((operand(), operand(), operand()), 1..=32)
}

fn s32(x: u64) -> i32 {
    x as u32 as i32
}
fn u32_(x: u64) -> u32 {
    x as u32
}
fn f32_(x: u64) -> f32 {
    f32::from_bits(x as u32)
}
fn f64_(x: u64) -> f64 {
    f64::from_bits(x)
}
fn w32(v: u32) -> u64 {
    u64::from(v)
}
fn wf32(v: f32) -> u64 {
    u64::from(v.to_bits())
}

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

/// f32 rounding of an i64 toward zero, by truncating the magnitude to 24 significant bits.
fn i64_to_f32_rz(v: i64) -> f32 {
    let m = v.unsigned_abs();
    let bits = 64 - m.leading_zeros();
    let drop = bits.saturating_sub(24);
    let t = (m >> drop) << drop;
    let f = t as f32; // exact
    if v < 0 { -f } else { f }
}

/// Value of a finite half, from its fields (independent of the interpreter's decoder).
fn half_value(h: u16) -> f64 {
    let (e, m) = (i32::from(h >> 10 & 0x1f), f64::from(h & 0x3ff));
    let mag = if e == 0 {
        m / 1024.0 * 2f64.powi(-14)
    } else {
        (1.0 + m / 1024.0) * 2f64.powi(e - 15)
    };
    if h & 0x8000 != 0 { -mag } else { mag }
}

/// Round to half by searching the ordered table of positive halves (mode: n, z, m, p).
fn half_round(x: f64, mode: char) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    // Positive halves 0..=0x7c00 are ordered by value; infinity counts as 65536 (the
    // IEEE overflow threshold for round-to-nearest is then the midpoint 65520).
    let val = |h: u16| if h == 0x7c00 { 65536.0 } else { half_value(h) };
    let hi = (0u16..=0x7c00)
        .collect::<Vec<_>>()
        .partition_point(|&h| val(h) < a) as u16;
    let hi = hi.min(0x7c00);
    let lo = if val(hi) == a || hi == 0 { hi } else { hi - 1 };
    let lo = if a.is_infinite() { 0x7c00 } else { lo };
    let away = match mode {
        'z' => false,
        'm' => sign != 0,
        'p' => sign == 0,
        _ => {
            let (dl, dh) = (a - val(lo), val(hi) - a);
            dh < dl || (dh == dl && hi & 1 == 0)
        }
    };
    let r = if away { hi } else { lo };
    // directed toward zero never gives infinity for finite input
    let r = if !away && r == 0x7c00 && !a.is_infinite() {
        0x7bff
    } else {
        r
    };
    sign | r
}

fn half_bits_model(x: f64, mode: char) -> u64 {
    u64::from(half_round(x, mode))
}

const CVT: &[(&str, St, Model)] = &[
    (
        "cvt.rn.f16.f32 %h, %fa;\ncvt.u32.u16 %d32, %h;",
        St::U32,
        |a, _, _| half_bits_model(f64::from(f32_(a)), 'n'),
    ),
    (
        "cvt.rz.f16.f32 %h, %fa;\ncvt.u32.u16 %d32, %h;",
        St::U32,
        |a, _, _| half_bits_model(f64::from(f32_(a)), 'z'),
    ),
    (
        "cvt.rm.f16.f64 %h, %da;\ncvt.u32.u16 %d32, %h;",
        St::U32,
        |a, _, _| half_bits_model(f64_(a), 'm'),
    ),
    (
        "cvt.rp.f16.f32 %h, %fa;\ncvt.u32.u16 %d32, %h;",
        St::U32,
        |a, _, _| half_bits_model(f64::from(f32_(a)), 'p'),
    ),
    (
        "cvt.rn.f16.s32 %h, %a32;\ncvt.u32.u16 %d32, %h;",
        St::U32,
        |a, _, _| half_bits_model(f64::from(s32(a)), 'n'),
    ),
    (
        "cvt.u16.u32 %h, %a32;\ncvt.f32.f16 %fd, %h;",
        St::F32,
        |a, _, _| {
            let h = a as u16;
            if h & 0x7c00 == 0x7c00 && h & 0x3ff != 0 {
                return u64::from(f32::NAN.to_bits());
            }
            wf32(if h & 0x7fff == 0x7c00 {
                if h & 0x8000 != 0 {
                    f32::NEG_INFINITY
                } else {
                    f32::INFINITY
                }
            } else {
                half_value(h) as f32
            })
        },
    ),
    (
        "cvt.u16.u32 %h, %a32;\ncvt.rzi.s32.f16 %d32, %h;",
        St::U32,
        |a, _, _| {
            let h = a as u16;
            let v = if h & 0x7c00 == 0x7c00 {
                if h & 0x3ff != 0 {
                    return 0;
                }
                if h & 0x8000 != 0 {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }
            } else {
                half_value(h)
            };
            w32(v.trunc() as i32 as u32)
        },
    ),
    ("cvt.rni.s32.f32 %d32, %fa;", St::U32, |a, _, _| {
        w32(f32_(a).round_ties_even() as i32 as u32)
    }),
    ("cvt.rzi.u32.f32 %d32, %fa;", St::U32, |a, _, _| {
        w32(f32_(a).trunc() as u32)
    }),
    ("cvt.rmi.s64.f32 %d64, %fa;", St::U64, |a, _, _| {
        // NaN -> 0x8000000000000000 for 64-bit targets (measured for s64 on the hardware)
        if f32_(a).is_nan() {
            1 << 63
        } else {
            f32_(a).floor() as i64 as u64
        }
    }),
    ("cvt.rpi.u64.f64 %d64, %da;", St::U64, |a, _, _| {
        if f64_(a).is_nan() {
            1 << 63
        } else {
            f64_(a).ceil() as u64
        }
    }),
    ("cvt.rzi.s32.f64 %d32, %da;", St::U32, |a, _, _| {
        w32(f64_(a).trunc() as i32 as u32)
    }),
    ("cvt.rn.f32.s32 %fd, %a32;", St::F32, |a, _, _| {
        wf32(s32(a) as f32)
    }),
    ("cvt.rn.f32.u64 %fd, %a64;", St::F32, |a, _, _| {
        wf32(a as f32)
    }),
    ("cvt.rz.f32.s64 %fd, %a64;", St::F32, |a, _, _| {
        wf32(i64_to_f32_rz(a as i64))
    }),
    ("cvt.rn.f64.s64 %dd, %a64;", St::F64, |a, _, _| {
        (a as i64 as f64).to_bits()
    }),
    ("cvt.rn.f32.f64 %fd, %da;", St::F32, |a, _, _| {
        wf32(f64_(a) as f32)
    }),
    ("cvt.f64.f32 %dd, %fa;", St::F64, |a, _, _| {
        f64::from(f32_(a)).to_bits()
    }),
    ("cvt.rzi.f32.f32 %fd, %fa;", St::F32, |a, _, _| {
        wf32(f32_(a).trunc())
    }),
    ("cvt.rni.f32.f32 %fd, %fa;", St::F32, |a, _, _| {
        wf32(f32_(a).round_ties_even())
    }),
    ("cvt.sat.f32.f32 %fd, %fa;", St::F32, |a, _, _| {
        let x = f32_(a);
        wf32(if x > 0.0 { x.min(1.0) } else { 0.0 })
    }),
    ("cvt.u16.u32 %d32, %a32;", St::U32, |a, _, _| a & 0xffff),
    ("cvt.s32.s8 %d32, %a32;", St::U32, |a, _, _| {
        w32(a as u8 as i8 as i32 as u32)
    }),
    ("cvt.s64.s32 %d64, %a32;", St::U64, |a, _, _| {
        s32(a) as i64 as u64
    }),
    ("cvt.u64.u32 %d64, %a32;", St::U64, |a, _, _| {
        a & 0xffff_ffff
    }),
    ("cvt.sat.u8.s32 %d32, %a32;", St::U32, |a, _, _| {
        w32(s32(a).clamp(0, 255) as u32)
    }),
    ("cvt.sat.s8.s32 %d32, %a32;", St::U32, |a, _, _| {
        w32(s32(a).clamp(-128, 127) as u32)
    }),
    ("cvt.sat.s16.s64 %d32, %a64;", St::U32, |a, _, _| {
        w32((a as i64).clamp(-32768, 32767) as i32 as u32)
    }),
    ("cvt.sat.u32.s64 %d32, %a64;", St::U32, |a, _, _| {
        w32((a as i64).clamp(0, u32::MAX as i64) as u32)
    }),
    ("cvt.s8.s32 %d32, %a32;", St::U32, |a, _, _| {
        w32(a as u8 as i8 as i32 as u32)
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

/// f32 in ±[2^-16, 2^16]: small enough for exact i128 models of directed rounding.
fn moderate_f32() -> impl Strategy<Value = u64> {
    (any::<bool>(), 0u32..(1 << 23), (127 - 16)..(127 + 16u32))
        .prop_map(|(neg, m, e)| u64::from((u32::from(neg) << 31) | (e << 23) | m))
}

/// Exact value of a moderate f32 in units of 2^-39 (it is a multiple of that).
fn units39(x: f32) -> i128 {
    (f64::from(x) * 2f64.powi(39)) as i128
}

/// Exact value of a moderate f32 (or of a rounded result) in units of 2^-78.
fn units(x: f32) -> i128 {
    let v = f64::from(x) * 2f64.powi(78);
    if v.abs() < 2f64.powi(100) {
        v as i128
    } else {
        units39(x) << 39
    }
}

/// Directed rounding of the exact value `x` (units of 2^-78) to f32; mode z, m or p.
fn round_units(x: i128, mode: char) -> f32 {
    let approx = (x as f64 * 2f64.powi(-78)) as f32;
    let mut lo = approx.next_down().next_down();
    while units(lo.next_up()) <= x {
        lo = lo.next_up();
    }
    let hi = if units(lo) == x { lo } else { lo.next_up() };
    match mode {
        'm' => lo,
        'p' => hi,
        _ => {
            if x >= 0 {
                lo
            } else {
                hi
            }
        }
    }
}

fn dir_add(a: u64, b: u64, mode: char, sub: bool) -> u64 {
    let (x, y) = (units(f32_(a)), units(f32_(b)));
    wf32(round_units(if sub { x - y } else { x + y }, mode))
}

fn dir_mul(a: u64, b: u64, mode: char) -> u64 {
    let p = units39(f32_(a)) * units39(f32_(b));
    wf32(round_units(p, mode))
}

fn dir_fma(a: u64, b: u64, c: u64, mode: char) -> u64 {
    let p = units39(f32_(a)) * units39(f32_(b)) + units(f32_(c));
    wf32(round_units(p, mode))
}

const DIRECTED: &[(&str, St, Model)] = &[
    ("add.rz.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        dir_add(a, b, 'z', false)
    }),
    ("add.rm.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        dir_add(a, b, 'm', false)
    }),
    ("sub.rp.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        dir_add(a, b, 'p', true)
    }),
    ("mul.rz.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        dir_mul(a, b, 'z')
    }),
    ("mul.rm.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        dir_mul(a, b, 'm')
    }),
    ("mul.rp.f32 %fd, %fa, %fb;", St::F32, |a, b, _| {
        dir_mul(a, b, 'p')
    }),
    ("fma.rz.f32 %fd, %fa, %fb, %fc;", St::F32, |a, b, c| {
        dir_fma(a, b, c, 'z')
    }),
    ("fma.rm.f32 %fd, %fa, %fb, %fc;", St::F32, |a, b, c| {
        dir_fma(a, b, c, 'm')
    }),
    ("fma.rp.f32 %fd, %fa, %fb, %fc;", St::F32, |a, b, c| {
        dir_fma(a, b, c, 'p')
    }),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn directed_rounding_f32(inputs in prop::collection::vec((moderate_f32(), moderate_f32(), moderate_f32()), 1..=32)) {
        check(DIRECTED, &inputs)?;
    }

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
    fn cvt_ops(inputs in warp_inputs()) {
        check(CVT, &inputs)?;
    }

    #[test]
    fn setp_ops(inputs in warp_inputs()) {
        check(SETP, &inputs)?;
    }
}
