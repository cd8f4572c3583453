//! `vgpu-proto`: what a VM process (`vgpu-vmm --gpu host=SOCKET`) and the `vgpud` daemon share:
//! the versioned messages (`proto`, documented in docs/architecture.md, "Sharing one GPU"),
//! the `SOCK_SEQPACKET` socket layer with descriptor passing (`wire`), and the option grammar
//! of the command lines (`units`: `key=value,...`, sizes, durations; `--gpu`, `--sched`),
//! the grant word both sides share (`word`, version 4),
//! and what both sides compute alike: a kernel's identity (`kernel::KernelKey`) and the clock
//! of their stamps (`proto::monotonic_ns`). Kept apart from the daemon so that the device model
//! (`vgpu`) depends on the protocol, not on the daemon's scheduler and state.

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod kernel;
pub mod proto;
pub mod units;
pub mod wire;
pub mod word;
