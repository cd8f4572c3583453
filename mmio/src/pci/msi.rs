//! The MSI capability (64-bit address, one vector) in a function's configuration space, and
//! the message a device sends when the guest has enabled it.

use super::config::PciConfig;

/// Capability id of MSI.
pub const CAP_ID_MSI: u8 = 0x05;
/// Bytes the 64-bit MSI capability takes.
pub const MSI_CAP_LEN: usize = 14;

/// A message-signalled interrupt as the guest programmed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

impl PciConfig {
    /// Adds a 64-bit, single-vector MSI capability; returns its offset.
    pub fn add_msi(&mut self) -> Option<usize> {
        let off = self.add_capability(CAP_ID_MSI, MSI_CAP_LEN)?;
        // Message control: 64-bit capable (bit 7); enable (bit 0) is writable.
        self.set_raw(off + 2, &[0x80, 0x00]);
        self.set_wmask(off + 2, &[0x01, 0x00]);
        self.set_wmask(off + 4, &[0xfc, 0xff, 0xff, 0xff]);
        self.set_wmask(off + 8, &[0xff; 4]);
        self.set_wmask(off + 12, &[0xff, 0xff]);
        Some(off)
    }

    /// The message to send, if the guest enabled MSI in the capability at `off`.
    pub fn msi_message(&self, off: usize) -> Option<MsiMessage> {
        let mut b = [0u8; MSI_CAP_LEN];
        self.read(off, &mut b);
        if b[0] != CAP_ID_MSI || b[2] & 1 == 0 {
            return None;
        }
        let lo = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let hi = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        Some(MsiMessage {
            address: u64::from(hi) << 32 | u64::from(lo),
            data: u32::from(u16::from_le_bytes([b[12], b[13]])),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msi_capability_is_listed_and_programmable() {
        let mut c = PciConfig::new(0x1234, 0x9a01, 3, 2, 0);
        let off = c.add_msi().unwrap();
        let mut b = [0u8; 2];
        c.read(0x06, &mut b);
        assert_ne!(b[0] & 0x10, 0, "status: capability list");
        c.read(0x34, &mut b[..1]);
        assert_eq!(usize::from(b[0]), off);
        assert_eq!(c.msi_message(off), None, "disabled at reset");
        c.write(off + 4, &0xfee0_1000u32.to_le_bytes());
        c.write(off + 8, &0u32.to_le_bytes());
        c.write(off + 12, &0x0041u16.to_le_bytes());
        c.write(off + 2, &[0x01, 0x00]);
        assert_eq!(
            c.msi_message(off),
            Some(MsiMessage {
                address: 0xfee0_1000,
                data: 0x41
            })
        );
        // Read-only parts stay: id, next pointer, 64-bit capable bit.
        c.write(off, &[0xff, 0xff, 0xff, 0xff]);
        c.read(off, &mut b);
        assert_eq!(b, [CAP_ID_MSI, 0]);
        let mut ctl = [0u8; 1];
        c.read(off + 2, &mut ctl);
        assert_eq!(ctl[0], 0x81);
    }
}
