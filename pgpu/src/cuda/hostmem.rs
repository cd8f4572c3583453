//! Host regions of the cuda engine (guest RAM the GPU may map).
//!
//! - `alloc_host_region`: 2 MiB chunks of host memory from `cuMemCreate` with location
//!   `HOST_NUMA` (node 0), mapped once into a private VA reservation with read-write access for
//!   the device and the host: the CPU uses that private VA as the region's pointer, and address
//!   spaces map the same chunks at guest VAs like VRAM chunks. Needs a driver that supports
//!   host-located `cuMemCreate` (CUDA 12.2+); otherwise the call fails with the driver's error.
//! - `register_host_region`: `cuMemHostRegister` (pinned, device-mapped). CUDA cannot map such
//!   memory at a chosen GPU VA, so a mapping that targets it is refused
//!   (`EngineError::BadHostRegion`); it is usable only as a pinned source/destination of copies
//!   done by the hypervisor itself. Guest RAM that guest kernels must reach has to come from
//!   `alloc_host_region`.

use std::ptr::NonNull;

use super::sys;

use super::driver::{DrvError, ck, sync_legacy};
use super::vmm::{self, CHUNK, Handle, Loc};

/// One host region.
#[derive(Debug)]
pub enum HostRegion {
    /// Engine-allocated, mappable at any VA.
    Allocated {
        chunks: Vec<Handle>,
        /// Private VA of the region (also the CPU's pointer).
        base: u64,
        /// Bytes reserved at `base`.
        len: u64,
        /// Chunks mapped at `base` so far.
        mapped: u64,
    },
    /// Registered caller memory (pinned), not mappable at a chosen VA.
    Registered { base: *mut u8, len: u64 },
}

// SAFETY: the raw pointer is only handed to the driver (unregister); the memory is the caller's.
unsafe impl Send for HostRegion {}
// SAFETY: no interior mutability; shared (`Arc`, two engines after a move) only for reads of
// its handles and range, the pointer used by the driver call of the last owner's drop.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// Allocates `len` bytes (a multiple of 2 MiB), zeroed.
    pub fn allocate(device: i32, len: u64) -> Result<(HostRegion, NonNull<u8>), DrvError> {
        let base = vmm::reserve(len, 0)?;
        let mut r = HostRegion::Allocated {
            chunks: Vec::new(),
            base,
            len,
            mapped: 0,
        };
        if let HostRegion::Allocated { chunks, mapped, .. } = &mut r {
            for i in 0..len / CHUNK {
                let h = vmm::create(Loc::HostNuma(0))?;
                chunks.push(h);
                vmm::map(base + i * CHUNK, h)?;
                *mapped += 1;
            }
        }
        vmm::set_access(base, len, &[Loc::Device(device), Loc::HostNuma(0)], true)?;
        // cuMemsetD8 refuses host-located VMM memory (CUDA_ERROR_INVALID_VALUE, measured on
        // H200/driver 580): zero it with synchronous copies from a zero buffer instead.
        let zero = vec![0u8; CHUNK as usize];
        for i in 0..len / CHUNK {
            // SAFETY: the chunk is mapped read-write for the device; the source is `zero`.
            ck("cuMemcpyHtoD", unsafe {
                sys::cuMemcpyHtoD_v2(base + i * CHUNK, zero.as_ptr().cast(), zero.len())
            })?;
        }
        sync_legacy()?;
        let ptr = NonNull::new(base as *mut u8).ok_or(DrvError {
            call: "cuMemAddressReserve",
            code: sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        })?;
        Ok((r, ptr))
    }

    /// Registers caller memory (pinned, device-mapped).
    ///
    /// # Safety
    /// `base..base+len` must be valid memory that outlives the registration.
    pub unsafe fn register(base: *mut u8, len: usize) -> Result<HostRegion, DrvError> {
        // SAFETY: the caller guarantees the range is valid memory.
        ck("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(base.cast(), len, sys::CU_MEMHOSTREGISTER_DEVICEMAP)
        })?;
        Ok(HostRegion::Registered {
            base,
            len: len as u64,
        })
    }

    /// The private VA range of an engine-allocated region (its CPU address), else `None`.
    pub fn private_range(&self) -> Option<(u64, u64)> {
        match self {
            HostRegion::Allocated { base, len, .. } => Some((*base, *len)),
            HostRegion::Registered { .. } => None,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            HostRegion::Allocated { len, .. } | HostRegion::Registered { len, .. } => *len,
        }
    }

    /// The chunk at `offset` (a multiple of 2 MiB), if the region is mappable.
    pub fn chunk(&self, offset: u64) -> Option<Handle> {
        match self {
            HostRegion::Allocated { chunks, .. } => chunks.get((offset / CHUNK) as usize).copied(),
            HostRegion::Registered { .. } => None,
        }
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        match self {
            HostRegion::Allocated {
                chunks,
                base,
                len,
                mapped,
            } => {
                for i in 0..*mapped {
                    let _ = vmm::unmap(*base + i * CHUNK, CHUNK);
                }
                vmm::free(*base, *len);
                for &h in chunks.iter() {
                    vmm::release(h);
                }
            }
            HostRegion::Registered { base, .. } => {
                // SAFETY: the range was registered by `register`.
                let _ = unsafe { sys::cuMemHostUnregister(base.cast()) };
            }
        }
    }
}
