//! CUDA virtual memory management primitives: 2 MiB physical chunks (`cuMemCreate` on the device
//! or on the host), VA reservations, map/unmap and access rights.

use super::sys;

use super::driver::{DrvError, ck};

/// The chunk (page) size of the cuda engine.
pub const CHUNK: u64 = 2 << 20;

/// A physical allocation handle.
pub type Handle = sys::CUmemGenericAllocationHandle;

/// Where a chunk lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// Device memory of this device.
    Device(i32),
    /// Host memory on this NUMA node.
    HostNuma(i32),
}

fn location(loc: Loc) -> sys::CUmemLocation {
    use sys::CUmemLocationType::*;
    let (type_, id) = match loc {
        Loc::Device(d) => (CU_MEM_LOCATION_TYPE_DEVICE, d),
        Loc::HostNuma(n) => (CU_MEM_LOCATION_TYPE_HOST_NUMA, n),
    };
    sys::CUmemLocation { type_, id }
}

fn prop(loc: Loc) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is valid (plain integers and a null pointer).
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location = location(loc);
    p
}

/// The minimum mapping granularity for chunks at `loc`.
pub fn granularity(loc: Loc) -> Result<u64, DrvError> {
    let p = prop(loc);
    let mut g = 0usize;
    // SAFETY: pointers to locals.
    ck("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &p,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(g as u64)
}

/// Creates one 2 MiB physical chunk.
pub fn create(loc: Loc) -> Result<Handle, DrvError> {
    let p = prop(loc);
    let mut h: Handle = 0;
    // SAFETY: pointers to locals.
    ck("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut h, CHUNK as usize, &p, 0)
    })?;
    Ok(h)
}

/// Releases a chunk (its memory goes when its last mapping does).
pub fn release(h: Handle) {
    // SAFETY: `h` came from `create` and is released once.
    let _ = unsafe { sys::cuMemRelease(h) };
}

/// Reserves `size` bytes of VA at `addr` (0: anywhere), aligned to 2 MiB. Returns what the
/// driver gave, which for a non-zero `addr` may differ (the address is a hint).
pub fn reserve(size: u64, addr: u64) -> Result<u64, DrvError> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: pointer to a local.
    ck("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut p, size as usize, CHUNK as usize, addr, 0)
    })?;
    Ok(p)
}

/// Frees a reservation (nothing may be mapped in it).
pub fn free(addr: u64, size: u64) {
    // SAFETY: the range came from `reserve`.
    let _ = unsafe { sys::cuMemAddressFree(addr, size as usize) };
}

/// Maps chunk `h` at `va` (2 MiB).
pub fn map(va: u64, h: Handle) -> Result<(), DrvError> {
    // SAFETY: `va` lies in a reservation of ours and is free; `h` is a live chunk.
    ck("cuMemMap", unsafe {
        sys::cuMemMap(va, CHUNK as usize, 0, h, 0)
    })
}

/// Unmaps `len` bytes at `va`.
pub fn unmap(va: u64, len: u64) -> Result<(), DrvError> {
    // SAFETY: the range is mapped by us; no job of ours runs in it (state checks of the caller).
    ck("cuMemUnmap", unsafe { sys::cuMemUnmap(va, len as usize) })
}

/// Grants access to `va..va+len` (already mapped) for each location in `to`.
pub fn set_access(va: u64, len: u64, to: &[Loc], write: bool) -> Result<(), DrvError> {
    let flags = if write {
        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    } else {
        sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ
    };
    let descs: Vec<sys::CUmemAccessDesc> = to
        .iter()
        .map(|&l| sys::CUmemAccessDesc {
            location: location(l),
            flags,
        })
        .collect();
    // SAFETY: the descriptor array lives across the call; the range is mapped.
    ck("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(va, len as usize, descs.as_ptr(), descs.len())
    })
}
