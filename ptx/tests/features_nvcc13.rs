//! Edge cases of the instructions added for nvcc 13.0's output of ordinary CUDA C (see
//! nvcc_probes*.rs for the real programs): `bmsk` (CUB), `sad`, packed `.u16x2/.s16x2`
//! arithmetic (sm_90 `__vadd2`...), `cvt.f16x2.f32`, `.reg.TYPE` without a blank (the inline PTX
//! of cuda_fp16.hpp), and votes/reductions restricted to each lane's membermask (cooperative
//! groups' tiles).

mod common;
use common::*;

/// Runs a one-warp kernel whose body computes `%r9` from lane-dependent `%r1` (= lane) and
/// stores it to out[lane]; returns the 32 results.
fn lanes(regs: &str, body: &str) -> Vec<u32> {
    lanes_with("", regs, body)
}

/// [`lanes`] with module-scope declarations `module` before the entry.
fn lanes_with(module: &str, regs: &str, body: &str) -> Vec<u32> {
    let text = kern(
        ".param .u64 k_param_0",
        &format!(".reg .pred %p<4>;\n.reg .b32 %r<16>;\n.reg .b64 %rd<4>;\n{regs}"),
        &format!(
            "ld.param.u64 %rd1, [k_param_0];\nmov.u32 %r1, %tid.x;\n{body}\n\
             mul.wide.u32 %rd2, %r1, 4;\nadd.s64 %rd3, %rd1, %rd2;\nst.global.u32 [%rd3], %r9;\nret;"
        ),
    );
    let text = text.replacen(".visible .entry", &format!("{module}\n.visible .entry"), 1);
    let m = common::module(&text);
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(128);
    run(
        &m,
        "k",
        cfg([1, 1, 1], [32, 1, 1], 0, Params::default().u64(out)),
        &mem,
        1,
    );
    mem.u32s(out, 32)
}

#[test]
fn bmsk_clamp_and_wrap() {
    // a = lane, b = 40 - lane: clamp limits both to 32, wrap takes them modulo 32.
    let clamp = lanes(
        "",
        "mov.u32 %r2, 40;\nsub.u32 %r3, %r2, %r1;\nbmsk.clamp.b32 %r9, %r1, %r3;",
    );
    let wrap = lanes(
        "",
        "mov.u32 %r2, 40;\nsub.u32 %r3, %r2, %r1;\nbmsk.wrap.b32 %r9, %r1, %r3;",
    );
    for l in 0..32u32 {
        let mask = |a: u32, b: u32| {
            if b == 0 {
                0
            } else {
                ((u64::from(u32::MAX >> (32 - b))) << a) as u32
            }
        };
        assert_eq!(
            clamp[l as usize],
            mask(l, (40 - l).min(32)),
            "clamp lane {l}"
        );
        assert_eq!(wrap[l as usize], mask(l, (40 - l) & 31), "wrap lane {l}");
    }
    assert_eq!(clamp[0], u32::MAX);
    assert_eq!(wrap[8], 0, "width 32 wraps to 0");
}

#[test]
fn sad_signed_and_unsigned() {
    // sad.s32 of (lane - 16) and 5, plus 100; sad.u32 of the same bits wraps differently.
    let s = lanes("", "sub.s32 %r2, %r1, 16;\nsad.s32 %r9, %r2, 5, 100;");
    let u = lanes("", "sub.s32 %r2, %r1, 16;\nsad.u32 %r9, %r2, 5, 100;");
    for l in 0..32i32 {
        assert_eq!(
            s[l as usize],
            (l - 16 - 5).unsigned_abs() + 100,
            "s32 lane {l}"
        );
        assert_eq!(
            u[l as usize],
            ((l - 16) as u32).abs_diff(5).wrapping_add(100),
            "u32 lane {l}"
        );
    }
}

