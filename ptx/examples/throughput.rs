//! Interpreter throughput on matmul- and reduction-like kernels (thread-instructions/s).
//! Run: `cargo run -p ptx --release --example throughput [workers]`.

use std::sync::Arc;
use std::time::Instant;

use ptx::{FlatMemory, Launch, LaunchConfig, Limits, RunControl, RunOutcome};

const MATMUL: &str = include_str!("../../suite/kernels/matmul.ptx");
const REDUCTION: &str = include_str!("../../suite/kernels/reduction.ptx");
const BASE: u64 = 0x1_0000_0000;

fn params(v: &[u64], last: u32) -> Vec<u8> {
    let mut p: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    p.extend_from_slice(&last.to_le_bytes());
    p
}

/// On-CPU time of the calling thread in seconds (Linux schedstat), if available: with one
/// worker this gives a rate that does not depend on how busy the machine is.
fn thread_cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

fn measure(name: &str, text: &str, cfg: LaunchConfig, mem: &FlatMemory, workers: usize) {
    let m = Arc::new(ptx::parse(text).expect("parse"));
    let mut best = 0f64;
    let mut best_cpu = 0f64;
    for _ in 0..3 {
        let mut l = Launch::new(m.clone(), name, cfg.clone(), &Limits::default()).expect("launch");
        let c0 = thread_cpu_seconds();
        let t = Instant::now();
        let s = match l.run(mem, &RunControl::new(workers)) {
            RunOutcome::Completed(s) => s,
            o => panic!("{o:?}"),
        };
        let dt = t.elapsed().as_secs_f64();
        let rate = s.thread_instructions as f64 / dt;
        best = best.max(rate);
        let cpu = match (c0, thread_cpu_seconds()) {
            (Some(a), Some(b)) if workers == 1 && b > a => {
                let r = s.thread_instructions as f64 / (b - a);
                best_cpu = best_cpu.max(r);
                format!(" per-cpu-second={r:.3e}")
            }
            _ => String::new(),
        };
        println!(
            "{name:10} workers={workers} thread_instr={} warp_instr={} time={:.3}s rate={:.3e} thread-instr/s{cpu}",
            s.thread_instructions, s.warp_instructions, dt, rate
        );
    }
    let cpu = if best_cpu > 0.0 {
        format!(" (per on-CPU second: {best_cpu:.3e})")
    } else {
        String::new()
    };
    println!("{name:10} workers={workers} best={best:.3e} thread-instr/s{cpu}");
}

fn main() {
    let workers: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let n = 256usize;
    let mem = FlatMemory::new(BASE, 16 << 20);
    let a: Vec<f32> = (0..n * n).map(|i| (i % 17) as f32).collect();
    assert!(mem.write_f32s(BASE, &a));
    assert!(mem.write_f32s(BASE + (1 << 20), &a));
    let g = (n / 16) as u32;
    let cfg = LaunchConfig {
        grid: [g, g, 1],
        block: [16, 16, 1],
        dynamic_shared: 0,
        params: params(&[BASE, BASE + (1 << 20), BASE + (2 << 20)], n as u32),
    };
    measure("matmul", MATMUL, cfg, &mem, workers);
    let cnt = 1usize << 21;
    let cfg = LaunchConfig {
        grid: [64, 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 8 * 256,
        params: params(&[BASE, BASE + (12 << 20), BASE + (13 << 20)], cnt as u32),
    };
    measure("reduction", REDUCTION, cfg, &mem, workers);
    preempt_latency(workers);
}

const SPIN: &str = r#"
.version 7.8
.target sm_80
.address_size 64
.visible .entry forever()
{
    .reg .b32 %r<3>;
    mov.u32 %r1, 0;
$L_top:
    add.s32 %r1, %r1, 1;
    bra.uni $L_top;
}
"#;

/// Time from setting the preempt flag to `run` returning, on a runaway kernel.
fn preempt_latency(workers: usize) {
    let m = Arc::new(ptx::parse(SPIN).expect("parse"));
    let mem = FlatMemory::new(BASE, 4096);
    let mut worst = 0f64;
    let mut total = 0f64;
    let rounds = 20;
    for _ in 0..rounds {
        let cfg = LaunchConfig {
            grid: [64, 1, 1],
            block: [256, 1, 1],
            dynamic_shared: 0,
            params: Vec::new(),
        };
        let mut l = Launch::new(m.clone(), "forever", cfg, &Limits::default()).expect("launch");
        let ctl = RunControl::new(workers);
        let (out, lat) = std::thread::scope(|s| {
            let h = s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                ctl.preempt
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Instant::now()
            });
            let out = l.run(&mem, &ctl);
            let done = Instant::now();
            let set = h.join().expect("setter");
            (out, done.duration_since(set).as_secs_f64())
        });
        assert!(matches!(out, RunOutcome::Preempted(_)));
        worst = worst.max(lat);
        total += lat;
    }
    println!(
        "preempt    workers={workers} latency mean={:.1}us worst={:.1}us (flag set -> run returned)",
        total / rounds as f64 * 1e6,
        worst * 1e6
    );
}
