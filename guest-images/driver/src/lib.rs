//! gpu-driver (being written: the guest GPU driver library)