#[test]
fn packed_16x2_arithmetic() {
    // x = lane * 0x0fff_1001 (both halves vary, some negative as s16), y = 0x8001_7fff.
    let pre = "mul.lo.u32 %r2, %r1, 268374017;\nmov.u32 %r3, -2147385345;\n";
    let ops = [
        "add.u16x2",
        "sub.u16x2",
        "min.u16x2",
        "max.u16x2",
        "min.s16x2",
        "max.s16x2",
    ];
    for op in ops {
        let got = lanes("", &format!("{pre}{op} %r9, %r2, %r3;"));
        for l in 0..32u32 {
            let (x, y) = (l.wrapping_mul(0x0fff_1001), 0x8001_7fffu32);
            let half = |k: u32| {
                let (p, q) = ((x >> k) as u16, (y >> k) as u16);
                let v = match op {
                    "add.u16x2" => p.wrapping_add(q),
                    "sub.u16x2" => p.wrapping_sub(q),
                    "min.u16x2" => p.min(q),
                    "max.u16x2" => p.max(q),
                    "min.s16x2" => (p as i16).min(q as i16) as u16,
                    _ => (p as i16).max(q as i16) as u16,
                };
                u32::from(v) << k
            };
            assert_eq!(got[l as usize], half(0) | half(16), "{op} lane {l}");
        }
    }
}

#[test]
fn cvt_f16x2_rounds_each_half_and_relu_clamps() {
    // a = lane - 16.3 (upper half), b = 2049 + lane (lower half: ties to even above 2048).
    let pre =
        "cvt.rn.f32.s32 %f1, %r1;\nsub.f32 %f2, %f1, 0f41826666;\nadd.f32 %f3, %f1, 0f45001000;\n";
    let rn = lanes(
        ".reg .f32 %f<4>;",
        &format!("{pre}cvt.rn.f16x2.f32 %r9, %f2, %f3;"),
    );
    let relu = lanes(
        ".reg .f32 %f<4>;",
        &format!("{pre}cvt.rz.relu.f16x2.f32 %r9, %f2, %f3;"),
    );
    for l in 0..32u32 {
        let (a, b) = (l as f32 - 16.3, 2049.0 + l as f32);
        let (hi, lo) = (rn[l as usize] >> 16, rn[l as usize] & 0xffff);
        // 2049 + l: halves above 2048 are even integers; odd ones tie to the even neighbour.
        let want_b = if (2049 + l) % 2 == 1 {
            if (2049 + l) % 4 == 1 {
                b - 1.0
            } else {
                b + 1.0
            }
        } else {
            b
        };
        assert_eq!(half_value(lo), want_b, "lower half, lane {l}");
        assert!(
            (half_value(hi) - a).abs() <= a.abs() / 1024.0,
            "upper half, lane {l}"
        );
        let relu_hi = half_value(relu[l as usize] >> 16);
        if a < 0.0 {
            assert_eq!(relu[l as usize] >> 16, 0, "relu clamps lane {l}");
        } else {
            assert!(relu_hi <= a && a - relu_hi <= a / 1024.0, "rz, lane {l}");
        }
    }
}

fn half_value(h: u32) -> f32 {
    let (e, f) = (((h >> 10) & 31) as i32, (h & 0x3ff) as f32);
    let m = match e {
        0 => f * 2f32.powi(-24),
        31 if f == 0.0 => f32::INFINITY,
        31 => f32::NAN,
        _ => (1.0 + f / 1024.0) * 2f32.powi(e - 15),
    };
    if h & 0x8000 != 0 { -m } else { m }
}

#[test]
fn joined_reg_type_declaration() {
    let got = lanes(
        "",
        "{.reg.b32 t;\n.reg.b16 h;\nadd.u32 t, %r1, 7;\ncvt.u16.u32 h, t;\ncvt.u32.u16 %r9, h;\n}",
    );
    assert_eq!(got, (7..39).collect::<Vec<u32>>());
}

#[test]
fn votes_and_reductions_per_membermask() {
    // Tiles of 4 lanes (mask 0xf << (lane & ~3)), as cooperative groups build them.
    let pre = "and.b32 %r2, %r1, -4;\nmov.u32 %r3, 15;\nshl.b32 %r4, %r3, %r2;\n";
    let ballot = lanes(
        "",
        &format!(
            "{pre}and.b32 %r5, %r1, 1;\nsetp.ne.s32 %p1, %r5, 0;\nvote.sync.ballot.b32 %r9, %p1, %r4;"
        ),
    );
    let all = lanes(
        "",
        &format!(
            "{pre}setp.lt.u32 %p1, %r1, 6;\nvote.sync.all.pred %p2, %p1, %r4;\nselp.u32 %r9, 1, 0, %p2;"
        ),
    );
    let sum = lanes("", &format!("{pre}redux.sync.add.u32 %r9, %r1, %r4;"));
    for l in 0..32u32 {
        let tile = l & !3;
        assert_eq!(ballot[l as usize], 0xa << tile, "ballot lane {l}");
        assert_eq!(all[l as usize], u32::from(tile + 3 < 6), "all lane {l}");
        assert_eq!(sum[l as usize], 4 * tile + 6, "redux lane {l}");
    }
}

