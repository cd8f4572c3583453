//! nvcc 13.0 output of the probes of library-style code on the interpreter against a CPU
//! reference: integer and bit intrinsics (intrin.cu, whose compute_90 PTX differs and is run
//! too), a volatile warp-synchronous reduction, cooperative groups (cg.cu) and CUB's block
//! reduce, scan and radix sort (cub.cu, compute_80 and compute_90).

mod common;
use common::*;

const INTRIN: [&str; 2] = [
    include_str!("data/probes/intrin.80.ptx"),
    include_str!("data/probes/intrin.90.ptx"),
];
const CG: &str = include_str!("data/probes/cg.80.ptx");
const CUB: [&str; 2] = [
    include_str!("data/probes/cub.80.ptx"),
    include_str!("data/probes/cub.90.ptx"),
];

fn sext24(x: u32) -> i32 {
    ((x << 8) as i32) >> 8
}

fn intrin_ref(i: usize, x: u32, y: u64) -> ([u32; 12], [u64; 2]) {
    let funnel = (u64::from(0xdead_beefu32) << 32) | u64::from(x);
    let s = (i & 31) as u32;
    let bp = |k: u32| -> u32 {
        let bytes = funnel_bytes(x, 0x1122_3344);
        u32::from(bytes[((0x5140u32 >> (4 * k)) & 7) as usize]) << (8 * k)
    };
    let vadd2 = (x & 0xffff_0000).wrapping_add(0x0001_0000) | ((x & 0xffff) + 1) & 0xffff;
    let vsub4 = (0..4).fold(0u32, |a, k| {
        a | (((x >> (8 * k)) as u8).wrapping_sub(1) as u32) << (8 * k)
    });
    let ffs = |v: u64| if v == 0 { 0 } else { v.trailing_zeros() + 1 };
    (
        [
            x.reverse_bits(),
            x.leading_zeros(),
            ffs(u64::from(x)),
            y.count_ones(),
            ((u64::from(x) * 0x9e37_79b9) >> 32) as u32,
            (sext24(x & 0xff_ffff) as i64 * 12345) as u32,
            (x & 0xffff).abs_diff(777) + 5,
            bp(0) | bp(1) | bp(2) | bp(3),
            ((funnel << s) >> 32) as u32,
            (funnel >> s) as u32,
            y.leading_zeros() + ffs(y),
            vadd2 ^ vsub4,
        ],
        [
            ((u128::from(y) * 0x9e37_79b9_7f4a_7c15) >> 64) as u64,
            y.reverse_bits() ^ (((y as i64 as i128) * -3) >> 64) as u64,
        ],
    )
}

/// The 8 bytes `__byte_perm` selects from: x's four, then y's.
fn funnel_bytes(x: u32, y: u32) -> [u8; 8] {
    let mut b = [0; 8];
    b[..4].copy_from_slice(&x.to_le_bytes());
    b[4..].copy_from_slice(&y.to_le_bytes());
    b
}

