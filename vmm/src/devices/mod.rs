//! Legacy and test devices on the port/MMIO buses.

pub mod console_out;
pub mod debug_exit;
pub mod i8042;
pub mod serial;
pub mod testdev;
