//! Long-running kernels, for measuring preemption (`vgpu-bench preempt --workload long`): the
//! kernel classes a preemption method must handle, each sized to run 1-100 ms on an H100 at
//! [`Size::Xl`] and a fraction of a second or less on the sim interpreter at the smaller sizes:
//!
//! - `long_tight`: few long CTAs, a tight loop (four instructions; `lcg_spin`);
//! - `long_many`: many short CTAs of the same tight loop;
//! - `long_loose`: few long CTAs, a loose loop (a table load and a data-dependent branch);
//! - `long_smem`: few long CTAs, shared memory and two barriers per iteration;
//! - `long_atomic`: few long CTAs, a global atomic add per iteration (not idempotent).
//!
//! Not part of [`crate::all`] (whose workloads are short); [`all`] and [`find`] list them. The
//! PTX is `suite/kernels/long.ptx` (and `lcg_spin.ptx`); every expected output is computed on the
//! CPU here, exactly, and is independent of scheduling order.
//!
//! One more, found by [`find`] but not in [`all`] (the preempt experiment's figures are over the
//! five above): `long_inplace` (`suite/kernels/inplace.ptx`), few long CTAs updating a buffer in
//! place through two pointer parameters that hold the same address — an aliased launch, which
//! a method may not restart (a rerun thread would start from its own output).

use alloc::vec;
use alloc::vec::Vec;

use crate::lcg::{self, A, C};
use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, u32_bytes};

/// PTX module of `long_loose`, `long_smem` and `long_atomic`.
pub const PTX: &str = include_str!("../kernels/long.ptx");

static ALL: [Workload; 5] = [
    Workload::new(
        "long_tight",
        lcg::PTX,
        lcg::ENTRY,
        "few long CTAs, tight 4-instruction loop (lcg_spin)",
        tight,
    ),
    Workload::new(
        "long_many",
        lcg::PTX,
        lcg::ENTRY,
        "many short CTAs of the tight loop (lcg_spin)",
        many,
    ),
    Workload::new(
        "long_loose",
        PTX,
        "long_loose",
        "few long CTAs, loose loop: table load and branch per iteration",
        loose,
    ),
    Workload::new(
        "long_smem",
        PTX,
        "long_smem",
        "few long CTAs, shared memory and two barriers per iteration",
        smem,
    ),
    Workload::new(
        "long_atomic",
        PTX,
        "long_atomic",
        "few long CTAs, a global atomic add per iteration",
        atomic,
    ),
];

/// Every long-running workload, in the order above.
pub fn all() -> &'static [Workload] {
    &ALL
}

/// PTX module of `long_inplace`.
pub const INPLACE_PTX: &str = include_str!("../kernels/inplace.ptx");

static INPLACE: Workload = Workload::new(
    "long_inplace",
    INPLACE_PTX,
    "long_inplace",
    "few long CTAs, an in-place update through aliased pointers (not idempotent)",
    inplace,
);

/// The long-running workload with this name (one of [`all`], or `long_inplace`).
pub fn find(name: &str) -> Option<&'static Workload> {
    ALL.iter()
        .chain(core::iter::once(&INPLACE))
        .find(|w| w.name == name)
}

const SEED: u32 = 0x5eed_1234;

fn lcg_step(x: u32) -> u32 {
    x.wrapping_mul(A).wrapping_add(C)
}

fn named(mut inst: Instance, name: &'static str, size: Size) -> Instance {
    inst.workload = name;
    inst.size = size;
    inst
}

/// (CTAs, threads, iterations) by size.
fn tight(size: Size) -> Instance {
    let (ctas, threads, iters) = size.pick(
        (2, 64, 400),
        (2, 64, 2_000),
        (2, 128, 5_000),
        (2, 256, 4_000_000),
    );
    named(
        lcg::instance(iters, ctas, threads, SEED),
        "long_tight",
        size,
    )
}