#[test]
fn integer_and_bit_intrinsics() {
    let n = 256usize;
    let mut rng = Rng(13);
    let a: Vec<u32> = (0..n)
        .map(|i| if i == 3 { 0 } else { rng.u32() >> (i % 32) })
        .collect();
    let b: Vec<u64> = (0..n)
        .map(|i| if i == 5 { 0 } else { rng.next() >> (i % 64) })
        .collect();
    for text in INTRIN {
        let mut mem = Mem::new(1 << 20);
        let (va, vb) = (mem.put_u32(&a), mem.put_u64(&b));
        let (out, out64) = (mem.alloc(n * 48), mem.alloc(n * 16));
        let m = module(text);
        let p = Params::default()
            .u64(va)
            .u64(vb)
            .u64(out)
            .u64(out64)
            .u32(n as u32);
        run(&m, "intrin", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
        let (got, got64) = (mem.u32s(out, n * 12), mem.u64s(out64, n * 2));
        for i in 0..n {
            let (w, w64) = intrin_ref(i, a[i], b[i]);
            assert_eq!(
                got[i * 12..i * 12 + 12],
                w,
                "element {i}: x={:#x} y={:#x}",
                a[i],
                b[i]
            );
            assert_eq!(got64[i * 2..i * 2 + 2], w64, "element {i}: y={:#x}", b[i]);
        }
    }
}

#[test]
fn volatile_warp_synchronous_reduction_and_clocks() {
    let mut rng = Rng(17);
    let v: Vec<u32> = (0..64).map(|_| rng.u32() % 100_000).collect();
    for text in INTRIN {
        let mut mem = Mem::new(1 << 16);
        let (vi, out) = (mem.put_u32(&v), mem.alloc(8));
        let m = module(text);
        run(
            &m,
            "warp_sync_reduce",
            cfg([1, 1, 1], [64, 1, 1], 0, Params::default().u64(vi).u64(out)),
            &mem,
            1,
        );
        assert_eq!(mem.u32s(out, 2), [v.iter().sum::<u32>(), 2]);
    }
}

#[test]
fn cooperative_groups_tiles_and_reductions() {
    let n = 1000usize;
    let mut rng = Rng(19);
    let v: Vec<u32> = (0..n).map(|_| rng.u32() % 1000).collect();
    let mut mem = Mem::new(1 << 20);
    let vi = mem.put_u32(&v);
    let mut init = vec![0u32; 3 + n];
    init[1] = i32::MIN as u32;
    let out = mem.put_u32(&init);
    let m = module(CG);
    run(
        &m,
        "cg_reduce",
        cfg(
            [4, 1, 1],
            [256, 1, 1],
            0,
            Params::default().u64(vi).u64(out).u32(n as u32),
        ),
        &mem,
        2,
    );
    let got = mem.u32s(out, 3 + n);
    let sum: u32 = v.iter().sum();
    // Thread 0 of each block posts the maximum of its own tile (the block's first 32 values).
    let first_tiles_max = (0..4)
        .map(|b| *v[b * 256..b * 256 + 32].iter().max().unwrap())
        .max()
        .unwrap();
    assert_eq!(got[..3], [sum, first_tiles_max, sum]);
    for i in 0..n {
        let q = &v[i & !3..(i & !3) + 4];
        let want = q.iter().sum::<u32>()
            + u32::from(q.iter().any(|x| *x > 500))
            + 2 * u32::from(q.iter().all(|x| *x > 10));
        assert_eq!(got[3 + i], want, "thread {i}");
    }
}

#[test]
fn cub_block_reduce_scan_and_radix_sort() {
    let blocks = 2usize;
    let mut rng = Rng(23);
    let v: Vec<u32> = (0..blocks * 512)
        .map(|_| (rng.u32() as i32 >> 8) as u32)
        .collect();
    for (k, text) in CUB.iter().enumerate() {
        let mut mem = Mem::new(1 << 20);
        let vi = mem.put_u32(&v);
        let (sum, scan, sorted) = (
            mem.alloc(blocks * 4),
            mem.alloc(blocks * 512),
            mem.alloc(blocks * 2048),
        );
        let m = module(text);
        let p = Params::default().u64(vi).u64(sum).u64(scan).u64(sorted);
        run(
            &m,
            "cub_block",
            cfg([blocks as u32, 1, 1], [128, 1, 1], 0, p),
            &mem,
            2,
        );
        let arch = if k == 0 { "compute_80" } else { "compute_90" };
        for b in 0..blocks {
            let part = &v[b * 128..(b + 1) * 128];
            assert_eq!(
                mem.u32s(sum + 4 * b as u64, 1)[0],
                part.iter().fold(0u32, |a, x| a.wrapping_add(*x)),
                "{arch} sum"
            );
            let mut acc = 0u32;
            let want_scan: Vec<u32> = part
                .iter()
                .map(|x| {
                    let e = acc;
                    acc = acc.wrapping_add(*x);
                    e
                })
                .collect();
            assert_eq!(
                mem.u32s(scan + 512 * b as u64, 128),
                want_scan,
                "{arch} scan"
            );
            let mut keys: Vec<i32> = v[b * 512..(b + 1) * 512]
                .iter()
                .map(|x| *x as i32)
                .collect();
            keys.sort_unstable();
            let got: Vec<i32> = mem
                .u32s(sorted + 2048 * b as u64, 512)
                .into_iter()
                .map(|x| x as i32)
                .collect();
            assert_eq!(got, keys, "{arch} sort");
        }
    }
}
