//! Execution of the project's workload kernels (hand-written PTX and real nvcc output) through
//! the interpreter, checked against CPU references.

#![allow(clippy::needless_range_loop)] // reference loops index several arrays by position

mod common;
use common::*;

const VECADD: &str = include_str!("../../suite/kernels/vecadd.ptx");
const MATMUL: &str = include_str!("../../suite/kernels/matmul.ptx");
const REDUCTION: &str = include_str!("../../suite/kernels/reduction.ptx");
const HISTOGRAM: &str = include_str!("../../suite/cuda/histogram.ptx");
const SCAN: &str = include_str!("../../suite/cuda/scan.ptx");
const VOTE: &str = include_str!("../../suite/cuda/vote.ptx");
const WARP_REDUCE: &str = include_str!("../../suite/cuda/warp_reduce.ptx");
const ATOMICS64: &str = include_str!("../../suite/cuda/atomics64.ptx");

#[test]
fn vecadd_matches_cpu() {
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let mut mem = Mem::new(1 << 20);
    let (va, vb) = (mem.put_f32(&a), mem.put_f32(&b));
    let vc = mem.alloc(n * 4);
    let m = module(VECADD);
    let p = Params::default().u64(va).u64(vb).u64(vc).u32(n as u32);
    let s = run(&m, "vecadd", cfg([4, 1, 1], [256, 1, 1], 0, p), &mem, 2);
    let c = mem.f32s(vc, n);
    for i in 0..n {
        assert_eq!(c[i], a[i] + b[i], "i={i}");
    }
    assert!(s.thread_instructions >= n as u64);
}

fn matmul_ref(a: &[f32], b: &[f32], n: usize) -> Vec<f32> {
    let mut c = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..n {
            let mut acc = 0f32;
            for k in 0..n {
                acc = a[i * n + k].mul_add(b[k * n + j], acc);
            }
            c[i * n + j] = acc;
        }
    }
    c
}

#[test]
fn matmul_bit_exact() {
    let n = 48usize;
    let mut r = Rng(7);
    let a: Vec<f32> = (0..n * n).map(|_| (r.u32() % 100) as f32 / 7.0).collect();
    let b: Vec<f32> = (0..n * n)
        .map(|_| (r.u32() % 100) as f32 / 3.0 - 10.0)
        .collect();
    let mut mem = Mem::new(1 << 20);
    let (va, vb) = (mem.put_f32(&a), mem.put_f32(&b));
    let vc = mem.alloc(n * n * 4);
    let m = module(MATMUL);
    let p = Params::default().u64(va).u64(vb).u64(vc).u32(n as u32);
    let g = (n / 16) as u32;
    run(&m, "matmul", cfg([g, g, 1], [16, 16, 1], 0, p), &mem, 2);
    assert_eq!(mem.f32s(vc, n * n), matmul_ref(&a, &b, n));
}

#[test]
fn reduction_with_dynamic_shared() {
    let n = 10_000usize;
    let v: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) >> 8)
        .collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u32(&v);
    let parts = mem.alloc(8 * 8);
    let total = mem.put_u64(&[0]);
    let m = module(REDUCTION);
    let p = Params::default()
        .u64(vin)
        .u64(parts)
        .u64(total)
        .u32(n as u32);
    run(
        &m,
        "reduction",
        cfg([8, 1, 1], [128, 1, 1], 8 * 128, p),
        &mem,
        2,
    );
    let want: u64 = v.iter().map(|&x| u64::from(x)).sum();
    assert_eq!(mem.u64s(total, 1)[0], want);
    assert_eq!(mem.u64s(parts, 8).iter().sum::<u64>(), want);
}

