//! Property tests: the interpreter's conversions (cvt rounding modes and saturation, f16
//! halves) and directed rounding of f32 add/mul/fma, each run as a small PTX kernel over one warp
//! and compared with exact Rust models.

mod common;
use common::model::*;

use proptest::prelude::*;

/// f32 rounding of an i64 toward zero, by truncating the magnitude to 24 significant bits.
fn i64_to_f32_rz(v: i64) -> f32 {
    let m = v.unsigned_abs();
    let bits = 64 - m.leading_zeros();
    let drop = bits.saturating_sub(24);
    let t = (m >> drop) << drop;
    let f = t as f32; // exact
    if v < 0 { -f } else { f }
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
    fn cvt_ops(inputs in warp_inputs()) {
        check(CVT, &inputs)?;
    }
}
