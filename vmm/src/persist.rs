//! The one state contract of the VM's devices (Firecracker's `Persist`, Cloud Hypervisor's
//! `Snapshottable`): a device says which section of the state file holds it (id and version),
//! saves a typed state, restores a freshly created self from one, and encodes and decodes that
//! state as a section payload ([`snapfmt::Dec`]: bounded, hostile bytes). The controller keeps
//! the VM's devices as [`DeviceSnapshot`] objects and loops over them to save; a restore loops
//! over the same list to put each section back ([`restore_all`]); [`check_section`] decodes a
//! device section when a snapshot is loaded, before any VM is built.
//!
//! Implementations: the UART (`devices::serial`), the CMOS (`linux::cmos`), the PCI test device
//! (`devices::testdev`), the virtio-blk disks (`disk::state`, one section each: devices of one
//! id are paired with that id's sections in order) and the PCI root (here: `mmio` knows
//! nothing of snapshots files). The
//! virtual GPU's state is an image streamed to its own file (`gpu.bin`, VRAM included); it has
//! the same shape through `vgpu::Vgpu::{save, restore}` and is restored last (vm.rs).

use std::sync::{Mutex, PoisonError};

use mmio::pci::{FunctionState, PciRoot, PciRootState};
use snapfmt::{Dec, Enc, FrameError, Id};

use crate::snapshot::format::{DecodeError, tag};

