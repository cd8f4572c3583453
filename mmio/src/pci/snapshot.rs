//! Saving and restoring the PCI root complex for VM snapshots: the configuration-address latch
//! and the 256 configuration bytes of every function. A restore writes the saved bytes through
//! the guest's write path (read-only bits, a device's identity and its BAR size bits stay this
//! build's), then maps BARs as the guest had programmed them, so that every device gets its
//! `bar_moved` and `config_written` calls.

use super::Bdf;
use super::config::{CONFIG_SIZE, PciConfig};
use super::root::PciRoot;

/// Saved configuration space of one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionState {
    /// Device/function byte on bus 0.
    pub devfn: u8,
    /// The name the function was added under ("host-bridge", "vgpu", ...).
    pub name: String,
    /// The whole configuration space.
    pub config: [u8; CONFIG_SIZE],
}

/// Saved state of a [`PciRoot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciRootState {
    /// The configuration address latch (port 0xCF8).
    pub address: u32,
    /// Every function, ordered by devfn.
    pub functions: Vec<FunctionState>,
}

/// Why a saved PCI state does not fit this VM.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PciRestoreError {
    #[error("the snapshot has PCI functions [{saved}], this VM has [{here}]")]
    Functions { saved: String, here: String },
    #[error(
        "PCI {bdf} {name}: the snapshot's function is {saved_id:08x} class {saved_class:06x}, \
         this VM's {here_id:08x} class {here_class:06x}"
    )]
    Identity {
        bdf: Bdf,
        name: String,
        saved_id: u32,
        saved_class: u32,
        here_id: u32,
        here_class: u32,
    },
}

fn id_class(cfg: &[u8; CONFIG_SIZE]) -> (u32, u32) {
    let id = u32::from_le_bytes([cfg[0], cfg[1], cfg[2], cfg[3]]);
    let class = u32::from_le_bytes([cfg[9], cfg[10], cfg[11], 0]);
    (id, class)
}

impl PciConfig {
    /// The configuration bytes as the guest reads them.
    pub fn bytes(&self) -> [u8; CONFIG_SIZE] {
        let mut b = [0u8; CONFIG_SIZE];
        self.read(0, &mut b);
        b
    }
}

