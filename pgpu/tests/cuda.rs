//! The cuda engine.
//!
//! Without a GPU (CI, dev machines): construction fails with a clear error instead of panicking,
//! and the PTX rewrite for sliced launches is checked on the sim engine (every suite workload run
//! as 1-D sub-launches of 3 blocks gives the same bytes as the plain run).
//!
//! With one, `cargo test -p pgpu --release --test cuda -- --ignored --test-threads=1`: the
//! conformance checks, every suite workload against sim (identical bytes), preemption from
//! another thread with identical bytes, a kernel fault that loses the context (in a child
//! process), host regions, and measurements printed as `MEASURE` lines.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpu::conformance::{Setup, check_engine, check_fatal_kernel_fault};
use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::sim::{SimConfig, SimEngine};
use pgpu::*;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;
/// The GPU VA window the vGPU advertises.
const VGPU_BASE: u64 = 0x10_0000_0000;
const VGPU_SIZE: u64 = 4 << 30;

fn cuda(cfg: CudaConfig) -> CudaEngine {
    CudaEngine::new(cfg).expect("a CUDA device")
}

fn sim() -> SimEngine {
    SimEngine::new(SimConfig {
        vram_size: 512 * MIB,
        ..SimConfig::default()
    })
    .unwrap()
}

/// Runs the ignored test `name` in a child process (for what loses the CUDA context or may
/// crash), passing its output through.
fn in_child(name: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PGPU_CUDA_CHILD", name)
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child {name}: {:?}", out.status);
}

fn is_child(name: &str) -> bool {
    std::env::var("PGPU_CUDA_CHILD").as_deref() == Ok(name)
}

#[test]
fn construction_without_a_driver_is_a_clear_error() {
    match CudaEngine::new(CudaConfig::default()) {
        Ok(e) => assert_eq!(e.info().page_sizes, vec![PageSize::Size2M]),
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("CUDA"), "{text}");
        }
    }
    let bad = CudaEngine::new(CudaConfig {
        vram_size: 3 * MIB,
        ..CudaConfig::default()
    });
    assert!(bad.is_err());
}

// ---- placing and running suite instances on any engine ----

struct Placed {
    space: SpaceId,
    module: ModuleId,
    addrs: Vec<u64>,
}

/// Maps every buffer on 2 MiB pages (an unmapped 2 MiB guard after each) from `window.base`,
/// VRAM from 0, fills it and loads the PTX.
fn place(e: &dyn Engine, inst: &suite::Instance, window: VaWindow) -> Placed {
    let space = e.create_space(window).unwrap();
    let (mut va, mut pa) = (window.base, 0);
    let mut maps = Vec::new();
    let mut addrs = Vec::new();
    for b in &inst.buffers {
        let len = (b.init.len().max(1) as u64).next_multiple_of(PAGE);
        maps.push(Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        });
        addrs.push(va);
        va += len + PAGE;
        pa += len;
    }
    e.map_batch(space, &maps).unwrap();
    for (b, &va) in inst.buffers.iter().zip(&addrs) {
        e.copy_to_space(space, va, &b.init).unwrap();
    }
    let module = e.load_module(inst.ptx).unwrap();
    Placed {
        space,
        module,
        addrs,
    }
}

