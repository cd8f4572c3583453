//! Fuzz harness of the snapshot state-file decoder (`fuzz/fuzz_targets/snapshot.rs`): any
//! bytes must decode or be refused with an error, never panic; what decodes must encode back
//! to the same bytes (the format has one encoding per state). Each input is tried as is and
//! with its sections' checksums made valid, so that mutations get past the CRC.

use super::state::MachineState;

/// Decodes `data` as a state file, then again with every section's checksum made valid
/// (so that mutations reach the section decoders instead of stopping at the CRC).
pub fn run(data: &[u8]) {
    check(data);
    if let Some(fixed) = with_valid_checksums(data) {
        check(&fixed);
    }
}

fn check(data: &[u8]) {
    if let Ok(state) = MachineState::decode(data) {
        assert_eq!(
            state.encode(),
            data,
            "a decoded state re-encodes differently"
        );
    }
}

/// `data` with each section's CRC-32 recomputed, as far as its lengths hold.
fn with_valid_checksums(data: &[u8]) -> Option<Vec<u8>> {
    let head = snapfmt::HEADER;
    let mut out = data.get(..head)?.to_vec();
    let mut at = head;
    while at + 16 <= data.len() {
        let len = u64::from_le_bytes(data[at + 8..at + 16].try_into().ok()?);
        let end = (at + 16).checked_add(usize::try_from(len).ok()?)?;
        let body = data.get(at..end)?;
        let mut h = crc32fast::Hasher::new();
        h.update(body);
        out.extend_from_slice(body);
        out.extend_from_slice(&h.finalize().to_le_bytes());
        at = end + 4;
    }
    Some(out)
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
        // A flipped payload byte with its checksum made valid again reaches the decoders:
        // the file decodes (a register changed) where the raw one is refused.
        let mut g = good.clone();
        g[12 + 16 + 5] ^= 1; // inside the VM section's first irqchip
        assert!(MachineState::decode(&g).is_err());
        let fixed = with_valid_checksums(&g).unwrap();
        assert!(MachineState::decode(&fixed).is_ok());
        assert_eq!(with_valid_checksums(&good).unwrap(), good);
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
