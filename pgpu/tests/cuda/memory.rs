//! Memory on the GPU: host regions the GPU and the CPU share, spaces that time-share one VA
//! window with jobs from several threads, and hostile saved-context bytes.

use std::sync::Arc;
use std::time::Instant;

use pgpu::cuda::CudaConfig;
use pgpu::*;

use crate::support::*;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_host_regions() {
    in_child("memory::gpu_host_regions_child");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run by gpu_host_regions"]
fn gpu_host_regions_child() {
    if !is_child("memory::gpu_host_regions_child") {
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
    let module = e
        .load_module(inst.ptx, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
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
    let module = e
        .load_module(FILL, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
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
    let module = e
        .load_module(FILL, &pgpu::LoadLimits::default())
        .map(|m| m.id)
        .unwrap();
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
