//! The PCI root complex: configuration mechanism #1 on ports 0xCF8 (address) and 0xCFC-0xCFF
//! (data), a host bridge at 00:00.0, firmware-style BAR assignment, and BAR mapping on the
//! MMIO/PIO buses that follows every guest change of a BAR or of the command register.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use super::config::{BarKind, PciConfig, PciError};
use super::{Bdf, CMD_IO, CMD_MEM, PciDevice};
use crate::bus::{Bus, BusDevice, BusHandler};

/// Guest-physical windows BARs may decode in (anything else is left unmapped).
#[derive(Debug, Clone)]
pub struct PciWindows {
    /// 32-bit MMIO window (below 4 GiB).
    pub mmio32: Range<u64>,
    /// 64-bit MMIO window (above RAM).
    pub mmio64: Range<u64>,
    /// I/O port window.
    pub pio: Range<u64>,
}

type SharedPci = Arc<Mutex<dyn PciDevice>>;

pub(super) fn lock(dev: &SharedPci) -> std::sync::MutexGuard<'_, dyn PciDevice + 'static> {
    dev.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bus handler for one BAR of one device.
struct BarHandler {
    pub(super) dev: SharedPci,
    bar: usize,
}

impl BusHandler for BarHandler {
    fn read(&self, offset: u64, data: &mut [u8]) {
        lock(&self.dev).bar_read(self.bar, offset, data)
    }
    fn write(&self, offset: u64, data: &[u8]) {
        lock(&self.dev).bar_write(self.bar, offset, data)
    }
}

pub(super) struct Slot {
    pub(super) name: String,
    pub(super) dev: SharedPci,
    /// What each BAR is mapped at on its bus now: (kind, base, size).
    mapped: [Option<(BarKind, u64, u64)>; 6],
}

/// The host bridge at 00:00.0 (no BARs).
struct HostBridge(PciConfig);

impl PciDevice for HostBridge {
    fn config(&self) -> &PciConfig {
        &self.0
    }
    fn config_mut(&mut self) -> &mut PciConfig {
        &mut self.0
    }
    fn bar_read(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff)
    }
    fn bar_write(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
}

/// Root complex of bus 0. Register it on the PIO bus at 0xCF8 with length 8.
pub struct PciRoot {
    pub(super) address: u32,
    pub(super) slots: BTreeMap<u8, Slot>,
    mmio: Arc<Bus>,
    pio: Arc<Bus>,
    windows: PciWindows,
    next_mmio32: u64,
    next_mmio64: u64,
    next_pio: u64,
}

impl std::fmt::Debug for PciRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciRoot")
            .field("devices", &self.slots.len())
            .finish_non_exhaustive()
    }
}

/// Base of the configuration address port.
pub const CONFIG_ADDRESS_PORT: u64 = 0xcf8;
/// Ports the root decodes from [`CONFIG_ADDRESS_PORT`]: address (4) and data (4).
pub const CONFIG_PORTS_LEN: u64 = 8;

impl PciRoot {
    /// A root complex with a host bridge at 00:00.0 (vendor 0x8086, device 0x0d57, class
    /// 06:00:00), mapping BARs on `mmio` and `pio` within `windows`.
    pub fn new(mmio: Arc<Bus>, pio: Arc<Bus>, windows: PciWindows) -> Self {
        let mut root = PciRoot {
            address: 0,
            slots: BTreeMap::new(),
            mmio,
            pio,
            next_mmio32: windows.mmio32.start,
            next_mmio64: windows.mmio64.start,
            next_pio: windows.pio.start,
            windows,
        };
        let bridge = HostBridge(PciConfig::new(0x8086, 0x0d57, 0x06, 0x00, 0x00));
        root.slots.insert(
            0,
            Slot {
                name: "host-bridge".into(),
                dev: Arc::new(Mutex::new(bridge)),
                mapped: [None; 6],
            },
        );
        root
    }

