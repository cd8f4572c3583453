//! The guest backend: [`crate::device::Device`] over the guest GPU driver inside a VM.
//!
//! PLACEHOLDER (libcuda helper): the `guestcuda` helper replaces this file with the real
//! backend; [`open`] is the hook `backend::open` calls for `VGPU_CUDA_BACKEND=guest` (and by
//! default when the virtual GPU's PCI function exists). Until then it reports no device.

use crate::device::{Device, DeviceError};

/// Opens one context's device on the virtual GPU.
pub fn open() -> Result<Box<dyn Device>, DeviceError> {
    Err(DeviceError::NoDevice(
        "the guest backend is not built into this library yet".into(),
    ))
}
