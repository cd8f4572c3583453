//! Hostile inputs through the engine API: mutated context bytes, random launch shapes and
//! parameters, random map requests. Nothing may panic; the engine stays usable afterwards.

mod common;

use common::runner::{check, place, run};
use common::*;
use pgpu::*;

#[test]
fn mutated_context_bytes_never_panic() {
    let e = engine();
    let inst = suite::find("matmul").unwrap().instance(suite::Size::Small);
    let p = place(&e, &inst, 0);
    let l = &inst.launches[0];
    let job = p.job(l);
    let h = PreemptHandle::new();
    e.set_step_limit(Some(40));
    let Outcome::Preempted { context, .. } = e.execute(&job, &h).unwrap() else {
        panic!()
    };
    let bytes = context.into_bytes();
    let mut rng = Rng(77);
    let (mut refused, mut ran) = (0, 0);
    for _ in 0..400 {
        let mut b = bytes.clone();
        match rng.below(4) {
            0 => b.truncate(rng.below(b.len() as u64) as usize),
            _ => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] ^= 1 << rng.below(8);
                }
            }
        }
        e.set_step_limit(Some(200));
        match e.resume(SavedContext::from_bytes(b), &h) {
            Err(_) => refused += 1,
            Ok(mut out) => {
                ran += 1;
                // A mutated but valid state may compute anything, fault, or loop: bound it.
                for _ in 0..20 {
                    let Outcome::Preempted { context, .. } = out else {
                        break;
                    };
                    out = e.resume(context, &h).unwrap();
                }
            }
        }
    }
    assert!(refused > 0, "some mutations must be refused");
    assert!(ran + refused == 400);
    // The engine still runs the real workload correctly.
    e.set_step_limit(None);
    let p2 = place(&e, &inst, 16 * MIB);
    let (outs, _) = run(&e, &p2, &inst, || None).unwrap();
    check(&inst, &outs).unwrap();
}

#[test]
fn random_launches_and_maps_never_panic() {
    let e = engine();
    let inst = suite::find("vecadd").unwrap().instance(suite::Size::Small);
    let p = place(&e, &inst, 0);
    let h = PreemptHandle::new();
    let mut rng = Rng(3);
    e.set_step_limit(Some(500));
    for _ in 0..300 {
        let dim = |rng: &mut Rng| match rng.below(4) {
            0 => 0,
            1 => rng.next() as u32,
            _ => 1 + rng.below(64) as u32,
        };
        let plen = if rng.below(4) == 0 {
            rng.below(64) as usize
        } else {
            28
        };
        let job = Job::Launch(LaunchJob {
            space: p.space,
            module: p.module,
            entry: if rng.below(8) == 0 {
                "x".into()
            } else {
                "vecadd".into()
            },
            grid: [dim(&mut rng), dim(&mut rng), 1],
            block: [dim(&mut rng), 1, dim(&mut rng)],
            dynamic_shared: if rng.below(4) == 0 {
                rng.next() as u32
            } else {
                0
            },
            params: rng.bytes(plen),
        });
        // Random pointers: faults or garbage results, never a panic.
        let _ = e.execute(&job, &h);
        let m = Mapping {
            va: rng.next() & !0xfff,
            len: (rng.below(1 << 22) + 1) & !0xfff,
            target: MapTarget::Vram {
                pa: rng.next() & !0xfff,
            },
            perm: Perm::ReadWrite,
            page_size: if rng.below(2) == 0 {
                PageSize::Size4K
            } else {
                PageSize::Size2M
            },
        };
        let _ = e.map(p.space, &m);
        let _ = e.unmap(p.space, rng.next() & !0xfff, rng.next() & !0xfff);
        let mut buf = vec![0u8; rng.below(9000) as usize];
        let _ = e.copy_from_space(p.space, rng.next(), &mut buf);
        let _ = e.copy_to_space(p.space, rng.next(), &buf);
        let _ = e.execute(
            &Job::Copy(CopyJob {
                space: p.space,
                src: rng.next(),
                dst: rng.next(),
                len: rng.next(),
            }),
            &h,
        );
    }
    assert!(e.counters().faults > 0);
}