    /// Adds a device at the next free device number, assigns its BARs from the windows, enables
    /// decode (as firmware does) and maps them. Returns its address.
    pub fn add_device(&mut self, name: &str, dev: SharedPci) -> Result<Bdf, PciError> {
        let devno = (1..32u8)
            .find(|d| !self.slots.contains_key(&(d << 3)))
            .ok_or(PciError::NoSlot)?;
        let bdf = Bdf {
            dev: devno,
            func: 0,
        };
        {
            let mut d = lock(&dev);
            let bars = *d.config().bars();
            let mut enable = 0;
            for (i, spec) in bars.iter().enumerate() {
                let Some(spec) = spec else { continue };
                let (next, window) = match spec.kind {
                    BarKind::Mmio32 => (&mut self.next_mmio32, &self.windows.mmio32),
                    BarKind::Mmio64 => (&mut self.next_mmio64, &self.windows.mmio64),
                    BarKind::Io => (&mut self.next_pio, &self.windows.pio),
                };
                let base = next.next_multiple_of(spec.size);
                let end = base.checked_add(spec.size).filter(|e| *e <= window.end);
                let Some(end) = end else {
                    return Err(PciError::NoSpace {
                        name: name.into(),
                        bar: i,
                        size: spec.size,
                    });
                };
                *next = end;
                d.config_mut().set_bar_addr(i, base);
                enable |= if spec.kind == BarKind::Io {
                    CMD_IO
                } else {
                    CMD_MEM
                };
            }
            d.config_mut().enable(enable);
        }
        self.slots.insert(
            bdf.devfn(),
            Slot {
                name: name.into(),
                dev,
                mapped: [None; 6],
            },
        );
        self.sync_bars(bdf.devfn());
        log::info!("pci: {bdf} {name}");
        Ok(bdf)
    }

    fn window_ok(&self, kind: BarKind, base: u64, size: u64) -> bool {
        let Some(end) = base.checked_add(size) else {
            return false;
        };
        let inside = |w: &Range<u64>| base >= w.start && end <= w.end;
        match kind {
            BarKind::Io => inside(&self.windows.pio),
            BarKind::Mmio32 | BarKind::Mmio64 => {
                inside(&self.windows.mmio32) || inside(&self.windows.mmio64)
            }
        }
    }

    /// Brings the bus mappings of device `devfn` in line with its BARs and command register.
    pub(super) fn sync_bars(&mut self, devfn: u8) {
        let Some(slot) = self.slots.get(&devfn) else {
            return;
        };
        let dev = slot.dev.clone();
        let wanted: Vec<_> = {
            let d = lock(&dev);
            (0..6).map(|i| d.config().bar_window(i)).collect()
        };
        let bdf = Bdf {
            dev: devfn >> 3,
            func: devfn & 7,
        };
        for (i, want) in wanted.into_iter().enumerate() {
            let Some(slot) = self.slots.get(&devfn) else {
                return;
            };
            let have = slot.mapped[i];
            let want = want.filter(|&(k, b, s)| {
                let ok = self.window_ok(k, b, s);
                if !ok && have != Some((k, b, s)) {
                    log::debug!(
                        "pci: {bdf} BAR{i} at {b:#x} is outside the PCI windows; not decoded"
                    );
                }
                ok
            });
            if have == want {
                continue;
            }
            let name = format!("{bdf} {} BAR{i}", slot.name);
            let bus_of = |k: BarKind| {
                if k == BarKind::Io {
                    &self.pio
                } else {
                    &self.mmio
                }
            };
            if let Some((k, b, _)) = have
                && let Err(e) = bus_of(k).remove(b)
            {
                log::error!("pci: {name}: {e}");
            }
            let mut now = None;
            if let Some((k, b, s)) = want {
                let handler = Arc::new(BarHandler {
                    dev: dev.clone(),
                    bar: i,
                });
                match bus_of(k).insert(&name, b, s, handler) {
                    Ok(()) => now = want,
                    Err(e) => log::warn!("pci: {name} not decoded: {e}"),
                }
            }
            if let Some(slot) = self.slots.get_mut(&devfn) {
                slot.mapped[i] = now;
            }
            lock(&dev).bar_moved(i, now.map(|(_, b, _)| b));
        }
    }

    fn target(&self) -> Option<(u8, usize)> {
        let a = self.address;
        let enabled = a & 0x8000_0000 != 0;
        let bus = (a >> 16) & 0xff;
        (enabled && bus == 0).then_some((((a >> 8) & 0xff) as u8, (a & 0xfc) as usize))
    }
}

