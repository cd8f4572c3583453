//! The device's page-table management: mapping and unmapping ranges (tables written through
//! the table backend in full mode, batched hypercalls in para mode), raw PTE/PDE access for
//! tests, translation, and TLB flushes.

use super::*;

impl<P: Platform> Gpu<P> {
    pub(super) fn backend(&mut self) -> (Backend<'_, P>, &mut AddressSpace) {
        let aperture = self.p.vram_aperture().min(self.info.vram_size);
        (
            Backend {
                p: &mut self.p,
                mmio: &mut self.mmio,
                vram: &mut self.vram,
                tables: &mut self.tables,
                placement: self.cfg.tables,
                aperture,
            },
            &mut self.space,
        )
    }

    /// Maps [va, va + len) to `phys` of `target` (2 MiB pages where aligned). The TLB is
    /// flushed before the next submission.
    pub fn map(
        &mut self,
        va: u64,
        len: u64,
        target: Target,
        phys: u64,
        read_only: bool,
    ) -> Result<(), Error> {
        let (mut b, space) = self.backend();
        space.map(&mut b, va, len, target, phys, read_only)?;
        if self.para.is_some() {
            let big = self.info.page_sizes & regs::PAGE_2M != 0;
            let e = para::map_entries(va, len, target, phys, read_only, big)?;
            let r = self.para_batch(para::OP_MAP_BATCH, &e, true);
            if r.is_err() {
                // Refused as a whole: the range most likely was unmapped before (a fresh VA);
                // make the driver's record say so again rather than keep what was refused.
                let (mut b, space) = self.backend();
                let _ = space.unmap(&mut b, va, len);
            }
            return r;
        }
        self.tlb_dirty = true;
        Ok(())
    }

    /// Whether page-table changes go through the para-virtual interface.
    pub fn is_para(&self) -> bool {
        self.para.is_some()
    }

    /// Para mode, for attack tests: one raw call (`op`, ARG, COUNT; the entries in the area
    /// as they are) with the argument area registered at `area` (`None`: the driver's own).
    /// Afterwards the driver's own area and page directory are registered and selected again.
    /// Returns the BAR3 STATUS register, or `None` outside para mode.
    pub fn para_raw(
        &mut self,
        area: Option<u64>,
        op: u32,
        arg: u64,
        count: u32,
    ) -> Result<Option<u32>, Error> {
        let pdb = self.pdb();
        let Some(pi) = self.para.as_mut() else {
            return Ok(None);
        };
        let before = pi.calls;
        if area.is_some() {
            pi.register(&mut self.p, area);
        }
        let status = pi.raw(&mut self.p, op, arg, count)?;
        if area.is_some() {
            pi.register(&mut self.p, None);
        }
        let restore = pi.raw(&mut self.p, para::OP_SET_PD, pdb, 0)?;
        self.mmio += pi.calls - before + 2 + if area.is_some() { 4 } else { 0 };
        if restore & 0xff != para::ST_OK {
            return Err(Error::ParaRefused {
                status: restore & 0xff,
                index: 0,
            });
        }
        Ok(Some(status))
    }

    /// Para mode: one call without entries; a refusal is an error.
    pub(super) fn para_call(&mut self, op: u32, arg: u64) -> Result<(), Error> {
        if self.para.is_none() {
            return Ok(());
        }
        self.p.lock_device();
        let r = self.para_call_locked(op, arg);
        self.p.unlock_device();
        r
    }

    fn para_call_locked(&mut self, op: u32, arg: u64) -> Result<(), Error> {
        self.para_select(op)?;
        let Some(pi) = self.para.as_mut() else {
            return Ok(());
        };
        let out = pi.call(&mut self.p, op, arg)?;
        self.mmio += 1;
        match out.status {
            para::ST_OK => Ok(()),
            status => Err(Error::ParaRefused {
                status,
                index: out.index,
            }),
        }
    }

