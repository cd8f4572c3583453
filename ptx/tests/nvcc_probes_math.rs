//! nvcc 13.0 output of tests/data/probes/math.cu (CUDA's math library in single and double
//! precision, the fast intrinsics, half conversions) on the interpreter against Rust's `std`
//! math. CUDA's functions are not correctly rounded (documented ulp bounds) and the fast
//! intrinsics use `.approx` instructions the interpreter computes exactly, so results are
//! compared within a relative tolerance; conversions are checked exactly.

mod common;
use common::*;

const MATH: &str = include_str!("data/probes/math.80.ptx");

/// erf by its Taylor series in f64 (std has no erf): accurate to ~1e-12 for |z| <= 5.
fn erf(z: f64) -> f64 {
    let (mut term, mut sum) = (z, z);
    for n in 1..200 {
        term *= -z * z / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs().max(1.0)
}

fn inputs(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (i as f32 - 128.0) * 0.37 + (i % 7) as f32 * 0.113)
        .collect()
}

#[test]
fn single_precision_math_library() {
    let n = 256usize;
    let x = inputs(n);
    let mut mem = Mem::new(1 << 20);
    let (vin, out) = (mem.put_f32(&x), mem.alloc(n * 80));
    let m = module(MATH);
    let p = Params::default().u64(vin).u64(out).u32(n as u32);
    run(&m, "mathf", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let got = mem.f32s(out, n * 20);
    for i in 0..n {
        let x = x[i];
        let ax = x.abs() + 0.5;
        let (xd, axd) = (f64::from(x), f64::from(ax));
        let want: [(f64, f64); 20] = [
            (axd.sqrt(), 1e-7),
            ((xd * 0.05).exp(), 4e-7),
            (axd.ln(), 4e-7),
            (xd.sin(), 4e-7),
            (xd.cos(), 4e-7),
            (axd.powf(1.7), 1e-6),
            (xd.min(1.0) + xd.max(-1.0), 1e-7),
            (1.0 / axd.sqrt(), 4e-7),
            (xd / axd, 4e-7),
            (erf(xd * 0.1), 4e-7),
            ((xd * 0.1).tanh(), 4e-7),
            ((xd * 0.05).exp() + axd.ln() + xd.sin() + xd.cos(), 2e-6),
            (f64::from(x), 1e-3),
            (
                xd.floor() + xd.ceil() + xd.trunc() + xd.round() + xd.round_ties_even(),
                1e-7,
            ),
            (f64::from(x % 3.0), 1e-7),
            (
                (xd.atan2(2.0)) + xd.atan() + (xd * 0.001).asin() + (xd * 0.001).acos(),
                1e-6,
            ),
            (
                (xd * 0.1).exp2() + axd.log2() + axd.log10() + (xd * 0.01).exp_m1() + axd.ln_1p(),
                1e-6,
            ),
            (xd.cbrt() + xd.hypot(3.0), 1e-6),
            (xd / axd, 1e-7),
            (f64::from(x as i32) + f64::from((ax * 3.0) as u32), 0.0),
        ];
        for (k, (w, tol)) in want.iter().enumerate() {
            let g = f64::from(got[i * 20 + k]);
            assert!(
                close(g, *w, *tol),
                "mathf output {k} for x={x}: got {g}, want {w}"
            );
        }
    }
}

#[test]
fn double_precision_math_library() {
    let n = 256usize;
    let x: Vec<f64> = (0..n)
        .map(|i| (i as f64 - 128.0) * 0.151 + (i % 5) as f64 * 0.0371)
        .collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u64(&x.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    let out = mem.alloc(n * 80);
    let m = module(MATH);
    let p = Params::default().u64(vin).u64(out).u32(n as u32);
    run(&m, "mathd", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let got: Vec<f64> = mem
        .u64s(out, n * 10)
        .into_iter()
        .map(f64::from_bits)
        .collect();
    for i in 0..n {
        let x = x[i];
        let ax = x.abs() + 0.5;
        let want: [(f64, f64); 10] = [
            (ax.sqrt(), 1e-16),
            ((x * 0.05).exp(), 1e-15),
            (ax.ln(), 1e-15),
            (x.sin() + x.cos(), 1e-15),
            (ax.powf(1.7), 1e-15),
            (x / ax, 1e-16),
            (x.min(1.0) + x.max(-1.0) + x.floor() + x.ceil(), 1e-16),
            (erf(x * 0.1) + (x * 0.1).tanh(), 1e-12),
            (1.0 / ax.sqrt() + 1.0 / ax, 1e-15),
            ((x as i64) as f64 + f64::from(x as f32), 0.0),
        ];
        for (k, (w, tol)) in want.iter().enumerate() {
            let g = got[i * 10 + k];
            assert!(
                close(g, *w, *tol),
                "mathd output {k} for x={x}: got {g}, want {w}"
            );
        }
    }
}

fn f16_to_f32(h: u16) -> f32 {
    let (s, e, f) = (
        (h >> 15) as u32,
        ((h >> 10) & 31) as i32,
        (h & 0x3ff) as f32,
    );
    let mag = match e {
        0 => f * 2f32.powi(-24),
        31 => {
            if f == 0.0 {
                f32::INFINITY
            } else {
                f32::NAN
            }
        }
        _ => (1.0 + f / 1024.0) * 2f32.powi(e - 15),
    };
    if s == 1 { -mag } else { mag }
}

/// `h` is the nearest half to `x` (ties to even), checked against its neighbours.
fn is_nearest_half(h: u16, x: f32) -> bool {
    let d = |k: u16| (f64::from(f16_to_f32(k)) - f64::from(x)).abs();
    let (lo, hi) = (h.wrapping_sub(1), h.wrapping_add(1));
    let tie_ok = |k: u16| d(k) > d(h) || (d(k) == d(h) && h & 1 == 0);
    (h & 0x7fff == 0 || tie_ok(lo)) && (h & 0x7fff >= 0x7bff || tie_ok(hi))
}

#[test]
fn half_conversions_including_the_packed_pair() {
    let n = 256usize;
    let x: Vec<f32> = inputs(n)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 + i as f32 * 0.77))
        .collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_f32(&x);
    let (h, back, h2) = (mem.alloc(n * 2), mem.alloc(n * 4), mem.alloc(n * 4));
    let m = module(MATH);
    let p = Params::default()
        .u64(vin)
        .u64(h)
        .u64(back)
        .u64(h2)
        .u32(n as u32);
    run(&m, "halfs", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let hs: Vec<u16> = mem
        .mem
        .read(h, n * 2)
        .unwrap()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let backs = mem.f32s(back, n);
    let pairs = mem.u32s(h2, n);
    for i in 0..n {
        assert!(is_nearest_half(hs[i], x[i]), "x={} -> {:#06x}", x[i], hs[i]);
        // __floats2half2_rn(x, -x): .x (low half) = x, .y (high half) = -x.
        assert_eq!(
            pairs[i] & 0xffff,
            u32::from(hs[i]),
            "low half of the pair, x={}",
            x[i]
        );
        assert_eq!(
            pairs[i] >> 16,
            u32::from(hs[i] ^ 0x8000),
            "high half of the pair, x={}",
            x[i]
        );
        // back = half(x) + half_rz(x/2): recover the rz half and check it truncates.
        let rz = backs[i] - f16_to_f32(hs[i]);
        let half_x = x[i] * 0.5;
        assert!(
            rz.abs() <= half_x.abs(),
            "rz rounds toward zero: {rz} vs {half_x}"
        );
        assert!(
            half_x.abs() - rz.abs() <= half_x.abs() / 1024.0 + 6e-8,
            "rz within one half ulp"
        );
    }
}

/// Nearest half to `v` (ties to even), by search over the monotonic positive encodings.
fn to_half(v: f64) -> u16 {
    if v.is_nan() {
        return 0x7fff;
    }
    let sign = if v.is_sign_negative() { 0x8000 } else { 0 };
    let a = v.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    let val = |k: u16| f64::from(f16_to_f32(k));
    let (mut lo, mut hi) = (0u16, 0x7bffu16);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if val(mid) <= a {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    let k = if lo < 0x7bff {
        let (d0, d1) = (a - val(lo), val(lo + 1) - a);
        if d1 < d0 || (d1 == d0 && lo & 1 == 1) {
            lo + 1
        } else {
            lo
        }
    } else {
        lo
    };
    sign | k
}

#[test]
fn half_and_half2_arithmetic() {
    let n = 256usize;
    let mut rng = Rng(29);
    let mut rnd = || to_half(((rng.u32() % 16001) as f64 - 8000.0) / 1000.0);
    let (a, b): (Vec<u16>, Vec<u16>) = (0..n).map(|_| (rnd(), rnd())).unzip();
    let mut mem = Mem::new(1 << 20);
    let put16 = |mem: &mut Mem, v: &[u16]| {
        let va = mem.alloc(v.len() * 2);
        assert!(mem.mem.write(
            va,
            &v.iter().flat_map(|h| h.to_le_bytes()).collect::<Vec<_>>()
        ));
        va
    };
    let (va, vb) = (put16(&mut mem, &a), put16(&mut mem, &b));
    let (out, out2, fout) = (mem.alloc(n * 8), mem.alloc(n * 4), mem.alloc(n * 4));
    let m = module(include_str!("data/probes/halfmath.80.ptx"));
    let p = Params::default()
        .u64(va)
        .u64(vb)
        .u64(out)
        .u64(out2)
        .u64(fout)
        .u32(n as u32);
    run(&m, "halfmath", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let got: Vec<u16> = mem
        .mem
        .read(out, n * 8)
        .unwrap()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let (got2, gotf) = (mem.u32s(out2, n), mem.f32s(fout, n));
    let h = |k: u16| f64::from(f16_to_f32(k));
    for i in 0..n {
        let (x, y) = (h(a[i]), h(b[i]));
        let want = [
            to_half(x + y),
            to_half(x * y),
            to_half(x * y + 1.0),
            if x > y { a[i] } else { b[i] },
        ];
        assert_eq!(got[i * 4..i * 4 + 4], want, "element {i}: x={x} y={y}");
        let lane = |v: f64| u32::from(to_half(h(to_half(v * v)) + h(to_half(v * v + v))));
        assert_eq!(
            got2[i],
            lane(x) | lane(y) << 16,
            "half2 element {i}: x={x} y={y}"
        );
        let sqrt = f16_to_f32(to_half(f64::from((x.abs() as f32).sqrt())));
        assert_eq!(
            gotf[i],
            sqrt + if -x <= y { 1.0 } else { 0.0 },
            "element {i}: x={x} y={y}"
        );
    }
}

#[test]
fn bfloat16_conversions_compute_80_and_90() {
    let n = 256usize;
    let mut rng = Rng(31);
    let x: Vec<f32> = (0..n)
        .map(|i| match i {
            0 => f32::from_bits(0x3f80_8000), // a tie: 1 + 2^-8, to even (1.0)
            1 => f32::from_bits(0x3f81_8000), // a tie to even upwards
            2 => -f32::from_bits(0x3f80_8001),
            3 => f32::MAX,
            _ => f32::from_bits(rng.u32() & 0xbfff_ffff),
        })
        .collect();
    for (k, text) in [
        include_str!("data/probes/halfmath.80.ptx"),
        include_str!("data/probes/halfmath.90.ptx"),
    ]
    .iter()
    .enumerate()
    {
        let mut mem = Mem::new(1 << 20);
        let vin = mem.put_f32(&x);
        let (out, back) = (mem.alloc(n * 2), mem.alloc(n * 4));
        let m = module(text);
        let p = Params::default().u64(vin).u64(out).u64(back).u32(n as u32);
        run(&m, "bf16conv", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
        let bs: Vec<u16> = mem
            .mem
            .read(out, n * 2)
            .unwrap()
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let backs = mem.f32s(back, n);
        for i in 0..n {
            let bits = x[i].to_bits();
            let (lo, rest) = ((bits >> 16) as u16, bits & 0xffff);
            // Nearest, ties to even; toward zero is the truncation.
            let rn = if rest > 0x8000 || (rest == 0x8000 && lo & 1 == 1) {
                lo + 1
            } else {
                lo
            };
            let f = |h: u16| f32::from_bits(u32::from(h) << 16);
            assert_eq!(
                bs[i],
                rn,
                "compute_{} x={:e} ({bits:#x})",
                80 + 10 * k,
                x[i]
            );
            assert_eq!(
                backs[i],
                f(rn) - f(lo),
                "compute_{} x={:e}",
                80 + 10 * k,
                x[i]
            );
        }
    }
}