impl BusDevice for PciRoot {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset < 4 {
            let bytes = self.address.to_le_bytes();
            for (i, b) in data.iter_mut().enumerate() {
                *b = bytes.get(offset as usize + i).copied().unwrap_or(0xff);
            }
            return;
        }
        let reg_off = (offset - 4) as usize;
        match self
            .target()
            .and_then(|(devfn, reg)| self.slots.get(&devfn).map(|s| (s, reg)))
        {
            Some((slot, reg)) => lock(&slot.dev).config().read(reg + reg_off, data),
            None => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset < 4 {
            let mut bytes = self.address.to_le_bytes();
            for (i, b) in data.iter().enumerate() {
                if let Some(slot) = bytes.get_mut(offset as usize + i) {
                    *slot = *b;
                }
            }
            self.address = u32::from_le_bytes(bytes);
            return;
        }
        let Some((devfn, reg)) = self.target() else {
            return;
        };
        let Some(slot) = self.slots.get(&devfn) else {
            return;
        };
        let off = reg + (offset - 4) as usize;
        {
            let mut d = lock(&slot.dev);
            d.config_mut().write(off, data);
            d.config_written(off, data.len());
        }
        let touches = |lo: usize, hi: usize| off < hi && off + data.len() > lo;
        if touches(0x04, 0x06) || touches(0x10, 0x28) {
            self.sync_bars(devfn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::BarSpec;

    struct Dev {
        cfg: PciConfig,
        moved: Vec<(usize, Option<u64>)>,
    }
    impl PciDevice for Dev {
        fn config(&self) -> &PciConfig {
            &self.cfg
        }
        fn config_mut(&mut self) -> &mut PciConfig {
            &mut self.cfg
        }
        fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill((bar as u8) << 4 | offset as u8);
        }
        fn bar_write(&mut self, _: usize, _: u64, _: &[u8]) {}
        fn bar_moved(&mut self, bar: usize, addr: Option<u64>) {
            self.moved.push((bar, addr));
        }
    }

    fn setup() -> (PciRoot, Arc<Bus>, Arc<Bus>, Arc<Mutex<Dev>>) {
        let mmio = Arc::new(Bus::new("mmio"));
        let pio = Arc::new(Bus::new("pio"));
        let windows = PciWindows {
            mmio32: 0xc000_0000..0xfec0_0000,
            mmio64: 0x100_0000_0000..0x200_0000_0000,
            pio: 0x1000..0x10000,
        };
        let mut root = PciRoot::new(mmio.clone(), pio.clone(), windows);
        let mut cfg = PciConfig::new(0x1234, 0x7e57, 0xff, 0, 0);
        cfg.add_bar(
            0,
            BarSpec {
                kind: BarKind::Mmio32,
                size: 0x1000,
                prefetchable: false,
            },
        )
        .unwrap();
        cfg.add_bar(
            1,
            BarSpec {
                kind: BarKind::Io,
                size: 0x10,
                prefetchable: false,
            },
        )
        .unwrap();
        cfg.add_bar(
            2,
            BarSpec {
                kind: BarKind::Mmio64,
                size: 0x4000,
                prefetchable: false,
            },
        )
        .unwrap();
        let dev = Arc::new(Mutex::new(Dev { cfg, moved: vec![] }));
        assert_eq!(
            root.add_device("t", dev.clone()).unwrap(),
            Bdf { dev: 1, func: 0 }
        );
        (root, mmio, pio, dev)
    }

    fn cfg_write(root: &mut PciRoot, dev: u8, reg: u32, val: u32) {
        root.write(0, &(0x8000_0000 | u32::from(dev) << 11 | reg).to_le_bytes());
        root.write(4, &val.to_le_bytes());
    }

    fn cfg_read(root: &mut PciRoot, dev: u8, reg: u32) -> u32 {
        root.write(
            0,
            &(0x8000_0000 | u32::from(dev) << 11 | (reg & !3)).to_le_bytes(),
        );
        let mut b = [0u8; 4];
        root.read(4, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn enumeration_through_ports() {
        let (mut root, ..) = setup();
        assert_eq!(cfg_read(&mut root, 0, 0), 0x0d57_8086);
        assert_eq!(cfg_read(&mut root, 1, 0), 0x7e57_1234);
        assert_eq!(cfg_read(&mut root, 2, 0), 0xffff_ffff, "empty slot");
        // Byte access through 0xCFE reads the device id's low byte.
        root.write(0, &0x8000_0800u32.to_le_bytes());
        let mut b = [0u8; 1];
        root.read(6, &mut b);
        assert_eq!(b[0], 0x57);
        // Bus 1 does not exist.
        root.write(0, &0x8001_0000u32.to_le_bytes());
        let mut w = [0u8; 4];
        root.read(4, &mut w);
        assert_eq!(w, [0xff; 4]);
    }

    #[test]
    fn firmware_assignment_maps_bars() {
        let (mut root, mmio, pio, _) = setup();
        assert_eq!(cfg_read(&mut root, 1, 0x10), 0xc000_0000);
        assert_eq!(cfg_read(&mut root, 1, 0x14), 0x1001);
        assert_eq!(cfg_read(&mut root, 1, 0x18), 0x4);
        assert_eq!(cfg_read(&mut root, 1, 0x1c), 0x100);
        let mut b = [0u8; 1];
        assert!(mmio.read(0xc000_0003, &mut b));
        assert_eq!(b[0], 0x03);
        assert!(pio.read(0x1002, &mut b));
        assert_eq!(b[0], 0x12);
        assert!(mmio.read(0x100_0000_0001, &mut b));
        assert_eq!(b[0], 0x21);
    }

    #[test]
    fn relocation_and_command_gating() {
        let (mut root, mmio, _, dev) = setup();
        // Size probe then relocate, with decode disabled meanwhile as Linux does.
        cfg_write(&mut root, 1, 0x04, 0);
        let mut b = [0u8; 1];
        assert!(!mmio.read(0xc000_0000, &mut b), "decode off");
        cfg_write(&mut root, 1, 0x10, 0xffff_ffff);
        assert_eq!(cfg_read(&mut root, 1, 0x10), 0xffff_f000);
        cfg_write(&mut root, 1, 0x10, 0xd000_0000);
        cfg_write(&mut root, 1, 0x04, u32::from(CMD_MEM | CMD_IO));
        assert!(mmio.read(0xd000_0010, &mut b));
        assert!(!mmio.read(0xc000_0010, &mut b));
        // Relocate while decoding: the mapping follows at once.
        cfg_write(&mut root, 1, 0x10, 0xd010_0000);
        assert!(mmio.read(0xd010_0000, &mut b));
        assert!(!mmio.read(0xd000_0000, &mut b));
        let moved = &dev.lock().unwrap().moved;
        assert!(moved.contains(&(0, None)) && moved.contains(&(0, Some(0xd010_0000))));
        // The counters stayed with the BAR across moves.
        let row = mmio
            .stats()
            .into_iter()
            .find(|r| r.name.ends_with("BAR0"))
            .unwrap();
        assert_eq!((row.reads, row.base), (2, Some(0xd010_0000)));
    }

    #[test]
    fn bar_outside_window_or_overlapping_is_not_decoded() {
        let (mut root, mmio, _, _) = setup();
        // Onto the 64-bit BAR's range? It lives at 1 TiB; put BAR0 into guest RAM instead.
        cfg_write(&mut root, 1, 0x10, 0x0010_0000);
        let mut b = [0u8; 1];
        assert!(!mmio.read(0x0010_0000, &mut b));
        assert!(!mmio.read(0xc000_0000, &mut b));
        // Another device whose BAR the guest moves onto the first one's.
        let mut cfg = PciConfig::new(0x1234, 0x1111, 0xff, 0, 0);
        cfg.add_bar(
            0,
            BarSpec {
                kind: BarKind::Mmio32,
                size: 0x1000,
                prefetchable: false,
            },
        )
        .unwrap();
        root.add_device("u", Arc::new(Mutex::new(Dev { cfg, moved: vec![] })))
            .unwrap();
        cfg_write(&mut root, 1, 0x10, 0xc000_0000);
        let u_base = u64::from(cfg_read(&mut root, 2, 0x10));
        cfg_write(&mut root, 2, 0x10, 0xc000_0000);
        assert!(mmio.read(0xc000_0000, &mut b));
        assert_eq!(b[0], 0x00, "first device keeps its decode");
        assert!(
            !mmio.read(u_base, &mut b),
            "second device's BAR is not decoded"
        );
    }
}
