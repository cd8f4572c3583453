//! nvcc 13.0 output of tests/data/probes/misc.cu on the interpreter against a CPU reference:
//! integer division and modulo (32/64-bit, signed/unsigned, a `__noinline__` device function),
//! structs passed by value, `__constant__` and `__device__` variables, a local array indexed
//! at run time, 64-bit grid-stride indexing.

mod common;
use common::*;

const MISC: &str = include_str!("data/probes/misc.80.ptx");

#[test]
fn integer_division_and_modulo() {
    let n = 256usize;
    let mut rng = Rng(21);
    let a: Vec<i32> = (0..n).map(|_| rng.u32() as i32).collect();
    let b: Vec<i32> = (0..n)
        .map(|i| {
            let v = (rng.u32() as i32) >> (i % 31);
            // No division by zero (also of (b | 1) + 3 in 32 bits) and no INT_MIN / -1.
            if v == 0 || v == -1 || v == -3 { 3 } else { v }
        })
        .collect();
    let c: Vec<u64> = (0..n).map(|_| rng.next()).collect();
    let mut mem = Mem::new(1 << 20);
    let va = mem.put_u32(&a.iter().map(|x| *x as u32).collect::<Vec<_>>());
    let vb = mem.put_u32(&b.iter().map(|x| *x as u32).collect::<Vec<_>>());
    let vc = mem.put_u64(&c);
    let out = mem.alloc(n * 64);
    let m = module(MISC);
    let p = Params::default()
        .u64(va)
        .u64(vb)
        .u64(vc)
        .u64(out)
        .u32(n as u32);
    run(&m, "intdiv", cfg([2, 1, 1], [128, 1, 1], 0, p), &mem, 2);
    let got = mem.u64s(out, n * 8);
    for i in 0..n {
        let (x, y) = (a[i], b[i]);
        let (ux, uy) = (x as u32, (y as u32) | 1);
        let (cx, sx) = (c[i], c[i] as i64);
        let want: [i64; 8] = [
            i64::from(x / y),
            i64::from(x % y),
            i64::from(ux / uy),
            i64::from(ux % uy),
            (cx / u64::from(uy.wrapping_add(3))) as i64,
            sx % i64::from(y | 1),
            i64::from(
                (x / y + x % y)
                    .wrapping_add(x / 7)
                    .wrapping_add(x % 13)
                    .wrapping_add((ux / 10) as i32),
            ),
            sx / 1_000_003,
        ];
        let got_i: Vec<i64> = got[i * 8..i * 8 + 8].iter().map(|v| *v as i64).collect();
        assert_eq!(got_i, want, "element {i}: a={x} b={y} c={cx}");
    }
}

#[test]
fn structs_by_value_constant_and_device_variables() {
    let m = module(MISC);
    // __constant__ float coeffs[8]; __constant__ int cscale: written by the host
    // (cudaMemcpyToSymbol); __device__ float table[4] has an initializer.
    let coeffs: Vec<u8> = (0..8)
        .flat_map(|k| (k as f32 * 0.125).to_le_bytes())
        .collect();
    assert!(m.write_variable("coeffs", &coeffs));
    assert!(m.write_variable("cscale", &4i32.to_le_bytes()));
    let n = 100usize;
    let mut mem = Mem::new(1 << 16);
    let out = mem.alloc(n * 4);
    // struct Params { int a; float scale; double offset; char tag; long long big; } (32 bytes,
    // align 8) and struct Vec3 { float x, y, z; } (12 bytes), then the pointer and n.
    let mut p = Vec::new();
    p.extend_from_slice(&3i32.to_le_bytes());
    p.extend_from_slice(&0.5f32.to_le_bytes());
    p.extend_from_slice(&2.25f64.to_le_bytes());
    p.extend_from_slice(&[7, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee]);
    p.extend_from_slice(&(5i64 << 20).to_le_bytes());
    for v in [0.25f32, 1.0, 2.0] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.extend_from_slice(&[0; 4]);
    p.extend_from_slice(&out.to_le_bytes());
    p.extend_from_slice(&(n as u32).to_le_bytes());
    assert_eq!(p.len(), m.entry("structs").unwrap().param_size as usize);
    run(
        &m,
        "structs",
        cfg([1, 1, 1], [128, 1, 1], 0, Params(p)),
        &mem,
        1,
    );
    let table = [1.0f32, 2.0, 4.0, 8.0];
    let want: Vec<f32> = (0..n)
        .map(|i| {
            3.0 * 0.5
                + 2.25
                + 7.0
                + 5.0
                + 0.25 * i as f32
                + 1.0
                + 2.0
                + (i & 7) as f32 * 0.125 * 4.0
                + table[i & 3]
        })
        .collect();
    assert_eq!(mem.f32s(out, n), want);

    // The __device__ counter the launch incremented, and a kernel writing a __device__ array.
    let out2 = mem.alloc(8);
    run(
        &m,
        "counters",
        cfg([1, 1, 1], [1, 1, 1], 0, Params::default().u64(out2)),
        &mem,
        1,
    );
    assert_eq!(mem.u32s(out2, 2), [1, 1 + 3 + 4 + 8]);
    let t = m.read_variable("table").unwrap();
    assert_eq!(f32::from_le_bytes(t[4..8].try_into().unwrap()), 3.0);
}

#[test]
fn local_array_indexed_at_run_time() {
    let n = 200usize;
    let mut rng = Rng(4);
    let idx: Vec<u32> = (0..n).map(|_| rng.u32() % 1024).collect();
    let mut mem = Mem::new(1 << 16);
    let (vi, out) = (mem.put_u32(&idx), mem.alloc(n * 4));
    let m = module(MISC);
    let p = Params::default().u64(vi).u64(out).u32(n as u32);
    run(
        &m,
        "local_array",
        cfg([2, 1, 1], [128, 1, 1], 0, p),
        &mem,
        2,
    );
    let want: Vec<u32> = (0..n)
        .map(|i| {
            let arr = |k: u32| k * k + i as u32;
            arr(idx[i] & 31) + arr((idx[i] >> 5) & 31)
        })
        .collect();
    assert_eq!(mem.u32s(out, n), want);
}

