//! vgpu-vmm: a KVM virtual machine monitor built from rust-vmm crates, which runs bare-metal
//! test guests (and, later, Linux) and gives them a virtual GPU.
//!
//! Module map: [`layout`] (every guest address), [`memory`] (RAM and KVM slots), [`arch`]
//! (x86-64 entry state), [`slots`] (memory slots beyond RAM: the GPU's remapped aperture), [`loader`] (images and boot info), [`linux`] (stock Linux kernels), [`devices`] (serial, i8042,
//! debug exit, PCI test device), [`disk`] (virtio-blk disks on virtio-mmio), [`vcpu`] (threads
//! and exit dispatch), [`lifecycle`] (signals, timeout), [`exit`] (why the VM stopped), [`stats`]
//! (`--stats`), [`builder`] (building a VM, for boot or from a snapshot), [`vm`] (running it),
//! [`pause`] (parking vCPUs), [`persist`] (the devices' state contract), [`snapshot`] (the
//! snapshot format, saving and loading), [`control`] (pause, resume, stats, snapshot of a running
//! VM), [`live`] (the pre-copy of live snapshots and migration), [`copy_pool`] (the threads
//! that copy and checksum snapshot data: how many, at what nice value), [`move_gpu`] (moving the
//! virtual GPU to another GPU of its vgpud), [`standby`] (`--standby`: a VM prepared before the
//! snapshot it restores or the migration it receives), [`api`] (`--api-socket` and `vgpu-vmm ctl`).

pub mod api;
pub mod arch;
pub mod builder;
pub mod control;
pub mod copy_pool;
pub mod devices;
pub mod disk;
pub mod exit;
pub mod layout;
pub mod lifecycle;
pub mod linux;
pub mod live;
pub mod loader;
pub mod memory;
pub mod move_gpu;
pub mod pause;
pub mod persist;
pub mod slots;
pub mod snapshot;
pub mod standby;
pub mod stats;
pub mod vcpu;
pub mod vm;
