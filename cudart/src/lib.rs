//! `libcudart.so.13`: the CUDA runtime API of vgpu-vmm, built on the driver API
//! (`libcuda.so.1`, opened at run time as NVIDIA's runtime opens theirs), so that it runs over
//! this project's driver library (guest or host backends) and over NVIDIA's alike.
