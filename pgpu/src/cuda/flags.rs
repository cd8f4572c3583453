//! The cuda engine's flag words for write-set validation (`ptx::ckpt::bounds`,
//! `EngineSnapshot::alloc_flag`): one 4 KiB `cuMemAlloc` buffer of 32-bit words, made on first
//! use and zeroed, outside every address space's reservation (kernels of every space reach it
//! at its CUDA VA, as they reach the checkpoint method's buffers, `ckmem`). A take copies the
//! word to the host and clears it (synchronous calls on the legacy stream, after the jobs that
//! may store to it ended). A `cuMemsetD8` on device memory returns before it runs and job
//! streams do not wait for the legacy stream, so every clear waits for it (`sync_legacy`):
//! a late clear would erase a store of the next kernel.

use std::sync::Mutex;

use super::driver::{Ctx, DrvError, ck, sync_legacy};
use super::sys;

/// Flag words of the buffer.
const WORDS: usize = 1024;

#[derive(Debug, Default)]
struct State {
    /// Device address of the buffer (0: not allocated yet).
    ptr: u64,
    used: Vec<bool>,
}

/// The buffer and which words are handed out.
#[derive(Debug)]
pub struct Flags {
    ctx: Ctx,
    state: Mutex<State>,
}

impl Flags {
    pub fn new(ctx: Ctx) -> Self {
        Flags {
            ctx,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh zeroed word's device address, or `None` when all are in use.
    pub fn alloc(&self) -> Result<Option<u64>, DrvError> {
        let mut st = self.lock();
        self.ctx.bind()?;
        if st.ptr == 0 {
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: out-pointer to a local; 4 KiB.
            ck("cuMemAlloc_v2", unsafe {
                sys::cuMemAlloc_v2(&mut ptr, WORDS * 4)
            })?;
            // SAFETY: the allocation just made.
            if let Err(e) = ck("cuMemsetD8_v2", unsafe {
                sys::cuMemsetD8_v2(ptr, 0, WORDS * 4)
            })
            .and_then(|_| sync_legacy())
            {
                // SAFETY: allocated above, freed once.
                unsafe { sys::cuMemFree_v2(ptr) };
                return Err(e);
            }
            st.ptr = ptr;
            st.used = vec![false; WORDS];
        }
        let Some(i) = st.used.iter().position(|u| !u) else {
            return Ok(None);
        };
        let va = st.ptr + 4 * i as u64;
        // SAFETY: word `i` of the buffer.
        ck("cuMemsetD8_v2", unsafe { sys::cuMemsetD8_v2(va, 0, 4) })?;
        sync_legacy()?;
        st.used[i] = true;
        Ok(Some(va))
    }

    /// Word index of `va` if it is handed out.
    fn index(st: &State, va: u64) -> Option<usize> {
        let i = usize::try_from(va.checked_sub(st.ptr)? / 4).ok()?;
        (st.ptr != 0 && va.is_multiple_of(4) && st.used.get(i).copied().unwrap_or(false))
            .then_some(i)
    }

    /// Reads and clears the word at `va`; `Ok(None)` if it is not a handed-out word.
    pub fn take(&self, va: u64) -> Result<Option<bool>, DrvError> {
        let st = self.lock();
        if Self::index(&st, va).is_none() {
            return Ok(None);
        }
        self.ctx.bind()?;
        let mut w = [0u8; 4];
        // SAFETY: `va` is a word of our buffer; the destination is `w`.
        ck("cuMemcpyDtoH_v2", unsafe {
            sys::cuMemcpyDtoH_v2(w.as_mut_ptr().cast(), va, 4)
        })?;
        if w == [0; 4] {
            return Ok(Some(false));
        }
        // SAFETY: as above.
        ck("cuMemsetD8_v2", unsafe { sys::cuMemsetD8_v2(va, 0, 4) })?;
        sync_legacy()?;
        Ok(Some(true))
    }

    /// Gives the word at `va` back.
    pub fn free(&self, va: u64) {
        let mut st = self.lock();
        if let Some(i) = Self::index(&st, va) {
            st.used[i] = false;
        }
    }
}

impl Drop for Flags {
    fn drop(&mut self) {
        let ptr = self.state.get_mut().map(|s| s.ptr).unwrap_or(0);
        if ptr != 0 && self.ctx.bind().is_ok() {
            // SAFETY: our allocation, freed once.
            unsafe { sys::cuMemFree_v2(ptr) };
        }
    }
}
