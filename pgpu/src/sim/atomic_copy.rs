//! Byte copies into and out of GPU-visible memory with relaxed atomic accesses.
//!
//! Kernels run on worker threads and touch VRAM and registered guest RAM only through atomic
//! operations (the `ptx` interpreter's contract), so every other access the engine makes to that
//! memory (copy engine, host copies, hypervisor VRAM access) is atomic too: racing a kernel is then
//! a defined (if unordered) interleaving, as on hardware. Eight bytes at a time when the GPU
//! addresses allow it, single bytes otherwise.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

const W: usize = 8;

/// # Safety
/// `p` must be valid for reads and writes of one byte and accessed concurrently only atomically.
unsafe fn byte<'a>(p: *mut u8) -> &'a AtomicU8 {
    // SAFETY: forwarded to the caller.
    unsafe { AtomicU8::from_ptr(p) }
}

/// # Safety
/// `p` must be 8-aligned, valid for reads and writes of 8 bytes, accessed concurrently only
/// atomically.
unsafe fn word<'a>(p: *mut u8) -> &'a AtomicU64 {
    // SAFETY: forwarded to the caller (alignment included).
    unsafe { AtomicU64::from_ptr(p.cast()) }
}

/// Copies `buf.len()` bytes of GPU memory at `src` into `buf`.
///
/// # Safety
/// `src..src+buf.len()` must be valid for reads and writes and accessed concurrently only
/// through atomics.
pub unsafe fn load(src: *mut u8, buf: &mut [u8]) {
    let len = buf.len();
    let mut i = 0;
    let head = (src as usize).wrapping_neg() % W;
    // SAFETY: every pointer stays inside `src..src+len` per the loop bounds, and word accesses
    // are 8-aligned because the `head` bytes were done one by one first; the caller vouches for
    // validity and atomic-only sharing.
    unsafe {
        while i < len && i < head {
            buf[i] = byte(src.add(i)).load(Ordering::Relaxed);
            i += 1;
        }
        while i + W <= len {
            let v = word(src.add(i)).load(Ordering::Relaxed);
            buf[i..i + W].copy_from_slice(&v.to_ne_bytes());
            i += W;
        }
        while i < len {
            buf[i] = byte(src.add(i)).load(Ordering::Relaxed);
            i += 1;
        }
    }
}

/// Copies `data` into GPU memory at `dst`.
///
/// # Safety
/// `dst..dst+data.len()` must be valid for reads and writes and accessed concurrently only
/// through atomics.
pub unsafe fn store(data: &[u8], dst: *mut u8) {
    let len = data.len();
    let mut i = 0;
    let head = (dst as usize).wrapping_neg() % W;
    // SAFETY: as in `load`, for `dst`.
    unsafe {
        while i < len && i < head {
            byte(dst.add(i)).store(data[i], Ordering::Relaxed);
            i += 1;
        }
        while i + W <= len {
            let mut b = [0u8; W];
            b.copy_from_slice(&data[i..i + W]);
            word(dst.add(i)).store(u64::from_ne_bytes(b), Ordering::Relaxed);
            i += W;
        }
        while i < len {
            byte(dst.add(i)).store(data[i], Ordering::Relaxed);
            i += 1;
        }
    }
}

/// Copies `len` bytes of GPU memory from `src` to `dst`, forward (overlapping ranges give the
/// result of a forward copy in 8-byte or 1-byte units, never undefined behaviour).
///
/// # Safety
/// Both ranges must be valid for reads and writes and accessed concurrently only through atomics.
pub unsafe fn copy(src: *mut u8, dst: *mut u8, len: usize) {
    let mut i = 0;
    // SAFETY: pointers stay inside their ranges per the loop bounds; words are used only when
    // both addresses are 8-aligned at `i`; the caller vouches for validity and atomic-only
    // sharing.
    unsafe {
        if (src as usize) % W == (dst as usize) % W {
            let head = (src as usize).wrapping_neg() % W;
            while i < len && i < head {
                let v = byte(src.add(i)).load(Ordering::Relaxed);
                byte(dst.add(i)).store(v, Ordering::Relaxed);
                i += 1;
            }
            while i + W <= len {
                let v = word(src.add(i)).load(Ordering::Relaxed);
                word(dst.add(i)).store(v, Ordering::Relaxed);
                i += W;
            }
        }
        while i < len {
            let v = byte(src.add(i)).load(Ordering::Relaxed);
            byte(dst.add(i)).store(v, Ordering::Relaxed);
            i += 1;
        }
    }
}

/// Fills `len` bytes at `dst` with `value`.
///
/// # Safety
/// As for [`store`].
pub unsafe fn fill(dst: *mut u8, len: usize, value: u8) {
    let chunk = [value; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len());
        // SAFETY: `dst+done..dst+done+n` is inside the caller's range.
        unsafe { store(&chunk[..n], dst.add(done)) };
        done += n;
    }
}

/// Whether the `words` 8-byte words at `src` are all zero (relaxed atomic loads, read in
/// place: nothing is copied).
///
/// # Safety
/// `src` must be 8-aligned, `src..src+8*words` valid for reads and accessed concurrently only
/// through atomics.
pub unsafe fn words_zero(src: *mut u8, words: usize) -> bool {
    let mut acc = 0u64;
    // SAFETY: every word lies inside the caller's 8-aligned range.
    unsafe {
        for i in 0..words {
            acc |= word(src.add(i * W)).load(Ordering::Relaxed);
        }
    }
    acc == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_at_every_alignment() {
        for so in 0..9 {
            for d_o in 0..9 {
                for len in [0usize, 1, 7, 8, 9, 31] {
                    let mut src: Vec<u8> = (0..64u8).collect();
                    let mut dst = vec![0u8; 64];
                    // SAFETY: both buffers are 64 bytes, offsets + len <= 40; no other thread.
                    unsafe { copy(src.as_mut_ptr().add(so), dst.as_mut_ptr().add(d_o), len) };
                    assert_eq!(&dst[d_o..d_o + len], &src[so..so + len]);
                    assert!(dst[..d_o].iter().all(|&b| b == 0));
                    assert!(dst[d_o + len..].iter().all(|&b| b == 0));
                    let mut out = vec![0u8; len];
                    // SAFETY: as above.
                    unsafe { load(src.as_mut_ptr().add(so), &mut out) };
                    assert_eq!(&out[..], &src[so..so + len]);
                    let mut dst2 = vec![0u8; 64];
                    // SAFETY: as above.
                    unsafe { store(&out, dst2.as_mut_ptr().add(d_o)) };
                    assert_eq!(&dst2[d_o..d_o + len], &out[..]);
                    assert!(dst2[d_o + len..].iter().all(|&b| b == 0));
                }
            }
        }
        let mut b = vec![1u8; 9000];
        // SAFETY: inside the buffer.
        unsafe { fill(b.as_mut_ptr().add(3), 8990, 7) };
        assert_eq!(b[2], 1);
        assert!(b[3..8993].iter().all(|&x| x == 7));
        assert_eq!(b[8993], 1);
    }
}
