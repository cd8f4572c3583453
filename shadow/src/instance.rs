//! Instance blocks: reading and validating the 32 defined bytes of a channel's instance block
//! into a typed `Instance` (spec: "Instance block").

use crate::fault::{FaultKind, GuestFault, Rule};
use crate::layout::GpuLayout;
use crate::mem::GuestMem;
use crate::types::{Aperture, Pdb};

/// Bytes of the instance block the spec defines (the rest of the 4 KiB page is ignored).
pub const INSTANCE_BYTES: usize = 32;
/// Size and alignment of an instance block.
pub const INSTANCE_BLOCK_SIZE: u64 = inst::SIZE;

// Field offsets as FAULT_INFO values (u32); the layout is vgpu-hw's.
const OFF_PDB: u32 = inst::PDB as u32;
const OFF_GPFIFO_BASE: u32 = inst::GPFIFO_BASE as u32;
const OFF_GPFIFO_ENTRIES: u32 = inst::GPFIFO_ENTRIES as u32;
const OFF_RESERVED: u32 = inst::RESERVED as u32;
const OFF_ENGINE_CTX: u32 = inst::ENGINE_CTX as u32;
/// Bytes of the engine context save area at ENGINE_CTX.
const ENGINE_CTX_BYTES: u64 = 4096;
use vgpu_hw::inst::{self, GPFIFO_MAX_ENTRIES, GPFIFO_MIN_ENTRIES};

/// A validated instance block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Instance {
    /// Guest VRAM address of the instance block itself.
    pub addr: u64,
    /// The page directory (inside guest VRAM or one RAM region, whole).
    pub pdb: Pdb,
    /// GPU VA of the GPFIFO ring (8-byte aligned; the ring lies inside the VA window).
    pub gpfifo_base: u64,
    /// Ring size in entries (a power of two, 2..=65536).
    pub gpfifo_entries: u32,
    /// GPU VA of the 4 KiB context save area (inside the VA window), or 0.
    pub engine_ctx: u64,
}

impl Instance {
    /// Checks an instance block address (as written to CHAN_INST): 4 KiB aligned and the whole
    /// 4 KiB block inside guest VRAM. Kind 6, ADDR = `addr`.
    pub fn check_addr(layout: &GpuLayout, addr: u64) -> Result<(), GuestFault> {
        let fault = |rule| GuestFault::new(FaultKind::BadInstance, rule, addr, 0);
        if !addr.is_multiple_of(INSTANCE_BLOCK_SIZE) {
            return Err(fault(Rule::InstanceMisaligned));
        }
        layout
            .check_range(Aperture::Vram, addr, INSTANCE_BLOCK_SIZE)
            .map_err(|_| fault(Rule::InstanceOutsideVram))
    }

    /// Reads the instance block at guest VRAM `addr` and validates it (see [`Instance::parse`]).
    pub fn read<M: GuestMem + ?Sized>(
        mem: &M,
        layout: &GpuLayout,
        addr: u64,
    ) -> Result<Self, GuestFault> {
        Self::check_addr(layout, addr)?;
        let mut bytes = [0u8; INSTANCE_BYTES];
        mem.read_vram(addr, &mut bytes).map_err(|e| {
            log::warn!("instance block at {addr:#x} unreadable: {e}");
            GuestFault::new(FaultKind::BadInstance, Rule::InstanceOutsideVram, addr, 0)
        })?;
        Self::parse(layout, addr, &bytes)
    }

    /// Validates the 32 bytes of the instance block at guest VRAM `addr`.
    ///
    /// Faults carry ADDR = `addr` and INFO = the field's byte offset. Kind 6 (BAD_INSTANCE):
    /// PDB target not 1/2 (or 2 without CAPS sysmem), PDB bits 11:2 set, page directory
    /// (VA_SIZE / 2 MiB × 8 bytes) not wholly inside guest VRAM / one RAM region, reserved u32
    /// at 0x14 not 0, ENGINE_CTX ≠ 0 and its 4 KiB not inside the VA window. Kind 7
    /// (BAD_GPFIFO): GPFIFO_BASE not 8-byte aligned, GPFIFO_ENTRIES not a power of two in
    /// 2..=65536, the ring not inside the VA window.
    pub fn parse(
        layout: &GpuLayout,
        addr: u64,
        bytes: &[u8; INSTANCE_BYTES],
    ) -> Result<Self, GuestFault> {
        let u64_at = |o: u32| {
            let o = o as usize;
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |o: u32| {
            let o = o as usize;
            let mut b = [0u8; 4];
            b.copy_from_slice(&bytes[o..o + 4]);
            u32::from_le_bytes(b)
        };
        let inst = |rule, off| GuestFault::new(FaultKind::BadInstance, rule, addr, off);
        let fifo = |rule, off| GuestFault::new(FaultKind::BadGpfifo, rule, addr, off);

        let raw_pdb = u64_at(OFF_PDB);
        let aperture = match Aperture::from_target(raw_pdb) {
            Some(Aperture::Sysmem) if !layout.sysmem => {
                return Err(inst(Rule::SysmemUnsupported, OFF_PDB));
            }
            Some(a) => a,
            None => return Err(inst(Rule::PdbTarget, OFF_PDB)),
        };
        if raw_pdb & 0xffc != 0 {
            return Err(inst(Rule::PdbReserved, OFF_PDB));
        }
        let pdb = Pdb {
            aperture,
            addr: raw_pdb & !0xfff,
        };
        if layout
            .check_range(aperture, pdb.addr, layout.pd_bytes())
            .is_err()
        {
            let rule = match aperture {
                Aperture::Vram => Rule::PdOutsideVram,
                Aperture::Sysmem => Rule::PdOutsideRam,
            };
            return Err(inst(rule, OFF_PDB));
        }

        let gpfifo_base = u64_at(OFF_GPFIFO_BASE);
        if !gpfifo_base.is_multiple_of(8) {
            return Err(fifo(Rule::GpfifoMisaligned, OFF_GPFIFO_BASE));
        }
        let gpfifo_entries = u32_at(OFF_GPFIFO_ENTRIES);
        if !gpfifo_entries.is_power_of_two()
            || !(GPFIFO_MIN_ENTRIES..=GPFIFO_MAX_ENTRIES).contains(&gpfifo_entries)
        {
            return Err(fifo(Rule::GpfifoEntries, OFF_GPFIFO_ENTRIES));
        }
        if !layout.va_contains(gpfifo_base, u64::from(gpfifo_entries) * 8) {
            return Err(fifo(Rule::GpfifoOutsideWindow, OFF_GPFIFO_BASE));
        }
        if u32_at(OFF_RESERVED) != 0 {
            return Err(inst(Rule::InstanceReserved, OFF_RESERVED));
        }
        let engine_ctx = u64_at(OFF_ENGINE_CTX);
        if engine_ctx != 0 && !layout.va_contains(engine_ctx, ENGINE_CTX_BYTES) {
            return Err(inst(Rule::EngineCtxOutsideWindow, OFF_ENGINE_CTX));
        }
        Ok(Self {
            addr,
            pdb,
            gpfifo_base,
            gpfifo_entries,
            engine_ctx,
        })
    }
}