/// Preempts every `every` from a helper thread while alive.
struct Preempter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Preempter {
    fn start(h: &PreemptHandle, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, h) = (stop.clone(), h.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                h.request();
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Preempter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs every launch; with `preempt_every`, a helper thread preempts and the run resumes
/// (alternately from memory and from bytes). Returns buffers and preemption count.
fn run(
    e: &dyn Engine,
    p: &Placed,
    inst: &suite::Instance,
    preempt_every: Option<Duration>,
) -> Result<(Vec<Vec<u8>>, u32), String> {
    let h = PreemptHandle::new();
    let _p = preempt_every.map(|d| Preempter::start(&h, d));
    let mut n = 0;
    for l in &inst.launches {
        let params = suite::layout_params(&l.params, &p.addrs).map_err(|e| e.to_string())?;
        let job = Job::Launch(LaunchJob {
            space: p.space,
            module: p.module,
            entry: l.entry.to_string(),
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params,
        });
        h.clear();
        let mut out = e.execute(&job, &h).map_err(|e| e.to_string())?;
        while let Outcome::Preempted { context, .. } = out {
            n += 1;
            let context = if n % 2 == 0 {
                SavedContext::from_bytes(context.into_bytes())
            } else {
                context
            };
            h.clear();
            out = e.resume(context, &h).map_err(|e| e.to_string())?;
        }
        if let Outcome::Faulted { fault, .. } = out {
            return Err(format!("{}: {fault}", l.entry));
        }
    }
    let mut outs = Vec::new();
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        let mut buf = vec![0u8; b.init.len()];
        e.copy_from_space(p.space, va, &mut buf)
            .map_err(|e| e.to_string())?;
        outs.push(buf);
    }
    Ok((outs, n))
}

fn check(inst: &suite::Instance, outs: &[Vec<u8>]) -> Result<(), String> {
    let slices: Vec<&[u8]> = outs.iter().map(Vec::as_slice).collect();
    inst.check(&slices).map(|_| ()).map_err(|m| m.to_string())
}

/// Conformance set-up for the cuda engine: 1 GiB windows (CUDA honours large reservations at
/// their address) above the vGPU's window, kernel faults fatal; `distinct` gives spaces alive
/// at once disjoint windows (else they share one, time-shared by the engine).
fn cuda_setup_with(distinct: bool) -> Setup {
    Setup {
        window_base: VGPU_BASE + VGPU_SIZE,
        window_size: 1 << 30,
        distinct_windows: distinct,
        fatal_kernel_faults: true,
    }
}

fn cuda_setup() -> Setup {
    cuda_setup_with(true)
}

fn window() -> VaWindow {
    VaWindow {
        base: VGPU_BASE,
        size: VGPU_SIZE,
    }
}

// ---- CPU: the rewrite, checked on sim ----

#[test]
fn rewritten_ptx_run_as_sub_launches_on_sim_gives_identical_bytes() {
    let e = sim();
    let mut failures = Vec::new();
    let (mut subs, mut runs) = (0, 0);
    for w in suite::all() {
        let inst = w.instance(suite::Size::Small);
        let rw = pgpu::cuda::rewrite::rewrite(inst.ptx);
        if !rw.sliced {
            failures.push(format!("{}: not sliced: {}", w.name, rw.reason));
            continue;
        }
        let plain = place(&e, &inst, window());
        let (want, _) = run(&e, &plain, &inst, None).unwrap();
        e.destroy_space(plain.space).unwrap();
        let p = place(&e, &inst, window());
        let module = e.load_module(&rw.text).unwrap();
        let h = PreemptHandle::new();
        for l in &inst.launches {
            let mut params = suite::layout_params(&l.params, &p.addrs).unwrap();
            params.resize(params.len().next_multiple_of(4), 0);
            let total: u32 = l.grid.iter().product();
            let mut next = 0;
            while next < total {
                let n = 3.min(total - next);
                let mut pp = params.clone();
                for v in [next, l.grid[0], l.grid[1], l.grid[2]] {
                    pp.extend_from_slice(&v.to_le_bytes());
                }
                let job = Job::Launch(LaunchJob {
                    space: p.space,
                    module,
                    entry: l.entry.to_string(),
                    grid: [n, 1, 1],
                    block: l.block,
                    dynamic_shared: l.shared_bytes,
                    params: pp,
                });
                let out = e.execute(&job, &h).unwrap();
                assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
                next += n;
                subs += 1;
            }
        }
        let mut outs = Vec::new();
        for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
            let mut buf = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut buf).unwrap();
            outs.push(buf);
        }
        if let Err(m) = check(&inst, &outs) {
            failures.push(format!("{}: {m}", w.name));
        } else if w.name != "spin" && outs != want {
            failures.push(format!("{}: sliced bytes differ", w.name));
        } else {
            runs += 1;
        }
        e.destroy_space(p.space).unwrap();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(runs, suite::all().count());
    println!("{runs} workloads, {subs} sub-launches");
    assert!(subs > 2 * runs);
}

