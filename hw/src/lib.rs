//! `vgpu-hw`: the hardware interface of the virtual GPU, written once. docs/hardware.md ("The
//! virtual GPU") is its prose; `tests/docs.rs` checks that its tables name the same offsets,
//! methods and fault kinds as this crate. The device model (`vgpu`), the shadow layer
//! (`shadow`) and the guest driver (`gpu-driver`, bare-metal and Linux guests) all use these
//! definitions, so a register or fault kind is added in one place.
//!
//! Modules: `regs` (BAR0 register offsets and bit fields), `method` (method addresses and
//! pushbuffer headers), `inst` (instance block layout), `pte` (PDE/PTE encoding), `para` (the
//! para-virtual BAR and its calls), `bell` (the doorbell page of exitless submission), `fault`
//! (fault kinds and access kinds).
#![no_std]

pub mod bell;
pub mod fault;
pub mod inst;
pub mod method;
pub mod para;
pub mod pte;
pub mod regs;

pub use fault::{Access, FaultKind};

/// Defines `pub const NAME: $ty = value;` items and `ALL`, a table of (name, value) pairs of
/// them in order, from one list (the table is what tests check docs/hardware.md against).
macro_rules! named_consts {
    ($ty:ty; $( $(#[$meta:meta])* $name:ident = $value:expr; )*) => {
        $( $(#[$meta])* pub const $name: $ty = $value; )*
        /// Every constant of this list with its name, in declaration order.
        pub const ALL: &[(&str, $ty)] = &[$((stringify!($name), $name)),*];
    };
}
pub(crate) use named_consts;
