//! What the bulk VRAM calls of a live copy cost a guest's small copy jobs (issue 24: during a
//! 1 GiB live migration the `fairness` guest's GPU time per launch grew by 10-20 µs while its
//! kernels' own device time did not: the growth is in its copy jobs, which read each kernel's
//! 2 KiB output back to guest RAM). The migration guest's pattern — `lcg_spin` (20 000 steps,
//! 8 CTAs of 64 threads) then a copy of its output from VRAM to a host region (guest RAM) —
//! back to back, alone and while other threads loop `contend.rs`'s bulk calls over 1 GiB (one
//! per phase, and scattered reads with every CPU busy at once), the copy done two ways: the
//! engine's copy job (`cuMemcpyDtoDAsync`, a copy engine) and a copy kernel launched in the
//! same space (the SMs' stores). Prints a `MEASURE` line per way and phase: the copy's GPU time
//! (the engine's) and wall time, median and p90, the launch's GPU time median; every copy's
//! bytes are checked against the kernel's output.
//!
//! On an H200 (session 19) no phase slowed the copy jobs (p50 7-8 µs throughout; page writes
//! p90 13 µs): the bulk slots were made before the phases. What slowed them in the VM was the
//! slots' allocation itself, in the first live copy (`CudaConfig::bulk_slot_bytes`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgpu::cuda::CudaConfig;
use pgpu::*;

use crate::contend::{Bulk, GIB, bulk_pass, pct};
use crate::support::*;

/// A copy of `n` 32-bit words, one thread per word.
const COPY_PTX: &str = r#".version 7.0
.target sm_50
.address_size 64

.visible .entry copy_words(.param .u64 dst, .param .u64 src, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [dst];
    ld.param.u64 %rd2, [src];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    add.s64 %rd5, %rd1, %rd3;
    ld.global.u32 %r6, [%rd4];
    st.global.u32 [%rd5], %r6;
DONE:
    ret;
}
"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Way {
    CopyEngine,
    Kernel,
}

