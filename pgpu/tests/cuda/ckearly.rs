//! Early preemption requests on checkpointed launches (the "bytes differ" of
//! `gpu_ckpath_armed_notice_mirror_on_every_long_kernel` on a fresh engine's first
//! preemption), all ignored: a request pending before `execute`, one made while a fresh
//! engine's first launch is being set up (its pool buffer, signal stream, job stream and events
//! made on first use) by a requesting thread's first request, one made the moment the engine
//! marks the job running (right before `cuLaunchKernel`) and ones a few hundred µs after the
//! call, on the default request path (`write-value/sync/strided`) and on
//! `armed/notice/mirror`, for a one-CTA 10 ms spin and two long kernels with exact outputs
//! (`long_tight`, `long_atomic` at size xl) under `checkpoint`. Every run must be preempted and
//! resume to the exact outputs (the spin to its bounds: `spin_ok`). `MEASURE early` lines say
//! what the runs did, and whether two unpreempted spin runs even write the same bytes (they are
//! `%globaltimer` readings). Also: a restarting launch stopped by a pending request is not
//! escalated (`pgpu::ckpt::stalled` is not asked about a run that started under a request).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use pgpu::cuda::{CudaConfig, CudaEngine, EndWait, FlagWrite, StatusRead};
use pgpu::*;

use super::support::*;

const PATHS: [(FlagWrite, EndWait, StatusRead); 2] = [
    (FlagWrite::WriteValue, EndWait::Sync, StatusRead::Strided),
    (FlagWrite::Armed, EndWait::Notice, StatusRead::Mirror),
];

fn ck_engine(fw: FlagWrite, ew: EndWait, sr: StatusRead) -> CudaEngine {
    cuda(CudaConfig {
        vram_size: 64 * MIB,
        preempt: PreemptMethod::Checkpoint,
        flag_write: fw,
        end_wait: ew,
        status_read: sr,
        // These three for every run, whatever the kernel's length.
        ck_path: pgpu::cuda::CkPathChoice::Fixed,
        ..CudaConfig::default()
    })
}

fn kernels() -> Vec<suite::Instance> {
    vec![
        suite::hand::spin::instance_with(10_000_000, 1, 256, suite::Size::Large),
        suite::long::find("long_tight")
            .unwrap()
            .instance(suite::Size::Xl),
        suite::long::find("long_atomic")
            .unwrap()
            .instance(suite::Size::Xl),
    ]
}

/// When the request comes.
#[derive(Debug, Clone, Copy)]
enum When {
    /// Before `execute` is called.
    Pending,
    /// As soon as the engine marks the job running (`PreemptHandle::running_since`).
    AtStart,
    /// This long after the request was handed to the requesting thread.
    After(Duration),
}

/// A long-lived requesting thread (its first request is its first driver call).
struct Requester {
    tx: mpsc::Sender<(PreemptHandle, When)>,
    done: mpsc::Receiver<bool>,
}

impl Requester {
    fn new() -> Requester {
        let (tx, rx) = mpsc::channel::<(PreemptHandle, When)>();
        let (dtx, done) = mpsc::channel();
        std::thread::spawn(move || {
            while let Ok((h, when)) = rx.recv() {
                let asked = match when {
                    When::Pending => true,
                    When::After(d) => {
                        std::thread::sleep(d);
                        h.request();
                        true
                    }
                    When::AtStart => {
                        let t0 = Instant::now();
                        while h.running_since().is_none() && t0.elapsed() < Duration::from_secs(5) {
                            std::hint::spin_loop();
                        }
                        h.request();
                        h.running_since().is_some()
                    }
                };
                if dtx.send(asked).is_err() {
                    return;
                }
            }
        });
        Requester { tx, done }
    }
}

/// One run of `inst`'s launch on `e` (buffers set to their initial bytes first) with a request
/// made `when`, resumed (no request) until it completes. Returns the resumes and the first
/// buffer's bytes; an error says what went wrong.
fn early_once(
    e: &CudaEngine,
    p: &Placed,
    inst: &suite::Instance,
    when: When,
    req: &Requester,
) -> Result<(u32, Vec<u8>), String> {
    for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
        e.copy_to_space(p.space, va, &b.init)
            .map_err(|e| e.to_string())?;
    }
    let job = launch_job(p, &inst.launches[0])?;
    let h = PreemptHandle::new();
    if matches!(when, When::Pending) {
        h.request();
    }
    req.tx.send((h.clone(), when)).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let out = e.execute(&job, &h);
    // Heard from before anything else: the next run must not read this one's answer.
    let asked = req
        .done
        .recv_timeout(Duration::from_secs(10))
        .map_err(|e| format!("requester: {e}"))?;
    let mut out = out.map_err(|e| e.to_string())?;
    if !asked {
        return Err("the job was never marked running".into());
    }
    if !matches!(out, Outcome::Preempted { .. }) {
        return Err(format!("{when:?}: not preempted: {out:?}"));
    }
    let mut resumes = 0;
    while let Outcome::Preempted { context, .. } = out {
        resumes += 1;
        if resumes > 100 {
            return Err(format!(
                "{when:?}: still preempted after 100 unrequested resumes"
            ));
        }
        out = e
            .resume(context, &PreemptHandle::new())
            .map_err(|e| e.to_string())?;
    }
    if !matches!(out, Outcome::Completed { .. }) {
        return Err(format!("{when:?}: resumed to {out:?}"));
    }
    let span = t0.elapsed();
    let mut buf = vec![0u8; inst.buffers[0].init.len()];
    e.copy_from_space(p.space, p.addrs[0], &mut buf)
        .map_err(|e| e.to_string())?;
    let judged = if inst.workload == "spin" {
        spin_ok(inst, &buf, span)
    } else {
        check(inst, std::slice::from_ref(&buf))
    };
    judged.map_err(|m| format!("{when:?}, {resumes} resume(s): {m}"))?;
    Ok((resumes, buf))
}

