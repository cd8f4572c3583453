//! The checkpoint preemption method on a real GPU (`CudaConfig::preempt = Checkpoint`), all
//! ignored (need an NVIDIA GPU): every suite workload preempted from another thread many times
//! gives the bytes of the unpreempted run on sim; a single-CTA kernel of ~10 ms (which slicing
//! cannot split) is preempted and resumed; a kernel the transformation refuses falls back to
//! slicing and is counted; `MEASURE ckpt` lines: preemption latency (request → context saved,
//! GPU free) of both flag writes, resume latency, bytes saved.

use std::time::{Duration, Instant};

use pgpu::cuda::{CudaConfig, CudaEngine, FlagWrite};
use pgpu::*;

use super::support::*;

fn ck_cuda(flag_write: FlagWrite) -> CudaEngine {
    cuda(CudaConfig {
        vram_size: 512 * MIB,
        preempt: PreemptMethod::Checkpoint,
        flag_write,
        // This flag write for every run, whatever the kernel's length.
        ck_path: pgpu::cuda::CkPathChoice::Fixed,
        ..CudaConfig::default()
    })
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckpt_every_workload_preempted_gives_identical_bytes() {
    let s = sim();
    let e = ck_cuda(FlagWrite::WriteValue);
    let mut failures = Vec::new();
    let mut total = 0;
    for w in suite::all().filter(|w| w.name != "spin") {
        let inst = w.instance(suite::Size::Medium);
        let ps = place(&s, &inst, window());
        let (want, _) = run(&s, &ps, &inst, None).unwrap();
        s.destroy_space(ps.space).unwrap();
        for every in [Duration::from_micros(30), Duration::from_micros(300)] {
            let p = place(&e, &inst, window());
            match run(&e, &p, &inst, Some(every)) {
                Ok((got, n)) => {
                    total += n;
                    if got != want {
                        failures.push(format!("{} every {every:?}: bytes differ", w.name));
                    }
                }
                Err(m) => failures.push(format!("{}: {m}", w.name)),
            }
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
        }
    }
    let st = e.ckpt_stats();
    println!(
        "MEASURE ckpt suite: {total} preemptions, {} threads saved, {} bytes full, {} incremental, fallbacks {:?}",
        st.saved_threads, st.saved_full_bytes, st.saved_incremental_bytes, st.fallback_reasons
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(st.fallback_modules, 0, "{:?}", st.fallback_reasons);
    assert!(
        st.preemptions > 0 && st.preemptions == u64::from(total),
        "{st:?}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckpt_conformance() {
    for method in [FlagWrite::WriteValue, FlagWrite::Memcpy] {
        let e = ck_cuda(method);
        for distinct in [false, true] {
            assert_eq!(
                pgpu::conformance::check_engine(&e, cuda_setup_with(distinct)),
                Ok(7)
            );
        }
        let st = e.ckpt_stats();
        assert!(st.modules_transformed > 0 && st.launches > 0, "{st:?}");
        println!("MEASURE ckpt conformance ({method:?}): 7 of 7 checks passed, {st:?}");
    }
}

/// One CTA spinning `ns`: slicing cannot split it, checkpoints stop it within a point.
fn spin_one_cta(
    e: &CudaEngine,
    ns: u64,
    request_after: Duration,
) -> (Outcome, Duration, Placed, suite::Instance) {
    let inst = suite::hand::spin::instance_with(ns, 1, 256, suite::Size::Large);
    let p = place(e, &inst, window());
    let l = &inst.launches[0];
    let job = p.job(l);
    let h = PreemptHandle::new();
    let h2 = h.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(request_after);
        h2.request()
    });
    let out = e.execute(&job, &h).unwrap();
    let done = Instant::now();
    let asked = t.join().unwrap();
    (out, done.saturating_duration_since(asked), p, inst)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckpt_single_cta_10ms_kernel_is_preempted_and_resumed() {
    for method in [FlagWrite::WriteValue, FlagWrite::Memcpy] {
        let e = ck_cuda(method);
        let mut lat = Vec::new();
        let mut resume = Vec::new();
        for _ in 0..10 {
            let (out, l, p, inst) = spin_one_cta(&e, 10_000_000, Duration::from_millis(2));
            let Outcome::Preempted { context, .. } = out else {
                panic!("{method:?}: the 10 ms kernel was not preempted: {out:?}");
            };
            lat.push(l.as_secs_f64() * 1e6);
            let h = PreemptHandle::new();
            let t0 = Instant::now();
            let out = e.resume(context, &h).unwrap();
            resume.push((h.running_since().unwrap() - t0).as_secs_f64() * 1e6);
            assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
            let mut buf = vec![0u8; inst.buffers[0].init.len()];
            e.copy_from_space(p.space, p.addrs[0], &mut buf).unwrap();
            check(&inst, &[buf]).unwrap();
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
        }
        lat.sort_by(f64::total_cmp);
        resume.sort_by(f64::total_cmp);
        let st = e.ckpt_stats();
        println!(
            "MEASURE ckpt single-CTA 10 ms spin, flag {method:?}: preemption latency p50 {:.1} us max {:.1} us; resume p50 {:.1} us; bytes saved full {} incremental {}",
            lat[lat.len() / 2],
            lat[lat.len() - 1],
            resume[resume.len() / 2],
            st.saved_full_bytes,
            st.saved_incremental_bytes
        );
        assert_eq!(st.preemptions, 10);
    }
}

/// Uses the transformation's reserved prefix: refused, counted, run sliced.
const RESERVED: &str = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry k(.param .u64 out)
{
    .reg .u32 %__ck_x;
    .reg .u64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %__ck_x, %tid.x;
    mul.wide.u32 %rd2, %__ck_x, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %__ck_x;
    ret;
}
"#;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckpt_refused_kernel_falls_back_to_slicing_and_is_counted() {
    let e = ck_cuda(FlagWrite::WriteValue);
    let space = e.create_space(window()).unwrap();
    e.map(
        space,
        &Mapping {
            va: VGPU_BASE,
            len: PAGE,
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let m = e.load_module(RESERVED, &LoadLimits::default()).unwrap().id;
    let job = Job::Launch(LaunchJob {
        space,
        module: m,
        entry: "k".into(),
        grid: [4, 1, 1],
        block: [64, 1, 1],
        dynamic_shared: 0,
        params: VGPU_BASE.to_le_bytes().to_vec(),
    });
    let subs = e.sub_launches();
    let out = e.execute(&job, &PreemptHandle::new()).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }));
    assert!(e.sub_launches() > subs, "ran sliced");
    let mut buf = vec![0u8; 256];
    e.copy_from_space(space, VGPU_BASE, &mut buf).unwrap();
    for t in 0..64u32 {
        assert_eq!(
            u32::from_le_bytes(buf[4 * t as usize..][..4].try_into().unwrap()),
            t
        );
    }
    let st = e.ckpt_stats();
    assert_eq!(st.fallback_modules, 1);
    assert!(st.fallback_reasons[0].contains("__ck"), "{st:?}");
    assert_eq!(st.launches, 0);
}

