//! GPU page tables (docs/hardware.md, "Page tables"): PDE/PTE encoding and an [`AddressSpace`]
//! that keeps a copy of every entry it wrote, so mapping needs no read-backs and only changed
//! entries are written (each write to VRAM tables is a trap). Storage is abstract
//! ([`TableBackend`]) so the logic is tested on the host.

use crate::error::Error;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

/// Small page and big page sizes, PTEs per page table.
pub use vgpu_hw::pte::{PAGE_2M, PAGE_4K, PTES_PER_TABLE};

/// Where an entry points (bits 1:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Guest VRAM address.
    Vram,
    /// Guest-physical (system memory) address.
    Sysmem,
}

impl Target {
    /// Field value.
    pub const fn bits(self) -> u64 {
        match self {
            Target::Vram => vgpu_hw::pte::TARGET_VRAM,
            Target::Sysmem => vgpu_hw::pte::TARGET_SYSMEM,
        }
    }
}

use vgpu_hw::pte::{ADDR_MASK, BIG, READ_ONLY};

/// A PDE mapping a 2 MiB page at `addr` (2 MiB aligned).
pub const fn pde_big(target: Target, addr: u64, read_only: bool) -> u64 {
    (addr & ADDR_MASK) | BIG | if read_only { READ_ONLY } else { 0 } | target.bits()
}

/// A PDE pointing at a page table at `addr` (4 KiB aligned).
pub const fn pde_table(target: Target, addr: u64) -> u64 {
    (addr & ADDR_MASK) | target.bits()
}

/// A PTE mapping a 4 KiB page at `addr`.
pub const fn pte(target: Target, addr: u64, read_only: bool) -> u64 {
    (addr & ADDR_MASK) | if read_only { READ_ONLY } else { 0 } | target.bits()
}

/// Instance-block PDB value for a page directory at `addr`.
pub const fn pdb(target: Target, addr: u64) -> u64 {
    (addr & ADDR_MASK) | target.bits()
}

/// One table (directory or page table) in backend storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableLoc {
    pub target: Target,
    /// Guest VRAM or guest-physical address.
    pub addr: u64,
    /// Backend's handle (e.g. index of the system-memory buffer).
    pub handle: usize,
}

/// Storage for tables: allocates them and writes their entries.
pub trait TableBackend {
    /// A new table of `bytes` (4 KiB aligned); `true` if it is known to read as zero.
    fn alloc_table(&mut self, bytes: u64) -> Result<(TableLoc, bool), Error>;
    /// Writes entry `index` (u64) of a table.
    fn write_entry(&mut self, table: TableLoc, index: usize, value: u64) -> Result<(), Error>;
}

/// One GPU address space: a page directory and the page tables below it.
#[derive(Debug)]
pub struct AddressSpace {
    va_base: u64,
    big_pages: bool,
    dir: TableLoc,
    pdes: Vec<u64>,
    tables: BTreeMap<usize, (TableLoc, Vec<u64>)>,
}

impl AddressSpace {
    /// Creates the directory for the window [va_base, va_base + va_size) (va_size a multiple of
    /// 2 MiB) and makes every entry invalid.
    pub fn new(
        backend: &mut impl TableBackend,
        va_base: u64,
        va_size: u64,
        big_pages: bool,
    ) -> Result<Self, Error> {
        if !va_size.is_multiple_of(PAGE_2M) || va_size == 0 || !va_base.is_multiple_of(PAGE_2M) {
            return Err(Error::BadInfo("VA window not 2 MiB aligned"));
        }
        let n = usize::try_from(va_size / PAGE_2M).map_err(|_| Error::BadInfo("VA_SIZE"))?;
        let (dir, zeroed) = backend.alloc_table((n as u64 * 8).next_multiple_of(PAGE_4K))?;
        if !zeroed {
            for i in 0..n {
                backend.write_entry(dir, i, 0)?;
            }
        }
        Ok(Self {
            va_base,
            big_pages,
            dir,
            pdes: alloc::vec![0; n],
            tables: BTreeMap::new(),
        })
    }

    /// Where the page directory is.
    pub fn directory(&self) -> TableLoc {
        self.dir
    }

