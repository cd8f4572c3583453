//! A ring in DMA memory for what launches and fills hand the GPU by address (kernel
//! parameters, fill patterns): bump allocation; before it wraps, the work that used it is
//! waited for.

use gpu_driver::{Fence, Gpu, SysAlloc};
use vgpu_linux_tools::platform::LinuxGpu;
use vgpu_linux_tools::session::Session;

/// See the module documentation.
pub(super) struct Arena {
    buf: SysAlloc,
    off: u64,
    /// The last submission that reads the ring.
    last: Option<Fence>,
}

impl Arena {
    pub(super) fn new(gpu: &mut Gpu<LinuxGpu>, bytes: u64) -> Result<Self, gpu_driver::Error> {
        Ok(Self {
            buf: gpu.sys_alloc_aligned(bytes, 4096)?,
            off: 0,
            last: None,
        })
    }

    /// Copies `data` into the ring at a multiple of `align` (a power of two); its GPU VA (0
    /// for no data).
    pub(super) fn place(
        &mut self,
        s: &mut Session,
        data: &[u8],
        align: u64,
    ) -> Result<u64, gpu_driver::Error> {
        let len = data.len() as u64;
        if len == 0 {
            return Ok(0);
        }
        if len > self.buf.len {
            return Err(gpu_driver::Error::NoSysmem(len));
        }
        let mut at = self.off.next_multiple_of(align.max(1));
        if at + len > self.buf.len {
            if let Some(f) = self.last.take()
                && let Some((gpu, ch)) = s.parts()
            {
                ch.wait(gpu, f)?;
            }
            at = 0;
        }
        s.gpu.sys_write(&self.buf, at, data)?;
        self.off = at + len;
        Ok(self.buf.va + at)
    }

    /// Notes that the submission `f` reads what was placed so far.
    pub(super) fn used_by(&mut self, f: Fence) {
        self.last = Some(f);
    }
}
