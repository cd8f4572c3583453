//! Save-area writes against the legacy stream on a real GPU, ignored (needs an NVIDIA GPU).
//!
//! The lead's H100 fairness runs (`vgpu-bench fairness --backend cuda --policy timeslice
//! --kernel-us 500,5000 --blocks 1 --vms 16 --gpu-extra preempt=auto`) had a VM's 5 ms
//! kernel "complete" after one preemption in 0.24 ms with its output never written. A
//! restarting launch preempted before any thread finished is escalated: its next run is the
//! checkpoint form, resumed from a status-only area written with `cuMemcpyHtoD` from pageable
//! memory — on the legacy stream, which returns once the bytes are staged, and which the job
//! stream (non-blocking) does not wait for. When the DMA landed after the resume kernel read
//! its records, every thread found the pool buffer's zero (done) status and returned: the
//! launch completed unrequested and nothing was written. Here two threads keep the legacy
//! stream busy with host-to-device copies (as other VMs' guest writes do under vgpud) while
//! every launch is preempted once (stalled, so escalated) and then resumed, and each run's
//! output is checked against the CPU's on fresh buffers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pgpu::cuda::CudaConfig;
use pgpu::*;

use super::support::*;

/// Launches preempted and resumed per method.
const ROUNDS: u32 = 40;
/// The first run's time slice (far below the kernel's tens of ms: no thread finishes).
const SLICE: Duration = Duration::from_micros(300);
/// Bytes of each background copy.
const TRAFFIC: usize = 8 << 20;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_escalated_resume_sees_its_status_area_under_legacy_stream_traffic() {
    for method in [PreemptMethod::Restart, PreemptMethod::Auto] {
        let e = Arc::new(cuda(CudaConfig {
            vram_size: 512 * MIB,
            preempt: method,
            ..CudaConfig::default()
        }));
        // Background legacy-stream traffic in a space of another window (not time-shared with
        // the launches'), on VRAM far above theirs.
        let stop = Arc::new(AtomicBool::new(false));
        let base = VGPU_BASE + VGPU_SIZE;
        let traffic = e
            .create_space(VaWindow {
                base,
                size: VGPU_SIZE,
            })
            .unwrap();
        e.map(
            traffic,
            &Mapping {
                va: base,
                len: 2 * TRAFFIC as u64,
                target: MapTarget::Vram { pa: 384 * MIB },
                perm: Perm::ReadWrite,
                page_size: PageSize::Size2M,
            },
        )
        .unwrap();
        let copiers: Vec<_> = (0..2u64)
            .map(|i| {
                let (e, stop) = (e.clone(), stop.clone());
                std::thread::spawn(move || {
                    let data = vec![0x5au8; TRAFFIC];
                    let mut copies = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        e.copy_to_space(traffic, base + i * TRAFFIC as u64, &data)
                            .unwrap();
                        copies += 1;
                    }
                    copies
                })
            })
            .collect();
        let inst = suite::long::find("long_tight")
            .unwrap()
            .instance(suite::Size::Xl);
        let h = PreemptHandle::new();
        let mut preempted = 0u32;
        let mut failures = Vec::new();
        for round in 0..ROUNDS {
            let p = place(&*e, &inst, window());
            for l in &inst.launches {
                let job = p.job(l);
                h.clear();
                h.set_deadline(Some(Instant::now() + SLICE));
                let mut out = e.execute(&job, &h).unwrap();
                h.set_deadline(None);
                let mut runs = 1;
                while let Outcome::Preempted { context, .. } = out {
                    preempted += 1;
                    runs += 1;
                    assert!(runs < 100, "{method} round {round}: never finished");
                    h.clear();
                    out = e.resume(context, &h).unwrap();
                }
                if let Outcome::Faulted { fault, .. } = out {
                    panic!("{method} round {round}: {fault}");
                }
            }
            let mut outs = Vec::new();
            for (b, &va) in inst.buffers.iter().zip(&p.addrs) {
                let mut buf = vec![0u8; b.init.len()];
                e.copy_from_space(p.space, va, &mut buf).unwrap();
                outs.push(buf);
            }
            if let Err(m) = check(&inst, &outs) {
                failures.push(format!("round {round}: {m}"));
            }
            e.destroy_space(p.space).unwrap();
            e.unload_module(p.module).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let copies: u64 = copiers.into_iter().map(|t| t.join().unwrap()).sum();
        let st = e.ckpt_stats();
        println!(
            "MEASURE legacy {method}: {ROUNDS} launches, {preempted} preemptions, {} escalated, {copies} background copies of {} MiB, {} wrong",
            st.escalated_launches,
            TRAFFIC >> 20,
            failures.len()
        );
        assert!(failures.is_empty(), "{method}: {failures:#?}");
        assert!(
            st.escalated_launches >= u64::from(ROUNDS) / 2,
            "{method}: the escalation path was not exercised: {st:?}"
        );
    }
}