/// Special halves: +0, -0, 1, -2.5, max finite, +inf, NaN, smallest subnormal.
const HALVES: [u16; 8] = [
    0x0000, 0x8000, 0x3c00, 0xc100, 0x7bff, 0x7c00, 0x7e00, 0x0001,
];

fn hv(h: u16) -> f64 {
    f64::from(half_value(u32::from(h)))
}

/// Nearest half to `v`, ties to even (NaN as 0x7fff).
fn to_half(v: f64) -> u16 {
    if v.is_nan() {
        return 0x7fff;
    }
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    let a = v.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    let k = (0..0x7c00u16)
        .min_by(|&p, &q| {
            let (dp, dq) = ((hv(p) - a).abs(), (hv(q) - a).abs());
            dp.partial_cmp(&dq).unwrap().then((p & 1).cmp(&(q & 1)))
        })
        .unwrap();
    sign | k
}

#[test]
fn half_arithmetic_on_special_values() {
    let table = format!(
        ".global .align 2 .b16 tab[8] = {{{}}};",
        HALVES.map(|h| h.to_string()).join(", ")
    );
    // x = tab[lane & 7], y = tab[(lane >> 3) * 2 + 1 & 7]: each x against four ys.
    let load = "and.b32 %r2, %r1, 7;\nshr.u32 %r3, %r1, 3;\nshl.b32 %r3, %r3, 1;\nadd.u32 %r3, %r3, 1;\n\
        and.b32 %r3, %r3, 7;\nmov.u64 %rd2, tab;\nmul.wide.u32 %rd3, %r2, 2;\nadd.s64 %rd3, %rd2, %rd3;\n\
        ld.global.b16 %h1, [%rd3];\nmul.wide.u32 %rd3, %r3, 2;\nadd.s64 %rd3, %rd2, %rd3;\nld.global.b16 %h2, [%rd3];\n";
    let regs = ".reg .b16 %h<4>;";
    let run_op = |op: &str| lanes_with(&table, regs, &format!("{load}{op}\ncvt.u32.u16 %r9, %h3;"));
    let add = run_op("add.f16 %h3, %h1, %h2;");
    let mul = run_op("mul.rn.f16 %h3, %h1, %h2;");
    let min = run_op("min.f16 %h3, %h1, %h2;");
    let max = run_op("max.f16 %h3, %h1, %h2;");
    let fma_sat = run_op("fma.rn.sat.f16 %h3, %h1, %h2, %h1;");
    let lt = run_op("setp.lt.f16 %p1, %h1, %h2;\nselp.b16 %h3, 1, 0, %p1;");
    let neg = run_op("neg.f16 %h3, %h1;");
    for l in 0..32usize {
        let (p, q) = (HALVES[l & 7], HALVES[((l >> 3) * 2 + 1) & 7]);
        let (x, y) = (hv(p), hv(q));
        let ctx = format!("lane {l}: x={x} ({p:#06x}) y={y} ({q:#06x})");
        let canon = |h: u16| if hv(h).is_nan() { 0x7fff } else { h };
        assert_eq!(canon(add[l] as u16), to_half(x + y), "add, {ctx}");
        assert_eq!(canon(mul[l] as u16), to_half(x * y), "mul, {ctx}");
        let pick = |want_min: bool| -> u16 {
            match (x.is_nan(), y.is_nan()) {
                (true, true) => 0x7fff,
                (true, false) => q,
                (false, true) => p,
                _ if x == y => {
                    if want_min == x.is_sign_negative() {
                        p
                    } else {
                        q
                    }
                }
                _ => {
                    if (x < y) == want_min {
                        p
                    } else {
                        q
                    }
                }
            }
        };
        assert_eq!(min[l] as u16, pick(true), "min, {ctx}");
        assert_eq!(max[l] as u16, pick(false), "max, {ctx}");
        let f = x * y + x;
        let sat = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
        assert_eq!(fma_sat[l] as u16, to_half(sat), "fma.sat, {ctx}");
        assert_eq!(lt[l], u32::from(x < y), "setp.lt, {ctx}");
        assert_eq!(neg[l] as u16, p ^ 0x8000, "neg, {ctx}");
    }
}