#[test]
fn grid_stride_loop_with_64_bit_indices() {
    let (n, stride) = (3000usize, 3usize);
    let mut mem = Mem::new(1 << 16);
    let buf = mem.alloc(n * stride * 4);
    let m = module(MISC);
    let p = Params::default().u64(buf).u64(n as u64).u64(stride as u64);
    run(&m, "big_index", cfg([3, 1, 1], [64, 1, 1], 0, p), &mem, 2);
    let got = mem.f32s(buf, n * stride);
    for (k, v) in got.iter().enumerate() {
        let want = if k % stride == 0 {
            ((k / stride) % 1000) as f32 + 0.5
        } else {
            0.0
        };
        assert_eq!(*v, want, "index {k}");
    }
}

#[test]
fn device_assert_passes_or_stops_the_kernel_with_a_trap() {
    let m = module(include_str!("data/probes/assert.80.ptx"));
    let n = 100usize;
    let mut mem = Mem::new(1 << 16);
    let good: Vec<u32> = (0..n as u32).collect();
    let (vi, out) = (mem.put_u32(&good), mem.alloc(n * 4));
    run(
        &m,
        "checked",
        cfg(
            [1, 1, 1],
            [128, 1, 1],
            0,
            Params::default().u64(vi).u64(out).u32(n as u32),
        ),
        &mem,
        1,
    );
    assert_eq!(
        mem.u32s(out, n),
        good.iter().map(|x| x * 2).collect::<Vec<_>>()
    );

    let mut bad = good.clone();
    bad[37] = -5i32 as u32;
    let vb = mem.put_u32(&bad);
    let c = cfg(
        [1, 1, 1],
        [128, 1, 1],
        0,
        Params::default().u64(vb).u64(out).u32(n as u32),
    );
    let mut l = ptx::Launch::new(m.clone(), "checked", c, &ptx::Limits::default()).unwrap();
    match l.run(&mem.mem, &ptx::RunControl::new(1)) {
        ptx::RunOutcome::Faulted(f) => assert_eq!(f.reason, ptx::FaultReason::Trap, "{f:?}"),
        other => panic!("a failed assert must fault: {other:?}"),
    }
}

#[test]
fn kernel_printf_formats_like_c() {
    let m = module(include_str!("data/probes/printf.80.ptx"));
    let n = 40usize;
    let mut mem = Mem::new(1 << 16);
    let vals: Vec<u32> = (0..n as u32).map(|i| i * 7).collect();
    let vi = mem.put_u32(&vals);
    // One worker: lanes print in order, warp 0 before warp 1.
    let c = cfg(
        [1, 1, 1],
        [64, 1, 1],
        0,
        Params::default().u64(vi).u32(n as u32),
    );
    let mut l = ptx::Launch::new(m, "kprintf", c, &ptx::Limits::default()).unwrap();
    assert!(matches!(
        l.run(&mem.mem, &ptx::RunControl::new(1)),
        ptx::RunOutcome::Completed(_)
    ));
    let out = String::from_utf8(l.take_printf_output()).unwrap();
    let line = |i: usize| format!("thread {i} value {} half {:.6}\n", i * 7, i as f64 * 3.5);
    // Warp 0 runs both of its printf calls before warp 1 runs (CUDA orders only the lines of
    // one thread); the second line is what glibc's printf prints for the same call.
    let mut want: String = (0..32).map(line).collect();
    want.push_str(
        "[  -42|ff  |0003.142|1.234568e+04|0.0001|str|Z|-1234567890123|4000000000|%|0x1234]\n",
    );
    want.extend((32..n).map(line));
    assert_eq!(out, want);
    assert!(
        l.take_printf_output().is_empty(),
        "taking empties the buffer"
    );
}

#[test]
fn kernel_printf_conversions_and_flags_match_glibc() {
    let m = module(include_str!("data/probes/printf.80.ptx"));
    let d = [
        1e-5,
        123_456_789.0,
        100_000.0,
        0.5,
        0.0,
        2.5e-300,
        -3.14158,
        123_456.789,
        f64::INFINITY,
        f64::NAN,
        18_446_744_073_709_549_568.0 / 4.0,
        -0.0,
    ];
    let k = [42i32, -7, 5, 8, 0xbeef, 0, i32::from(b'q')];
    let mut mem = Mem::new(1 << 16);
    let vd = mem.put_u64(&d.map(f64::to_bits));
    let vk = mem.put_u32(&k.map(|x| x as u32));
    let c = cfg([1, 1, 1], [1, 1, 1], 0, Params::default().u64(vd).u64(vk));
    let mut l = ptx::Launch::new(m, "kprintf_formats", c, &ptx::Limits::default()).unwrap();
    assert!(matches!(
        l.run(&mem.mem, &ptx::RunControl::new(1)),
        ptx::RunOutcome::Completed(_)
    ));
    // glibc's output for the same calls (tests/data/probes/printf.cu, compiled with gcc).
    let want = "1e-05 1.23457e+08 100000 0.5 0 2.5E-300\n\
                +42 -7 005 010 BEEF 0 ab  -3.1 1.23e+05| inf nan q\n   \
                -3.1416|42        |-000003.14|4611686018427387392|-7|-16657|   ab|ab   |-0.000000e+00\n";
    assert_eq!(String::from_utf8(l.take_printf_output()).unwrap(), want);
}
