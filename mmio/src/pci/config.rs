//! Type-0 PCI configuration space: identity registers, the command register, BARs with size
//! probing (all-ones writes read back the size mask) and 64-bit BAR pairs, interrupt line/pin,
//! and byte-granular write masks so a guest can change only what hardware would let it.

/// BAR address-space kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit memory BAR.
    Mmio32,
    /// 64-bit memory BAR (takes two BAR slots).
    Mmio64,
    /// I/O-port BAR.
    Io,
}

/// What a device declares for one BAR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarSpec {
    pub kind: BarKind,
    /// Size in bytes: a power of two, at least 16 for memory and 4 for I/O BARs.
    pub size: u64,
    pub prefetchable: bool,
}

/// Errors in declaring a device's config space.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PciError {
    #[error("BAR{0}: index out of range or slot already used")]
    BarSlot(usize),
    #[error("BAR{0}: size {1:#x} is not a valid power of two for its kind")]
    BarSize(usize, u64),
    #[error("no free device number on bus 0")]
    NoSlot,
    #[error("no room for BAR{bar} ({size:#x} bytes) of {name} in its window")]
    NoSpace { name: String, bar: usize, size: u64 },
}

const BAR0: usize = 0x10;
pub(super) const CONFIG_SIZE: usize = 256;

/// A function's 256-byte configuration space.
#[derive(Clone)]
pub struct PciConfig {
    regs: [u8; CONFIG_SIZE],
    wmask: [u8; CONFIG_SIZE],
    bars: [Option<BarSpec>; 6],
    /// Where the next capability goes (0 until the first is added).
    next_cap: usize,
}

/// Capabilities start here (after the type-0 header).
const CAP_START: usize = 0x40;

impl std::fmt::Debug for PciConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciConfig")
            .field("vendor", &format_args!("{:#06x}", self.read_u16(0)))
            .field("device", &format_args!("{:#06x}", self.read_u16(2)))
            .field("bars", &self.bars)
            .finish()
    }
}

impl PciConfig {
    /// A header-type-0 function with the given identity and class code.
    pub fn new(vendor: u16, device: u16, class: u8, subclass: u8, prog_if: u8) -> Self {
        let mut c = PciConfig {
            regs: [0; CONFIG_SIZE],
            wmask: [0; CONFIG_SIZE],
            bars: [None; 6],
            next_cap: 0,
        };
        c.regs[0..2].copy_from_slice(&vendor.to_le_bytes());
        c.regs[2..4].copy_from_slice(&device.to_le_bytes());
        c.regs[0x09] = prog_if;
        c.regs[0x0a] = subclass;
        c.regs[0x0b] = class;
        let cmd_mask = super::CMD_IO | super::CMD_MEM | super::CMD_MASTER | super::CMD_INTX_DISABLE;
        c.wmask[4..6].copy_from_slice(&cmd_mask.to_le_bytes());
        c.wmask[0x0c] = 0xff; // cache line size
        c.wmask[0x0d] = 0xff; // latency timer
        c.wmask[0x3c] = 0xff; // interrupt line
        c
    }

    /// Appends a capability of `len` bytes (id and next pointer included) to the capability
    /// list; returns its offset, or `None` if config space is full.
    pub fn add_capability(&mut self, id: u8, len: usize) -> Option<usize> {
        let off = if self.next_cap == 0 {
            CAP_START
        } else {
            self.next_cap
        };
        let end = off.checked_add(len.max(2))?.next_multiple_of(4);
        if end > CONFIG_SIZE {
            return None;
        }
        // Link from the header or the previous capability.
        let mut link = 0x34;
        while self.regs[link] != 0 {
            link = usize::from(self.regs[link]) + 1;
        }
        self.regs[link] = off as u8;
        self.regs[off] = id;
        self.regs[off + 1] = 0;
        self.regs[0x06] |= 0x10; // status: capability list
        self.next_cap = end;
        Some(off)
    }

