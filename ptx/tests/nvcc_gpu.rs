//! Real nvcc output (CUDA 13.0, `-arch=sm_80 -O3`) of `tests/data/nvcc/*.cu`, run through the
//! interpreter and compared with what an NVIDIA H200 computed for the same inputs
//! (`tests/data/nvcc/gpu.txt`, written by `harness.cu`). Integer results must match bit for bit;
//! float results too except where the code uses `.approx` instructions (ex2/lg2/rcp/...), which
//! the interpreter computes exactly rounded: those are compared within a few ulp.

mod common;
use common::*;

const MATHFN: &str = include_str!("data/nvcc/mathfn.ptx");
const INTOPS: &str = include_str!("data/nvcc/intops.ptx");
const GPU: &str = include_str!("data/nvcc/gpu.txt");

/// The GPU's output words after the section header `name`.
fn gpu_section(name: &str, count: usize) -> Vec<u64> {
    let mut lines = GPU.lines().skip_while(|l| *l != name).skip(1);
    (0..count)
        .map(|_| u64::from_str_radix(lines.next().expect("enough lines"), 16).expect("hex"))
        .collect()
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn math_input(i: usize) -> f32 {
    if i.is_multiple_of(50) {
        return 1.0e6f32 + i as f32;
    }
    (i as i32 - 128) as f32 * 0.37 + (i % 7) as f32 * 13.1
}

#[test]
fn intops_matches_the_gpu_bit_for_bit() {
    let n = 256usize;
    let a: Vec<u64> = (0..n as u64).map(mix).collect();
    let b: Vec<u64> = (0..n as u64).map(|i| mix(i + 1000)).collect();
    let mut mem = Mem::new(1 << 20);
    let (va, vb) = (mem.put_u64(&a), mem.put_u64(&b));
    let out = mem.alloc(n * 64);
    let m = module(INTOPS);
    let p = Params::default().u64(va).u64(vb).u64(out).u32(n as u32);
    run(&m, "intops", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let got = mem.u64s(out, n * 8);
    let want = gpu_section("intops", n * 8);
    for k in 0..n * 8 {
        assert_eq!(
            got[k],
            want[k],
            "element {k} (thread {}, output {})",
            k / 8,
            k % 8
        );
    }
}

#[test]
fn mathfn_matches_the_gpu() {
    let n = 256usize;
    let input: Vec<f32> = (0..n).map(math_input).collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_f32(&input);
    let out = mem.alloc(n * 32);
    let counts = mem.alloc(n * 4);
    let m = module(MATHFN);
    let p = Params::default()
        .u64(vin)
        .u64(out)
        .u64(counts)
        .u32(n as u32);
    run(&m, "mathfn", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let want = gpu_section("mathfn", n * 8 + n + 1);
    let got = mem.u32s(out, n * 8);
    let mut exact = 0;
    for k in 0..n * 8 {
        let (g, w) = (f32::from_bits(got[k]), f32::from_bits(want[k] as u32));
        if got[k] == want[k] as u32 {
            exact += 1;
            continue;
        }
        let tol = w.abs() * 4.0 * f32::EPSILON + 1e-30;
        assert!(
            (g - w).abs() <= tol,
            "element {k} (x = {}, fn {}): got {g:e} ({:#x}), gpu {w:e} ({:#x})",
            input[k / 8],
            k % 8,
            got[k],
            want[k]
        );
    }
    // Most results do not depend on approximate instructions at all.
    assert!(exact * 2 > n * 8, "only {exact} of {} bit-exact", n * 8);
    let c = mem.u32s(counts, n);
    for i in 0..n {
        assert_eq!(
            u64::from(c[i]),
            want[n * 8 + i],
            "__syncthreads_count of thread {i}"
        );
    }
    assert_eq!(
        m.read_variable("calls"),
        Some((want[n * 9] as u32).to_le_bytes().to_vec()),
        "__device__ counter"
    );
}

const COV1: &str = include_str!("data/nvcc/cov1.ptx");

#[test]
fn nvcc_switch_and_half_conversions() {
    let m = module(COV1);
    let n = 300usize;
    let mut r = Rng(9);
    let v: Vec<u32> = (0..n).map(|_| r.u32()).collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u32(&v);
    let out = mem.alloc(n * 4);
    let p = Params::default().u64(vin).u64(out).u32(n as u32);
    run(&m, "sw", cfg([3, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let got = mem.u32s(out, n);
    for i in 0..n {
        let x = v[i] as i32;
        let want = match x & 7 {
            0 => x.wrapping_mul(3),
            1 => x ^ 0x55,
            2 => x / 7,
            3 => x % 11,
            4 => x.count_ones() as i32,
            5 => x.leading_zeros() as i32,
            6 => x << 3,
            _ => x.wrapping_neg(),
        };
        assert_eq!(got[i] as i32, want, "i={i} x={x}");
    }
    // __float2half / __half2float round trip plus a warp reduction of the thread index.
    let f: Vec<f32> = (0..n).map(|i| (i as f32 - 150.0) * 1.37 + 0.3).collect();
    let vf = mem.put_f32(&f);
    let halves = mem.alloc(n * 2);
    let back = mem.alloc(n * 4);
    let p = Params::default()
        .u64(vf)
        .u64(halves)
        .u64(back)
        .u32(n as u32);
    run(&m, "halfconv", cfg([3, 1, 1], [128, 1, 1], 0, p), &mem, 1);
    let hb = mem.mem.read(halves, n * 2).unwrap();
    let b = mem.f32s(back, n);
    for i in 0..n {
        let h = u16::from_le_bytes([hb[2 * i], hb[2 * i + 1]]);
        // Reference half rounding: f32 -> f64 -> nearest half, via the value grid.
        let x = f64::from(f[i]);
        let e = x.abs().log2().floor().max(-14.0) as i32;
        let ulp = 2f64.powi(e - 10);
        let q = (x / ulp).round_ties_even() * ulp;
        let hv = f32::from_bits(
            ((u32::from(h) & 0x8000) << 16) | {
                let (ex, mt) = (u32::from(h >> 10 & 0x1f), u32::from(h & 0x3ff));
                if ex == 0 {
                    0
                } else {
                    ((ex + 112) << 23) | (mt << 13)
                }
            },
        );
        assert_eq!(f64::from(hv), q, "i={i}");
        let warp_lo = (i / 32) * 32;
        let sum: u32 = (warp_lo..(warp_lo + 32).min(n)).map(|k| k as u32).sum();
        // The last warp of the last CTA is partial (threads >= n exit before the reduction).
        assert_eq!(b[i], hv + sum as f32, "i={i}");
    }
}

#[test]
fn nvcc_double_math_is_accurate() {
    let m = module(COV1);
    let n = 96usize;
    let x: Vec<f64> = (0..n).map(|i| (i as f64 - 40.0) * 0.731 + 0.01).collect();
    let mut mem = Mem::new(1 << 20);
    let b: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let vin = mem.alloc(n * 8);
    assert!(mem.mem.write(vin, &b));
    let out = mem.put_u64(&vec![0; n + 1]);
    let p = Params::default().u64(vin).u64(out).u32(n as u32);
    run(&m, "dmath", cfg([3, 1, 1], [32, 1, 1], 0, p), &mem, 1);
    let got: Vec<f64> = mem.u64s(out, n).into_iter().map(f64::from_bits).collect();
    let f = |x: f64| {
        x.sin()
            + x.cos() * (x * 0.01).exp()
            + (x.abs() + 1.0).ln()
            + x.abs().powf(0.3)
            + x.abs().sqrt()
            + x.tanh()
            + x.atan2(2.0)
    };
    for i in 0..n {
        // __shfl_down_sync past the last lane returns the caller's own value.
        let r = f(x[i]) + if i % 32 == 31 { f(x[i]) } else { f(x[i + 1]) };
        let want = r / (x[i] + 3.0);
        assert!(
            (got[i] - want).abs() <= want.abs() * 1e-13 + 1e-13,
            "i={i} x={}: got {} want {want}",
            x[i],
            got[i]
        );
    }
}

const COV2: &str = include_str!("data/nvcc/cov2.ptx");

#[test]
fn nvcc_cooperative_groups_atomics_and_templates() {
    let m = module(COV2);
    let n = 128usize;
    let mut mem = Mem::new(1 << 20);
    let f4: Vec<f32> = (0..n).flat_map(|i| [i as f32, 1.0, 2.0, 3.0]).collect();
    let vin = mem.put_f32(&f4);
    let fmax = mem.put_f32(&[-1.0e30]);
    let u = mem.put_u32(&[u32::MAX, 0, 0, 500, 0]);
    let dsum = mem.put_u64(&[0]);
    let t = mem.put_u64(&[0, 0]);
    let p = Params::default()
        .u64(vin)
        .u64(fmax)
        .u64(u)
        .u64(dsum)
        .u64(t)
        .u32(n as u32);
    run(&m, "cov2", cfg([2, 1, 1], [64, 1, 1], 64 * 8, p), &mem, 2);
    // s = x + y*z - w = i - 1; tile sums of 32 consecutive i; the largest is the last tile.
    let tile_max: f32 = (96..128).map(|i| i as f32 - 1.0).sum();
    assert_eq!(mem.f32s(fmax, 1)[0], tile_max);
    let uu = mem.u32s(u, 5);
    assert_eq!(uu[1], 127);
    assert_eq!(uu[2], 128);
    assert_eq!(uu[3], 500 - 128);
    // match.any over s > 0: lanes 0 and 1 of the first warp (s = -1, 0) form the smallest
    // group mask.
    assert_eq!(uu[0], 0b11);
    let total: f64 = (0..128).map(|i| f64::from(i) - 1.0).sum();
    assert_eq!(f64::from_bits(mem.u64s(dsum, 1)[0]), total);
}