// ---- GPU ----

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_conformance() {
    let e = cuda(CudaConfig {
        vram_size: 64 * MIB,
        ..CudaConfig::default()
    });
    println!("device: {}", e.device_name());
    for distinct in [false, true] {
        assert_eq!(check_engine(&e, cuda_setup_with(distinct)), Ok(7));
        println!("MEASURE conformance (distinct windows: {distinct}): 7 of 7 checks passed");
    }
    // The vGPU's window comes back exact.
    let s = e.create_space(window()).unwrap();
    e.destroy_space(s).unwrap();
    println!("MEASURE window {VGPU_BASE:#x}+{VGPU_SIZE:#x}: reserved at its base");
    // 4 KiB mappings are refused.
    let s = e.create_space(window()).unwrap();
    let m = Mapping {
        va: VGPU_BASE,
        len: 4096,
        target: MapTarget::Vram { pa: 0 },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size4K,
    };
    assert!(matches!(
        e.map(s, &m),
        Err(EngineError::BadMapping(MapError::UnsupportedPageSize(
            PageSize::Size4K
        )))
    ));
    // A different window overlapping it is refused (one VA space per process); the same
    // window is shared (time-multiplexed, see gpu_shared_windows_and_concurrent_jobs).
    let other = VaWindow {
        base: VGPU_BASE + (1 << 30),
        size: 1 << 30,
    };
    assert!(matches!(
        e.create_space(other),
        Err(EngineError::BadWindow { .. })
    ));
    let same = e.create_space(window()).unwrap();
    e.destroy_space(same).unwrap();
    e.destroy_space(s).unwrap();
    // The JIT log reaches the caller.
    match e.load_module(".version 7.8\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n\tbogus.u32 %r1;\n}\n") {
        Err(EngineError::ModuleLoad { log }) => println!("MEASURE JIT log: {log}"),
        other => panic!("{other:?}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_kernel_fault_loses_the_context() {
    in_child("gpu_kernel_fault_child");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run by gpu_kernel_fault_loses_the_context"]
fn gpu_kernel_fault_child() {
    if !is_child("gpu_kernel_fault_child") {
        return;
    }
    let e = cuda(CudaConfig::default());
    let setup = cuda_setup();
    assert_eq!(check_fatal_kernel_fault(&e, setup), Ok(()));
    println!("MEASURE fault: {}", e.lost().unwrap());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_every_workload_matches_sim() {
    let c = cuda(CudaConfig {
        vram_size: 512 * MIB,
        ..CudaConfig::default()
    });
    let s = sim();
    let mut failures = Vec::new();
    let mut count = 0;
    for size in [suite::Size::Small, suite::Size::Medium] {
        for w in suite::all() {
            let inst = w.instance(size);
            let mut outs = Vec::new();
            for e in [&c as &dyn Engine, &s as &dyn Engine] {
                let p = place(e, &inst, window());
                outs.push(run(e, &p, &inst, None));
                e.destroy_space(p.space).unwrap();
                e.unload_module(p.module).unwrap();
            }
            let (sim_out, cuda_out) = (outs.pop().unwrap(), outs.pop().unwrap());
            match (cuda_out, sim_out) {
                (Ok((a, _)), Ok((b, _))) => {
                    if let Err(m) = check(&inst, &a) {
                        failures.push(format!("{} {size:?} cuda: {m}", w.name));
                    } else if w.name != "spin" && a != b {
                        failures.push(format!("{} {size:?}: cuda bytes differ from sim", w.name));
                    } else {
                        count += 1;
                        let sum: u64 = a.iter().flatten().map(|&b| u64::from(b)).sum();
                        println!(
                            "MEASURE suite {} {size:?}: equal to sim (byte sum {sum})",
                            w.name
                        );
                    }
                }
                (a, b) => failures.push(format!(
                    "{} {size:?}: cuda {:?} sim {:?}",
                    w.name,
                    a.err(),
                    b.err()
                )),
            }
        }
    }
    println!("MEASURE suite: {count} workload runs equal to sim");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_preempted_runs_give_identical_bytes() {
    // One block per sub-launch (the target is far below one block's time), preempted every
    // 100 us: every workload runs as many sub-launches and is preempted many times.
    let e = cuda(CudaConfig {
        vram_size: 1024 * MIB,
        sub_launch_target: Duration::from_nanos(1),
        initial_blocks: 1,
        ..CudaConfig::default()
    });
    let mut failures = Vec::new();
    for w in suite::all() {
        let inst = w.instance(suite::Size::Large);
        let p = place(&e, &inst, window());
        let plain = run(&e, &p, &inst, None);
        e.destroy_space(p.space).unwrap();
        let p = place(&e, &inst, window());
        let s0 = e.sub_launches();
        let pre = run(&e, &p, &inst, Some(Duration::from_micros(100)));
        let subs = e.sub_launches() - s0;
        e.destroy_space(p.space).unwrap();
        match (plain, pre) {
            (Ok((a, _)), Ok((b, n))) => {
                if let Err(m) = check(&inst, &b) {
                    failures.push(format!("{} preempted: {m}", w.name));
                } else if w.name != "spin" && a != b {
                    failures.push(format!("{}: preempted bytes differ", w.name));
                } else {
                    println!(
                        "MEASURE preempted {} Large: identical bytes, {subs} sub-launches, {n} preemptions",
                        w.name
                    );
                }
            }
            (a, b) => failures.push(format!("{}: {:?} {:?}", w.name, a.err(), b.err())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_measurements() {
    let e = cuda(CudaConfig {
        vram_size: 1024 * MIB,
        ..CudaConfig::default()
    });
    // Map / unmap cost per 2 MiB page.
    let s = e.create_space(window()).unwrap();
    let pages = 256u64;
    let maps: Vec<Mapping> = (0..pages)
        .map(|i| Mapping {
            va: VGPU_BASE + i * PAGE,
            len: PAGE,
            target: MapTarget::Vram { pa: i * PAGE },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        })
        .collect();
    let t = Instant::now();
    e.map_batch(s, &maps).unwrap();
    let map_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    let t = Instant::now();
    e.unmap(s, VGPU_BASE, pages * PAGE).unwrap();
    let unmap_us = t.elapsed().as_secs_f64() * 1e6 / pages as f64;
    println!(
        "MEASURE map+access {map_us:.1} us / 2 MiB, unmap {unmap_us:.1} us / 2 MiB ({pages} pages)"
    );
    e.destroy_space(s).unwrap();

    drop(e);
    // A long kernel: spin, 100 us per thread, 400k CTAs of 32 threads (~95 waves on an H200).
    let inst = suite::hand::spin::instance_with(100_000, 400_000, 32, suite::Size::Large);
    let l = &inst.launches[0];
    let mut whole = Duration::ZERO;
    for (target, depth) in [
        (Duration::from_secs(10), 1),
        (Duration::from_micros(200), 1),
        (Duration::from_micros(200), 2),
        (Duration::from_micros(50), 2),
    ] {
        let e = cuda(CudaConfig {
            vram_size: 1024 * MIB,
            sub_launch_target: target,
            pipeline_depth: depth,
            ..CudaConfig::default()
        });
        let p = place(&e, &inst, window());
        let job = Job::Launch(LaunchJob {
            space: p.space,
            module: p.module,
            entry: l.entry.to_string(),
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params: suite::layout_params(&l.params, &p.addrs).unwrap(),
        });
        let h = PreemptHandle::new();
        e.execute(&job, &h).unwrap(); // warm-up: JIT, throughput measured
        let reps = 3;
        let n0 = e.sub_launches();
        let (mut wall, mut gpu) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..reps {
            let t = Instant::now();
            let out = e.execute(&job, &h).unwrap();
            wall += t.elapsed();
            gpu += out.gpu_time();
        }
        let subs = (e.sub_launches() - n0) / reps;
        let wall = wall / reps as u32;
        if whole.is_zero() {
            whole = wall;
        }
        println!(
            "MEASURE spin 400k CTAs, sub-launch target {target:?}, depth {depth}: {subs} sub-launches, wall {:.2} ms, gpu_time {:.2} ms, {:+.1}% vs whole",
            wall.as_secs_f64() * 1e3,
            gpu.as_secs_f64() * 1e3 / reps as f64,
            (wall.as_secs_f64() / whole.as_secs_f64() - 1.0) * 100.0
        );
        if target != Duration::from_micros(200) || depth != 2 {
            e.destroy_space(p.space).unwrap();
            continue;
        }
        // Preemption latency at 200 us: request at a random point, measured until execute
        // returns; and resume latency (resume called -> first sub-launch about to be issued).
        let (mut stop_lat, mut resume_lat) = (Vec::new(), Vec::new());
        let mut seed = 0x1234_5678_u64;
        h.clear();
        let mut out = e.execute(&job, &h).unwrap();
        let mut rounds = 0;
        while rounds < 200 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let delay = Duration::from_micros(50 + (seed >> 33) % 1000);
            let hh = h.clone();
            match out {
                Outcome::Completed { .. } => {
                    h.clear();
                    let th = std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        hh.request();
                    });
                    out = e.execute(&job, &h).unwrap();
                    th.join().unwrap();
                }
                Outcome::Preempted { context, .. } => {
                    let at = h.requested_at().unwrap();
                    stop_lat.push(at.elapsed().as_secs_f64() * 1e6);
                    rounds += 1;
                    h.clear();
                    let th = std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        hh.request();
                    });
                    let t = Instant::now();
                    out = e.resume(context, &h).unwrap();
                    if let Some(r) = h.running_since() {
                        resume_lat.push(r.saturating_duration_since(t).as_secs_f64() * 1e6);
                    }
                    th.join().unwrap();
                }
                Outcome::Faulted { fault, .. } => panic!("{fault}"),
            }
        }
        let n = stop_lat.len();
        println!(
            "MEASURE preemption latency at 200us sub-launches, depth 2 (request -> execute returns) n={n}: p50 {:.0} us, p99 {:.0} us, max {:.0} us",
            percentile(&mut stop_lat, 0.5),
            percentile(&mut stop_lat, 0.99),
            percentile(&mut stop_lat, 1.0)
        );
        println!(
            "MEASURE resume latency (resume called -> running) p50 {:.1} us, p99 {:.1} us",
            percentile(&mut resume_lat, 0.5),
            percentile(&mut resume_lat, 0.99)
        );
        e.destroy_space(p.space).unwrap();
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_host_regions() {
    in_child("gpu_host_regions_child");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run by gpu_host_regions"]
fn gpu_host_regions_child() {
    if !is_child("gpu_host_regions_child") {
        return;
    }
    let e = cuda(CudaConfig::default());
    let (r, ptr) = match e.alloc_host_region(4 * MIB) {
        Ok(x) => x,
        Err(err) => {
            println!("MEASURE alloc_host_region: refused: {err}");
            return;
        }
    };
    println!("MEASURE alloc_host_region: ok at {:p}", ptr.as_ptr());
    // SAFETY: the region is 4 MiB of host memory owned by the engine until unregistered.
    let host = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), 4 * MIB as usize) };
    host[..5].copy_from_slice(b"guest");
    println!("MEASURE alloc_host_region: CPU writes through the pointer work");
    // What backs the pointer (for using it as guest RAM: KVM pins guest pages with GUP, which
    // process_vm_readv also uses).
    let addr = ptr.as_ptr() as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    for line in maps.lines() {
        let mut it = line.split(' ').next().unwrap_or("").split('-');
        let lo = usize::from_str_radix(it.next().unwrap_or("0"), 16).unwrap_or(0);
        let hi = usize::from_str_radix(it.next().unwrap_or("0"), 16).unwrap_or(0);
        if lo <= addr && addr < hi {
            println!("MEASURE alloc_host_region mapping: {line}");
        }
    }
    let mut probe = [0u8; 5];
    let local = libc::iovec {
        iov_base: probe.as_mut_ptr().cast(),
        iov_len: 5,
    };
    let remote = libc::iovec {
        iov_base: ptr.as_ptr().cast(),
        iov_len: 5,
    };
    // SAFETY: both iovecs describe 5 valid bytes of this process.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    println!(
        "MEASURE alloc_host_region GUP (process_vm_readv): {} ({:?}), /dev/kvm present: {}",
        got,
        (got < 0).then(std::io::Error::last_os_error),
        std::path::Path::new("/dev/kvm").exists()
    );
    let s = e.create_space(window()).unwrap();
    e.map(
        s,
        &Mapping {
            va: VGPU_BASE,
            len: 4 * MIB,
            target: MapTarget::Host {
                region: r,
                offset: 0,
            },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let mut b = [0u8; 5];
    e.copy_from_space(s, VGPU_BASE, &mut b).unwrap();
    assert_eq!(&b, b"guest");
    // A kernel writes guest RAM through the space; the CPU sees it.
    let inst = suite::find("vecadd").unwrap().instance(suite::Size::Small);
    let module = e.load_module(inst.ptx).unwrap();
    let n = 1000u32;
    let (a, bb, c) = (VGPU_BASE, VGPU_BASE + MIB, VGPU_BASE + 2 * MIB + 4096);
    let ones: Vec<u8> = (0..n).flat_map(|_| 1f32.to_le_bytes()).collect();
    e.copy_to_space(s, a, &ones).unwrap();
    e.copy_to_space(s, bb, &ones).unwrap();
    let mut params = Vec::new();
    for p in [a, bb, c] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    params.extend_from_slice(&n.to_le_bytes());
    let job = Job::Launch(LaunchJob {
        space: s,
        module,
        entry: "vecadd".into(),
        grid: [n.div_ceil(256), 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        params,
    });
    let out = e.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let off = (2 * MIB + 4096) as usize;
    let v = f32::from_le_bytes(host[off + 4 * 999..off + 4 * 1000].try_into().unwrap());
    assert_eq!(v, 2.0);
    println!("MEASURE host region: kernel output visible to the CPU");
    assert_eq!(
        e.unregister_host_region(r),
        Err(EngineError::HostRegionInUse(r))
    );
    e.destroy_space(s).unwrap();
    e.unregister_host_region(r).unwrap();
    // Registered memory: pinned, not mappable at a chosen VA.
    let mut v = vec![0u8; 8 << 20];
    let base = v.as_mut_ptr().wrapping_add(v.as_ptr().align_offset(4096));
    // SAFETY: 4 MiB inside `v`, which outlives the registration (unregistered below).
    let rr = unsafe { e.register_host_region(base, 4 << 20) }.unwrap();
    let s = e.create_space(window()).unwrap();
    let m = Mapping {
        va: VGPU_BASE,
        len: 2 * MIB,
        target: MapTarget::Host {
            region: rr,
            offset: 0,
        },
        perm: Perm::ReadWrite,
        page_size: PageSize::Size2M,
    };
    println!("MEASURE registered region map: {:?}", e.map(s, &m).err());
    e.destroy_space(s).unwrap();
    e.unregister_host_region(rr).unwrap();
}

/// `out[i] = i + param` for i < n (a kernel whose every parameter is checked).
const FILL: &str = ".version 7.8
.target sm_80
.address_size 64
.visible .entry fill(.param .u64 out, .param .u32 n, .param .u32 add)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .b64 %rd<5>;
	ld.param.u64 %rd1, [out];
	ld.param.u32 %r2, [n];
	ld.param.u32 %r6, [add];
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.s32 %r1, %r3, %r4, %r5;
	setp.ge.u32 %p1, %r1, %r2;
	@%p1 bra DONE;
	add.u32 %r7, %r1, %r6;
	mul.wide.u32 %rd3, %r1, 4;
	add.s64 %rd4, %rd1, %rd3;
	st.global.u32 [%rd4], %r7;
DONE:
	ret;
}
";

fn fill_job(space: SpaceId, module: ModuleId, out: u64, n: u32, add: u32) -> Job {
    let mut params = out.to_le_bytes().to_vec();
    params.extend_from_slice(&n.to_le_bytes());
    params.extend_from_slice(&add.to_le_bytes());
    Job::Launch(LaunchJob {
        space,
        module,
        entry: "fill".into(),
        grid: [n.div_ceil(128), 1, 1],
        block: [128, 1, 1],
        dynamic_shared: 0,
        params,
    })
}

fn filled(e: &dyn Engine, space: SpaceId, out: u64, n: u32, add: u32) -> bool {
    let mut b = vec![0u8; n as usize * 4];
    e.copy_from_space(space, out, &mut b).unwrap();
    b.chunks(4)
        .enumerate()
        .all(|(i, w)| u32::from_le_bytes(w.try_into().unwrap()) == i as u32 + add)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_shared_windows_and_concurrent_jobs() {
    let e = Arc::new(cuda(CudaConfig {
        vram_size: 512 * MIB,
        ..CudaConfig::default()
    }));
    let pages = 64u64;
    let n = (pages * PAGE / 4) as u32;
    let module = e.load_module(FILL).unwrap();
    // Two spaces on the vGPU's window (time-shared), one on another window.
    let mut spaces = Vec::new();
    for (i, base) in [VGPU_BASE, VGPU_BASE, VGPU_BASE + VGPU_SIZE]
        .into_iter()
        .enumerate()
    {
        let s = e
            .create_space(VaWindow {
                base,
                size: VGPU_SIZE,
            })
            .unwrap();
        e.map(
            s,
            &Mapping {
                va: base,
                len: pages * PAGE,
                target: MapTarget::Vram {
                    pa: i as u64 * pages * PAGE,
                },
                perm: Perm::ReadWrite,
                page_size: PageSize::Size2M,
            },
        )
        .unwrap();
        spaces.push((s, base));
    }
    // Switch cost: alternate host copies between the two spaces of one window.
    let mut b = [0u8; 4];
    let t = Instant::now();
    let switches = 20;
    for i in 0..switches {
        let (s, base) = spaces[i % 2];
        e.copy_from_space(s, base, &mut b).unwrap();
    }
    let per = t.elapsed().as_secs_f64() * 1e6 / switches as f64;
    println!(
        "MEASURE time-shared window switch with {pages} pages each: {per:.0} us ({:.1} us / 2 MiB)",
        per / (2 * pages) as f64
    );
    // Concurrent jobs from three threads, 30 each, checked every time.
    let threads: Vec<_> = spaces
        .iter()
        .enumerate()
        .map(|(i, &(s, base))| {
            let e = e.clone();
            std::thread::spawn(move || {
                let h = PreemptHandle::new();
                for round in 0..30u32 {
                    let add = (i as u32) << 24 | round;
                    let out = e.execute(&fill_job(s, module, base, n, add), &h).unwrap();
                    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
                    assert!(filled(&*e, s, base, n, add), "space {i} round {round}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    println!("MEASURE concurrent jobs in 3 spaces (2 sharing a window): 90 jobs, outputs right");
    for (s, _) in spaces {
        e.destroy_space(s).unwrap();
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_hostile_context_bytes() {
    let e = cuda(CudaConfig::default());
    let s = e.create_space(window()).unwrap();
    e.map(
        s,
        &Mapping {
            va: VGPU_BASE,
            len: PAGE,
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let module = e.load_module(FILL).unwrap();
    let n = 100_000;
    let h = PreemptHandle::new();
    h.request();
    let Outcome::Preempted { context, .. } = e
        .execute(&fill_job(s, module, VGPU_BASE, n, 7), &h)
        .unwrap()
    else {
        panic!("not preempted")
    };
    h.clear();
    let bytes = context.into_bytes();
    // Every byte except the parameter payload (pointers: a hostile guest owns those anyway),
    // flipped; every truncation and an extension.
    let payload = bytes.len() - 16;
    let (mut refused, mut ran) = (0, 0);
    let mut tries: Vec<Vec<u8>> = Vec::new();
    for i in 0..payload {
        for x in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= x;
            tries.push(b);
        }
    }
    for cut in 0..bytes.len() {
        tries.push(bytes[..cut].to_vec());
    }
    let mut long = bytes.clone();
    long.push(0);
    tries.push(long);
    for b in tries {
        match e.resume(SavedContext::from_bytes(b), &h) {
            Err(_) => refused += 1,
            Ok(Outcome::Faulted { fault, .. }) => panic!("fault from hostile bytes: {fault}"),
            Ok(_) => ran += 1,
        }
    }
    assert!(e.lost().is_none());
    let out = e.resume(SavedContext::from_bytes(bytes), &h).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }));
    assert!(filled(&e, s, VGPU_BASE, n, 7));
    println!(
        "MEASURE hostile context bytes: {refused} refused, {ran} ran harmlessly, engine intact"
    );
}
