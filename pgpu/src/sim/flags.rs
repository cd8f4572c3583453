//! The sim engine's flag words for write-set validation (`ptx::ckpt::bounds`,
//! `EngineSnapshot::alloc_flag`): one page of engine-owned 32-bit words at [`FLAG_BASE`],
//! outside any VA window (the page tables translate it before refusing an address outside
//! their window, so it costs the in-window path nothing), below the checkpoint method's own
//! memory (`sim::ckpt::CK_BASE`). Each word belongs to one address space, and only kernels of
//! that space reach it (4 bytes; every other address of the page faults as before), so a
//! guest can neither raise nor clear another's. A word is allocated zeroed, read and cleared
//! between jobs, and freed for reuse.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::sync::lock;

/// VA of the flag page in every address space.
pub const FLAG_BASE: u64 = 0xFFFF_E000_0000_0000;
/// Flag words (one 4 KiB page of `u32`).
pub const FLAG_WORDS: usize = 1024;

/// The page and which words are handed out.
#[derive(Debug)]
pub struct FlagPage {
    /// 8-byte aligned storage (the interpreter requires host pointers ≡ VA mod 8).
    words: Box<[AtomicU64]>,
    /// The space (`SpaceId.0`) each word belongs to, if handed out.
    used: Mutex<Vec<Option<u64>>>,
}

impl Default for FlagPage {
    fn default() -> Self {
        FlagPage {
            words: (0..FLAG_WORDS / 2).map(|_| AtomicU64::new(0)).collect(),
            used: Mutex::new(vec![None; FLAG_WORDS]),
        }
    }
}

impl FlagPage {
    fn word(&self, va: u64) -> Option<&AtomicU32> {
        let i = usize::try_from(va.checked_sub(FLAG_BASE)? / 4).ok()?;
        if i >= FLAG_WORDS || !va.is_multiple_of(4) {
            return None;
        }
        // SAFETY: the storage is `FLAG_WORDS * 4` bytes of atomics, 8-byte aligned; word `i`
        // lies inside it and is 4-byte aligned, and AtomicU32 has the layout of u32 with
        // interior mutability (the kernels' plain stores land in it between our accesses).
        Some(unsafe { &*(self.words.as_ptr().cast::<AtomicU32>().add(i)) })
    }

    /// A fresh zeroed word of `space`: its VA, or `None` when all are in use.
    pub fn alloc(&self, space: u64) -> Option<u64> {
        let mut used = lock(&self.used);
        let i = used.iter().position(Option::is_none)?;
        used[i] = Some(space);
        let va = FLAG_BASE + 4 * i as u64;
        self.word(va)?.store(0, Ordering::SeqCst);
        Some(va)
    }

    /// Reads and clears the word at `va`; `None` if it is not an allocated word.
    pub fn take(&self, va: u64) -> Option<bool> {
        let i = usize::try_from(va.checked_sub(FLAG_BASE)? / 4).ok()?;
        lock(&self.used).get(i).copied().flatten()?;
        Some(self.word(va)?.swap(0, Ordering::SeqCst) != 0)
    }

    /// Gives the word at `va` back.
    pub fn free(&self, va: u64) {
        if let Some(i) = va
            .checked_sub(FLAG_BASE)
            .and_then(|o| usize::try_from(o / 4).ok())
            && let Some(u) = lock(&self.used).get_mut(i)
        {
            *u = None;
        }
    }

    /// For a kernel of `space`: the host address of `va` and the bytes to its word's end, if
    /// `va` is in a word of `space`.
    pub fn span(&self, va: u64, space: u64) -> Option<(usize, usize)> {
        let off = va.checked_sub(FLAG_BASE)?;
        let i = usize::try_from(off / 4).ok()?;
        if i >= FLAG_WORDS || lock(&self.used).get(i).copied().flatten() != Some(space) {
            return None;
        }
        Some((
            self.words.as_ptr() as usize + off as usize,
            (4 - off % 4) as usize,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_handed_out_taken_and_reused() {
        let f = FlagPage::default();
        let a = f.alloc(7).unwrap();
        let b = f.alloc(8).unwrap();
        assert_eq!((a, b), (FLAG_BASE, FLAG_BASE + 4));
        assert_eq!(f.take(a), Some(false));
        // Only the owner's kernels reach a word, 4 bytes of it.
        assert!(f.span(b, 7).is_none());
        assert!(f.span(FLAG_BASE + 12, 8).is_none(), "not handed out");
        assert_eq!(f.span(b + 2, 8).unwrap().1, 2);
        let (host, len) = f.span(b, 8).unwrap();
        assert_eq!(len, 4);
        // SAFETY: `host` is word b of the page (what a kernel's store does).
        unsafe { (host as *mut u32).write_volatile(1) };
        assert_eq!(f.take(b), Some(true));
        assert_eq!(f.take(b), Some(false));
        assert_eq!(f.take(FLAG_BASE + 8), None, "not allocated");
        f.free(a);
        assert!(f.span(a, 7).is_none(), "freed");
        assert_eq!(f.alloc(9), Some(a));
        assert!(f.span(FLAG_BASE + 4096, 9).is_none());
        for _ in 2..FLAG_WORDS {
            assert!(f.alloc(1).is_some());
        }
        assert_eq!(f.alloc(1), None);
    }
}
