//! Fuzz harness of the snapshot state-file decoder (`fuzz/fuzz_targets/snapshot.rs`): any
//! bytes must decode or be refused with an error, never panic; what decodes must encode back
//! to the same bytes (the format has one encoding per state).

use super::state::MachineState;

/// Decodes `data` as a state file.
pub fn run(data: &[u8]) {
    if let Ok(state) = MachineState::decode(data) {
        assert_eq!(
            state.encode(),
            data,
            "a decoded state re-encodes differently"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::state::tests::sample;

    /// Deterministic inputs through the harness: random bytes, and a valid file with bytes
    /// flipped and truncated (most of which must be refused, the valid one must decode).
    #[test]
    fn harness_runs_and_reaches_the_decoder() {
        let good = sample().encode();
        assert!(
            MachineState::decode(&good).is_ok(),
            "the crafted input decodes"
        );
        run(&good);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..300 {
            let len = (next() % 256) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            run(&bytes);
            let mut g = good.clone();
            let i = (next() as usize) % g.len();
            g[i] ^= 1 << (next() % 8);
            run(&g);
            run(&good[..(next() as usize) % good.len()]);
        }
    }
}