    /// Bytes of the page directory.
    pub fn directory_bytes(&self) -> u64 {
        (self.pdes.len() as u64 * 8).next_multiple_of(PAGE_4K)
    }

    /// Moves the directory to `to`, which must already read as zero: writes only the valid
    /// entries there. Page tables stay where they are.
    pub fn move_directory(
        &mut self,
        backend: &mut impl TableBackend,
        to: TableLoc,
    ) -> Result<(), Error> {
        for (i, &v) in self.pdes.iter().enumerate() {
            if v != 0 {
                backend.write_entry(to, i, v)?;
            }
        }
        self.dir = to;
        Ok(())
    }

    fn pde_index(&self, va: u64) -> Result<usize, Error> {
        let off = va.checked_sub(self.va_base).ok_or(Error::OutOfRange(va))?;
        let i = usize::try_from(off / PAGE_2M).map_err(|_| Error::OutOfRange(va))?;
        if i >= self.pdes.len() {
            return Err(Error::OutOfRange(va));
        }
        Ok(i)
    }

    fn check_range(&self, va: u64, len: u64) -> Result<u64, Error> {
        if !va.is_multiple_of(PAGE_4K) || !len.is_multiple_of(PAGE_4K) || len == 0 {
            return Err(Error::Unaligned(va | len));
        }
        let end = va.checked_add(len).ok_or(Error::OutOfRange(va))?;
        self.pde_index(va)?;
        self.pde_index(end - 1)?;
        Ok(end)
    }

    fn table_for(&mut self, backend: &mut impl TableBackend, i: usize) -> Result<(), Error> {
        if self.tables.contains_key(&i) {
            return Ok(());
        }
        if self.pdes[i] & 3 != 0 {
            return Err(Error::Overlap(self.va_base + i as u64 * PAGE_2M));
        }
        let (loc, zeroed) = backend.alloc_table(PAGE_4K)?;
        if !zeroed {
            for k in 0..PTES_PER_TABLE {
                backend.write_entry(loc, k, 0)?;
            }
        }
        let v = pde_table(loc.target, loc.addr);
        backend.write_entry(self.dir, i, v)?;
        self.pdes[i] = v;
        self.tables.insert(i, (loc, alloc::vec![0; PTES_PER_TABLE]));
        Ok(())
    }

    /// Maps [va, va + len) to [phys, phys + len) of `target`, with 2 MiB pages wherever both
    /// addresses are 2 MiB aligned and a whole 2 MiB remains, 4 KiB pages elsewhere. All of
    /// va, phys and len must be 4 KiB aligned. The caller flushes the TLB afterwards.
    pub fn map(
        &mut self,
        backend: &mut impl TableBackend,
        va: u64,
        len: u64,
        target: Target,
        phys: u64,
        read_only: bool,
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        if !phys.is_multiple_of(PAGE_4K) {
            return Err(Error::Unaligned(phys));
        }
        phys.checked_add(len).ok_or(Error::OutOfRange(phys))?;
        let mut cur = va;
        while cur < end {
            let i = self.pde_index(cur)?;
            let p = phys + (cur - va);
            let whole = cur.is_multiple_of(PAGE_2M) && end - cur >= PAGE_2M;
            if self.big_pages && whole && p.is_multiple_of(PAGE_2M) && !self.tables.contains_key(&i)
            {
                let v = pde_big(target, p, read_only);
                if self.pdes[i] != v {
                    backend.write_entry(self.dir, i, v)?;
                    self.pdes[i] = v;
                }
                cur += PAGE_2M;
                continue;
            }
            self.table_for(backend, i)?;
            let stop = end.min(self.va_base + (i as u64 + 1) * PAGE_2M);
            let Some((loc, ptes)) = self.tables.get_mut(&i) else {
                return Err(Error::Overlap(cur));
            };
            while cur < stop {
                let k = ((cur / PAGE_4K) % PTES_PER_TABLE as u64) as usize;
                let v = pte(target, phys + (cur - va), read_only);
                if ptes[k] != v {
                    backend.write_entry(*loc, k, v)?;
                    ptes[k] = v;
                }
                cur += PAGE_4K;
            }
        }
        Ok(())
    }