/// Two unpreempted runs of the spin on `e`: whether their bytes are the same, and the range of
/// their values (timer readings: a diagnostic, never asserted).
fn spin_unpreempted(e: &CudaEngine, inst: &suite::Instance) -> String {
    let p = place(e, inst, window());
    let mut runs = Vec::new();
    for _ in 0..2 {
        e.copy_to_space(p.space, p.addrs[0], &inst.buffers[0].init)
            .unwrap();
        let (b, _) = run(e, &p, inst, None).unwrap();
        runs.push(b[0].clone());
    }
    e.unload_module(p.module).unwrap();
    e.destroy_space(p.space).unwrap();
    let vals: Vec<u64> = runs
        .iter()
        .flat_map(|b| b.chunks_exact(8))
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    format!(
        "identical {}, values {}..{} ns",
        runs[0] == runs[1],
        vals.iter().min().unwrap(),
        vals.iter().max().unwrap()
    )
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckearly_requests_before_and_at_the_launch_resume_to_the_right_bytes() {
    let ks = kernels();
    let spin = &ks[0];
    let whole = cuda(CudaConfig {
        vram_size: 64 * MIB,
        whole_launches: true,
        ..CudaConfig::default()
    });
    println!(
        "MEASURE early spin unpreempted, whole launches: {}",
        spin_unpreempted(&whole, spin)
    );
    drop(whole);
    let mut failures = Vec::new();
    for (fw, ew, sr) in PATHS {
        let path = format!("{fw}/{ew:?}/{sr:?}");
        let ck = ck_engine(fw, ew, sr);
        println!(
            "MEASURE early spin unpreempted, {path} checkpoint: {}",
            spin_unpreempted(&ck, spin)
        );
        for inst in &ks {
            let name = inst.workload;
            // A fresh engine per run, its first launch preempted by a fresh requesting thread's
            // first request (the failing test's first case: 300 µs), or before the call.
            let mut fresh = Vec::new();
            for when in [
                When::After(Duration::ZERO),
                When::After(Duration::from_micros(100)),
                When::After(Duration::from_micros(300)),
                When::After(Duration::from_micros(600)),
                When::Pending,
                When::AtStart,
            ] {
                let e = ck_engine(fw, ew, sr);
                let p = place(&e, inst, window());
                match early_once(&e, &p, inst, when, &Requester::new()) {
                    Ok((n, _)) => fresh.push(n),
                    Err(m) => failures.push(format!("{path} {name} fresh engine: {m}")),
                }
            }
            // One engine, many runs: pending, at the start, and 0-370 µs after the call.
            let p = place(&ck, inst, window());
            let req = Requester::new();
            let mut whens = vec![When::Pending; 5];
            whens.extend([When::AtStart; 10]);
            whens.extend((0..10).map(|k| When::After(Duration::from_micros(37 * k))));
            let mut ok = 0;
            for when in whens {
                match early_once(&ck, &p, inst, when, &req) {
                    Ok(_) => ok += 1,
                    Err(m) => failures.push(format!("{path} {name}: {m}")),
                }
            }
            ck.unload_module(p.module).unwrap();
            ck.destroy_space(p.space).unwrap();
            println!(
                "MEASURE early {path} {name}: fresh engines {}/6 right (resumes {fresh:?}); one engine {ok}/25 right",
                fresh.len()
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A restarting launch (`long_tight` at size xl under `restart`) stopped by a request pending at
/// `execute`, five times: every run is preempted, none is taken as stalled (no escalation to
/// the checkpoint form: no thread ran), and each resumes to the exact outputs.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_ckearly_a_pending_request_does_not_escalate_a_restarting_launch() {
    let e = cuda(CudaConfig {
        vram_size: 64 * MIB,
        preempt: PreemptMethod::Restart,
        ..CudaConfig::default()
    });
    let inst = suite::long::find("long_tight")
        .unwrap()
        .instance(suite::Size::Xl);
    let p = place(&e, &inst, window());
    let req = Requester::new();
    for run in 0..5 {
        if let Err(m) = early_once(&e, &p, &inst, When::Pending, &req) {
            panic!("run {run}: {m}");
        }
    }
    let st = e.ckpt_stats();
    println!("MEASURE early restart pending: {st:?}");
    assert!(st.restart_launches >= 5, "{st:?}");
    assert_eq!(st.escalated_launches, 0, "{st:?}");
}