fn many(size: Size) -> Instance {
    let (ctas, threads, iters) = size.pick(
        (32, 32, 50),
        (64, 32, 200),
        (256, 64, 100),
        (32_768, 128, 4_000),
    );
    named(lcg::instance(iters, ctas, threads, SEED), "long_many", size)
}

/// The `long_loose` output of thread `gid`.
pub fn loose_reference(gid: u32, iters: u32, seed: u32, table: &[u32; 256]) -> u32 {
    let (mut x, mut y) = (gid ^ seed, 0u32);
    for _ in 0..iters {
        x = lcg_step(x);
        let t = table[(x >> 24) as usize];
        y = if x & 0x8000 != 0 {
            y.wrapping_add(t ^ x)
        } else {
            (y ^ t).wrapping_mul(3)
        };
    }
    y ^ x
}

fn loose(size: Size) -> Instance {
    let (ctas, threads, iters) = size.pick(
        (2, 32, 250),
        (2, 32, 1_000),
        (2, 128, 1_500),
        (4, 128, 300_000),
    );
    let mut rng = Rng::for_workload("long_loose", size.tag());
    let mut table = [0u32; 256];
    for t in &mut table {
        *t = rng.next_u32();
    }
    let n = ctas * threads;
    let out: Vec<u32> = (0..n)
        .map(|g| loose_reference(g, iters, SEED, &table))
        .collect();
    Instance {
        workload: "long_loose",
        size,
        ptx: PTX,
        buffers: vec![
            Buffer::exact_out("out", Elem::U32, u32_bytes(&out)),
            Buffer::input("table", u32_bytes(&table)),
        ],
        launches: vec![Launch::linear(
            "long_loose",
            ctas,
            threads,
            vec![
                Param::Buffer(0),
                Param::Buffer(1),
                Param::U32(iters),
                Param::U32(SEED),
            ],
        )],
        approx_thread_instrs: u64::from(n) * (20 + 14 * u64::from(iters)),
    }
}

/// The `long_smem` outputs of one CTA of `threads` threads whose first global id is `first`.
pub fn smem_reference(first: u32, threads: u32, iters: u32, seed: u32) -> Vec<u32> {
    let mut x: Vec<u32> = (0..threads).map(|t| (first + t) ^ seed).collect();
    let mut next = x.clone();
    for _ in 0..iters {
        for t in 0..x.len() {
            let nb = x[(t + 1) % x.len()];
            next[t] = x[t].wrapping_mul(A).wrapping_add(nb);
        }
        core::mem::swap(&mut x, &mut next);
    }
    x
}

fn smem(size: Size) -> Instance {
    let (ctas, threads, iters) = size.pick(
        (2, 32, 300),
        (2, 64, 800),
        (2, 128, 2_500),
        (2, 256, 200_000),
    );
    let out: Vec<u32> = (0..ctas)
        .flat_map(|c| smem_reference(c * threads, threads, iters, SEED))
        .collect();
    let n = u64::from(ctas * threads);
    Instance {
        workload: "long_smem",
        size,
        ptx: PTX,
        buffers: vec![Buffer::exact_out("out", Elem::U32, u32_bytes(&out))],
        launches: vec![Launch::linear(
            "long_smem",
            ctas,
            threads,
            vec![Param::Buffer(0), Param::U32(iters), Param::U32(SEED)],
        )],
        approx_thread_instrs: n * (24 + 8 * u64::from(iters)),
    }
}

/// The `long_atomic` histogram of `threads` threads (global ids `0..threads`).
pub fn atomic_reference(threads: u32, iters: u32, seed: u32) -> [u32; 256] {
    let mut hist = [0u32; 256];
    for g in 0..threads {
        let mut x = g ^ seed;
        for _ in 0..iters {
            x = lcg_step(x);
            hist[(x >> 24) as usize] = hist[(x >> 24) as usize].wrapping_add(1);
        }
    }
    hist
}

