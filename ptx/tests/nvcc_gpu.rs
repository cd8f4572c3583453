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
