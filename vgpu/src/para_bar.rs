//! The para-virtual BAR3 front end (docs/hardware.md, "Para-virtual interface"): its
//! registers, and the hypercall itself on the vCPU thread: read the argument area from guest
//! RAM, validate every entry ([`ParaSpaces::decode`]), apply all or nothing
//! ([`ParaSpaces::commit`]), write the result back, and record a refused entry as the
//! device-level fault the spec names.

use std::sync::Arc;

use shadow::{Aperture, GpuLayout, PAGE_4K};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::para::*;
use crate::para_vram::VramAllocator;
use crate::state::Shared;

/// The BAR3 front end: registers and the hypercall (runs on vCPU threads).
pub struct Para {
    spaces: SharedSpaces,
    ram: GuestMemoryMmap,
    layout: GpuLayout,
    shared: Arc<Shared>,
    args: u64,
    status: u32,
    vram: VramAllocator,
}

impl Para {
    pub fn new(spaces: SharedSpaces, ram: GuestMemoryMmap, shared: Arc<Shared>) -> Self {
        let layout = lock(&spaces).layout.clone();
        Para {
            vram: VramAllocator::new(layout.vram_size),
            spaces,
            ram,
            layout,
            shared,
            args: 0,
            status: 0,
        }
    }

    /// The shared spaces (for the worker).
    pub fn spaces(&self) -> SharedSpaces {
        self.spaces.clone()
    }

    /// The front end's state for a snapshot: ARGS, STATUS and the VRAM blocks.
    pub fn image(&self) -> (u64, u32, Vec<(u64, u64)>) {
        (self.args, self.status, self.vram.blocks())
    }

    /// Puts a snapshot's front-end state in place (ARGS is checked at every call anyway);
    /// the blocks must fit this VM's VRAM.
    pub fn restore_image(
        &mut self,
        args: u64,
        status: u32,
        blocks: &[(u64, u64)],
    ) -> Result<(), String> {
        self.vram = VramAllocator::with_blocks(self.layout.vram_size, blocks)?;
        self.args = args;
        self.status = status;
        Ok(())
    }

    /// A BAR3 register read.
    pub fn read(&self, off: u64) -> u32 {
        // BAR3 is 4 KiB: every offset fits the u32 register map.
        match off as u32 {
            PARA_ID => PARA_ID_VALUE,
            PARA_VERSION => PARA_VERSION_VALUE,
            ARGS_LO => self.args as u32,
            ARGS_HI => (self.args >> 32) as u32,
            MAX_BATCH_REG => MAX_BATCH,
            STATUS => self.status,
            _ => 0xffff_ffff,
        }
    }

    /// A BAR3 register write.
    pub fn write(&mut self, off: u64, v: u32) {
        match off as u32 {
            ARGS_LO => self.args = (self.args & !0xffff_ffff) | u64::from(v),
            ARGS_HI => self.args = (self.args & 0xffff_ffff) | u64::from(v) << 32,
            CALL => self.call(v & 0xff),
            _ => log::debug!("vgpu para: write {v:#x} to BAR3 {off:#x} ignored"),
        }
    }

    fn area_ok(&self) -> bool {
        self.args != 0
            && self.args.is_multiple_of(PAGE_4K)
            && self
                .layout
                .check_range(Aperture::Sysmem, self.args, ARGS_BYTES)
                .is_ok()
    }

    fn call(&mut self, op: u32) {
        let result = if self.area_ok() {
            self.run(op)
        } else {
            Err(CallError::BadCall(
                "argument area not registered or not in RAM",
            ))
        };
        let (status, index, kind, addr) = match &result {
            Ok((n, addr)) => (ST_OK, *n, 0, *addr),
            Err(CallError::Entry(f)) => (ST_ENTRY_FAULT, f.index, u32::from(f.kind.code()), f.va),
            Err(e) => (e.status(), 0, 0, 0),
        };
        {
            let mut s = lock(&self.spaces);
            s.counters.hypercalls += 1;
            if result.is_err() {
                s.counters.refused += 1;
            }
        }
        if let Err(e) = &result {
            log::debug!("vgpu para: op {op}: {e}");
            if let CallError::Entry(f) = e {
                let mut r = self.shared.lock();
                self.shared.device_fault(&mut r, f.kind, f.va, f.index);
            }
        }
        self.status = status | kind << 8 | (index.min(0xffff)) << 16;
        if self.area_ok() {
            let mut out = [0u8; 24];
            out[0..4].copy_from_slice(&status.to_le_bytes());
            out[4..8].copy_from_slice(&index.to_le_bytes());
            out[8..12].copy_from_slice(&kind.to_le_bytes());
            out[16..24].copy_from_slice(&addr.to_le_bytes());
            if let Err(e) = self
                .ram
                .write_slice(&out, GuestAddress(self.args + OFF_RESULT))
            {
                log::warn!("vgpu para: result write: {e}");
            }
        }
    }

    /// Performs `op`; `Ok((n, addr))` = entries applied, and the address VRAM_ALLOC chose.
    fn run(&mut self, op: u32) -> Result<(u32, u64), CallError> {
        let mut header = [0u8; 16];
        self.ram
            .read_slice(&mut header, GuestAddress(self.args))
            .map_err(|_| CallError::BadCall("argument area unreadable"))?;
        let count = match op {
            OP_SET_PD => {
                lock(&self.spaces).set_pd(u64_at(&header, OFF_ARG as usize))?;
                return Ok((0, 0));
            }
            OP_TLB_FLUSH => return Ok((0, 0)),
            OP_VRAM_ALLOC => {
                let len = u64_at(&header, OFF_ARG as usize);
                let log2 = match u32_at(&header, OFF_COUNT as usize) {
                    0 => 12,
                    n @ 12..=30 => n,
                    _ => {
                        return Err(CallError::BadCall(
                            "VRAM_ALLOC alignment outside 2^12 … 2^30",
                        ));
                    }
                };
                if len == 0 || len > self.layout.vram_size {
                    return Err(CallError::BadCall("VRAM_ALLOC size 0 or larger than VRAM"));
                }
                let addr = self.vram.alloc(len, 1 << log2).ok_or(CallError::NoMemory)?;
                return Ok((0, addr));
            }
            OP_VRAM_FREE => {
                let addr = u64_at(&header, OFF_ARG as usize);
                if !self.vram.free(addr) {
                    return Err(CallError::BadCall(
                        "VRAM_FREE of an address VRAM_ALLOC did not return",
                    ));
                }
                return Ok((0, 0));
            }
            OP_MAP => 1,
            OP_MAP_BATCH | OP_UNMAP_BATCH => u32_at(&header, OFF_COUNT as usize),
            _ => return Err(CallError::BadCall("unknown operation")),
        };
        if count > MAX_BATCH {
            return Err(CallError::BadCall("COUNT above MAX_BATCH"));
        }
        let mut bytes = vec![0u8; count as usize * ENTRY_BYTES];
        self.ram
            .read_slice(&mut bytes, GuestAddress(self.args + OFF_ENTRIES))
            .map_err(|_| CallError::BadCall("argument area unreadable"))?;
        let mut spaces = lock(&self.spaces);
        let ops = bytes
            .chunks_exact(ENTRY_BYTES)
            .enumerate()
            .map(|(i, e)| spaces.decode(i as u32, e, op == OP_UNMAP_BATCH))
            .collect::<Result<Vec<_>, _>>()
            .map_err(CallError::Entry)?;
        spaces.commit(&ops)?;
        Ok((count, 0))
    }
}
