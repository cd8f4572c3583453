//! The implementations of [`crate::device::Device`] and the choice between them
//! (`VGPU_CUDA_BACKEND=guest|sim|cuda`; without it: `guest` when the virtual GPU is present,
//! else `sim`).

pub mod guest;
