//! `Engine::prepare` on a real GPU (issue 25), ignored (needs an NVIDIA GPU): a fresh engine's
//! first run of a checkpointed launch made its streams and save area (and, with CUDA's lazy
//! loading, loaded its kernel) inside the run — under a vgpud grant, with the slice's clock
//! running. Prepared first (as the VM's worker now does before it asks for the GPU), the run
//! makes no stream and no save area, stops at its 2 ms slice end, and the launch finishes with
//! the CPU reference's bytes. Prints `MEASURE prepare` lines: when the run started and how late
//! it stopped, unprepared and prepared (the stop latency itself is `vgpu-bench fairness`'s).
//! Also `Engine::prepare_module` (what the in-process library does at a module load under a
//! method): the first launch then loads nothing; and a save area over 256 MiB is kept idle.

use std::time::{Duration, Instant};

use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::*;

use super::support::*;

const SLICE: Duration = Duration::from_millis(2);

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_prepared_first_run_makes_nothing_and_stops_at_its_slice() {
    for prepared in [false, true] {
        let e = cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: PreemptMethod::Checkpoint,
            ..CudaConfig::default()
        });
        let inst = suite::long::find("long_tight")
            .unwrap()
            .instance(suite::Size::Xl);
        let p = place(&e, &inst, window());
        let l = &inst.launches[0];
        let job = p.job(l);
        assert!(!e.prepared(&job), "a fresh engine has made nothing for it");
        if prepared {
            e.prepare(&job).unwrap();
            assert!(e.prepared(&job), "prepared: the run finds everything");
        }
        let before = e.made_counts();
        let h = PreemptHandle::new();
        let t0 = Instant::now();
        h.set_deadline(Some(t0 + SLICE));
        let out = e.execute(&job, &h).unwrap();
        let ran = t0.elapsed();
        let started = h.running_since().map(|t| t.saturating_duration_since(t0));
        let after = e.made_counts();
        let made = (after.0 - before.0, after.1 - before.1);
        println!(
            "MEASURE prepare prepared={prepared}: run started {:.0} us after the call, ended {:.0} us after the {SLICE:?} slice end; made {} streams, {} save areas in the run",
            started.unwrap_or_default().as_secs_f64() * 1e6,
            ran.saturating_sub(SLICE).as_secs_f64() * 1e6,
            made.0,
            made.1
        );
        let mut ctx = match out {
            Outcome::Preempted { context, .. } => Some(context),
            other => panic!("a kernel of tens of ms in a {SLICE:?} slice: {other:?}"),
        };
        if prepared {
            assert_eq!(
                made,
                (0, 0),
                "a prepared run makes no stream and no save area"
            );
        }
        h.clear();
        h.set_deadline(None);
        while let Some(c) = ctx.take() {
            match e.resume(c, &h).unwrap() {
                Outcome::Completed { .. } => {}
                Outcome::Preempted { context, .. } => ctx = Some(context),
                Outcome::Faulted { fault, .. } => panic!("{fault}"),
            }
        }
        let mut outs = Vec::new();
        for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
            let mut buf = vec![0u8; b.init.len()];
            e.copy_from_space(p.space, va, &mut buf).unwrap();
            outs.push(buf);
        }
        check(&inst, &outs).unwrap_or_else(|m| panic!("prepared={prepared}: {m}"));
    }
}

/// One thread per word: `out[i] = i` for `i < n` (record of 8 bytes under the transformation).
const FILL: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.visible .entry fill(
    .param .u64 out,
    .param .u32 n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r5;
DONE:
    ret;
}
"#;

