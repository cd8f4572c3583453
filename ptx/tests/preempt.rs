//! Preemption at instruction granularity with save → bytes → restore → continue must give
//! bit-identical results to an uninterrupted run; runaway kernels stop on preempt; hostile
//! context bytes give typed errors.

mod common;
use common::*;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ptx::{ContextError, Launch, LaunchConfig, Limits, Module, RunControl, RunOutcome};

const MATMUL: &str = include_str!("../../suite/kernels/matmul.ptx");
const REDUCTION: &str = include_str!("../../suite/kernels/reduction.ptx");
const SCAN: &str = include_str!("../../suite/cuda/scan.ptx");

struct Case {
    m: Arc<Module>,
    entry: &'static str,
    mem: Mem,
    cfg: LaunchConfig,
    out: (u64, usize),
}

fn matmul_case() -> Case {
    let n = 32usize;
    let mut r = Rng(1);
    let a: Vec<f32> = (0..n * n).map(|_| r.u32() as f32 / 1e9).collect();
    let b: Vec<f32> = (0..n * n).map(|_| r.u32() as f32 / 3e9).collect();
    let mut mem = Mem::new(1 << 20);
    let (va, vb) = (mem.put_f32(&a), mem.put_f32(&b));
    let vc = mem.alloc(n * n * 4);
    let p = Params::default().u64(va).u64(vb).u64(vc).u32(n as u32);
    Case {
        m: module(MATMUL),
        entry: "matmul",
        mem,
        cfg: cfg([2, 2, 1], [16, 16, 1], 0, p),
        out: (vc, n * n * 4),
    }
}

fn reduction_case() -> Case {
    let n = 3000usize;
    let v: Vec<u32> = (0..n as u32).map(|i| i ^ 0x5a5a).collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u32(&v);
    let parts = mem.alloc(6 * 8);
    let total = mem.put_u64(&[0]);
    let p = Params::default()
        .u64(vin)
        .u64(parts)
        .u64(total)
        .u32(n as u32);
    Case {
        m: module(REDUCTION),
        entry: "reduction",
        mem,
        cfg: cfg([6, 1, 1], [64, 1, 1], 8 * 64, p),
        out: (parts, 6 * 8 + 8),
    }
}

fn scan_case() -> Case {
    let n = 700usize;
    let v: Vec<u32> = (0..n as u32).map(|i| i * 13 % 101).collect();
    let mut mem = Mem::new(1 << 20);
    let vin = mem.put_u32(&v);
    let out = mem.alloc(n * 4);
    let sums = mem.alloc(3 * 4);
    let p = Params::default().u64(vin).u64(out).u64(sums).u32(n as u32);
    Case {
        m: module(SCAN),
        entry: "scan",
        mem,
        cfg: cfg([3, 1, 1], [256, 1, 1], 0, p),
        out: (out, n * 4),
    }
}

fn reference(c: &Case) -> Vec<u8> {
    let mut l = Launch::new(c.m.clone(), c.entry, c.cfg.clone(), &Limits::default()).unwrap();
    assert!(matches!(
        l.run(&c.mem.mem, &RunControl::new(1)),
        RunOutcome::Completed(_)
    ));
    c.mem.mem.read(c.out.0, c.out.1).unwrap()
}

/// Run with deterministic preemption every `steps` warp-instructions (random per slice),
/// saving and restoring the context after every preemption.
fn interrupted(c: &Case, seed: u64, threads: usize) -> (Vec<u8>, u32) {
    let mut r = Rng(seed);
    let mut l = Launch::new(c.m.clone(), c.entry, c.cfg.clone(), &Limits::default()).unwrap();
    let mut preemptions = 0;
    loop {
        let mut ctl = RunControl::new(threads);
        ctl.step_limit = Some(1 + r.next() % 400);
        match l.run(&c.mem.mem, &ctl) {
            RunOutcome::Completed(_) => break,
            RunOutcome::Preempted(_) => {
                preemptions += 1;
                let bytes = l.save();
                l = Launch::restore(c.m.clone(), &bytes, &Limits::default()).unwrap();
                assert_eq!(l.save(), bytes, "save(restore(x)) == x");
            }
            RunOutcome::Faulted(f) => panic!("fault {f}"),
        }
        assert!(preemptions < 100_000);
    }
    (c.mem.mem.read(c.out.0, c.out.1).unwrap(), preemptions)
}

fn zero_out(c: &Case) {
    assert!(c.mem.mem.write(c.out.0, &vec![0; c.out.1]));
}

#[test]
fn preempt_save_restore_is_bit_identical() {
    for case in [matmul_case(), reduction_case(), scan_case()] {
        zero_out(&case);
        let want = reference(&case);
        for seed in 1..6 {
            zero_out(&case);
            let (got, n) = interrupted(&case, seed, 1);
            assert!(n > 3, "{}: preempted only {n} times", case.entry);
            assert_eq!(got, want, "{} seed {seed}", case.entry);
        }
        zero_out(&case);
        let (got, _) = interrupted(&case, 42, 2);
        assert_eq!(got, want, "{} with 2 workers", case.entry);
    }
}

