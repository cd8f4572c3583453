//! Workload descriptors (name, PTX, entry, instance builder), sizes, and helpers to build buffers.

use alloc::vec::Vec;

use crate::instance::{Buffer, Elem, Expect, Instance};

/// Problem size of an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Size {
    /// Fast tests: at most a few 1e5 thread-instructions (well under 10 ms on an interpreter
    /// doing ~1e8 thread-instructions/s).
    Small,
    /// A few ms on such an interpreter (~3e5..1e6 thread-instructions).
    Medium,
    /// Benchmark size for real GPUs and long runs (1e7..1e8 thread-instructions).
    Large,
}

impl Size {
    /// Every size, smallest first.
    pub const ALL: [Size; 3] = [Size::Small, Size::Medium, Size::Large];

    /// Lower-case name ("small", "medium", "large").
    pub const fn name(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Medium => "medium",
            Size::Large => "large",
        }
    }

    /// MiB of GPU-visible system memory the whole suite at this size needs from the guest
    /// driver's pool (the driver's default, 8, is enough below `Large`).
    pub const fn sys_pool_mib(self) -> u64 {
        self.pick(8, 8, 64)
    }

    /// Guest RAM in MiB (`vgpu-vmm --memory`) the bundled `workloads` guest needs to run the
    /// whole suite at this size (its bump heap keeps every workload's host copies): measured,
    /// 256 (the default) fails `Large`, 512 passes.
    pub const fn guest_ram_mib(self) -> u64 {
        self.pick(256, 256, 512)
    }

    /// Parses a name given by [`Size::name`].
    pub fn from_name(name: &str) -> Option<Size> {
        Size::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Picks the value for this size.
    pub const fn pick<T: Copy>(self, small: T, medium: T, large: T) -> T {
        match self {
            Size::Small => small,
            Size::Medium => medium,
            Size::Large => large,
        }
    }

    /// Seed tag for [`crate::Rng::for_workload`].
    pub const fn tag(self) -> u64 {
        self as u64 + 1
    }
}

/// A workload: one PTX module and a recipe for instances of it.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Name (unique across [`crate::all`]).
    pub name: &'static str,
    /// PTX module text.
    pub ptx: &'static str,
    /// Main entry point (every launch of its instances uses it).
    pub entry: &'static str,
    /// One line saying what it computes.
    pub about: &'static str,
    build: fn(Size) -> Instance,
}

impl Workload {
    pub(crate) const fn new(
        name: &'static str,
        ptx: &'static str,
        entry: &'static str,
        about: &'static str,
        build: fn(Size) -> Instance,
    ) -> Self {
        Self {
            name,
            ptx,
            entry,
            about,
            build,
        }
    }

    /// Builds the instance of the given size (deterministic: same inputs every call).
    pub fn instance(&self, size: Size) -> Instance {
        (self.build)(size)
    }
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of u32 values.
pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of i32 values.
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of u64 values.
pub fn u64_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Buffer {
    /// Input buffer, not read back.
    pub fn input(name: &'static str, init: Vec<u8>) -> Self {
        Self {
            name,
            init,
            expect: Expect::Ignore,
        }
    }

    /// Buffer compared exactly after the run.
    pub fn exact(name: &'static str, init: Vec<u8>, elem: Elem, expected: Vec<u8>) -> Self {
        Self {
            name,
            init,
            expect: Expect::Exact {
                elem,
                bytes: expected,
            },
        }
    }

    /// Zero-filled output buffer compared exactly.
    pub fn exact_out(name: &'static str, elem: Elem, expected: Vec<u8>) -> Self {
        Self::exact(name, alloc::vec![0; expected.len()], elem, expected)
    }
}
