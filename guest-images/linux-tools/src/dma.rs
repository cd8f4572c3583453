//! GPU-visible memory for a Linux guest: a range of guest RAM the kernel never manages
//! (`memmap=SIZE$ADDR` on its command line: reserved in the e820 map), mapped through
//! `/dev/mem` 2 MiB at a time as the pool is used ([`LazyMap`]). Its guest-physical addresses are known without `/proc/self/pagemap`, it is
//! contiguous, and `mmap` of `/dev/mem` fills the page tables at once (remap_pfn_range): no page
//! fault and no kernel-side zeroing per page, each of which costs milliseconds under PVM's
//! emulated CPL0. Allocation is a bump pointer; nothing is freed before exit (the driver keeps
//! its pools for its whole life).

use std::fs::OpenOptions;

use gpu_driver::DmaBuf;

use crate::ToolError;
use crate::args::parse_num;
use crate::lazymap::LazyMap;

/// The reserved range named by a kernel command line: the first `memmap=SIZE$ADDR`.
pub fn reserved_range(cmdline: &str) -> Option<(u64, u64)> {
    cmdline.split_whitespace().find_map(|w| {
        let v = w.strip_prefix("memmap=")?;
        let (size, addr) = v.split_once('$')?;
        let (size, addr) = (parse_num(size)?, parse_num(addr)?);
        (size > 0 && addr.checked_add(size).is_some()).then_some((addr, size))
    })
}

/// The mapped range and its bump pointer.
#[derive(Debug)]
pub struct DmaPool {
    map: LazyMap,
    gpa: u64,
    next: usize,
}

impl DmaPool {
    /// Maps the range reserved on this kernel's command line (`/proc/cmdline`).
    pub fn open() -> Result<Self, ToolError> {
        let cmdline = std::fs::read_to_string("/proc/cmdline")
            .map_err(ToolError::io("read /proc/cmdline"))?;
        let (gpa, len) = reserved_range(&cmdline).ok_or_else(|| {
            ToolError::Bad(
                "no memmap=SIZE$ADDR on the kernel command line: no memory for the GPU".into(),
            )
        })?;
        Self::map(gpa, len)
    }

    /// Maps `len` bytes of guest-physical memory at `gpa` (page-aligned) through `/dev/mem`,
    /// 2 MiB at a time as the pool is used.
    pub fn map(gpa: u64, len: u64) -> Result<Self, ToolError> {
        let len = usize::try_from(len).map_err(|_| ToolError::Bad("DMA range too large".into()))?;
        if !gpa.is_multiple_of(4096) {
            return Err(ToolError::Bad(format!(
                "DMA range at {gpa:#x} is not page-aligned"
            )));
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/mem")
            .map_err(ToolError::io("open /dev/mem"))?;
        let map = LazyMap::new(f, gpa, len).map_err(ToolError::io("reserve address space"))?;
        Ok(Self { map, gpa, next: 0 })
    }

    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two) in guest-physical
    /// terms; `None` when the pool is exhausted.
    pub fn alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        let align = align.max(8);
        if !align.is_power_of_two() {
            return None;
        }
        let at = (self.gpa + self.next as u64).next_multiple_of(align as u64);
        let start = usize::try_from(at - self.gpa).ok()?;
        let ptr = self.map.ensure(start, len.max(1))?;
        self.next = start + len.max(1);
        // SAFETY: start..start+len is mapped (ensure) and handed out once.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        // SAFETY: the mapping stays for the life of the pool (the driver's platform owns it
        // for the driver's whole life), the range is given to this one buffer only, and it is
        // guest-physical gpa + start.
        unsafe { DmaBuf::from_raw(ptr, self.gpa + start as u64, len) }
    }

    /// Bytes handed out so far.
    pub fn used(&self) -> usize {
        self.next
    }

    /// Size of the pool.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memmap_on_the_command_line() {
        assert_eq!(
            reserved_range("console=ttyS0 memmap=64M$0x8000000 quiet"),
            Some((0x800_0000, 64 << 20))
        );
        assert_eq!(reserved_range("memmap=64M@0x8000000"), None);
        assert_eq!(reserved_range("memmap=0$0x1000"), None);
        assert_eq!(reserved_range("memmap=1G$0xffffffffffffffff"), None);
        assert_eq!(reserved_range(""), None);
    }
}
