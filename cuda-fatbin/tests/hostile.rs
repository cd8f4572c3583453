//! Hostile input: random bytes, mutated and truncated real fat binaries, and crafted headers
//! (sizes that lie, decompression bombs) give an error, never a panic or unbounded memory.

use cuda_fatbin::{
    FatbinError, HEADER_PEEK, Limits, MAX_FATBIN_SIZE, PtxIsa, choose_ptx, fatbin_len,
    parse_fatbin, parse_image, ptx_text,
};
use proptest::prelude::*;

const ZSTD: &[u8] = include_bytes!("fixtures/zstd.fatbin");
const LZ4: &[u8] = include_bytes!("fixtures/lz4.fatbin");
const RAW: &[u8] = include_bytes!("fixtures/raw.fatbin");
const MIXED: &[u8] = include_bytes!("fixtures/mixed.fatbin");

/// Offset of the first entry's header in every fixture (after the 16-byte header).
const E0: usize = 16;

fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn first_ptx_error(bytes: &[u8]) -> FatbinError {
    let fb = parse_fatbin(bytes).unwrap();
    ptx_text(&fb.entries[0]).unwrap_err()
}

#[test]
fn a_truncated_fatbin_is_refused_at_every_length() {
    for full in [ZSTD, LZ4, RAW, MIXED] {
        for len in 0..full.len() {
            assert!(parse_fatbin(&full[..len]).is_err(), "length {len}");
        }
    }
}

#[test]
fn a_declared_size_beyond_the_limit_is_refused_before_reading() {
    let mut b = ZSTD.to_vec();
    set_u64(&mut b, 8, MAX_FATBIN_SIZE);
    assert_eq!(
        fatbin_len(&b[..HEADER_PEEK]),
        Err(FatbinError::TooLarge(MAX_FATBIN_SIZE + 16))
    );
    set_u64(&mut b, 8, u64::MAX);
    assert!(matches!(fatbin_len(&b), Err(FatbinError::TooLarge(_))));
}

#[test]
fn entry_sizes_that_lie_are_refused() {
    let mut b = ZSTD.to_vec();
    set_u32(&mut b, E0 + 4, 0);
    assert_eq!(
        parse_fatbin(&b).unwrap_err(),
        FatbinError::EntryHeaderSize {
            offset: E0,
            size: 0
        }
    );
    let mut b = ZSTD.to_vec();
    set_u64(&mut b, E0 + 8, u64::MAX);
    assert!(matches!(
        parse_fatbin(&b),
        Err(FatbinError::EntryPayload { .. })
    ));
}

#[test]
fn decompression_is_bounded_by_the_declared_size() {
    for codec in [ZSTD, LZ4] {
        // A bomb: a declared size over the limit is refused without decompressing.
        let mut b = codec.to_vec();
        set_u64(&mut b, E0 + 56, 1 << 40);
        assert_eq!(
            first_ptx_error(&b),
            FatbinError::PtxTooLarge {
                arch: 80,
                size: 1 << 40
            }
        );
        // Declared shorter than the real text: refused, not truncated silently.
        let mut b = codec.to_vec();
        set_u64(&mut b, E0 + 56, 100);
        assert!(matches!(
            first_ptx_error(&b),
            FatbinError::Decompress { .. } | FatbinError::SizeMismatch { .. }
        ));
        // Declared longer than the real text.
        let mut b = codec.to_vec();
        set_u64(&mut b, E0 + 56, 5000);
        assert!(matches!(
            first_ptx_error(&b),
            FatbinError::Decompress { .. } | FatbinError::SizeMismatch { .. }
        ));
        // Compressed size beyond the payload.
        let mut b = codec.to_vec();
        set_u32(&mut b, E0 + 16, 100_000);
        assert!(matches!(
            first_ptx_error(&b),
            FatbinError::CompressedSize { .. }
        ));
    }
}

#[test]
fn both_compression_flags_are_refused() {
    let mut b = ZSTD.to_vec();
    b[E0 + 41] |= 0x20;
    assert!(matches!(
        first_ptx_error(&b),
        FatbinError::AmbiguousCompression { .. }
    ));
}

fn check_all(bytes: &[u8]) {
    let _ = fatbin_len(bytes);
    if let Ok(cuda_fatbin::Image::Fatbin(fb)) = parse_image(bytes) {
        for e in &fb.entries {
            let _ = ptx_text(e);
        }
        let _ = choose_ptx(
            &fb,
            Limits {
                max_arch: 90,
                max_isa: PtxIsa::new(9, 0),
            },
        )
        .map_err(|e| e.to_string());
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_all(&bytes);
        let mut with_magic = ZSTD[..16].to_vec();
        with_magic.extend_from_slice(&bytes);
        check_all(&with_magic);
    }

    #[test]
    fn mutated_fatbins_never_panic(
        which in 0usize..4,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..12),
        cut in any::<Option<usize>>(),
    ) {
        let mut b = [ZSTD, LZ4, RAW, MIXED][which].to_vec();
        for (at, v) in edits {
            let at = at % b.len();
            b[at] = v;
        }
        if let Some(cut) = cut {
            b.truncate(cut % (b.len() + 1));
        }
        check_all(&b);
    }
}