    /// Removes the translations of [va, va + len). A 2 MiB page is removed only whole.
    pub fn unmap(
        &mut self,
        backend: &mut impl TableBackend,
        va: u64,
        len: u64,
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        let mut cur = va;
        while cur < end {
            let i = self.pde_index(cur)?;
            let pde_end = self.va_base + (i as u64 + 1) * PAGE_2M;
            let stop = end.min(pde_end);
            if let Some((loc, ptes)) = self.tables.get_mut(&i) {
                while cur < stop {
                    let k = ((cur / PAGE_4K) % PTES_PER_TABLE as u64) as usize;
                    if ptes[k] != 0 {
                        backend.write_entry(*loc, k, 0)?;
                        ptes[k] = 0;
                    }
                    cur += PAGE_4K;
                }
            } else {
                if self.pdes[i] != 0 {
                    if !cur.is_multiple_of(PAGE_2M) || stop != pde_end {
                        return Err(Error::Unaligned(cur));
                    }
                    backend.write_entry(self.dir, i, 0)?;
                    self.pdes[i] = 0;
                }
                cur = stop;
            }
        }
        Ok(())
    }

    /// Writes a raw PDE (for tests of the device's validation). Forgets any page table the
    /// entry pointed to.
    pub fn set_pde_raw(
        &mut self,
        backend: &mut impl TableBackend,
        va: u64,
        value: u64,
    ) -> Result<(), Error> {
        let i = self.pde_index(va)?;
        backend.write_entry(self.dir, i, value)?;
        self.pdes[i] = value;
        self.tables.remove(&i);
        Ok(())
    }

    /// Writes a raw PTE for the 4 KiB page at `va` (creating its page table if needed).
    pub fn set_pte_raw(
        &mut self,
        backend: &mut impl TableBackend,
        va: u64,
        value: u64,
    ) -> Result<(), Error> {
        let i = self.pde_index(va)?;
        self.table_for(backend, i)?;
        let k = ((va / PAGE_4K) % PTES_PER_TABLE as u64) as usize;
        let Some((loc, ptes)) = self.tables.get_mut(&i) else {
            return Err(Error::Overlap(va));
        };
        backend.write_entry(*loc, k, value)?;
        ptes[k] = value;
        Ok(())
    }

