//! PCI: type-0 configuration space with BARs ([`PciConfig`]), the device trait the bus calls
//! ([`PciDevice`]), and the root complex ([`PciRoot`]) that serves ports 0xCF8/0xCFC, owns the
//! host bridge at 00:00.0, assigns BARs like firmware would, and keeps the MMIO/PIO buses in
//! step with what the guest programs into BARs and the command register; [`PciRootState`] saves
//! and restores all of it for VM snapshots.

mod config;
mod msi;
mod root;
mod snapshot;

pub use config::{BarKind, BarSpec, PciConfig, PciError};
pub use msi::{CAP_ID_MSI, MsiMessage};
pub use root::{CONFIG_ADDRESS_PORT, CONFIG_PORTS_LEN, PciRoot, PciWindows};
pub use snapshot::{FunctionState, PciRestoreError, PciRootState};

/// Command register bit: I/O space decode.
pub const CMD_IO: u16 = 1 << 0;
/// Command register bit: memory space decode.
pub const CMD_MEM: u16 = 1 << 1;
/// Command register bit: bus master (DMA) enable.
pub const CMD_MASTER: u16 = 1 << 2;
/// Command register bit: INTx disable.
pub const CMD_INTX_DISABLE: u16 = 1 << 10;

/// A PCI function as the root complex sees it.
pub trait PciDevice: Send {
    /// The device's configuration space.
    fn config(&self) -> &PciConfig;
    /// Mutable configuration space (the root writes guest config accesses through it).
    fn config_mut(&mut self) -> &mut PciConfig;
    /// Guest read of a BAR region; `offset` is relative to the BAR's base.
    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]);
    /// Guest write to a BAR region.
    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]);
    /// Called after the guest wrote `len` bytes of config space at `offset`.
    fn config_written(&mut self, _offset: usize, _len: usize) {}
    /// Called when a BAR starts decoding at a guest address (`Some`) or stops (`None`).
    fn bar_moved(&mut self, _bar: usize, _addr: Option<u64>) {}
}

/// Bus/device/function of a PCI function on bus 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bdf {
    pub dev: u8,
    pub func: u8,
}

impl Bdf {
    /// The device/function byte (`dev << 3 | func`).
    pub fn devfn(self) -> u8 {
        (self.dev << 3) | self.func
    }
}

impl std::fmt::Display for Bdf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "00:{:02x}.{}", self.dev, self.func)
    }
}