    /// Para mode: `entries` as batched calls. A refused entry is also the device's fault
    /// record: with `take` it is read and returned as [`Error::Fault`], otherwise it is left
    /// for the caller (the raw-entry test hooks) and the call returns `Ok`.
    pub(super) fn para_batch(
        &mut self,
        op: u32,
        entries: &[para::Entry],
        take: bool,
    ) -> Result<(), Error> {
        if self.para.is_none() {
            return Ok(());
        }
        self.p.lock_device();
        let r = self.para_batch_locked(op, entries, take);
        self.p.unlock_device();
        r
    }

    fn para_batch_locked(
        &mut self,
        op: u32,
        entries: &[para::Entry],
        take: bool,
    ) -> Result<(), Error> {
        self.para_select(op)?;
        let Some(pi) = self.para.as_mut() else {
            return Ok(());
        };
        let before = pi.calls;
        let out = pi.batch(&mut self.p, op, entries)?;
        self.mmio += pi.calls - before;
        match out.status {
            para::ST_OK => Ok(()),
            para::ST_ENTRY_FAULT if !take => Ok(()),
            status => Err(match self.take_fault() {
                Some(f) if status == para::ST_ENTRY_FAULT => Error::Fault(f),
                _ => Error::ParaRefused {
                    status,
                    index: out.index,
                },
            }),
        }
    }

    /// Removes the translations of [va, va + len).
    pub fn unmap(&mut self, va: u64, len: u64) -> Result<(), Error> {
        let (mut b, space) = self.backend();
        space.unmap(&mut b, va, len)?;
        if self.para.is_some() {
            let e = para::unmap_entry(va, len)?;
            return self.para_batch(para::OP_UNMAP_BATCH, &[e], true);
        }
        self.tlb_dirty = true;
        Ok(())
    }

    /// Writes a raw PTE for the 4 KiB page at `va` (device validation tests).
    pub fn set_pte_raw(&mut self, va: u64, value: u64) -> Result<(), Error> {
        let (mut b, space) = self.backend();
        space.set_pte_raw(&mut b, va, value)?;
        if self.para.is_some() {
            // The device's verdict on the entry is its fault record, as after a flush.
            let e = para::Entry {
                va,
                pte: value,
                pages: 1,
            };
            return self.para_batch(para::OP_MAP_BATCH, &[e], false);
        }
        self.tlb_dirty = true;
        Ok(())
    }

    /// Writes a raw PDE for the 2 MiB region of `va` (device validation tests).
    pub fn set_pde_raw(&mut self, va: u64, value: u64) -> Result<(), Error> {
        // Para mode: a BIG PDE is one 2 MiB entry, an invalid one unmaps the 2 MiB; a
        // page-table pointer has no para equivalent (there are no tables).
        if self.para.is_some() && value & 3 != 0 && value & para::BIG == 0 {
            return Err(Error::BadInfo("para mode: a PDE must be BIG or invalid"));
        }
        let (mut b, space) = self.backend();
        space.set_pde_raw(&mut b, va, value)?;
        if self.para.is_some() {
            let e = para::Entry {
                va: va - va % PAGE_2M,
                pte: if value & 3 == 0 { para::BIG } else { value },
                pages: 1,
            };
            return self.para_batch(para::OP_MAP_BATCH, &[e], false);
        }
        self.tlb_dirty = true;
        Ok(())
    }

    /// What `va` translates to, per the tables the driver wrote.
    pub fn translate(&self, va: u64) -> Option<(Target, u64, bool)> {
        self.space.translate(va)
    }

    /// The instance-block PDB value for this address space.
    pub(crate) fn pdb(&self) -> u64 {
        let d = self.space.directory();
        crate::mmu::pdb(d.target, d.addr)
    }

    /// Tells the GPU to forget translations (one register write).
    pub fn flush_tlb(&mut self) {
        // Para mode: a call's mappings are in effect when it returns; nothing to flush.
        if self.para.is_none() {
            self.reg_write(regs::TLB_FLUSH, 1);
        }
        self.tlb_dirty = false;
    }

    /// Flushes if tables changed since the last flush.
    pub fn flush_if_needed(&mut self) {
        if self.tlb_dirty {
            self.flush_tlb();
        }
    }
}