/// Why a saved state does not go back into a device.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("the UART state: {0}")]
    Serial(String),
    #[error(transparent)]
    Pci(#[from] mmio::pci::PciRestoreError),
    #[error(transparent)]
    Disk(#[from] crate::disk::state::StateError),
    #[error("section {0}: {1}")]
    Decode(String, DecodeError),
    #[error("the snapshot has {0} state, which this VM has no device for")]
    NoDevice(String),
    #[error("the snapshot has no {0} state, which this VM's device needs")]
    NoState(String),
}

/// A device's part of a snapshot.
pub trait Persist {
    /// What is saved.
    type State;
    /// The state file section that holds it.
    const SECTION: Id;
    /// The section's version (bumped whenever `encode`'s bytes change).
    const VERSION: u32;
    /// The device's state (the VM paused).
    fn save(&self) -> Self::State;
    /// Puts `state` into this freshly created device.
    fn restore(&mut self, state: &Self::State) -> Result<(), PersistError>;
    /// The section payload of `state`.
    fn encode(state: &Self::State, out: &mut Enc);
    /// A state from a hostile payload (every byte consumed).
    fn decode(d: &mut Dec<'_>) -> Result<Self::State, DecodeError>;
}

/// One device section of the state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSection {
    pub id: Id,
    pub version: u32,
    pub payload: Vec<u8>,
}

/// A device as the controller sees it: a section to save and to restore.
pub trait DeviceSnapshot: Send + Sync {
    /// Its section id.
    fn id(&self) -> Id;
    /// Its saved state as a section.
    fn save_section(&self) -> DeviceSection;
    /// Puts a section back.
    fn restore_section(&self, s: &DeviceSection) -> Result<(), PersistError>;
}

impl<T: Persist + Send> DeviceSnapshot for Mutex<T> {
    fn id(&self) -> Id {
        T::SECTION
    }

    fn save_section(&self) -> DeviceSection {
        let state = self.lock().unwrap_or_else(PoisonError::into_inner).save();
        DeviceSection {
            id: T::SECTION,
            version: T::VERSION,
            payload: encode::<T>(&state),
        }
    }

    fn restore_section(&self, s: &DeviceSection) -> Result<(), PersistError> {
        let state = decode::<T>(s.version, &s.payload)
            .map_err(|e| PersistError::Decode(snapfmt::id_name(s.id), e))?;
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .restore(&state)
    }
}

/// `state`'s section payload.
pub fn encode<T: Persist>(state: &T::State) -> Vec<u8> {
    let mut e = Enc::default();
    T::encode(state, &mut e);
    e.0
}

/// A state from a section of `version`.
pub fn decode<T: Persist>(version: u32, payload: &[u8]) -> Result<T::State, DecodeError> {
    if version != T::VERSION {
        return Err(FrameError::SectionVersion {
            id: snapfmt::id_name(T::SECTION),
            found: version,
            want: T::VERSION,
        }
        .into());
    }
    let mut d = Dec::new(payload, "device state");
    let s = T::decode(&mut d)?;
    d.end()?;
    Ok(s)
}

/// Decodes a device section of a state file being loaded (every device type the VMM has), so
/// that a bad one is refused before any VM is built.
pub fn check_section(s: &DeviceSection) -> Result<(), DecodeError> {
    fn check<T: Persist>(s: &DeviceSection) -> Result<(), DecodeError> {
        decode::<T>(s.version, &s.payload).map(drop)
    }
    match s.id {
        tag::SERIAL => check::<crate::devices::serial::SerialDevice>(s),
        tag::CMOS => check::<crate::linux::cmos::Cmos>(s),
        tag::PCI => check::<PciRoot>(s),
        tag::TESTDEV => check::<crate::devices::testdev::TestDev>(s),
        tag::DISK => check::<crate::disk::device::BlockDevice>(s),
        id => Err(DecodeError::UnknownTag(snapfmt::id_name(id))),
    }
}

/// Restores every device of `devices` from its section of `sections`: each device must find
/// its section, and each section its device (the n-th device of an id takes the n-th section
/// of that id: several disks).
pub fn restore_all(
    devices: &[&dyn DeviceSnapshot],
    sections: &[DeviceSection],
) -> Result<(), PersistError> {
    let count = |id: Id| devices.iter().filter(|d| d.id() == id).count();
    for (i, s) in sections.iter().enumerate() {
        let before = sections[..i].iter().filter(|o| o.id == s.id).count();
        if before >= count(s.id) {
            return Err(PersistError::NoDevice(snapfmt::id_name(s.id)));
        }
    }
    for (i, d) in devices.iter().enumerate() {
        let before = devices[..i].iter().filter(|o| o.id() == d.id()).count();
        let s = sections
            .iter()
            .filter(|s| s.id == d.id())
            .nth(before)
            .ok_or_else(|| PersistError::NoState(snapfmt::id_name(d.id())))?;
        d.restore_section(s)?;
    }
    Ok(())
}

/// Most PCI functions on bus 0.
const MAX_FUNCTIONS: usize = 256;
/// Longest PCI function name.
const MAX_NAME: usize = 64;

/// The PCI root: the configuration-address latch and every function's configuration space
/// (functions must match on restore; BARs are placed again through the guest write path).
impl Persist for PciRoot {
    type State = PciRootState;
    const SECTION: Id = tag::PCI;
    const VERSION: u32 = 1;

    fn save(&self) -> PciRootState {
        PciRoot::save(self)
    }

    fn restore(&mut self, state: &PciRootState) -> Result<(), PersistError> {
        Ok(PciRoot::restore(self, state)?)
    }

    fn encode(s: &PciRootState, e: &mut Enc) {
        e.u32(s.address).u32(s.functions.len() as u32);
        for f in &s.functions {
            e.u8(f.devfn).bytes(f.name.as_bytes()).raw(&f.config);
        }
    }

    fn decode(d: &mut Dec<'_>) -> Result<PciRootState, DecodeError> {
        let address = d.at("PCI config address").u32()?;
        let n = d.at("PCI functions").count(MAX_FUNCTIONS, 1 + 4 + 256)?;
        let mut functions: Vec<FunctionState> = Vec::with_capacity(n);
        for _ in 0..n {
            let devfn = d.at("PCI devfn").u8()?;
            let name = d.at("PCI function name").string(MAX_NAME)?.to_owned();
            let config = d.at("PCI config space").array::<256>()?;
            if functions.last().is_some_and(|f| f.devfn >= devfn) {
                return Err(DecodeError::Invalid {
                    what: "PCI functions",
                    detail: "not in ascending devfn order".into(),
                });
            }
            functions.push(FunctionState {
                devfn,
                name,
                config,
            });
        }
        Ok(PciRootState { address, functions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::testdev::TestDev;
    use crate::linux::cmos::Cmos;

    #[test]
    fn devices_save_and_restore_through_their_sections() {
        let cmos = Mutex::new(Cmos::default());
        let dev = Mutex::new(TestDev::new().unwrap());
        // A saved state goes back into fresh devices, section by section.
        let saved = [
            DeviceSection {
                id: tag::CMOS,
                version: 1,
                payload: vec![0x0b],
            },
            DeviceSection {
                id: tag::TESTDEV,
                version: 1,
                payload: encode::<TestDev>(&(0x1234, 5)),
            },
        ];
        restore_all(&[&cmos, &dev], &saved).unwrap();
        assert_eq!(cmos.save_section(), saved[0]);
        assert_eq!(dev.save_section(), saved[1]);
        // A section without its device, a device without its section, another version, a
        // payload too long: refused.
        let e = restore_all(&[&cmos], &saved).unwrap_err();
        assert!(e.to_string().contains("no device for"), "{e}");
        let e = restore_all(&[&cmos, &dev], &saved[..1]).unwrap_err();
        assert!(e.to_string().contains("has no TDEV state"), "{e}");
        let mut v2 = saved.clone();
        v2[1].version = 2;
        let e = restore_all(&[&cmos, &dev], &v2).unwrap_err();
        assert!(
            e.to_string()
                .contains("version 2; this build reads version 1"),
            "{e}"
        );
        let mut long = saved.clone();
        long[0].payload.push(0);
        assert!(check_section(&long[0]).is_err());
        assert!(check_section(&saved[1]).is_ok());
    }

    #[test]
    fn devices_of_one_id_take_its_sections_in_order() {
        // Two devices of one id (as the disks are): the n-th takes the n-th section.
        let (a, b) = (
            Mutex::new(TestDev::new().unwrap()),
            Mutex::new(TestDev::new().unwrap()),
        );
        let section = |scratch| DeviceSection {
            id: tag::TESTDEV,
            version: 1,
            payload: encode::<TestDev>(&(scratch, 0)),
        };
        let saved = [section(1), section(2)];
        restore_all(&[&a, &b], &saved).unwrap();
        assert_eq!(a.save_section(), saved[0]);
        assert_eq!(b.save_section(), saved[1]);
        // One section more than devices, or one fewer: refused.
        let three = [section(1), section(2), section(3)];
        let e = restore_all(&[&a, &b], &three).unwrap_err();
        assert!(e.to_string().contains("no device for"), "{e}");
        let e = restore_all(&[&a, &b], &saved[..1]).unwrap_err();
        assert!(e.to_string().contains("has no TDEV state"), "{e}");
    }
}
