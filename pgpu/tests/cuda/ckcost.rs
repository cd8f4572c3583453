//! The host work of a checkpointed launch no request reaches (issue 23: a transformed kernel
//! never preempted should cost at most 5% over the untransformed launch), ignored (needs an
//! NVIDIA GPU). Every launch used to create and destroy two events, clear its flag with a
//! memset, record an event behind it, an origin event and time the kernel twice; now the
//! events are pooled, the flag is cleared only when a request raised it, and one event starts
//! the run. Asserted exactly: the driver calls of a warm never-requested run on the launching
//! thread (`CkptStats::unrequested_driver_calls`) against a whole untransformed launch's
//! (`CudaEngine::plain_run_calls`), and that a buffer whose flag a request raised is cleared
//! before its next launch (else that launch would stop at its entry and, unrequested, be
//! taken as complete: the bytes are checked). Prints `MEASURE ckcost` lines: host µs per
//! launch, wall and GPU, checkpoint / restart / whole.

use std::time::{Duration, Instant};

use pgpu::cuda::{CudaConfig, CudaEngine};
use pgpu::*;

use super::support::*;

/// Driver calls of a warm checkpointed run that no request reaches (default request path:
/// write-value flag, `Sync` end wait, strided status read): the start event, the launch, the
/// end event, its synchronisation and the elapsed time.
const CK_CALLS: u64 = 5;
/// Of a whole untransformed launch (`whole_launches`): the origin and start events, the
/// launch, the end event, its synchronisation, two elapsed times.
const WHOLE_CALLS: u64 = 7;
/// A checkpointed run on a buffer whose flag is up adds the clear and the event behind it.
const CLEAR_CALLS: u64 = 2;

/// One thread per word: `out[i] = i + salt` for `i < n`.
const FILL: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.visible .entry fill(
    .param .u64 out,
    .param .u32 n,
    .param .u32 salt
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    ld.param.u32 %r6, [salt];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    add.u32 %r7, %r5, %r6;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}
"#;

const THREADS: u32 = 64 * 256;
const LAUNCHES: u64 = 2000;

struct Fill {
    space: SpaceId,
    module: ModuleId,
}

