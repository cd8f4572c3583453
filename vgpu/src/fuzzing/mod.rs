//! Fuzz harnesses of the guest-facing decoders of the virtual GPU, shared by the cargo-fuzz
//! targets in `/fuzz` (feature `fuzzing`) and by this crate's tests, which run every harness over
//! a few hundred pseudo-random inputs so that the harnesses cannot rot (docs/fuzzing.md).
//!
//! Each harness takes arbitrary bytes, drives a decoder with them and panics only when an
//! invariant breaks (a panic inside the decoder is a finding as well).

pub mod para;
pub mod pushbuf;
pub mod snapshot;

/// A tiny deterministic generator (xorshift64*) for the tests' pseudo-random inputs.
#[cfg(test)]
pub(crate) fn random_inputs(seed: u64, count: usize, max_len: usize) -> Vec<Vec<u8>> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    (0..count)
        .map(|_| {
            let len = (next() % max_len as u64) as usize;
            (0..len).map(|_| (next() >> 56) as u8).collect()
        })
        .collect()
}
