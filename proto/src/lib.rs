//! `vgpu-proto`: what a VM process (`vgpu-vmm --gpu host=SOCKET`) and the `vgpud` daemon share:
//! the versioned messages (`proto`, documented in docs/architecture.md, "Sharing one GPU"),
//! the `SOCK_SEQPACKET` socket layer with descriptor passing (`wire`), and the size syntax of
//! both command lines (`units`). Kept apart from the daemon so that the device model (`vgpu`)
//! depends on the protocol, not on the daemon's scheduler and state.

pub mod proto;
pub mod units;
pub mod wire;