    /// Sets raw bytes (device-side initialisation; ignores write masks).
    pub fn set_raw(&mut self, off: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            if let Some(r) = self.regs.get_mut(off + i) {
                *r = *b;
            }
        }
    }

    /// Sets which bits of `bytes.len()` bytes at `off` the guest may write.
    pub fn set_wmask(&mut self, off: usize, mask: &[u8]) {
        for (i, m) in mask.iter().enumerate() {
            if let Some(r) = self.wmask.get_mut(off + i) {
                *r = *m;
            }
        }
    }

    /// Sets the subsystem vendor/device ids.
    pub fn set_subsystem(&mut self, vendor: u16, device: u16) {
        self.regs[0x2c..0x2e].copy_from_slice(&vendor.to_le_bytes());
        self.regs[0x2e..0x30].copy_from_slice(&device.to_le_bytes());
    }

    /// Sets the interrupt pin (1 = INTA#) and the line firmware routed it to.
    pub fn set_interrupt(&mut self, pin: u8, line: u8) {
        self.regs[0x3d] = pin;
        self.regs[0x3c] = line;
    }

    /// Declares BAR `idx`. A 64-bit BAR also takes slot `idx + 1`.
    pub fn add_bar(&mut self, idx: usize, spec: BarSpec) -> Result<(), PciError> {
        let slots = if spec.kind == BarKind::Mmio64 { 2 } else { 1 };
        if idx + slots > 6
            || (idx..idx + slots).any(|i| self.bars[i].is_some() || self.is_bar_high(i))
        {
            return Err(PciError::BarSlot(idx));
        }
        let min = if spec.kind == BarKind::Io { 4 } else { 16 };
        let max = match spec.kind {
            BarKind::Io => 1 << 16,
            BarKind::Mmio32 => 1 << 31,
            BarKind::Mmio64 => 1 << 62,
        };
        if !spec.size.is_power_of_two() || spec.size < min || spec.size > max {
            return Err(PciError::BarSize(idx, spec.size));
        }
        self.bars[idx] = Some(spec);
        let flags = Self::bar_flags(&spec);
        self.regs[BAR0 + 4 * idx..BAR0 + 4 * idx + 4].copy_from_slice(&flags.to_le_bytes());
        Ok(())
    }

    fn is_bar_high(&self, idx: usize) -> bool {
        idx > 0
            && matches!(
                self.bars[idx - 1],
                Some(BarSpec {
                    kind: BarKind::Mmio64,
                    ..
                })
            )
    }

    fn bar_flags(spec: &BarSpec) -> u32 {
        match spec.kind {
            BarKind::Io => 1,
            BarKind::Mmio32 => u32::from(spec.prefetchable) << 3,
            BarKind::Mmio64 => 0b100 | u32::from(spec.prefetchable) << 3,
        }
    }

    /// The declared BARs.
    pub fn bars(&self) -> &[Option<BarSpec>; 6] {
        &self.bars
    }

    fn read_u16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.regs[off], self.regs[off + 1]])
    }

    fn read_u32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.regs[off..off + 4].try_into().unwrap_or([0; 4]))
    }

    /// Vendor id.
    pub fn vendor(&self) -> u16 {
        self.read_u16(0)
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.read_u16(4)
    }

    /// Programs BAR `idx` with `addr` (firmware-style assignment; low bits are masked).
    pub fn set_bar_addr(&mut self, idx: usize, addr: u64) {
        let Some(spec) = self.bars.get(idx).copied().flatten() else {
            return;
        };
        let v = (addr as u32 & !((spec.size as u32).wrapping_sub(1))) | Self::bar_flags(&spec);
        self.regs[BAR0 + 4 * idx..BAR0 + 4 * idx + 4].copy_from_slice(&v.to_le_bytes());
        if spec.kind == BarKind::Mmio64 {
            let j = idx + 1;
            self.regs[BAR0 + 4 * j..BAR0 + 4 * j + 4]
                .copy_from_slice(&((addr >> 32) as u32).to_le_bytes());
        }
    }

    /// Sets command-register bits as firmware would.
    pub fn enable(&mut self, bits: u16) {
        let v = self.command() | bits;
        self.regs[4..6].copy_from_slice(&v.to_le_bytes());
    }

    /// The address BAR `idx` holds now, whatever the command register says.
    pub fn bar_addr(&self, idx: usize) -> Option<u64> {
        let spec = self.bars.get(idx).copied().flatten()?;
        let lo = u64::from(self.read_u32(BAR0 + 4 * idx));
        Some(match spec.kind {
            BarKind::Io => lo & !0x3,
            BarKind::Mmio32 => lo & !0xf,
            BarKind::Mmio64 => (lo & !0xf) | u64::from(self.read_u32(BAR0 + 4 * (idx + 1))) << 32,
        })
    }

    /// The window BAR `idx` decodes now: `(kind, base, size)`, or `None` when the BAR does not
    /// exist, its decode is disabled in the command register, or it holds address 0.
    pub fn bar_window(&self, idx: usize) -> Option<(BarKind, u64, u64)> {
        let spec = self.bars.get(idx).copied().flatten()?;
        let bit = if spec.kind == BarKind::Io {
            super::CMD_IO
        } else {
            super::CMD_MEM
        };
        let addr = self.bar_addr(idx)?;
        (self.command() & bit != 0 && addr != 0).then_some((spec.kind, addr, spec.size))
    }

    /// Guest read of config space; accesses past the end read as all-ones.
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = self.regs.get(offset + i).copied().unwrap_or(0xff);
        }
    }

    /// Guest write of config space. Read-only bits keep their value; BARs keep their size bits
    /// and flag bits, so writing all-ones reads back the size mask.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            let off = offset + i;
            if off >= CONFIG_SIZE {
                break;
            }
            if (BAR0..BAR0 + 24).contains(&off) {
                self.write_bar_byte(off, b);
            } else {
                let m = self.wmask[off];
                self.regs[off] = (self.regs[off] & !m) | (b & m);
            }
        }
    }

    fn write_bar_byte(&mut self, off: usize, b: u8) {
        let idx = (off - BAR0) / 4;
        let (spec, high) = if self.is_bar_high(idx) {
            (self.bars[idx - 1], true)
        } else {
            (self.bars[idx], false)
        };
        let Some(spec) = spec else { return };
        let mask: u32 = if high {
            !(((spec.size - 1) >> 32) as u32)
        } else {
            let low_bits = if spec.kind == BarKind::Io { 0x3 } else { 0xf };
            !((spec.size.min(1 << 32) - 1) as u32 | low_bits)
        };
        let shift = 8 * ((off - BAR0) % 4);
        let mut v = self.read_u32(BAR0 + 4 * idx);
        v = (v & !(0xff << shift)) | (u32::from(b) << shift);
        v &= mask;
        if !high {
            v |= Self::bar_flags(&spec);
        }
        self.regs[BAR0 + 4 * idx..BAR0 + 4 * idx + 4].copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::{CMD_IO, CMD_MEM};

    fn rd32(c: &PciConfig, off: usize) -> u32 {
        let mut b = [0; 4];
        c.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn cfg() -> PciConfig {
        let mut c = PciConfig::new(0x1234, 0x5678, 0x03, 0x02, 0);
        c.add_bar(
            0,
            BarSpec {
                kind: BarKind::Mmio32,
                size: 0x1000,
                prefetchable: false,
            },
        )
        .unwrap();
        c.add_bar(
            1,
            BarSpec {
                kind: BarKind::Io,
                size: 0x20,
                prefetchable: false,
            },
        )
        .unwrap();
        c.add_bar(
            2,
            BarSpec {
                kind: BarKind::Mmio64,
                size: 0x2_0000_0000,
                prefetchable: true,
            },
        )
        .unwrap();
        c
    }

    #[test]
    fn identity_and_read_only_fields() {
        let mut c = cfg();
        assert_eq!(rd32(&c, 0), 0x5678_1234);
        c.write(0, &[0, 0, 0, 0]);
        assert_eq!(rd32(&c, 0), 0x5678_1234);
        assert_eq!(rd32(&c, 8) >> 8, 0x03_02_00);
        let mut b = [0u8; 4];
        c.read(254, &mut b);
        assert_eq!(b, [0, 0, 0xff, 0xff]);
    }

    #[test]
    fn bar_sizing_reads_back_size_masks() {
        let mut c = cfg();
        for i in 0..6 {
            c.write(0x10 + 4 * i, &[0xff; 4]);
        }
        assert_eq!(rd32(&c, 0x10), 0xffff_f000);
        assert_eq!(rd32(&c, 0x14), 0xffff_ffe1);
        assert_eq!(rd32(&c, 0x18), 0x0000_000c); // 8 GiB: no low address bits writable
        assert_eq!(rd32(&c, 0x1c), 0xffff_fffe);
        assert_eq!(rd32(&c, 0x20), 0);
        assert_eq!(rd32(&c, 0x24), 0);
    }

    #[test]
    fn bar_programming_and_decode_gating() {
        let mut c = cfg();
        c.write(0x10, &0xc000_1234u32.to_le_bytes());
        assert_eq!(c.bar_addr(0), Some(0xc000_1000));
        assert_eq!(c.bar_window(0), None, "memory decode is off");
        c.write(4, &CMD_MEM.to_le_bytes());
        assert_eq!(
            c.bar_window(0),
            Some((BarKind::Mmio32, 0xc000_1000, 0x1000))
        );
        assert_eq!(c.bar_window(1), None, "I/O decode is off");
        c.write(0x14, &0x1000u32.to_le_bytes());
        c.write(4, &(CMD_MEM | CMD_IO).to_le_bytes());
        assert_eq!(c.bar_window(1), Some((BarKind::Io, 0x1000, 0x20)));
        // Byte-wise programming of the 64-bit BAR.
        c.write(0x18, &[0x00]);
        c.write(0x1c, &[0x04, 0, 0, 0]);
        assert_eq!(c.bar_addr(2), Some(0x4_0000_0000));
        assert_eq!(
            c.bar_window(2),
            Some((BarKind::Mmio64, 0x4_0000_0000, 0x2_0000_0000))
        );
    }

    #[test]
    fn bad_bar_declarations() {
        let mut c = cfg();
        let s = BarSpec {
            kind: BarKind::Mmio32,
            size: 0x1000,
            prefetchable: false,
        };
        assert_eq!(c.add_bar(0, s), Err(PciError::BarSlot(0)));
        assert_eq!(
            c.add_bar(3, s),
            Err(PciError::BarSlot(3)),
            "high half of BAR2"
        );
        assert_eq!(c.add_bar(6, s), Err(PciError::BarSlot(6)));
        let bad = BarSpec { size: 0x1800, ..s };
        assert_eq!(c.add_bar(4, bad), Err(PciError::BarSize(4, 0x1800)));
        let b64 = BarSpec {
            kind: BarKind::Mmio64,
            size: 0x1000,
            prefetchable: false,
        };
        assert_eq!(c.add_bar(5, b64), Err(PciError::BarSlot(5)));
    }
}
