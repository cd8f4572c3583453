//! lcg_spin: a compute-bound kernel of chosen length (`iters` steps of a dependent 32-bit linear
//! congruential recurrence per thread) whose result is exact and cheap to check: the load
//! generator of the fairness experiment (the `fairness` guest). Not one of [`crate::all`]'s
//! workloads, whose sizes are fixed; [`instance`] builds one for any length.
//!
//! Thread `gid` computes `x = gid ^ seed`, then `iters` times `x = x * A + C (mod 2^32)`, and
//! stores `x` to `out[gid]` (u32). [`reference`] is that loop; [`Jump`] is the same map composed
//! `iters` times (O(log iters) once, then one multiply-add per thread), for checking big grids.

use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Size, u32_bytes};

/// PTX module text (`suite/kernels/lcg_spin.ptx`).
pub const PTX: &str = include_str!("../kernels/lcg_spin.ptx");
/// Entry point. Parameters: out (u64 global address of u32[grid * block]), iters (u32), seed
/// (u32).
pub const ENTRY: &str = "lcg_spin";
/// Multiplier of the recurrence (Numerical Recipes' LCG).
pub const A: u32 = 1_664_525;
/// Increment of the recurrence.
pub const C: u32 = 1_013_904_223;
/// Thread-instructions per loop iteration (mad, add, setp, bra).
pub const INSTRS_PER_ITER: u64 = 4;

/// Start value of thread `gid` for `seed`.
pub const fn start(gid: u32, seed: u32) -> u32 {
    gid ^ seed
}

/// What thread `gid` stores, computed step by step (`iters` multiply-adds).
pub fn reference(gid: u32, iters: u32, seed: u32) -> u32 {
    let mut x = start(gid, seed);
    for _ in 0..iters {
        x = x.wrapping_mul(A).wrapping_add(C);
    }
    x
}

/// The recurrence applied `iters` times, as one affine map `x -> x * mul + add (mod 2^32)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Jump {
    pub mul: u32,
    pub add: u32,
}

impl Jump {
    /// The map of `iters` steps, by repeated squaring.
    pub fn new(iters: u32) -> Self {
        // (m1, a1) after (m2, a2): x -> (x * m2 + a2) * m1 + a1.
        let compose = |f: Jump, g: Jump| Jump {
            mul: g.mul.wrapping_mul(f.mul),
            add: g.add.wrapping_mul(f.mul).wrapping_add(f.add),
        };
        let mut acc = Jump { mul: 1, add: 0 };
        let mut pow = Jump { mul: A, add: C };
        let mut n = iters;
        while n != 0 {
            if n & 1 != 0 {
                acc = compose(pow, acc);
            }
            pow = compose(pow, pow);
            n >>= 1;
        }
        acc
    }

    /// What thread `gid` stores for `seed`.
    pub fn value(self, gid: u32, seed: u32) -> u32 {
        start(gid, seed)
            .wrapping_mul(self.mul)
            .wrapping_add(self.add)
    }
}

/// An instance: `ctas` CTAs of `threads` threads (0 counts as 1; `threads` capped at 1024),
/// each thread `iters` steps from `gid ^ seed`; the output is checked exactly.
pub fn instance(iters: u32, ctas: u32, threads: u32, seed: u32) -> Instance {
    let (ctas, threads) = (ctas.max(1), threads.clamp(1, 1024));
    let count = ctas.saturating_mul(threads);
    let jump = Jump::new(iters);
    let expected: Vec<u32> = (0..count).map(|g| jump.value(g, seed)).collect();
    Instance {
        workload: "lcg_spin",
        size: Size::Small,
        ptx: PTX,
        buffers: vec![Buffer::exact_out("out", Elem::U32, u32_bytes(&expected))],
        launches: vec![Launch::linear(
            ENTRY,
            ctas,
            threads,
            vec![Param::Buffer(0), Param::U32(iters), Param::U32(seed)],
        )],
        approx_thread_instrs: u64::from(count) * (12 + INSTRS_PER_ITER * u64::from(iters)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_equals_the_step_by_step_recurrence() {
        for iters in [0, 1, 2, 3, 7, 64, 1000, 4097, 100_000] {
            let j = Jump::new(iters);
            for (gid, seed) in [(0, 0), (1, 5), (31, 0xdead_beef), (4095, 1 << 31)] {
                assert_eq!(
                    j.value(gid, seed),
                    reference(gid, iters, seed),
                    "{iters} {gid}"
                );
            }
        }
        assert_eq!(Jump::new(0), Jump { mul: 1, add: 0 });
        assert_eq!(reference(0, 1, 0), C);
    }

    #[test]
    fn instance_is_valid_and_exact() {
        let inst = instance(10, 2, 32, 7);
        inst.validate().unwrap();
        let out = inst.reference_outputs();
        assert_eq!(out[0].len(), 64 * 4);
        let v63 = u32::from_le_bytes(out[0][63 * 4..].try_into().unwrap());
        assert_eq!(v63, reference(63, 10, 7));
        assert!(inst.check(&[&out[0]]).is_ok());
        let mut bad = out[0].clone();
        bad[0] ^= 1;
        assert!(inst.check(&[&bad]).is_err());
    }
}