    /// What `va` translates to, per the entries written: (target, address, read-only).
    pub fn translate(&self, va: u64) -> Option<(Target, u64, bool)> {
        let i = self.pde_index(va).ok()?;
        let decode = |e: u64| match e & 3 {
            1 => Some(Target::Vram),
            2 => Some(Target::Sysmem),
            _ => None,
        };
        let pde = self.pdes[i];
        if pde & BIG != 0 {
            let t = decode(pde)?;
            return Some((t, (pde & ADDR_MASK) + va % PAGE_2M, pde & READ_ONLY != 0));
        }
        let (_, ptes) = self.tables.get(&i)?;
        let e = ptes[((va / PAGE_4K) % PTES_PER_TABLE as u64) as usize];
        Some((
            decode(e)?,
            (e & ADDR_MASK) + va % PAGE_4K,
            e & READ_ONLY != 0,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[derive(Default)]
    struct Mock {
        next: u64,
        writes: Vec<(u64, usize, u64)>,
    }

    impl TableBackend for Mock {
        fn alloc_table(&mut self, bytes: u64) -> Result<(TableLoc, bool), Error> {
            let addr = 0x10_0000 + self.next;
            self.next += bytes;
            Ok((
                TableLoc {
                    target: Target::Vram,
                    addr,
                    handle: 0,
                },
                false,
            ))
        }
        fn write_entry(&mut self, t: TableLoc, index: usize, value: u64) -> Result<(), Error> {
            self.writes.push((t.addr, index, value));
            Ok(())
        }
    }

    const BASE: u64 = 0x1_0000_0000;

    #[test]
    fn entry_encoding_matches_spec() {
        assert_eq!(pde_big(Target::Vram, 0x40_0000, false), 0x40_0005);
        assert_eq!(pde_big(Target::Sysmem, 0x20_0000, true), 0x20_000e);
        assert_eq!(pde_table(Target::Vram, 0x3000), 0x3001);
        assert_eq!(pte(Target::Sysmem, 0x1234_5000, true), 0x1234_500a);
        assert_eq!(pte(Target::Vram, 0x5000, false), 0x5001);
        assert_eq!(pdb(Target::Sysmem, 0x9000), 0x9002);
    }

    #[test]
    fn directory_is_cleared_and_big_pages_used() {
        let mut m = Mock::default();
        let mut a = AddressSpace::new(&mut m, BASE, 4 << 30, true).unwrap();
        assert_eq!(m.writes.len(), 2048);
        m.writes.clear();
        a.map(
            &mut m,
            BASE + PAGE_2M,
            2 * PAGE_2M,
            Target::Vram,
            0x40_0000,
            false,
        )
        .unwrap();
        assert_eq!(
            m.writes,
            [(0x10_0000, 1, 0x40_0005), (0x10_0000, 2, 0x60_0005)]
        );
        assert_eq!(
            a.translate(BASE + PAGE_2M + 0x123),
            Some((Target::Vram, 0x40_0123, false))
        );
        m.writes.clear();
        a.map(
            &mut m,
            BASE + PAGE_2M,
            2 * PAGE_2M,
            Target::Vram,
            0x40_0000,
            false,
        )
        .unwrap();
        assert!(m.writes.is_empty(), "unchanged entries are not rewritten");
        a.unmap(&mut m, BASE + PAGE_2M, PAGE_2M).unwrap();
        assert_eq!(m.writes, [(0x10_0000, 1, 0)]);
        assert_eq!(a.translate(BASE + PAGE_2M), None);
    }

    #[test]
    fn moving_the_directory_writes_only_valid_entries() {
        let mut m = Mock::default();
        let mut a = AddressSpace::new(&mut m, BASE, 64 << 20, true).unwrap();
        a.map(&mut m, BASE + 4 * PAGE_2M, PAGE_2M, Target::Vram, 0, false)
            .unwrap();
        m.writes.clear();
        let to = TableLoc {
            target: Target::Vram,
            addr: 0x40_0000,
            handle: 0,
        };
        a.move_directory(&mut m, to).unwrap();
        assert_eq!(m.writes, [(0x40_0000, 4, 0x5)]);
        assert_eq!(a.directory(), to);
        assert_eq!(a.directory_bytes(), 4096);
    }

    #[test]
    fn small_pages_when_unaligned() {
        let mut m = Mock::default();
        let mut a = AddressSpace::new(&mut m, BASE, 64 << 20, true).unwrap();
        m.writes.clear();
        a.map(&mut m, BASE + 0x1000, 0x2000, Target::Sysmem, 0x7000, true)
            .unwrap();
        // table cleared (512), PDE 0 written, then two PTEs
        assert_eq!(m.writes.len(), 512 + 1 + 2);
        let table = m.writes[0].0;
        assert_eq!(m.writes[512], (0x10_0000, 0, table | 1));
        assert_eq!(m.writes[513], (table, 1, 0x700a));
        assert_eq!(m.writes[514], (table, 2, 0x800a));
        assert_eq!(
            a.translate(BASE + 0x2004),
            Some((Target::Sysmem, 0x8004, true))
        );
        // big mapping over a PDE with a table is refused; a 2 MiB sysmem not aligned uses PTEs
        assert_eq!(a.map(&mut m, BASE, PAGE_2M, Target::Vram, 0, false), Ok(()));
        assert_eq!(
            a.translate(BASE + 0x1000),
            Some((Target::Vram, 0x1000, false))
        );
        assert!(a.map(&mut m, BASE, 0x800, Target::Vram, 0, false).is_err());
        assert!(
            a.map(&mut m, BASE + (64 << 20), 0x1000, Target::Vram, 0, false)
                .is_err()
        );
        assert!(
            a.map(&mut m, BASE - 0x1000, 0x1000, Target::Vram, 0, false)
                .is_err()
        );
    }

    #[test]
    fn without_big_pages_everything_is_4k() {
        let mut m = Mock::default();
        let mut a = AddressSpace::new(&mut m, BASE, 4 << 20, false).unwrap();
        m.writes.clear();
        a.map(&mut m, BASE, PAGE_2M, Target::Vram, 0, false)
            .unwrap();
        assert_eq!(m.writes.len(), 512 + 1 + 512);
    }
}
