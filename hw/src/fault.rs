//! Fault kinds (`FAULT_STATUS.KIND`, `CHAN_STATUS` bits 15:8, the para-virtual KIND) and
//! access kinds (`FAULT_STATUS.ACCESS`); docs/hardware.md, "Fault kinds".
//!
//! The list lives in one macro, [`fault_kinds!`](crate::fault_kinds): this crate builds the
//! device's closed [`FaultKind`] from it, and a guest driver that must also represent codes it
//! does not know builds its own enum from the same list.

/// Calls `$callback! { (Variant, code, "NAME", "when"), ... }` with every fault kind, in code
/// order. Add a kind here and every user follows.
#[macro_export]
macro_rules! fault_kinds {
    ($callback:ident) => {
        $callback! {
            (Unmapped, 1, "UNMAPPED", "a GPU VA the work touched has no valid translation"),
            (ReadOnly, 2, "READ_ONLY", "a write or atomic to a read-only page"),
            (PteVramRange, 3, "PTE_VRAM_RANGE", "a PDE/PTE points at VRAM outside [0, VRAM_SIZE)"),
            (PteSysmemRange, 4, "PTE_SYSMEM_RANGE", "a PDE/PTE points at system memory outside the guest's RAM"),
            (BadEntry, 5, "BAD_ENTRY", "a malformed PDE/PTE"),
            (BadInstance, 6, "BAD_INSTANCE", "an instance block field is invalid"),
            (BadGpfifo, 7, "BAD_GPFIFO", "GPFIFO base/size invalid, GP_PUT too large, or a bad segment"),
            (BadMethod, 8, "BAD_METHOD", "unknown opcode or method, reserved bits, or a truncated method"),
            (BadLaunch, 9, "BAD_LAUNCH", "a launch value the engine refuses"),
            (PtxError, 10, "PTX_ERROR", "the PTX module failed to load"),
            (KernelFault, 11, "KERNEL_FAULT", "the kernel accessed an unmapped or read-only address"),
            (Timeout, 12, "TIMEOUT", "work ran longer than the host's per-job limit"),
            (BadChannel, 13, "BAD_CHANNEL", "a channel id at or above CHANNELS, or an unbound channel"),
            (BadRegister, 14, "BAD_REGISTER", "a refused register write"),
            (BadRunlist, 15, "BAD_RUNLIST", "a bad runlist"),
            (GpuLost, 16, "GPU_LOST", "the shared physical GPU was taken away from this VM"),
        }
    };
}

macro_rules! define_fault_kind {
    ($( ($variant:ident, $code:literal, $name:literal, $when:literal) ),* $(,)?) => {
        /// A fault kind; `code()` is the `FAULT_STATUS.KIND` value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum FaultKind {
            $( #[doc = $when] $variant = $code, )*
        }

        impl FaultKind {
            /// Every kind, in code order.
            pub const ALL: &[FaultKind] = &[$(FaultKind::$variant),*];

            /// The `FAULT_STATUS.KIND` value.
            pub const fn code(self) -> u8 {
                self as u8
            }

            /// The kind with value `code`, if any.
            pub const fn from_code(code: u8) -> Option<Self> {
                match code {
                    $( $code => Some(FaultKind::$variant), )*
                    _ => None,
                }
            }

            /// The upper-case name docs/hardware.md uses.
            pub const fn name(self) -> &'static str {
                match self {
                    $( FaultKind::$variant => $name, )*
                }
            }
        }
    };
}

fault_kinds!(define_fault_kind);

/// `FAULT_STATUS.ACCESS` (bits 23:16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Access {
    None = 0,
    Read = 1,
    Write = 2,
    Atomic = 3,
    Fetch = 4,
}

impl Access {
    /// The access with value `v`, if any.
    pub const fn from_code(v: u8) -> Option<Self> {
        match v {
            0 => Some(Access::None),
            1 => Some(Access::Read),
            2 => Some(Access::Write),
            3 => Some(Access::Atomic),
            4 => Some(Access::Fetch),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_dense() {
        for (i, k) in FaultKind::ALL.iter().enumerate() {
            assert_eq!(usize::from(k.code()), i + 1);
            assert_eq!(FaultKind::from_code(k.code()), Some(*k));
        }
        assert_eq!(FaultKind::from_code(0), None);
        assert_eq!(FaultKind::from_code(200), None);
        assert_eq!(FaultKind::GpuLost.name(), "GPU_LOST");
    }
}
