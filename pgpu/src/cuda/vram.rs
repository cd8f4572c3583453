//! Physical VRAM of the cuda engine: `vram_size / 2 MiB` chunks created eagerly with
//! `cuMemCreate` (zeroed), and mapped once into a hypervisor-private VA reservation so that the
//! hypervisor's own accesses (`vram_read/write/fill`) are plain `cuMemcpy`/`cuMemset` at
//! `private_base + pa`. Address spaces map the same chunks at guest VAs.

use super::sys;

use super::driver::{DrvError, ck, sync_legacy};
use super::vmm::{self, CHUNK, Handle, Loc};

/// The VRAM chunks and their private mapping.
#[derive(Debug)]
pub struct Vram {
    chunks: Vec<Handle>,
    base: u64,
    size: u64,
}

impl Vram {
    /// Creates `size` bytes (a multiple of 2 MiB) of VRAM on `device`, zeroed.
    pub fn new(device: i32, size: u64) -> Result<Vram, DrvError> {
        let mut v = Vram {
            chunks: Vec::new(),
            base: 0,
            size: 0,
        };
        v.base = vmm::reserve(size, 0)?;
        v.size = size;
        for i in 0..size / CHUNK {
            let h = vmm::create(Loc::Device(device))?;
            v.chunks.push(h);
            vmm::map(v.base + i * CHUNK, h)?;
        }
        vmm::set_access(v.base, size, &[Loc::Device(device)], true)?;
        v.fill(0, size, 0)?;
        Ok(v)
    }

    /// The device address of physical address `pa` in the private mapping.
    pub fn dev(&self, pa: u64) -> u64 {
        self.base + pa
    }

    /// The chunk holding physical address `pa` (a multiple of 2 MiB, checked by the caller).
    pub fn chunk(&self, pa: u64) -> Handle {
        self.chunks[(pa / CHUNK) as usize]
    }

    /// Reads `buf.len()` bytes at `pa` (range checked by the caller).
    pub fn read(&self, pa: u64, buf: &mut [u8]) -> Result<(), DrvError> {
        // SAFETY: the source lies in the private mapping; the destination is `buf`.
        ck("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(buf.as_mut_ptr().cast(), self.base + pa, buf.len())
        })
    }

    /// Writes `data` at `pa` (range checked by the caller).
    pub fn write(&self, pa: u64, data: &[u8]) -> Result<(), DrvError> {
        // SAFETY: the destination lies in the private mapping; the source is `data`.
        ck("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(self.base + pa, data.as_ptr().cast(), data.len())
        })
        .and_then(|_| sync_legacy())
    }

    /// Fills `len` bytes at `pa` (range checked by the caller).
    pub fn fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), DrvError> {
        // SAFETY: the range lies in the private mapping.
        let r = ck("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(self.base + pa, byte, len as usize)
        });
        // cuMemsetD8 is asynchronous with respect to the host for device memory: wait for the
        // legacy default stream it ran on (job streams are non-blocking, so not for kernels).
        r.and_then(|_| sync_legacy())
    }
}

impl Drop for Vram {
    fn drop(&mut self) {
        if self.size != 0 {
            let _ = vmm::unmap(self.base, self.chunks.len() as u64 * CHUNK);
            vmm::free(self.base, self.size);
        }
        for &h in &self.chunks {
            vmm::release(h);
        }
    }
}