fn fill_setup(e: &CudaEngine) -> Fill {
    let space = e.create_space(window()).unwrap();
    e.map(
        space,
        &Mapping {
            va: VGPU_BASE,
            len: (u64::from(THREADS) * 4).next_multiple_of(PAGE),
            target: MapTarget::Vram { pa: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let module = e.load_module(FILL, &LoadLimits::default()).unwrap().id;
    Fill { space, module }
}

fn fill_job(f: &Fill, salt: u32) -> Job {
    let mut params = VGPU_BASE.to_le_bytes().to_vec();
    params.extend_from_slice(&THREADS.to_le_bytes());
    params.extend_from_slice(&salt.to_le_bytes());
    Job::Launch(LaunchJob {
        space: f.space,
        module: f.module,
        entry: "fill".into(),
        grid: [THREADS.div_ceil(256), 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        params,
    })
}

fn completed(e: &CudaEngine, job: &Job) -> Duration {
    match e.execute(job, &PreemptHandle::new()).unwrap() {
        Outcome::Completed { gpu_time } => gpu_time,
        other => panic!("never requested: {other:?}"),
    }
}

fn check_fill(e: &CudaEngine, f: &Fill, salt: u32) {
    let mut out = vec![0u8; THREADS as usize * 4];
    e.copy_from_space(f.space, VGPU_BASE, &mut out).unwrap();
    for (i, w) in out.chunks_exact(4).enumerate() {
        let v = u32::from_le_bytes(w.try_into().unwrap());
        assert_eq!(v, i as u32 + salt, "word {i} (salt {salt})");
    }
}

/// (runs, driver calls) of the engine's never-requested checkpointed runs.
fn unrequested(e: &CudaEngine) -> (u64, u64) {
    let s = e.ckpt_stats();
    (s.unrequested_runs, s.unrequested_driver_calls)
}

/// `LAUNCHES` warm launches: (wall µs per launch, GPU µs per launch).
fn timed(e: &CudaEngine, f: &Fill) -> (f64, f64) {
    let job = fill_job(f, 0);
    let mut gpu = Duration::ZERO;
    let t0 = Instant::now();
    for _ in 0..LAUNCHES {
        gpu += completed(e, &job);
    }
    let wall = t0.elapsed();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / LAUNCHES as f64;
    (per(wall), per(gpu))
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_a_never_requested_checkpointed_launch_makes_fewer_driver_calls_than_a_whole_one() {
    let whole = cuda(CudaConfig {
        vram_size: 64 * MIB,
        whole_launches: true,
        ..CudaConfig::default()
    });
    let wf = fill_setup(&whole);
    completed(&whole, &fill_job(&wf, 0));
    let before = whole.plain_run_calls();
    let (whole_wall, whole_gpu) = timed(&whole, &wf);
    let after = whole.plain_run_calls();
    assert_eq!(after.0 - before.0, LAUNCHES);
    assert_eq!(
        after.1 - before.1,
        LAUNCHES * WHOLE_CALLS,
        "driver calls of whole launches"
    );
    check_fill(&whole, &wf, 0);
    println!(
        "MEASURE ckcost whole: {whole_wall:.2} us wall, {whole_gpu:.2} us GPU per launch, {WHOLE_CALLS} driver calls"
    );
    drop(whole);

    for method in [PreemptMethod::Checkpoint, PreemptMethod::Restart] {
        let e = cuda(CudaConfig {
            vram_size: 64 * MIB,
            preempt: method,
            // The fixed path's count (the adaptive one's is `ckadapt`'s).
            ck_path: pgpu::cuda::CkPathChoice::Fixed,
            ..CudaConfig::default()
        });
        let f = fill_setup(&e);
        // The first launch makes the save area and the event pair.
        completed(&e, &fill_job(&f, 0));
        let made = (e.made_counts(), e.ck_event_pairs_made());
        assert_eq!(made.1, 1, "{method}: one event pair");
        let before = unrequested(&e);
        let (wall, gpu) = timed(&e, &f);
        let after = unrequested(&e);
        assert_eq!(
            after.0 - before.0,
            LAUNCHES,
            "{method}: every run unrequested"
        );
        assert_eq!(
            after.1 - before.1,
            LAUNCHES * CK_CALLS,
            "{method}: driver calls of warm never-requested runs"
        );
        assert_eq!(
            (e.made_counts(), e.ck_event_pairs_made()),
            made,
            "{method}: warm runs make no stream, save area or event"
        );
        check_fill(&e, &f, 0);
        println!(
            "MEASURE ckcost {method}: {wall:.2} us wall, {gpu:.2} us GPU per launch ({:+.2} us wall, {:+.2} us GPU against whole), {CK_CALLS} driver calls",
            wall - whole_wall,
            gpu - whole_gpu
        );

        // A request raises the buffer's flag: a launch stopped at its entry, resumed (the
        // resumed run clears it, or the escalated one takes another buffer).
        let h = PreemptHandle::new();
        h.request();
        let ctx = match e.execute(&fill_job(&f, 7), &h).unwrap() {
            Outcome::Preempted { context, .. } => context,
            other => panic!("{method}: requested before it started: {other:?}"),
        };
        resume_to_end(&e, ctx);
        check_fill(&e, &f, 7);
        let before = (unrequested(&e), e.made_counts());
        completed(&e, &fill_job(&f, 11));
        check_fill(&e, &f, 11);
        let after = (unrequested(&e), e.made_counts());
        // A checkpointing launch gets its buffer back from the pool; a restarting one whose
        // early stop was taken as stalled continued in the checkpoint form's buffer, and its
        // own was freed: the next launch may allocate (more calls, flag down).
        let allocated = after.1 != before.1;
        assert!(
            !allocated || method == PreemptMethod::Restart,
            "{method}: the pool's buffer is reused"
        );
        if !allocated {
            assert_eq!(
                (after.0.0 - before.0.0, after.0.1 - before.0.1),
                (1, CK_CALLS),
                "{method}: the resumed run cleared the flag; the next launch finds it down"
            );
        }
        late_requests(&e, &f);
    }
}

fn resume_to_end(e: &CudaEngine, ctx: SavedContext) {
    let h = PreemptHandle::new();
    let mut ctx = Some(ctx);
    while let Some(c) = ctx.take() {
        match e.resume(c, &h).unwrap() {
            Outcome::Completed { .. } => {}
            Outcome::Preempted { context, .. } => ctx = Some(context),
            Outcome::Faulted { fault, .. } => panic!("{fault}"),
        }
    }
}

/// A time-slice deadline that passed before the run: the flag goes up right after the
/// launch, and a kernel this short often ends before it sees it — completed, its buffer back
/// in the pool with the flag up (what `hostcost::raised_after` tracks). The next launch must
/// clear it (else it stops at its entry and, unrequested, counts as complete): its bytes are
/// checked every time, its calls when the case was seen.
fn late_requests(e: &CudaEngine, f: &Fill) {
    let mut seen = 0;
    for i in 0..200u32 {
        let h = PreemptHandle::new();
        h.set_deadline(Some(Instant::now()));
        let before = unrequested(e);
        let late = match e.execute(&fill_job(f, 100 + i), &h).unwrap() {
            Outcome::Completed { .. } => unrequested(e).0 == before.0,
            Outcome::Preempted { context, .. } => {
                resume_to_end(e, context);
                false
            }
            Outcome::Faulted { fault, .. } => panic!("{fault}"),
        };
        check_fill(e, f, 100 + i);
        let (before, made) = (unrequested(e), e.made_counts());
        completed(e, &fill_job(f, 1000 + i));
        check_fill(e, f, 1000 + i);
        let after = unrequested(e);
        if late && e.made_counts() == made {
            seen += 1;
            assert_eq!(
                after.1 - before.1,
                CK_CALLS + CLEAR_CALLS,
                "a raised flag is cleared by the next launch"
            );
        }
    }
    println!("MEASURE ckcost late requests: {seen}/200 runs completed with their flag raised");
}

/// `FlagWrite::Armed`: the armed write always lands in the flag (its gate opens at the end),
/// so every launch finds it up and clears it: back-to-back launches keep their bytes.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_armed_launches_clear_the_flag_their_predecessor_left_up() {
    let e = cuda(CudaConfig {
        vram_size: 64 * MIB,
        preempt: PreemptMethod::Checkpoint,
        flag_write: pgpu::cuda::FlagWrite::Armed,
        ck_path: pgpu::cuda::CkPathChoice::Fixed,
        ..CudaConfig::default()
    });
    let f = fill_setup(&e);
    for salt in 0..50 {
        let before = unrequested(&e);
        completed(&e, &fill_job(&f, salt));
        check_fill(&e, &f, salt);
        let after = unrequested(&e);
        assert_eq!(after.0 - before.0, 1);
        println!(
            "MEASURE ckcost armed launch {salt}: {} driver calls",
            after.1 - before.1
        );
    }
}
