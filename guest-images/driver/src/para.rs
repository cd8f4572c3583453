//! The para-virtual path (docs/hardware.md, "Para-virtual interface"): the argument area in
//! system memory, and page-table changes as batched hypercalls (one BAR3 write per call)
//! instead of table writes plus TLB flushes.

use crate::error::Error;
use crate::mmu::{PAGE_2M, PAGE_4K, Target};
use crate::platform::{DmaBuf, Platform};
use alloc::vec::Vec;

/// BAR3 registers, operations and status codes: `vgpu-hw`'s definitions.
pub use vgpu_hw::para::{
    ARGS_HI, ARGS_LO, CALL, MAX_BATCH_REG, OP_MAP_BATCH, OP_SET_PD, OP_UNMAP_BATCH, PARA_ID,
    PARA_ID_VALUE, ST_ENTRY_FAULT, ST_LIMIT, ST_OK, STATUS,
};
/// Entry BIG bit (2 MiB pages).
pub use vgpu_hw::pte::BIG;
use vgpu_hw::pte::READ_ONLY;

/// Argument area layout, as buffer offsets.
pub const ARGS_BYTES: usize = vgpu_hw::para::ARGS_BYTES as usize;
const OFF_ARG: usize = vgpu_hw::para::OFF_ARG as usize;
const OFF_COUNT: usize = vgpu_hw::para::OFF_COUNT as usize;
const OFF_STATUS: usize = vgpu_hw::para::OFF_STATUS as usize;
const OFF_INDEX: usize = vgpu_hw::para::OFF_INDEX as usize;
const OFF_KIND: usize = vgpu_hw::para::OFF_KIND as usize;
const OFF_ADDR: usize = vgpu_hw::para::OFF_ADDR as usize;
const OFF_ENTRIES: usize = vgpu_hw::para::OFF_ENTRIES as usize;
const ENTRY_BYTES: usize = vgpu_hw::para::ENTRY_BYTES;
/// The most entries this driver puts in one call (the device's MAX_BATCH may be lower).
const MAX_BATCH: u32 = vgpu_hw::para::MAX_BATCH;

/// One entry: pages of 4 KiB (or 2 MiB with BIG in `pte`) from `va`, onto `pte`'s target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub va: u64,
    pub pte: u64,
    pub pages: u32,
}

/// What a call returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub status: u32,
    pub index: u32,
    pub kind: u32,
    pub addr: u64,
}

/// The entries mapping [va, va + len) onto `phys` of `target`: 2 MiB pages where both
/// addresses agree modulo 2 MiB and a whole 2 MiB remains (if `big`), 4 KiB pages elsewhere.
pub fn map_entries(
    va: u64,
    len: u64,
    target: Target,
    phys: u64,
    read_only: bool,
    big: bool,
) -> Result<Vec<Entry>, Error> {
    if !(va | len | phys).is_multiple_of(PAGE_4K) || len == 0 {
        return Err(Error::Unaligned(va | len | phys));
    }
    va.checked_add(len).ok_or(Error::OutOfRange(va))?;
    phys.checked_add(len).ok_or(Error::OutOfRange(phys))?;
    let flags = target.bits() | if read_only { READ_ONLY } else { 0 };
    let mut out = Vec::new();
    let mut push = |va: u64, n: u64, page: u64, phys: u64| -> Result<(), Error> {
        let mut done = 0;
        while done < n {
            let pages = ((n - done) / page).min(u64::from(u32::MAX));
            let extra = if page == PAGE_2M { BIG } else { 0 };
            out.push(Entry {
                va: va + done,
                pte: (phys + done) | flags | extra,
                pages: u32::try_from(pages).map_err(|_| Error::OutOfRange(va))?,
            });
            done += pages * page;
        }
        Ok(())
    };
    let (head, mid) = if big && va % PAGE_2M == phys % PAGE_2M {
        let head = ((PAGE_2M - va % PAGE_2M) % PAGE_2M).min(len);
        (head, (len - head) / PAGE_2M * PAGE_2M)
    } else {
        (len, 0)
    };
    push(va, head, PAGE_4K, phys)?;
    push(va + head, mid, PAGE_2M, phys + head)?;
    let tail = len - head - mid;
    push(va + head + mid, tail, PAGE_4K, phys + head + mid)?;
    Ok(out)
}