fn atomic(size: Size) -> Instance {
    let (ctas, threads, iters) = size.pick(
        (2, 32, 400),
        (2, 64, 800),
        (2, 128, 2_500),
        (8, 256, 50_000),
    );
    let hist = atomic_reference(ctas * threads, iters, SEED);
    Instance {
        workload: "long_atomic",
        size,
        ptx: PTX,
        buffers: vec![Buffer::exact_out("hist", Elem::U32, u32_bytes(&hist))],
        launches: vec![Launch::linear(
            "long_atomic",
            ctas,
            threads,
            vec![Param::Buffer(0), Param::U32(iters), Param::U32(SEED)],
        )],
        approx_thread_instrs: u64::from(ctas * threads) * (16 + 8 * u64::from(iters)),
    }
}

/// The `long_inplace` value of one element: the LCG step applied `iters` times to `first`.
pub fn inplace_reference(first: u32, iters: u32) -> u32 {
    (0..iters).fold(first, |x, _| lcg_step(x))
}

fn inplace(size: Size) -> Instance {
    let (ctas, threads, iters) = size.pick(
        (2, 64, 300),
        (2, 64, 1_000),
        (2, 128, 2_500),
        (4, 256, 100_000),
    );
    let mut rng = Rng::for_workload("long_inplace", size.tag());
    let first: Vec<u32> = (0..ctas * threads).map(|_| rng.next_u32()).collect();
    let last: Vec<u32> = first.iter().map(|&v| inplace_reference(v, iters)).collect();
    Instance {
        workload: "long_inplace",
        size,
        ptx: INPLACE_PTX,
        buffers: vec![Buffer::exact(
            "data",
            u32_bytes(&first),
            Elem::U32,
            u32_bytes(&last),
        )],
        // dst and src: the same buffer.
        launches: vec![Launch::linear(
            "long_inplace",
            ctas,
            threads,
            vec![Param::Buffer(0), Param::Buffer(0), Param::U32(iters)],
        )],
        approx_thread_instrs: u64::from(ctas * threads) * (16 + 6 * u64::from(iters)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_long_instance_is_valid_and_its_check_catches_a_flipped_bit() {
        for w in all().iter().chain(find("long_inplace")) {
            for size in [Size::Small, Size::Medium, Size::Large] {
                let inst = w.instance(size);
                inst.validate().unwrap();
                assert_eq!(inst.workload, w.name);
                let outs = inst.reference_outputs();
                let refs: Vec<&[u8]> = outs.iter().map(|o| o.as_slice()).collect();
                assert!(inst.check(&refs).is_ok(), "{}", w.name);
                let mut bad = outs[0].clone();
                bad[3] ^= 0x40;
                let mut refs2 = refs.clone();
                refs2[0] = &bad;
                assert!(inst.check(&refs2).is_err(), "{}", w.name);
            }
            assert!(find(w.name).is_some());
            assert!(crate::find(w.name).is_none(), "not one of the short suite");
        }
    }

    #[test]
    fn references_follow_their_definitions() {
        // smem: two threads, one step: x0' = x0*A + x1, x1' = x1*A + x0.
        let s = smem_reference(0, 2, 1, 0);
        assert_eq!(s, vec![1, A]);
        // atomic: one thread, one step lands in the bin of lcg(seed).
        let h = atomic_reference(1, 1, 7);
        assert_eq!(h[(lcg_step(7) >> 24) as usize], 1);
        assert_eq!(h.iter().sum::<u32>(), 1);
        // loose: zero iterations store gid ^ seed.
        assert_eq!(loose_reference(5, 0, 3, &[0; 256]), 6);
        // inplace: two steps of the LCG.
        assert_eq!(inplace_reference(9, 2), lcg_step(lcg_step(9)));
        assert!(!all().iter().any(|w| w.name == "long_inplace"));
    }
}
