//! The VMM's address-space bus: one [`Bus`] for port I/O and one for MMIO, PCI configuration
//! space through ports 0xCF8/0xCFC ([`pci::PciRoot`]), PCI devices with BARs, and per-region
//! access counters that the overhead experiments read.
//!
//! Trap dispatch is lock-light: a lookup takes a read lock on the range map only long enough to
//! clone the handler, so a device may reprogram the bus (a BAR relocation) while other vCPUs
//! keep dispatching.

pub mod bus;
pub mod pci;

pub use bus::{Bus, BusDevice, BusError, BusHandler, RegionStats};