fn gpu_time(o: Outcome) -> Duration {
    match o {
        Outcome::Completed { gpu_time } => gpu_time,
        other => panic!("{other:?}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_copy_jobs_beside_the_bulk_calls() {
    let e = cuda(CudaConfig {
        vram_size: 4 * GIB,
        ..CudaConfig::default()
    });
    let inst = suite::lcg::instance(20_000, 8, 64, 0x5eed_0024);
    let p = place(&e, &inst, window());
    let out_len = inst.buffers[0].init.len() as u64;
    let chunk: Vec<u8> = (0..64 * MIB).map(|i| (i % 251) as u8 | 1).collect();
    for off in (0..GIB).step_by(chunk.len()) {
        e.vram_write(GIB + off, &chunk).unwrap();
    }
    // Guest RAM: a host region mapped in the space, 512 MiB above the buffers' VAs.
    let (region, host_ptr) = e.alloc_host_region(2 * MIB).unwrap();
    let host_va = VGPU_BASE + 512 * MIB;
    e.map(
        p.space,
        &Mapping {
            va: host_va,
            len: 2 * MIB,
            target: MapTarget::Host { region, offset: 0 },
            perm: Perm::ReadWrite,
            page_size: PageSize::Size2M,
        },
    )
    .unwrap();
    let copy_module = e
        .load_module(COPY_PTX, &pgpu::LoadLimits::default())
        .unwrap()
        .id;
    let launch = launch_job(&p, &inst.launches[0]).unwrap();
    let ce_copy = Job::Copy(CopyJob {
        space: p.space,
        src: p.addrs[0],
        dst: host_va,
        len: out_len,
    });
    let words = (out_len / 4) as u32;
    let mut params = Vec::new();
    params.extend_from_slice(&host_va.to_le_bytes());
    params.extend_from_slice(&p.addrs[0].to_le_bytes());
    params.extend_from_slice(&words.to_le_bytes());
    let kernel_copy = Job::Launch(LaunchJob {
        space: p.space,
        module: copy_module,
        entry: "copy_words".into(),
        grid: [words.div_ceil(256), 1, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        params,
    });
    let h = PreemptHandle::new();
    // The copy's bytes, read after each step (no slice over memory the GPU writes).
    let copied = || {
        let mut b = vec![0u8; out_len as usize];
        // SAFETY: the region is 2 MiB of host memory the engine keeps until unregistered;
        // the GPU writes it only inside `execute`, which has returned when this reads.
        unsafe {
            std::ptr::copy_nonoverlapping(host_ptr.as_ptr(), b.as_mut_ptr(), b.len());
        }
        b
    };
    let step = |way: Way| {
        let g = gpu_time(e.execute(&launch, &h).unwrap());
        let t = Instant::now();
        let job = if way == Way::CopyEngine {
            &ce_copy
        } else {
            &kernel_copy
        };
        let c = gpu_time(e.execute(job, &h).unwrap());
        (g, c, t.elapsed())
    };
    for way in [Way::CopyEngine, Way::Kernel] {
        for _ in 0..50 {
            step(way);
        }
    }
    let mut scratch = vec![0u8; 64 * MIB as usize];
    for what in [Bulk::ReadContiguous, Bulk::ReadScattered, Bulk::WritePages] {
        bulk_pass(&e, what, &mut scratch);
    }
    // Each phase's loops run at once, one thread each.
    let phases: [&[Bulk]; 7] = [
        &[Bulk::Alone],
        &[Bulk::ReadContiguous],
        &[Bulk::ReadScattered],
        &[Bulk::WritePages],
        &[Bulk::CpuLoad],
        &[Bulk::ReadScattered, Bulk::CpuLoad],
        &[Bulk::Alone],
    ];
    for way in [Way::CopyEngine, Way::Kernel, Way::CopyEngine, Way::Kernel] {
        for what in phases {
            let stop = AtomicBool::new(false);
            let moved = AtomicU64::new(0);
            let (mut launch_us, mut copy_us, mut wall_us) = (Vec::new(), Vec::new(), Vec::new());
            let t0 = Instant::now();
            std::thread::scope(|s| {
                let loops: Vec<_> = what
                    .iter()
                    .map(|&what| {
                        let (e, stop, moved) = (&e, &stop, &moved);
                        s.spawn(move || {
                            let mut buf = vec![0u8; 64 * MIB as usize];
                            while what != Bulk::Alone && !stop.load(Ordering::Relaxed) {
                                moved.fetch_add(bulk_pass(e, what, &mut buf), Ordering::Relaxed);
                            }
                        })
                    })
                    .collect();
                std::thread::sleep(Duration::from_millis(5));
                while copy_us.len() < 600
                    || (what[0] != Bulk::Alone && moved.load(Ordering::Relaxed) == 0)
                {
                    let (g, c, w) = step(way);
                    launch_us.push(g.as_secs_f64() * 1e6);
                    copy_us.push(c.as_secs_f64() * 1e6);
                    wall_us.push(w.as_secs_f64() * 1e6);
                    let mut want = vec![0u8; out_len as usize];
                    e.copy_from_space(p.space, p.addrs[0], &mut want).unwrap();
                    assert_eq!(copied(), want, "{way:?} {what:?}: the copy's bytes");
                    if t0.elapsed() > Duration::from_secs(30) {
                        break;
                    }
                }
                stop.store(true, Ordering::Relaxed);
                for l in loops {
                    l.join().unwrap();
                }
            });
            println!(
                "MEASURE copy {way:?} {what:?}: {} copies, copy gpu p50 {:.1} p90 {:.1} us, \
                 wall p50 {:.1} p90 {:.1} us, launch gpu p50 {:.1} us",
                copy_us.len(),
                pct(&mut copy_us, 0.5),
                pct(&mut copy_us, 0.9),
                pct(&mut wall_us, 0.5),
                pct(&mut wall_us, 0.9),
                pct(&mut launch_us, 0.5),
            );
        }
    }
}
