//! Access to guest memory that the device model provides (`GuestMem`), and `VecGuestMem`, a
//! simple in-memory implementation for tests and tools.

use thiserror::Error;

use crate::types::Aperture;

/// Why a guest memory read failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MemError {
    #[error("{aperture:?} range {addr:#x}+{len:#x} is outside guest memory")]
    OutOfRange {
        aperture: Aperture,
        addr: u64,
        len: u64,
    },
    #[error("guest memory access failed: {0}")]
    Failed(String),
}

/// Reads of guest memory, implemented by the device model.
pub trait GuestMem {
    /// Reads guest VRAM at `addr`; fails unless `[addr, addr + buf.len())` is inside
    /// `[0, vram_size)`.
    fn read_vram(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// Reads guest RAM at guest-physical `gpa`; fails unless the whole range is inside the
    /// VM's RAM regions.
    fn read_ram(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError>;

    /// Reads from `aperture`.
    fn read(&self, aperture: Aperture, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        match aperture {
            Aperture::Vram => self.read_vram(addr, buf),
            Aperture::Sysmem => self.read_ram(addr, buf),
        }
    }
}

impl<T: GuestMem + ?Sized> GuestMem for &T {
    fn read_vram(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        (**self).read_vram(addr, buf)
    }
    fn read_ram(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        (**self).read_ram(gpa, buf)
    }
}

/// Guest memory held in vectors: one VRAM buffer and RAM regions at guest-physical addresses.
#[derive(Debug, Clone, Default)]
pub struct VecGuestMem {
    vram: Vec<u8>,
    ram: Vec<(u64, Vec<u8>)>,
}

impl VecGuestMem {
    /// `vram_size` bytes of zeroed VRAM and no RAM.
    pub fn new(vram_size: usize) -> Self {
        Self {
            vram: vec![0; vram_size],
            ram: Vec::new(),
        }
    }

    /// Adds a zeroed RAM region of `len` bytes at `gpa` (regions must not overlap: reads find
    /// the first region holding the whole range).
    pub fn add_ram(&mut self, gpa: u64, len: usize) {
        self.ram.push((gpa, vec![0; len]));
    }

    /// Which buffer (None = VRAM, Some(i) = RAM region i) and start index hold
    /// `[addr, addr + len)`.
    fn locate(
        &self,
        aperture: Aperture,
        addr: u64,
        len: usize,
    ) -> Result<(Option<usize>, usize), MemError> {
        let err = || MemError::OutOfRange {
            aperture,
            addr,
            len: len as u64,
        };
        let end = addr.checked_add(len as u64).ok_or_else(err)?;
        let (which, base, size) = match aperture {
            Aperture::Vram => (None, 0, self.vram.len()),
            Aperture::Sysmem => {
                let i = self
                    .ram
                    .iter()
                    .position(|(b, v)| *b <= addr && end <= b.saturating_add(v.len() as u64))
                    .ok_or_else(err)?;
                (Some(i), self.ram[i].0, self.ram[i].1.len())
            }
        };
        let start = usize::try_from(addr - base).map_err(|_| err())?;
        match start.checked_add(len) {
            Some(stop) if stop <= size => Ok((which, start)),
            _ => Err(err()),
        }
    }

    /// Writes bytes into `aperture` at `addr`.
    pub fn write(&mut self, aperture: Aperture, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let (which, start) = self.locate(aperture, addr, data.len())?;
        let buf = match which {
            None => &mut self.vram,
            Some(i) => &mut self.ram[i].1,
        };
        buf[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Writes a little-endian u64.
    pub fn write_u64(&mut self, aperture: Aperture, addr: u64, v: u64) -> Result<(), MemError> {
        self.write(aperture, addr, &v.to_le_bytes())
    }

    /// Writes a little-endian u32.
    pub fn write_u32(&mut self, aperture: Aperture, addr: u64, v: u32) -> Result<(), MemError> {
        self.write(aperture, addr, &v.to_le_bytes())
    }

    fn read_into(&self, aperture: Aperture, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let (which, start) = self.locate(aperture, addr, buf.len())?;
        let src = match which {
            None => &self.vram,
            Some(i) => &self.ram[i].1,
        };
        buf.copy_from_slice(&src[start..start + buf.len()]);
        Ok(())
    }
}

impl GuestMem for VecGuestMem {
    fn read_vram(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.read_into(Aperture::Vram, addr, buf)
    }
    fn read_ram(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.read_into(Aperture::Sysmem, gpa, buf)
    }
}
