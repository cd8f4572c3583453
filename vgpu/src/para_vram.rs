//! The VRAM allocation service of the para-virtual interface (VRAM_ALLOC / VRAM_FREE, as
//! GPUvm's MEM_ALLOC / MEM_FREE): first-fit allocation of 4 KiB-granular, aligned blocks of the
//! VM's guest VRAM. A convenience for para-virtual drivers, not a security boundary: the guest
//! owns its whole partition and page tables may still map any address in it.

use std::collections::BTreeMap;

const GRANULE: u64 = 4096;

/// Most live blocks one VM may hold (bounds the host memory a guest can make this use).
pub const MAX_BLOCKS: usize = 4096;

/// See the module documentation.
#[derive(Debug)]
pub struct VramAllocator {
    size: u64,
    /// Live blocks: start → length.
    blocks: BTreeMap<u64, u64>,
}

impl VramAllocator {
    /// An allocator over guest VRAM `[0, size)`.
    pub fn new(size: u64) -> Self {
        VramAllocator {
            size,
            blocks: BTreeMap::new(),
        }
    }

    /// A block of `len` bytes (rounded up to 4 KiB) aligned to `align` (a power of two ≥ 4 KiB);
    /// `None` if it does not fit or the block limit is reached.
    pub fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        if len == 0
            || !align.is_power_of_two()
            || align < GRANULE
            || self.blocks.len() >= MAX_BLOCKS
        {
            return None;
        }
        let len = len.checked_next_multiple_of(GRANULE)?;
        let mut cursor = 0u64;
        let place = |start: u64, end: u64| -> Option<u64> {
            let a = start.checked_next_multiple_of(align)?;
            (a.checked_add(len)? <= end).then_some(a)
        };
        for (&s, &l) in &self.blocks {
            if let Some(a) = place(cursor, s) {
                self.blocks.insert(a, len);
                return Some(a);
            }
            cursor = s + l;
        }
        let a = place(cursor, self.size)?;
        self.blocks.insert(a, len);
        Some(a)
    }

    /// Frees the block starting at `addr`; `false` if no block starts there.
    pub fn free(&mut self, addr: u64) -> bool {
        self.blocks.remove(&addr).is_some()
    }

    /// The live blocks `(start, length)`, by start (snapshot).
    pub fn blocks(&self) -> Vec<(u64, u64)> {
        self.blocks.iter().map(|(&s, &l)| (s, l)).collect()
    }

    /// An allocator holding a snapshot's `blocks`: each 4 KiB aligned, non-empty, inside
    /// `[0, size)`, sorted and non-overlapping, at most `MAX_BLOCKS`.
    pub fn with_blocks(size: u64, blocks: &[(u64, u64)]) -> Result<Self, String> {
        if blocks.len() > MAX_BLOCKS {
            return Err(format!(
                "{} VRAM blocks (at most {MAX_BLOCKS})",
                blocks.len()
            ));
        }
        let mut a = VramAllocator::new(size);
        let mut end = 0u64;
        for &(s, l) in blocks {
            let ok = s.is_multiple_of(GRANULE)
                && l.is_multiple_of(GRANULE)
                && l > 0
                && s >= end
                && s.checked_add(l).is_some_and(|e| e <= size);
            if !ok {
                return Err(format!(
                    "VRAM block at {s:#x} (+{l:#x}) misaligned, overlapping or outside the \
                     {size:#x}-byte VRAM"
                ));
            }
            end = s + l;
            a.blocks.insert(s, l);
        }
        Ok(a)
    }

    /// Bytes allocated now.
    pub fn used(&self) -> u64 {
        self.blocks.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_aligned_blocks_and_free() {
        let mut a = VramAllocator::new(16 << 20);
        assert_eq!(a.alloc(1, 4096), Some(0), "rounded up to 4 KiB");
        assert_eq!(a.alloc(4096, 2 << 20), Some(2 << 20), "aligned");
        assert_eq!(a.alloc(8192, 4096), Some(4096), "first fit fills the gap");
        assert_eq!(a.used(), 4096 + 4096 + 8192);
        assert!(a.free(4096));
        assert!(!a.free(4096), "double free refused");
        assert!(!a.free(12345), "not a block start");
        assert_eq!(
            a.alloc(14 << 20, 2 << 20),
            None,
            "does not fit above the 2 MiB block"
        );
        assert_eq!(a.alloc(12 << 20, 4 << 20), Some(4 << 20));
        assert_eq!(a.alloc(16 << 20, 4096), None);
    }

    #[test]
    fn hostile_requests_are_refused() {
        let mut a = VramAllocator::new(1 << 20);
        assert_eq!(a.alloc(0, 4096), None);
        assert_eq!(a.alloc(4096, 3000), None);
        assert_eq!(a.alloc(4096, 1024), None);
        assert_eq!(a.alloc(u64::MAX, 4096), None);
        let mut big = VramAllocator::new(1 << 40);
        for _ in 0..MAX_BLOCKS {
            assert!(big.alloc(4096, 4096).is_some());
        }
        assert_eq!(big.alloc(4096, 4096), None, "block limit");
    }
}