#[test]
fn histogram_nvcc() {
    let n = 5000usize;
    let mut r = Rng(3);
    let data: Vec<u8> = (0..n).map(|_| (r.u32() % 256) as u8).collect();
    let mut mem = Mem::new(1 << 20);
    let vd = mem.alloc(n);
    assert!(mem.mem.write(vd, &data));
    let bins = mem.put_u32(&[0; 256]);
    let m = module(HISTOGRAM);
    let p = Params::default().u64(vd).u64(bins).u32(n as u32);
    run(&m, "histogram", cfg([5, 1, 1], [96, 1, 1], 0, p), &mem, 2);
    let mut want = vec![0u32; 256];
    for d in &data {
        want[*d as usize] += 1;
    }
    assert_eq!(mem.u32s(bins, 256), want);
}

#[test]
fn scan_nvcc() {
    let n = 1000usize;
    let bs = 256usize;
    let v: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % 1000).collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u32(&v);
    let out = mem.alloc(n * 4);
    let nb = n.div_ceil(bs);
    let sums = mem.alloc(nb * 4);
    let m = module(SCAN);
    let p = Params::default().u64(vin).u64(out).u64(sums).u32(n as u32);
    run(
        &m,
        "scan",
        cfg([nb as u32, 1, 1], [bs as u32, 1, 1], 0, p),
        &mem,
        1,
    );
    let got = mem.u32s(out, n);
    for blk in 0..nb {
        let mut acc = 0u32;
        for i in blk * bs..((blk + 1) * bs).min(n) {
            acc = acc.wrapping_add(v[i]);
            assert_eq!(got[i], acc, "i={i}");
        }
    }
}

#[test]
fn vote_nvcc() {
    let n = 100usize;
    let mut r = Rng(11);
    let v: Vec<u32> = (0..n)
        .map(|i| if i % 7 == 0 { 0 } else { r.u32() })
        .collect();
    let nw = 4usize;
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u32(&v);
    let (ballots, counts, flags) = (mem.alloc(nw * 4), mem.alloc(nw * 4), mem.alloc(nw * 4));
    let m = module(VOTE);
    let p = Params::default()
        .u64(vin)
        .u64(ballots)
        .u64(counts)
        .u64(flags)
        .u32(n as u32);
    run(&m, "vote", cfg([1, 1, 1], [128, 1, 1], 0, p), &mem, 1);
    for w in 0..nw {
        let vals: Vec<u32> = (0..32)
            .map(|l| v.get(w * 32 + l).copied().unwrap_or(0))
            .collect();
        let ballot = vals
            .iter()
            .enumerate()
            .fold(0u32, |acc, (l, x)| acc | ((x & 1) << l));
        let any = vals.iter().any(|&x| x > 0x8000_0000);
        let all = vals.iter().all(|&x| x != 0);
        assert_eq!(mem.u32s(ballots, nw)[w], ballot, "w={w}");
        assert_eq!(
            mem.u32s(counts, nw)[w],
            ballot.count_ones() + vals[0].count_ones()
        );
        assert_eq!(
            mem.u32s(flags, nw)[w],
            u32::from(any) | (u32::from(all) << 1)
        );
    }
}

#[test]
fn warp_reduce_nvcc() {
    let n = 200usize;
    let v: Vec<u32> = (0..n as u32).map(|i| i * 3 + 1).collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u32(&v);
    let nw = 8;
    let ws = mem.alloc(nw * 4);
    let ls = mem.alloc(n * 4);
    let m = module(WARP_REDUCE);
    let p = Params::default().u64(vin).u64(ws).u64(ls).u32(n as u32);
    run(
        &m,
        "warp_reduce",
        cfg([2, 1, 1], [128, 1, 1], 0, p),
        &mem,
        2,
    );
    let val = |i: usize| if i < n { v[i] } else { 0 };
    let lanes = mem.u32s(ls, n);
    let sums = mem.u32s(ws, nw);
    for w in 0..nw {
        let sum: u32 = (w * 32..w * 32 + 32).map(val).sum();
        assert_eq!(sums[w], sum, "warp {w}");
        for i in w * 32..(w * 32 + 32).min(n) {
            assert_eq!(lanes[i], sum, "i={i}");
        }
    }
}

