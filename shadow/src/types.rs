//! Small shared types: apertures, the page-directory pointer, guest mappings, page constants.

/// 4 KiB.
pub const PAGE_4K: u64 = 4 << 10;
/// 2 MiB.
pub const PAGE_2M: u64 = 2 << 20;

/// Which guest memory an address names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Aperture {
    /// Guest VRAM (address in [0, VRAM_SIZE)).
    Vram,
    /// System memory (guest-physical address of the VM's RAM).
    Sysmem,
}

impl Aperture {
    /// Decodes a 2-bit target field: 1 VRAM, 2 system memory; 0 and 3 are `None`.
    pub const fn from_target(bits: u64) -> Option<Self> {
        match bits & 3 {
            1 => Some(Aperture::Vram),
            2 => Some(Aperture::Sysmem),
            _ => None,
        }
    }

    /// The 2-bit target field value.
    pub const fn target_bits(self) -> u64 {
        match self {
            Aperture::Vram => 1,
            Aperture::Sysmem => 2,
        }
    }
}

/// A page-directory pointer: where a guest page directory lives. Also the key of a
/// `ShadowSpace` (one engine address space per guest page directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pdb {
    /// Memory the page directory is in.
    pub aperture: Aperture,
    /// Its address (4 KiB aligned).
    pub addr: u64,
}

/// Where a guest mapping points (guest addresses, before partition / RAM translation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GuestTarget {
    /// Guest VRAM address.
    Vram(u64),
    /// Guest-physical address of guest RAM.
    Sysmem(u64),
}

impl GuestTarget {
    /// A target in `aperture` at `addr`.
    pub const fn new(aperture: Aperture, addr: u64) -> Self {
        match aperture {
            Aperture::Vram => GuestTarget::Vram(addr),
            Aperture::Sysmem => GuestTarget::Sysmem(addr),
        }
    }

    /// The guest address.
    pub const fn addr(self) -> u64 {
        match self {
            GuestTarget::Vram(a) | GuestTarget::Sysmem(a) => a,
        }
    }

    /// The aperture.
    pub const fn aperture(self) -> Aperture {
        match self {
            GuestTarget::Vram(_) => Aperture::Vram,
            GuestTarget::Sysmem(_) => Aperture::Sysmem,
        }
    }

    /// The same aperture, `delta` bytes further (`None` on overflow).
    pub fn offset(self, delta: u64) -> Option<Self> {
        Some(Self::new(self.aperture(), self.addr().checked_add(delta)?))
    }
}

/// One validated guest mapping: `len` bytes at GPU VA `va` onto `target` (contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GuestMapping {
    /// First GPU VA (4 KiB aligned).
    pub va: u64,
    /// Bytes (a non-zero multiple of 4 KiB).
    pub len: u64,
    /// Where the first byte lands.
    pub target: GuestTarget,
    /// Writes and atomics fault.
    pub read_only: bool,
}
