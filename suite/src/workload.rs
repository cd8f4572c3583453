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
    /// Real work on a data-centre GPU: 2–64× `Large`'s data (740 MiB of buffers over the suite,
    /// up to 96 MiB per workload), and the nine workloads whose one kernel is short on an H100
    /// launched 5–20 times in a row (`XL_REPEATS` of each), so that every workload's kernel
    /// phase lasts a millisecond or more on an H100 (measured: docs/performance.md, "A suite
    /// size for an H100"). For real GPUs only: on the sim interpreter (~1e8
    /// thread-instructions/s at best) one workload takes minutes ([`Size::real_gpu_only`]).
    Xl,
}

impl Size {
    /// Every size, smallest first.
    pub const ALL: [Size; 4] = [Size::Small, Size::Medium, Size::Large, Size::Xl];

    /// Lower-case name ("small", "medium", "large", "xl").
    pub const fn name(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Medium => "medium",
            Size::Large => "large",
            Size::Xl => "xl",
        }
    }

    /// MiB of GPU-visible system memory the whole suite at this size needs from the guest
    /// driver's pool (the driver's default, 8, is enough below `Large`): at least the largest
    /// workload's buffers and PTX, which all sit in the pool at once (staging copies).
    pub const fn sys_pool_mib(self) -> u64 {
        self.pick(8, 8, 64, XL_POOL_MIB)
    }

    /// Guest RAM in MiB (`vgpu-vmm --memory`) the bundled `workloads` guest needs to run the
    /// whole suite at this size: measured with the guest's earlier bump heap, which kept every
    /// workload's host copies, 256 (the default) failed `Large`, 512 passed; `Xl`: see
    /// [`XL_GUEST_RAM_MIB`]. The heap now reuses freed memory (`medium` peaked at 11 MiB
    /// instead of 15 on dev), so these are upper bounds.
    pub const fn guest_ram_mib(self) -> u64 {
        self.pick(256, 256, 512, XL_GUEST_RAM_MIB)
    }

    /// VRAM in MiB (`--gpu vram=`) the suite at this size needs, where that is more than the
    /// virtual GPU's default of 256 MiB (every buffer of the largest workload sits in VRAM at
    /// once, next to the driver's VRAM pool): `None` below `Xl`, which run in less.
    pub const fn vram_mib(self) -> Option<u64> {
        self.pick(None, None, None, Some(XL_VRAM_MIB))
    }

    /// Whether this size is meant for real GPUs only: on the sim backend (the PTX interpreter,
    /// ~1e8 thread-instructions/s at best, far less in a VM on a busy host) the suite at this
    /// size takes many minutes. Callers refuse it on sim unless told otherwise.
    pub const fn real_gpu_only(self) -> bool {
        matches!(self, Size::Xl)
    }

    /// Parses a name given by [`Size::name`].
    pub fn from_name(name: &str) -> Option<Size> {
        Size::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Picks the value for this size.
    pub const fn pick<T: Copy>(self, small: T, medium: T, large: T, xl: T) -> T {
        match self {
            Size::Small => small,
            Size::Medium => medium,
            Size::Large => large,
            Size::Xl => xl,
        }
    }

    /// Seed tag for [`crate::Rng::for_workload`].
    pub const fn tag(self) -> u64 {
        self as u64 + 1
    }
}

/// The driver pool at `Xl`, MiB: the largest workload's buffers (vecadd, 3 × 32 MiB) with room
/// for PTX and the channel's staging.
pub const XL_POOL_MIB: u64 = 160;

/// Guest RAM at `Xl`, MiB: the `workloads` guest's earlier bump heap kept every workload's host
/// copies (inputs, expected outputs, the builder's temporaries) next to the driver pool: measured
/// on an H100 host, that heap peaked at 2425 MiB (3.3× the suite's 742 MiB of buffers). The
/// heap now reuses freed memory, so this is an upper bound (not measured again). The heap stops
/// below 3 GiB (the PCI hole).
pub const XL_GUEST_RAM_MIB: u64 = 3072;

/// VRAM at `Xl`, MiB (`--gpu vram=`).
pub const XL_VRAM_MIB: u64 = 512;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_parses_by_name_and_xl_asks_for_more_memory() {
        for s in Size::ALL {
            assert_eq!(Size::from_name(s.name()), Some(s));
        }
        assert_eq!(Size::from_name("xl"), Some(Size::Xl));
        assert_eq!(Size::ALL.map(Size::tag), [1, 2, 3, 4]);
        for w in [Size::Small, Size::Medium, Size::Large] {
            assert!(!w.real_gpu_only(), "{w:?}");
            assert!(w.sys_pool_mib() < Size::Xl.sys_pool_mib());
            assert!(w.guest_ram_mib() < Size::Xl.guest_ram_mib());
            assert_eq!(w.vram_mib(), None);
        }
        assert!(Size::Xl.real_gpu_only());
        assert!(Size::Xl.vram_mib().is_some_and(|m| m > 256));
        // The guest's heap stops below 3 GiB (the PCI hole): the pool is carved from it too.
        assert!(Size::Xl.guest_ram_mib() <= 3072);
        assert_eq!(Size::Xl.pick(1, 2, 3, 4), 4);
        assert_eq!(Size::Large.pick(1, 2, 3, 4), 3);
    }
}
