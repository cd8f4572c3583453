//! Fault records (FAULT_* registers) decoded into types.

use core::fmt;

/// Builds the driver's view of `FAULT_STATUS.KIND` from `vgpu-hw`'s one list of kinds: every
/// known kind, plus `Unknown` for a code this driver does not know (device input is untrusted).
macro_rules! driver_fault_kind {
    ($( ($variant:ident, $code:literal, $name:literal, $when:literal) ),* $(,)?) => {
        /// `FAULT_STATUS.KIND` (docs/hardware.md, "Fault kinds").
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum FaultKind {
            $( #[doc = $when] $variant, )*
            /// A kind this driver does not know (device input is untrusted).
            Unknown(u8),
        }

        impl FaultKind {
            /// Decodes the 8-bit kind.
            pub fn from_raw(v: u8) -> Self {
                match v {
                    $( $code => FaultKind::$variant, )*
                    other => FaultKind::Unknown(other),
                }
            }

            /// The 8-bit kind.
            pub fn raw(self) -> u8 {
                match self {
                    $( FaultKind::$variant => $code, )*
                    FaultKind::Unknown(v) => v,
                }
            }

            /// Upper-case name as in the spec.
            pub fn name(self) -> &'static str {
                match self {
                    $( FaultKind::$variant => $name, )*
                    FaultKind::Unknown(_) => "UNKNOWN",
                }
            }
        }
    };
}

vgpu_hw::fault_kinds!(driver_fault_kind);

/// `FAULT_STATUS.ACCESS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    None,
    Read,
    Write,
    Atomic,
    Fetch,
    Unknown(u8),
}

impl Access {
    /// Decodes the 8-bit access field.
    pub fn from_raw(v: u8) -> Self {
        match v {
            0 => Access::None,
            1 => Access::Read,
            2 => Access::Write,
            3 => Access::Atomic,
            4 => Access::Fetch,
            other => Access::Unknown(other),
        }
    }
}

/// One fault record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub access: Access,
    /// Channel id, or `None` for a device-level fault (FAULT_CHANNEL = 0xffff).
    pub channel: Option<u32>,
    /// GPU VA, guest VRAM or guest-physical address, per kind.
    pub addr: u64,
    /// Kind-specific: method address, PTX line, entry index.
    pub info: u32,
}

impl Fault {
    /// Decodes the registers; `None` unless `status` has VALID set.
    pub fn decode(status: u32, channel: u32, addr: u64, info: u32) -> Option<Self> {
        if status & crate::regs::FAULT_VALID == 0 {
            return None;
        }
        Some(Self {
            kind: FaultKind::from_raw(status as u8),
            access: Access::from_raw((status >> 16) as u8),
            channel: (channel != crate::regs::FAULT_CHANNEL_DEVICE).then_some(channel),
            addr,
            info,
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (kind {})", self.kind.name(), self.kind.raw())?;
        match self.channel {
            Some(c) => write!(f, " channel {c}")?,
            None => write!(f, " device")?,
        }
        write!(
            f,
            " addr {:#x} info {:#x} access {:?}",
            self.addr, self.info, self.access
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_fields() {
        let f = Fault::decode(0x8002_000b, 3, 0x1234_5000, 17).unwrap();
        assert_eq!(f.kind, FaultKind::KernelFault);
        assert_eq!(f.access, Access::Write);
        assert_eq!(f.channel, Some(3));
        assert_eq!(f.info, 17);
        let d = Fault::decode(0x8000_000e, 0xffff, 0, 0).unwrap();
        assert_eq!(d.kind, FaultKind::BadRegister);
        assert_eq!(d.channel, None);
        assert!(Fault::decode(0x0000_000e, 0, 0, 0).is_none());
        assert_eq!(FaultKind::from_raw(200), FaultKind::Unknown(200));
        for k in vgpu_hw::FaultKind::ALL {
            let d = FaultKind::from_raw(k.code());
            assert_eq!((d.raw(), d.name()), (k.code(), k.name()));
        }
    }
}