fn list(names: impl Iterator<Item = (u8, String)>) -> String {
    names
        .map(|(devfn, n)| {
            format!(
                "{} {n}",
                Bdf {
                    dev: devfn >> 3,
                    func: devfn & 7
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl PciRoot {
    /// The root's state: the address latch and every function's configuration space.
    pub fn save(&self) -> PciRootState {
        PciRootState {
            address: self.address,
            functions: self
                .slots
                .iter()
                .map(|(&devfn, s)| FunctionState {
                    devfn,
                    name: s.name.clone(),
                    config: super::root::lock(&s.dev).config().bytes(),
                })
                .collect(),
        }
    }

    /// Restores `state` onto this root, whose functions must be the saved ones (same slots,
    /// names and identities); checks everything before changing anything. BARs are unmapped,
    /// the saved bytes written as guest writes, and the BARs mapped where they now point.
    pub fn restore(&mut self, state: &PciRootState) -> Result<(), PciRestoreError> {
        let same = state.functions.len() == self.slots.len()
            && state
                .functions
                .iter()
                .zip(&self.slots)
                .all(|(f, (&devfn, s))| f.devfn == devfn && f.name == s.name);
        if !same {
            return Err(PciRestoreError::Functions {
                saved: list(state.functions.iter().map(|f| (f.devfn, f.name.clone()))),
                here: list(self.slots.iter().map(|(&d, s)| (d, s.name.clone()))),
            });
        }
        for f in &state.functions {
            let slot = &self.slots[&f.devfn];
            let here = super::root::lock(&slot.dev).config().bytes();
            let (saved_id, saved_class) = id_class(&f.config);
            let (here_id, here_class) = id_class(&here);
            if (saved_id, saved_class) != (here_id, here_class) {
                return Err(PciRestoreError::Identity {
                    bdf: Bdf {
                        dev: f.devfn >> 3,
                        func: f.devfn & 7,
                    },
                    name: f.name.clone(),
                    saved_id,
                    saved_class,
                    here_id,
                    here_class,
                });
            }
        }
        // Unmap everything first, so that BARs the guest swapped between devices never collide.
        for f in &state.functions {
            let slot = &self.slots[&f.devfn];
            let mut d = super::root::lock(&slot.dev);
            let cmd = d.config().command();
            let off = cmd & !(super::CMD_IO | super::CMD_MEM);
            d.config_mut().write(4, &off.to_le_bytes());
            drop(d);
            self.sync_bars(f.devfn);
        }
        for f in &state.functions {
            {
                let slot = &self.slots[&f.devfn];
                let mut d = super::root::lock(&slot.dev);
                d.config_mut().write(0, &f.config);
                d.config_written(0, CONFIG_SIZE);
            }
            self.sync_bars(f.devfn);
        }
        self.address = state.address;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::bus::{Bus, BusDevice};
    use crate::pci::{BarKind, BarSpec, PciDevice, PciWindows};

    struct Dev {
        cfg: PciConfig,
        moved: Vec<(usize, Option<u64>)>,
        written: usize,
    }
    impl PciDevice for Dev {
        fn config(&self) -> &PciConfig {
            &self.cfg
        }
        fn config_mut(&mut self) -> &mut PciConfig {
            &mut self.cfg
        }
        fn bar_read(&mut self, bar: usize, _: u64, data: &mut [u8]) {
            data.fill(bar as u8 + 1);
        }
        fn bar_write(&mut self, _: usize, _: u64, _: &[u8]) {}
        fn config_written(&mut self, _: usize, _: usize) {
            self.written += 1;
        }
        fn bar_moved(&mut self, bar: usize, addr: Option<u64>) {
            self.moved.push((bar, addr));
        }
    }

    fn root(device: u16) -> (PciRoot, Arc<Bus>, Arc<Mutex<Dev>>) {
        let mmio = Arc::new(Bus::new("mmio"));
        let pio = Arc::new(Bus::new("pio"));
        let windows = PciWindows {
            mmio32: 0xc000_0000..0xfec0_0000,
            mmio64: 0x100_0000_0000..0x200_0000_0000,
            pio: 0x1000..0x10000,
        };
        let mut root = PciRoot::new(mmio.clone(), pio, windows);
        let mut cfg = PciConfig::new(0x1234, device, 0xff, 0, 0);
        let spec = |kind, size| BarSpec {
            kind,
            size,
            prefetchable: false,
        };
        cfg.add_bar(0, spec(BarKind::Mmio32, 0x1000)).unwrap();
        cfg.add_bar(2, spec(BarKind::Mmio64, 0x4000)).unwrap();
        cfg.add_msi().unwrap();
        let dev = Arc::new(Mutex::new(Dev {
            cfg,
            moved: vec![],
            written: 0,
        }));
        root.add_device("t", dev.clone()).unwrap();
        (root, mmio, dev)
    }

    fn cfg_write(root: &mut PciRoot, reg: u32, val: u32) {
        root.write(0, &(0x8000_0800 | reg).to_le_bytes());
        root.write(4, &val.to_le_bytes());
    }

    #[test]
    fn restore_moves_bars_and_config_like_the_guest_did() {
        let (mut a, _, _) = root(0x7e57);
        // The guest moves BAR0 and BAR2, enables MSI and leaves the latch pointing somewhere.
        cfg_write(&mut a, 0x04, 0);
        cfg_write(&mut a, 0x10, 0xd000_0000);
        cfg_write(&mut a, 0x18, 0x0000_0000);
        cfg_write(&mut a, 0x1c, 0x180);
        cfg_write(&mut a, 0x04, 0x6);
        cfg_write(&mut a, 0x40, 0x0001_0000); // MSI enable (message control bit 0)
        a.write(0, &0x8000_0810u32.to_le_bytes());
        let saved = a.save();

        let (mut b, mmio, dev) = root(0x7e57);
        dev.lock().unwrap().moved.clear();
        b.restore(&saved).unwrap();
        assert_eq!(b.save(), saved);
        let mut x = [0u8; 1];
        assert!(mmio.read(0xd000_0000, &mut x) && x[0] == 1);
        assert!(!mmio.read(0xc000_0000, &mut x), "old BAR0 unmapped");
        assert!(mmio.read(0x180_0000_0000, &mut x) && x[0] == 3);
        let d = dev.lock().unwrap();
        assert!(d.moved.contains(&(0, Some(0xd000_0000))), "{:?}", d.moved);
        assert!(
            d.moved.contains(&(2, Some(0x180_0000_0000))),
            "{:?}",
            d.moved
        );
        assert!(d.written > 0);
        assert!(d.cfg.msi_message(0x40).is_some(), "MSI enable restored");
        // The latch came back: a data read hits BAR0's register of device 1.
        drop(d);
        let mut w = [0u8; 4];
        b.read(4, &mut w);
        assert_eq!(u32::from_le_bytes(w), 0xd000_0000);
    }

    #[test]
    fn restore_refuses_other_devices_and_keeps_read_only_bits() {
        let (a, _, _) = root(0x7e57);
        let saved = a.save();
        let (mut other, _, _) = root(0x1111);
        assert!(matches!(
            other.restore(&saved),
            Err(PciRestoreError::Identity { .. })
        ));
        let mut fewer = saved.clone();
        fewer.functions.pop();
        let (mut b, _, _) = root(0x7e57);
        assert!(matches!(
            b.restore(&fewer),
            Err(PciRestoreError::Functions { .. })
        ));
        // A hostile file cannot change read-only bits: the status register and BAR flags.
        let mut evil = saved.clone();
        evil.functions[1].config[0x06] = 0xff;
        evil.functions[1].config[0x10] = 0xff;
        b.restore(&evil).unwrap();
        let now = b.save();
        assert_eq!(
            now.functions[1].config[0x06],
            saved.functions[1].config[0x06]
        );
        assert_eq!(now.functions[1].config[0x10] & 0xf, 0);
    }
}
