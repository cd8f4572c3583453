//! The fuzz harness (docs/fuzzing.md): any bytes through [`crate::parse_image`], every entry's
//! PTX decompressed and the choice made; checks the invariants that hold for hostile input.

use crate::{
    Compression, Entry, EntryKind, Image, Limits, PtxIsa, choose_ptx, parse_image, ptx_text,
};

/// Runs one input. Panics only when an invariant breaks (never on a refused input).
pub fn run(data: &[u8]) {
    let Ok(image) = parse_image(data) else { return };
    match image {
        Image::Fatbin(fb) => {
            assert!(fb.len <= data.len(), "fat binary longer than its bytes");
            let mut end = usize::from(fb.header.header_size);
            for e in &fb.entries {
                assert_eq!(e.offset, end, "entries must be contiguous");
                end = e.offset + e.header_size as usize + e.payload.len();
                check_entry(e);
            }
            assert_eq!(end, fb.len, "entries must fill the fat binary exactly");
            for max_arch in [75, 80, 90, u32::MAX] {
                let limits = Limits {
                    max_arch,
                    max_isa: PtxIsa::new(9, 0),
                };
                if let Ok(c) = choose_ptx(&fb, limits) {
                    assert!(c.arch <= max_arch && c.isa <= limits.max_isa);
                    assert!(fb.entries.iter().all(|e| e.kind != EntryKind::Ptx
                        || e.arch > max_arch
                        || e.isa > limits.max_isa
                        || (e.arch, e.isa) <= (c.arch, c.isa)));
                }
            }
        }
        Image::Wrapper(w) => assert!((1..=2).contains(&w.version)),
        Image::Ptx(text) => assert!(!text.contains('\0')),
    }
}

fn check_entry(e: &Entry<'_>) {
    if let Ok(text) = ptx_text(e) {
        assert!(!text.contains('\0'));
        let bound = match e.compression() {
            Ok(Compression::None) => e.payload.len() as u64,
            _ => e.uncompressed_size,
        };
        assert!(
            text.len() as u64 <= bound,
            "PTX text beyond its declared size"
        );
    }
}

#[cfg(test)]
mod tests {
    /// A deterministic xorshift generator's inputs through the harness (the CI check of
    /// docs/fuzzing.md): mostly a valid fat binary with bytes flipped, so parsing gets deep.
    #[test]
    fn harness_survives_mutations_of_a_real_fatbin() {
        let base: &[u8] = include_bytes!("../tests/fixtures/zstd.fatbin");
        let lz4: &[u8] = include_bytes!("../tests/fixtures/lz4.fatbin");
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..600 {
            let mut d = if i % 2 == 0 {
                base.to_vec()
            } else {
                lz4.to_vec()
            };
            for _ in 0..(next() % 8) {
                let at = (next() as usize) % d.len();
                d[at] = next() as u8;
            }
            if i % 5 == 0 {
                let cut = (next() as usize) % d.len();
                d.truncate(cut);
            }
            super::run(&d);
        }
        super::run(base);
    }
}
