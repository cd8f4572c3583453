//! The control API (`--api-socket PATH`, docs/architecture.md "Control API"): JSON requests,
//! one per line, on a unix stream socket, each answered by one JSON line ([`protocol`]); the
//! server thread ([`server`]) and the `vgpu-vmm ctl` client ([`client`]).

pub mod client;
pub mod protocol;
pub mod server;