/// The entry unmapping [va, va + len) (4 KiB granular).
pub fn unmap_entry(va: u64, len: u64) -> Result<Entry, Error> {
    if !(va | len).is_multiple_of(PAGE_4K) || len == 0 {
        return Err(Error::Unaligned(va | len));
    }
    let pages = u32::try_from(len / PAGE_4K).map_err(|_| Error::OutOfRange(va))?;
    Ok(Entry { va, pte: 0, pages })
}

/// `e` split into one entry per page (its page size: 2 MiB with BIG, else 4 KiB).
fn per_page(e: Entry) -> impl Iterator<Item = Entry> {
    let size = if e.pte & BIG != 0 { PAGE_2M } else { PAGE_4K };
    (0..u64::from(e.pages)).map(move |i| Entry {
        va: e.va + i * size,
        pte: if e.pte & 3 == 0 {
            e.pte
        } else {
            e.pte + i * size
        },
        pages: 1,
    })
}

/// The driver's side of the interface: the registered argument area.
#[derive(Debug)]
pub struct ParaIf {
    args: DmaBuf,
    max_batch: u32,
    /// Naive para-virtualization (GPUvm without multicall): every page is its own call.
    per_page: bool,
    /// Hypercalls made.
    pub calls: u64,
}

impl ParaIf {
    /// Allocates and registers the argument area; `None` if the device has no para BAR.
    pub fn open<P: Platform>(p: &mut P) -> Result<Option<Self>, Error> {
        if p.para_read(PARA_ID) != PARA_ID_VALUE {
            return Ok(None);
        }
        let args = p
            .dma_alloc(ARGS_BYTES, PAGE_4K as usize)
            .ok_or(Error::NoSysmem(ARGS_BYTES as u64))?;
        if !args.gpa().is_multiple_of(PAGE_4K) || args.len() < ARGS_BYTES {
            return Err(Error::Unaligned(args.gpa()));
        }
        p.para_write(ARGS_LO, args.gpa() as u32);
        p.para_write(ARGS_HI, (args.gpa() >> 32) as u32);
        let max_batch = p.para_read(MAX_BATCH_REG).clamp(1, MAX_BATCH);
        Ok(Some(Self {
            args,
            max_batch,
            per_page: false,
            calls: 0,
        }))
    }

    fn put(&self, off: usize, v: u64) -> Result<(), Error> {
        self.args
            .write_u64(off, v)
            .ok_or(Error::OutOfRange(off as u64))
    }

    fn outcome(&self) -> Outcome {
        let u32_at = |o| self.args.read_u32(o).unwrap_or(u32::MAX);
        Outcome {
            status: u32_at(OFF_STATUS),
            index: u32_at(OFF_INDEX),
            kind: u32_at(OFF_KIND),
            addr: self.args.read_u64(OFF_ADDR).unwrap_or(0),
        }
    }

    /// One call: `op` with `arg`, no entries.
    pub fn call<P: Platform>(&mut self, p: &mut P, op: u32, arg: u64) -> Result<Outcome, Error> {
        self.put(OFF_ARG, arg)?;
        self.put(OFF_COUNT, 0)?;
        self.calls += 1;
        p.para_write(CALL, op);
        Ok(self.outcome())
    }

    /// Registers `gpa` as the argument area (`None`: the driver's own).
    pub fn register<P: Platform>(&self, p: &mut P, gpa: Option<u64>) {
        let a = gpa.unwrap_or(self.args.gpa());
        p.para_write(ARGS_LO, a as u32);
        p.para_write(ARGS_HI, (a >> 32) as u32);
    }

    /// A raw call (attack tests): ARG and COUNT as given, entries left as they are; returns
    /// the BAR3 STATUS register.
    pub fn raw<P: Platform>(
        &mut self,
        p: &mut P,
        op: u32,
        arg: u64,
        count: u32,
    ) -> Result<u32, Error> {
        self.put(OFF_ARG, arg)?;
        self.put(OFF_COUNT, u64::from(count))?;
        self.calls += 1;
        p.para_write(CALL, op);
        Ok(p.para_read(STATUS))
    }