/// A space with `bytes` of VRAM mapped at the window's base, `FILL` loaded: (space, module).
fn fill_space(e: &CudaEngine, bytes: u64) -> (SpaceId, ModuleId) {
    let space = e.create_space(window()).unwrap();
    e.map(
        space,
        &Mapping {
            va: VGPU_BASE,
            len: bytes.next_multiple_of(PAGE),
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let m = e.load_module(FILL, &LoadLimits::default()).unwrap().id;
    (space, m)
}

fn fill_job(space: SpaceId, module: ModuleId, threads: u32) -> Job {
    let mut params = VGPU_BASE.to_le_bytes().to_vec();
    params.extend_from_slice(&threads.to_le_bytes());
    Job::Launch(LaunchJob {
        space,
        module,
        entry: "fill".into(),
        grid: [threads.div_ceil(256), 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        params,
    })
}

fn run_to_end(e: &CudaEngine, job: &Job) {
    match e.execute(job, &PreemptHandle::new()).unwrap() {
        Outcome::Completed { .. } => {}
        other => panic!("never preempted: {other:?}"),
    }
}

fn check_fill(e: &CudaEngine, space: SpaceId, threads: u32) {
    let mut out = vec![0u8; threads as usize * 4];
    e.copy_from_space(space, VGPU_BASE, &mut out).unwrap();
    for (i, w) in out.chunks_exact(4).enumerate() {
        let v = u32::from_le_bytes(w.try_into().unwrap());
        assert_eq!(v, i as u32, "word {i}");
    }
}

/// `Engine::prepare_module` under the checkpoint method (what the in-process library does at
/// every module load, `VGPU_CUDA_PREPARE_MODULES`): the first launch then resolves no function
/// (the transformed kernel is on the device already), makes no stream and finds the signal
/// stream made; unprepared, it does both inside the launch. Prints `MEASURE prepare_module`
/// lines: the first launch's wall time either way.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_module_prepared_at_load_is_launched_without_loading_anything() {
    const THREADS: u32 = 64 * 256;
    for prepared in [false, true] {
        let e = cuda(CudaConfig {
            vram_size: 64 * MIB,
            preempt: PreemptMethod::Checkpoint,
            ..CudaConfig::default()
        });
        let (space, m) = fill_space(&e, u64::from(THREADS) * 4);
        if prepared {
            e.prepare_module(m).unwrap();
            assert_eq!(e.lazy_counts(), (0, true), "functions and signal at load");
        } else {
            assert_eq!(e.lazy_counts(), (0, false));
        }
        let made = e.made_counts();
        let job = fill_job(space, m, THREADS);
        let t0 = Instant::now();
        run_to_end(&e, &job);
        let first = t0.elapsed();
        let t1 = Instant::now();
        run_to_end(&e, &job);
        let second = t1.elapsed();
        println!(
            "MEASURE prepare_module prepared={prepared}: first launch {:.0} us, second {:.0} us",
            first.as_secs_f64() * 1e6,
            second.as_secs_f64() * 1e6
        );
        let (in_runs, signal) = e.lazy_counts();
        assert!(signal);
        assert_eq!(
            e.checkpoint_stats().unwrap().launches,
            2,
            "run checkpointed"
        );
        if prepared {
            assert_eq!(in_runs, 0, "a prepared module's launch resolves nothing");
            assert_eq!(e.made_counts().0, made.0, "nor makes a stream");
        } else {
            assert!(in_runs >= 1, "unprepared: the run loads its kernel");
        }
        check_fill(&e, space, THREADS);
    }
}

/// A save area over the pool's old flat 256 MiB of idle buffers (bfs's `expand` at `large`:
/// 4 Mi threads of 64-byte records, exactly the default limit) is kept for the next launch,
/// which allocates nothing; before, every launch allocated, zeroed and freed it.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_large_save_area_is_kept_for_the_next_launch() {
    // 48 Mi threads of 8-byte records: a 384 MiB area (limit 512 MiB).
    const THREADS: u32 = 48 << 20;
    let e = cuda(CudaConfig {
        vram_size: 256 * MIB,
        preempt: PreemptMethod::Checkpoint,
        max_save_area_bytes: 512 * MIB,
        ..CudaConfig::default()
    });
    let (space, m) = fill_space(&e, u64::from(THREADS) * 4);
    e.prepare_module(m).unwrap();
    let job = fill_job(space, m, THREADS);
    let mut areas = Vec::new();
    let mut times = Vec::new();
    for _ in 0..3 {
        let before = e.made_counts().1;
        let t = Instant::now();
        run_to_end(&e, &job);
        times.push(t.elapsed().as_secs_f64() * 1e6);
        areas.push(e.made_counts().1 - before);
    }
    println!("MEASURE large save area: launches {times:.0?} us, areas made {areas:?}");
    assert_eq!(
        e.checkpoint_stats().unwrap().launches,
        3,
        "run checkpointed"
    );
    assert_eq!(areas, [1, 0, 0], "made once, then kept");
    check_fill(&e, space, THREADS);
}