/// `restart` and `auto` on the GPU: every suite and long workload preempted from another
/// thread gives the bytes of the unpreempted run on sim; auto slices `long_many`'s grid only
/// at sizes with many waves, so here it counts restarts and checkpoints.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_restart_and_auto_preempted_give_identical_bytes() {
    let s = sim();
    for method in [PreemptMethod::Restart, PreemptMethod::Auto] {
        let e = cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: method,
            ..CudaConfig::default()
        });
        let mut failures = Vec::new();
        let mut total = 0;
        for w in suite::all()
            .filter(|w| w.name != "spin")
            .chain(suite::long::all())
        {
            let inst = w.instance(suite::Size::Medium);
            let ps = place(&s, &inst, window());
            let (want, _) = run(&s, &ps, &inst, None).unwrap();
            s.destroy_space(ps.space).unwrap();
            let p = place(&e, &inst, window());
            match run(&e, &p, &inst, Some(Duration::from_micros(30))) {
                Ok((got, n)) => {
                    total += n;
                    if got != want {
                        failures.push(format!("{method} {}: bytes differ", w.name));
                    }
                }
                Err(m) => failures.push(format!("{method} {}: {m}", w.name)),
            }
            e.unload_module(p.module).unwrap();
            e.destroy_space(p.space).unwrap();
        }
        let st = e.ckpt_stats();
        println!(
            "MEASURE {method} suite+long: {total} preemptions, {} restart launches, {} sliced, {} threads saved",
            st.restart_launches, st.sliced_launches, st.saved_threads
        );
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(st.restart_launches > 0, "{st:?}");
    }
}

/// Issue 23: an in-place launch (`long_inplace`, its written and read pointers the same
/// buffer) of an idempotent entry runs in the entry's checkpoint form under `auto` and
/// `restart` (before, it ran sliced, and a few-CTA sliced kernel cannot be stopped), preempted
/// from another thread, with the bytes of the unpreempted run on sim.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_an_aliased_in_place_launch_is_checkpointed() {
    let s = sim();
    let inst = suite::long::find("long_inplace")
        .unwrap()
        .instance(suite::Size::Large);
    let ps = place(&s, &inst, window());
    let (want, _) = run(&s, &ps, &inst, None).unwrap();
    s.destroy_space(ps.space).unwrap();
    for method in [PreemptMethod::Auto, PreemptMethod::Restart] {
        let e = cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: method,
            ..CudaConfig::default()
        });
        let p = place(&e, &inst, window());
        let (got, n) = run(&e, &p, &inst, Some(Duration::from_micros(30))).unwrap();
        let st = e.ckpt_stats();
        println!("MEASURE {method} long_inplace: {n} preemptions, {st:?}");
        assert!(got == want, "{method}: bytes differ");
        assert_eq!(
            (st.unproven_launches, st.launches, st.restart_launches),
            (1, 1, 0),
            "{method}: {st:?}"
        );
        assert_eq!(st.sliced_launches, 0, "{method}: {st:?}");
        e.unload_module(p.module).unwrap();
        e.destroy_space(p.space).unwrap();
    }
}