#[test]
fn preempt_flag_from_another_thread() {
    let case = matmul_case();
    zero_out(&case);
    let want = reference(&case);
    zero_out(&case);
    let mut l = Launch::new(
        case.m.clone(),
        case.entry,
        case.cfg.clone(),
        &Limits::default(),
    )
    .unwrap();
    let mut rounds = 0;
    loop {
        let ctl = RunControl::new(2);
        let out = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_micros(50 + rounds * 37 % 200));
                ctl.preempt.store(true, Ordering::Relaxed);
            });
            l.run(&case.mem.mem, &ctl)
        });
        rounds += 1;
        match out {
            RunOutcome::Completed(_) => break,
            RunOutcome::Preempted(_) => {
                let b = l.save();
                l = Launch::restore(case.m.clone(), &b, &Limits::default()).unwrap();
            }
            RunOutcome::Faulted(f) => panic!("{f}"),
        }
        assert!(rounds < 100_000);
    }
    assert_eq!(case.mem.mem.read(case.out.0, case.out.1).unwrap(), want);
}

const SPIN_FOREVER: &str = r#"
.version 7.8
.target sm_80
.address_size 64
.visible .entry forever(.param .u64 p)
{
    .reg .b32 %r<3>;
    mov.u32 %r1, 0;
$L_top:
    add.s32 %r1, %r1, 1;
    bra.uni $L_top;
}
"#;

#[test]
fn runaway_kernel_stops_on_preempt() {
    let m = module(SPIN_FOREVER);
    let mem = Mem::new(4096);
    let mut l = Launch::new(
        m,
        "forever",
        cfg([4, 1, 1], [64, 1, 1], 0, Params::default().u64(0)),
        &Limits::default(),
    )
    .unwrap();
    let ctl = RunControl::new(2);
    let t = std::time::Instant::now();
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            ctl.preempt.store(true, Ordering::Relaxed);
        });
        l.run(&mem.mem, &ctl)
    });
    assert!(matches!(out, RunOutcome::Preempted(s) if s.warp_instructions > 0));
    assert!(t.elapsed().as_secs() < 5);
    assert!(!l.is_complete());
    drop(l); // cancel
}

#[test]
fn hostile_contexts_are_rejected() {
    let case = reduction_case();
    let mut l = Launch::new(
        case.m.clone(),
        case.entry,
        case.cfg.clone(),
        &Limits::default(),
    )
    .unwrap();
    let mut ctl = RunControl::new(1);
    ctl.step_limit = Some(150);
    assert!(matches!(
        l.run(&case.mem.mem, &ctl),
        RunOutcome::Preempted(_)
    ));
    let good = l.save();
    assert!(Launch::restore(case.m.clone(), &good, &Limits::default()).is_ok());
    // Every truncation fails cleanly.
    for n in 0..good.len() {
        assert!(Launch::restore(case.m.clone(), &good[..n], &Limits::default()).is_err());
    }
    // Trailing garbage.
    let mut t = good.clone();
    t.push(0);
    assert_eq!(
        Launch::restore(case.m.clone(), &t, &Limits::default()).unwrap_err(),
        ContextError::Trailing
    );
    // Byte flips never panic; a restored context still runs without panicking.
    let mut r = Rng(77);
    for _ in 0..1000 {
        let mut b = good.clone();
        for _ in 0..1 + r.next() % 3 {
            let i = (r.next() % b.len() as u64) as usize;
            b[i] ^= 1 << (r.next() % 8);
        }
        if let Ok(mut l2) = Launch::restore(case.m.clone(), &b, &Limits::default()) {
            let mut c = RunControl::new(1);
            c.step_limit = Some(5_000);
            let _ = l2.run(&case.mem.mem, &c);
        }
    }
    // Another module.
    let other = module(MATMUL);
    assert_eq!(
        Launch::restore(other, &good, &Limits::default()).unwrap_err(),
        ContextError::ModuleMismatch
    );
    let mut v = good.clone();
    v[8] = 9;
    assert_eq!(
        Launch::restore(case.m.clone(), &v, &Limits::default()).unwrap_err(),
        ContextError::Version(9)
    );
    assert_eq!(
        Launch::restore(case.m.clone(), b"garbage!", &Limits::default()).unwrap_err(),
        ContextError::BadMagic
    );
}

#[test]
fn a_short_run_is_not_held_up_by_a_long_one() {
    // A runaway kernel keeps its workers (and the pool's helpers) busy; short launches with
    // several workers must still complete promptly, doing the work on their own thread.
    let spin = module(SPIN_FOREVER);
    let short = module(include_str!("../../suite/kernels/vecadd.ptx"));
    let mem = Mem::new(1 << 16);
    let ctl_long = RunControl::new(8);
    std::thread::scope(|s| {
        let long = s.spawn(|| {
            let mut l = Launch::new(
                spin.clone(),
                "forever",
                cfg([64, 1, 1], [64, 1, 1], 0, Params::default().u64(0)),
                &Limits::default(),
            )
            .unwrap();
            l.run(&mem.mem, &ctl_long)
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        let t = std::time::Instant::now();
        for _ in 0..20 {
            let p = Params::default()
                .u64(BASE)
                .u64(BASE)
                .u64(BASE + 4096)
                .u32(64);
            let mut l = Launch::new(
                short.clone(),
                "vecadd",
                cfg([1, 1, 1], [64, 1, 1], 0, p),
                &Limits::default(),
            )
            .unwrap();
            assert!(matches!(
                l.run(&mem.mem, &RunControl::new(4)),
                RunOutcome::Completed(_)
            ));
        }
        let short_time = t.elapsed();
        assert!(!long.is_finished(), "the long run must still be running");
        ctl_long.preempt.store(true, Ordering::Relaxed);
        assert!(matches!(long.join().unwrap(), RunOutcome::Preempted(_)));
        assert!(short_time.as_secs() < 5, "short runs took {short_time:?}");
    });
}
