//! `vgpud`: the host daemon that shares one physical GPU among VM processes. It owns the GPU's
//! VRAM (for the sim backend one shared memory object, partitioned), the channel quota and the
//! scheduler (`scheduler` crate); each `vgpu-vmm --gpu host=SOCKET` registers over a Unix
//! socket, gets its partition, and asks for, is granted and yields GPU time. The protocol is
//! `proto` (documented in docs/architecture.md, "Sharing one GPU: vgpud").
//!
//! Files: `background` (the daemon on a thread, for tests and tools), `proto` (messages), `wire` (SEQPACKET sockets, descriptor passing), `partition`
//! (VRAM pool), `session` (one connection), `daemon` (the poll loop, grants, slice ends,
//! revocation, reclaim), `handle` (message handling), `report` (what was measured), `units` (sizes on command lines).

mod background;
pub mod daemon;
mod handle;
pub mod partition;
pub mod proto;
pub mod report;
mod session;
pub mod units;
pub mod wire;

pub use background::Background;
pub use daemon::{Daemon, DaemonConfig, DaemonError};
pub use report::Report;
