//! Dirty logging of GPU memory for live snapshots and migration (issue 17): which 4 KiB pages of
//! VRAM and of registered host regions (the VM's RAM) the GPU wrote since the last harvest, so
//! that a pre-copy sends them again. The `EngineSnapshot` methods are `dirty_log_start`,
//! `dirty_log_harvest` and `dirty_log_stop`; an engine without a log reports every page dirty
//! on every harvest ([`DirtyLogKind::Everything`]), which is always correct and never cheaper
//! than a stop-and-copy. The sim engine's log is exact (`sim::dirty`).
//!
//! A harvest hands back a bitmap with one bit per 4 KiB page of the requested range (bit `i` of
//! word `i / 64` is the page at `start + i × 4096`), ORed into the caller's words.

use crate::engine::EngineError;

/// Bytes per page of the log.
pub const PAGE: u64 = 4096;

/// What a dirty log can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirtyLogKind {
    /// Exactly the pages written since the previous harvest (at 4 KiB granularity).
    Exact,
    /// Nothing: every harvest reports every page (the engine keeps no log).
    Everything,
}

/// Words of a bitmap over `len` bytes of pages.
pub fn words(len: u64) -> usize {
    len.div_ceil(PAGE).div_ceil(64) as usize
}

/// Checks a harvest request: `start` and `len` page-aligned, `bits` long enough.
pub fn check_request(start: u64, len: u64, bits: &[u64]) -> Result<(), EngineError> {
    if !start.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
        return Err(EngineError::Backend(format!(
            "dirty log: range {start:#x}+{len:#x} is not whole 4 KiB pages"
        )));
    }
    if bits.len() < words(len) {
        return Err(EngineError::Backend(format!(
            "dirty log: {} words for {} pages",
            bits.len(),
            len / PAGE
        )));
    }
    Ok(())
}

/// Sets the bits of the first `len / PAGE` pages (the conservative answer).
pub fn set_all(bits: &mut [u64], len: u64) {
    let pages = len / PAGE;
    for (i, w) in bits.iter_mut().enumerate().take(words(len)) {
        let first = i as u64 * 64;
        let n = (pages - first).min(64);
        *w |= if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    }
}

/// Whether page `p` is set in `bits`.
pub fn is_set(bits: &[u64], p: u64) -> bool {
    bits.get((p / 64) as usize)
        .is_some_and(|w| w >> (p % 64) & 1 == 1)
}

/// Pages set in `bits`.
pub fn count(bits: &[u64]) -> u64 {
    bits.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// Runs `(first page, pages)` of set bits among the first `pages` pages, each at most `max`
/// pages long.
pub fn runs(bits: &[u64], pages: u64, max: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, &w) in bits.iter().enumerate() {
        if w == 0 {
            continue;
        }
        let mut w = w;
        while w != 0 {
            let b = u64::from(w.trailing_zeros());
            w &= w - 1;
            let p = i as u64 * 64 + b;
            if p >= pages {
                return out;
            }
            match out.last_mut() {
                Some((first, n)) if *first + *n == p && *n < max => *n += 1,
                _ => out.push((p, 1)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_helpers() {
        let mut b = vec![0u64; words(130 * PAGE)];
        assert_eq!(b.len(), 3);
        set_all(&mut b, 130 * PAGE);
        assert_eq!(count(&b), 130);
        assert_eq!(b[2], 0b11);
        assert!(is_set(&b, 129) && !is_set(&b, 130));
        assert_eq!(runs(&b, 130, 100), vec![(0, 100), (100, 30)]);
        let b = [0b1011u64, 1 << 63];
        assert_eq!(runs(&b, 128, 256), vec![(0, 2), (3, 1), (127, 1)]);
        assert_eq!(runs(&b, 100, 256), vec![(0, 2), (3, 1)]);
        assert!(check_request(1, PAGE, &[0]).is_err());
        assert!(check_request(0, 65 * PAGE, &[0]).is_err());
        assert!(check_request(PAGE, 64 * PAGE, &[0]).is_ok());
    }
}