#[test]
fn atomics64_nvcc() {
    let n = 777usize;
    let mut r = Rng(5);
    let v: Vec<u64> = (0..n).map(|_| r.next() >> 8).collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u64(&v);
    let out = mem.put_u64(&[0, 0, 0]);
    let m = module(ATOMICS64);
    let p = Params::default().u64(vin).u64(out).u32(n as u32);
    run(&m, "atomics64", cfg([7, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let mix = |mut x: u64| {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    };
    let o = mem.u64s(out, 3);
    assert_eq!(o[0], v.iter().fold(0u64, |a, x| a.wrapping_add(*x)));
    assert_eq!(o[1], v.iter().map(|x| mix(*x)).max().unwrap_or(0));
    assert_eq!(o[2], n as u64);
}

const CONVERT: &str = include_str!("../../suite/cuda/convert.ptx");

/// Directed int→f32 rounding computed by truncating the integer (independent of the
/// interpreter's next_up/next_down method).
fn i2f_directed(p: i32, mode: char) -> f32 {
    let neg = p < 0;
    let a = p.unsigned_abs();
    let bits = 32 - a.leading_zeros();
    let drop = bits.saturating_sub(24);
    let t = (a >> drop) << drop;
    let up = if t != a {
        t as u64 + (1u64 << drop)
    } else {
        t as u64
    };
    let mag = match (mode, neg) {
        ('z', _) | ('d', false) | ('u', true) => t as u64,
        _ => up,
    };
    let f = mag as f32; // exact: at most 24 significant bits (or a power of two)
    if neg { -f } else { f }
}

#[test]
fn convert_nvcc_rounding_and_int_math() {
    let mut r = Rng(99);
    let mut xs: Vec<f32> = vec![
        2.5,
        -2.5,
        3.5,
        -0.5,
        0.49999997,
        3e9,
        -3e9,
        f32::NAN,
        f32::INFINITY,
        -1e-40,
        1.0,
        0.0,
    ];
    let mut ps: Vec<i32> = vec![16_777_217, -16_777_219, i32::MAX, i32::MIN, 7, -7];
    let mut qs: Vec<i32> = vec![3, -5, 2, 1, -1, i32::MAX];
    while xs.len() < 300 {
        xs.push(f32::from_bits(r.u32() & 0xCFFF_FFFF));
    }
    while ps.len() < 300 {
        ps.push(r.u32() as i32);
        let q = r.u32() as i32 >> (r.u32() % 31);
        qs.push(if q == 0 || q == -1 { 3 } else { q });
    }
    let n = xs.len();
    ps.truncate(n);
    qs.truncate(n);
    let mut mem = Mem::new(1 << 20);
    let vf = mem.put_f32(&xs);
    let va = mem.put_u32(&ps.iter().map(|&p| p as u32).collect::<Vec<_>>());
    let vb = mem.put_u32(&qs.iter().map(|&q| q as u32).collect::<Vec<_>>());
    let out = mem.alloc(n * 80);
    let m = module(CONVERT);
    let params = Params::default()
        .u64(vf)
        .u64(va)
        .u64(vb)
        .u64(out)
        .u32(n as u32);
    run(
        &m,
        "convert",
        cfg([3, 1, 1], [128, 1, 1], 0, params),
        &mem,
        2,
    );
    let got = mem.u32s(out, n * 20);
    for i in 0..n {
        let (x, p, q) = (xs[i], ps[i], qs[i]);
        // (long long)NaN is 0x8000000000000000 on the hardware (suite/README.md).
        let xl = if x.is_nan() { i64::MIN } else { x as i64 };
        let w = (i64::from(p) * i64::from(q)).wrapping_add(xl) as u64;
        let h = ((u128::from((i64::from(p) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            * u128::from(i64::from(q) as u64))
            >> 64) as u64;
        let sat = if x > 0.0 { x.min(1.0) } else { 0.0 };
        let want: [u32; 20] = [
            x.round_ties_even() as i32 as u32,
            x.trunc() as i32 as u32,
            x.floor() as i32 as u32,
            x.ceil() as i32 as u32,
            x.round_ties_even() as u32,
            (p as f32).to_bits(),
            i2f_directed(p, 'z').to_bits(),
            i2f_directed(p, 'd').to_bits(),
            i2f_directed(p, 'u').to_bits(),
            (p as u32 as f32).to_bits(),
            sat.to_bits(),
            (x / q as f32).to_bits(),
            ((i64::from(p) * i64::from(q)) >> 32) as u32,
            ((u64::from(p as u32) * u64::from(q as u32)) >> 32) as u32,
            w as u32,
            (w >> 32) as u32,
            (h ^ (h >> 32)) as u32,
            p.wrapping_div(q) as u32,
            p.wrapping_rem(q) as u32,
            (p as u32 / q as u32).wrapping_add(p as u32 % q as u32),
        ];
        let g = &got[i * 20..i * 20 + 20];
        for k in 0..20 {
            // NaN results compare by NaN-ness (payloads may differ)
            if k == 11 && f32::from_bits(want[k]).is_nan() {
                assert_eq!(g[k], 0x7fff_ffff, "canonical NaN, i={i}");
                continue;
            }
            assert_eq!(g[k], want[k], "i={i} k={k} x={x} p={p} q={q}");
        }
    }
}

const SAXPY: &str = include_str!("../../suite/kernels/saxpy.ptx");
const STENCIL: &str = include_str!("../../suite/kernels/stencil.ptx");
const GRAPH: &str = include_str!("../../suite/kernels/graph.ptx");
const SPIN: &str = include_str!("../../suite/kernels/spin.ptx");

#[test]
fn saxpy_single_rounding() {
    let n = 777usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32 / 7.0).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 / 3.0).collect();
    let a = 1.7f32;
    let mut mem = Mem::new(1 << 16);
    let (vx, vy) = (mem.put_f32(&x), mem.put_f32(&y));
    let m = module(SAXPY);
    let p = Params::default().u64(vx).u64(vy).f32(a).u32(n as u32);
    run(&m, "saxpy", cfg([4, 1, 1], [256, 1, 1], 0, p), &mem, 2);
    let want: Vec<f32> = (0..n).map(|i| a.mul_add(x[i], y[i])).collect();
    assert_eq!(mem.f32s(vy, n), want);
}

#[test]
fn stencil_matches_reference_order() {
    let (rows, cols) = (37usize, 53usize);
    let src: Vec<f32> = (0..rows * cols).map(|i| (i % 91) as f32 * 0.25).collect();
    let power: Vec<f32> = (0..rows * cols).map(|i| (i % 13) as f32 * 0.01).collect();
    let (cc, cp) = (0.1f32, 0.5f32);
    let mut mem = Mem::new(1 << 16);
    let (vs, vp) = (mem.put_f32(&src), mem.put_f32(&power));
    let vd = mem.alloc(rows * cols * 4);
    let m = module(STENCIL);
    let p = Params::default()
        .u64(vs)
        .u64(vd)
        .u64(vp)
        .u32(rows as u32)
        .u32(cols as u32)
        .f32(cc)
        .f32(cp);
    let g = [cols.div_ceil(16) as u32, rows.div_ceil(16) as u32, 1];
    run(&m, "stencil", cfg(g, [16, 16, 1], 0, p), &mem, 2);
    let got = mem.f32s(vd, rows * cols);
    let at = |r: usize, c: usize| src[r * cols + c];
    for r in 0..rows {
        for c in 0..cols {
            let me = at(r, c);
            let n = if r > 0 { at(r - 1, c) } else { me };
            let s = if r + 1 < rows { at(r + 1, c) } else { me };
            let w = if c > 0 { at(r, c - 1) } else { me };
            let e = if c + 1 < cols { at(r, c + 1) } else { me };
            let want = me + cc * ((n + s) + (w + e) - 4.0 * me) + cp * power[r * cols + c];
            let g = got[r * cols + c];
            // same operations in the same order: bit-exact unless the kernel orders them
            // differently; allow one ulp of difference to stay robust to that.
            assert!(
                (g - want).abs() <= want.abs() * 1e-6,
                "({r},{c}): {g} vs {want}"
            );
        }
    }
}

#[test]
fn graph_bfs_levels() {
    // A random graph of n vertices in CSR form; run BFS levels from vertex 0.
    let n = 300usize;
    let mut r = Rng(21);
    let mut adj: Vec<Vec<u32>> = vec![Vec::new(); n];
    for v in 0..n {
        for _ in 0..(r.u32() % 5) {
            let u = r.u32() as usize % n;
            adj[v].push(u as u32);
            adj[u].push(v as u32);
        }
    }
    let mut row = vec![0u32];
    let mut col = Vec::new();
    for a in &adj {
        col.extend_from_slice(a);
        row.push(col.len() as u32);
    }
    let mut levels = vec![u32::MAX; n];
    levels[0] = 0;
    let mut mem = Mem::new(1 << 18);
    let (vr, vc) = (mem.put_u32(&row), mem.put_u32(&col));
    let vl = mem.put_u32(&levels);
    let counts = mem.put_u32(&vec![0; n + 1]);
    let m = module(GRAPH);
    for cur in 0..20u32 {
        let p = Params::default()
            .u64(vr)
            .u64(vc)
            .u64(vl)
            .u64(counts)
            .u32(n as u32)
            .u32(cur);
        run(&m, "graph", cfg([3, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    }
    // CPU BFS
    let mut want = vec![u32::MAX; n];
    want[0] = 0;
    let mut frontier = vec![0usize];
    let mut d = 0;
    while !frontier.is_empty() && d < 20 {
        let mut next = Vec::new();
        for &v in &frontier {
            for &u in &adj[v] {
                if want[u as usize] == u32::MAX {
                    want[u as usize] = d + 1;
                    next.push(u as usize);
                }
            }
        }
        frontier = next;
        d += 1;
    }
    assert_eq!(mem.u32s(vl, n), want);
    let cnt = mem.u32s(counts, n + 1);
    for lvl in 1..=20u32 {
        let k = want.iter().filter(|&&x| x == lvl).count() as u32;
        assert_eq!(cnt[lvl as usize], k, "level {lvl}");
    }
}

#[test]
fn spin_waits_on_globaltimer() {
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(64 * 8);
    let m = module(SPIN);
    let dur = 2_000_000u64; // 2 ms
    let t = std::time::Instant::now();
    run(
        &m,
        "spin",
        cfg(
            [2, 1, 1],
            [32, 1, 1],
            0,
            Params::default().u64(out).u64(dur),
        ),
        &mem,
        2,
    );
    assert!(t.elapsed().as_nanos() as u64 >= dur);
    assert!(mem.u64s(out, 64).iter().all(|&x| x >= dur));
}

#[test]
fn concurrent_runs_share_the_worker_pool() {
    // Several launches run at once from different threads, each with several workers.
    let m = module(VECADD);
    std::thread::scope(|s| {
        for k in 0..4u32 {
            let m = m.clone();
            s.spawn(move || {
                let n = 3000usize;
                let mut mem = Mem::new(1 << 16);
                let a: Vec<f32> = (0..n).map(|i| (i as u32 * (k + 1)) as f32).collect();
                let (va, vb) = (mem.put_f32(&a), mem.put_f32(&a));
                let vc = mem.alloc(n * 4);
                for _ in 0..5 {
                    let p = Params::default().u64(va).u64(vb).u64(vc).u32(n as u32);
                    run(&m, "vecadd", cfg([12, 1, 1], [256, 1, 1], 0, p), &mem, 3);
                }
                let c = mem.f32s(vc, n);
                assert!((0..n).all(|i| c[i] == 2.0 * a[i]), "thread {k}");
            });
        }
    });
}
