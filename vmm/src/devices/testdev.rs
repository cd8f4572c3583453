//! The PCI test device (`--testdev`): identity and scratch registers behind a 32-bit MMIO BAR,
//! an I/O BAR and a 64-bit MMIO BAR, for bus tests and trap-cost benchmarks. Register map in
//! `guest_abi::testdev`.

use guest_abi::testdev::{DEVICE_ID, ID_VALUE, REG_ID, REG_READS, REG_SCRATCH, VENDOR_ID};
use mmio::pci::{BarKind, BarSpec, PciConfig, PciDevice, PciError};
use snapfmt::{Dec, Enc, Id};

use crate::persist::{Persist, PersistError};
use crate::snapshot::format::{DecodeError, tag};

/// See the module documentation.
pub struct TestDev {
    config: PciConfig,
    scratch: u32,
    reads: u32,
}

impl TestDev {
    pub fn new() -> Result<Self, PciError> {
        let mut config = PciConfig::new(VENDOR_ID, DEVICE_ID, 0xff, 0x00, 0x00);
        config.add_bar(
            0,
            BarSpec {
                kind: BarKind::Mmio32,
                size: 0x1000,
                prefetchable: false,
            },
        )?;
        config.add_bar(
            1,
            BarSpec {
                kind: BarKind::Io,
                size: 0x10,
                prefetchable: false,
            },
        )?;
        config.add_bar(
            2,
            BarSpec {
                kind: BarKind::Mmio64,
                size: 0x4000,
                prefetchable: false,
            },
        )?;
        Ok(TestDev {
            config,
            scratch: 0,
            reads: 0,
        })
    }

    fn reg_offset(bar: usize, offset: u64) -> u64 {
        if bar == 2 { offset & 0xf } else { offset }
    }
}

/// The scratch and read-counter registers (u32 each).
impl Persist for TestDev {
    type State = (u32, u32);
    const SECTION: Id = tag::TESTDEV;
    const VERSION: u32 = 1;

    fn save(&self) -> (u32, u32) {
        (self.scratch, self.reads)
    }

    fn restore(&mut self, &(scratch, reads): &(u32, u32)) -> Result<(), PersistError> {
        self.scratch = scratch;
        self.reads = reads;
        Ok(())
    }

    fn encode(&(scratch, reads): &(u32, u32), e: &mut Enc) {
        e.u32(scratch).u32(reads);
    }

    fn decode(d: &mut Dec<'_>) -> Result<(u32, u32), DecodeError> {
        let d = d.at("test device");
        Ok((d.u32()?, d.u32()?))
    }
}

impl PciDevice for TestDev {
    fn config(&self) -> &PciConfig {
        &self.config
    }
    fn config_mut(&mut self) -> &mut PciConfig {
        &mut self.config
    }

    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        self.reads = self.reads.wrapping_add(1);
        let v = match Self::reg_offset(bar, offset) & !3 {
            REG_ID => ID_VALUE,
            REG_SCRATCH => self.scratch,
            REG_READS => self.reads,
            _ => 0xffff_ffff,
        };
        let shift = (offset & 3) as usize;
        let bytes = v.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = bytes.get(shift + i).copied().unwrap_or(0);
        }
    }

    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if Self::reg_offset(bar, offset) == REG_SCRATCH && data.len() == 4 {
            self.scratch = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        }
    }
}