    /// Naive mode: each page of each entry becomes its own call (for the overhead experiment's
    /// "para-naive" row; the default batches whole ranges).
    pub fn set_per_page(&mut self, on: bool) {
        self.per_page = on;
    }

    /// `op` over `entries`, in calls of at most MAX_BATCH entries (each all-or-nothing);
    /// stops at the first call that does not return OK and returns its outcome (INDEX
    /// relative to `entries`).
    pub fn batch<P: Platform>(
        &mut self,
        p: &mut P,
        op: u32,
        entries: &[Entry],
    ) -> Result<Outcome, Error> {
        let mut last = Outcome {
            status: ST_OK,
            index: 0,
            kind: 0,
            addr: 0,
        };
        let pages: Vec<Entry>;
        let (entries, per_call) = if self.per_page {
            pages = entries.iter().flat_map(|e| per_page(*e)).collect();
            (&pages[..], 1)
        } else {
            (entries, self.max_batch as usize)
        };
        for (k, chunk) in entries.chunks(per_call).enumerate() {
            self.put(OFF_COUNT, chunk.len() as u64)?;
            for (i, e) in chunk.iter().enumerate() {
                let o = OFF_ENTRIES + i * ENTRY_BYTES;
                self.put(o, e.va)?;
                self.put(o + 8, e.pte)?;
                self.put(o + 16, u64::from(e.pages))?;
            }
            self.calls += 1;
            p.para_write(CALL, op);
            last = self.outcome();
            if last.status != ST_OK {
                last.index += (k * per_call) as u32;
                return Ok(last);
            }
        }
        Ok(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_page_splits_ranges_into_single_pages() {
        let big = Entry {
            va: 0x10_0000_0000,
            pte: 0x20_0000 | BIG | 2,
            pages: 3,
        };
        let v: Vec<Entry> = per_page(big).collect();
        assert_eq!(v.len(), 3);
        assert_eq!(
            (v[2].va, v[2].pte, v[2].pages),
            (0x10_0040_0000, 0x60_0000 | BIG | 2, 1)
        );
        let small = Entry {
            va: 0x10_0000_0000,
            pte: 0x1000 | 1,
            pages: 2,
        };
        let v: Vec<Entry> = per_page(small).collect();
        assert_eq!((v[1].va, v[1].pte), (0x10_0000_1000, 0x2000 | 1));
        let unmap = Entry {
            va: 0x10_0000_0000,
            pte: 0,
            pages: 2,
        };
        assert!(per_page(unmap).all(|e| e.pte == 0 && e.pages == 1));
    }

    #[test]
    fn ranges_become_few_entries() {
        let base = 0x10_0000_0000;
        // 2 MiB aligned both sides: one BIG entry.
        let e = map_entries(base, 8 * PAGE_2M, Target::Sysmem, 0x20_0000, false, true).unwrap();
        assert_eq!(
            e,
            [Entry {
                va: base,
                pte: 0x20_0000 | 2 | BIG,
                pages: 8
            }]
        );
        // Head and tail in 4 KiB pages around 2 MiB pages.
        let e = map_entries(base + 0x1000, 2 * PAGE_2M, Target::Vram, 0x1000, true, true).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!((e[0].pages, e[0].pte), (511, 0x1000 | 1 | 8));
        assert_eq!(
            (e[1].va, e[1].pages, e[1].pte),
            (base + PAGE_2M, 1, PAGE_2M | 1 | 8 | BIG)
        );
        assert_eq!((e[2].pages, e[2].va), (1, base + 2 * PAGE_2M));
        // Addresses that disagree modulo 2 MiB, or no big pages: all 4 KiB.
        let e = map_entries(base, PAGE_2M, Target::Vram, 0x1000, false, true).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].pages, 512);
        let e = map_entries(base, PAGE_2M, Target::Vram, 0, false, false).unwrap();
        assert_eq!((e.len(), e[0].pages, e[0].pte & BIG), (1, 512, 0));
        assert!(map_entries(base, 0x800, Target::Vram, 0, false, true).is_err());
        assert!(map_entries(u64::MAX - 0xfff, 0x2000, Target::Vram, 0, false, true).is_err());
        assert_eq!(unmap_entry(base, 0x3000).unwrap().pages, 3);
    }
}
