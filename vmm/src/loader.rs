//! Loading a guest: an ELF image (bundled by name or from a file) through linux-loader, the
//! command line, and the boot-info block bare-metal guests find through `rdi`.

use std::io::Cursor;
use std::path::PathBuf;

use guest_abi::{BOOT_INFO_MAGIC, BOOT_INFO_VERSION, BootInfo};
use linux_loader::loader::{KernelLoader, elf::Elf};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{BOOT_INFO_ADDR, CMDLINE_ADDR, CMDLINE_MAX, HIMEM_START};

/// Errors loading a guest image.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("no bundled guest named {name:?} (bundled: {known})")]
    UnknownGuest { name: String, known: String },
    #[error("cannot read kernel {path}: {err}")]
    Read { path: PathBuf, err: std::io::Error },
    #[error("{path} is not a loadable 64-bit ELF image: {err}")]
    Elf {
        path: String,
        err: linux_loader::loader::Error,
    },
    #[error("command line is {0} bytes; at most {max} fit", max = CMDLINE_MAX - 1)]
    CmdlineTooLong(usize),
    #[error("write boot data into guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
}

/// What to run.
#[derive(Debug, Clone)]
pub enum Image {
    /// A bundled guest, by name.
    Bundled(String),
    /// An ELF file.
    File(PathBuf),
}

/// The bytes of `image` and a name for messages.
pub fn image_bytes(image: &Image) -> Result<(String, Vec<u8>), LoadError> {
    match image {
        Image::Bundled(name) => guest_images::get(name)
            .map(|b| (format!("guest {name}"), b.to_vec()))
            .ok_or_else(|| LoadError::UnknownGuest {
                name: name.clone(),
                known: guest_images::names().collect::<Vec<_>>().join(", "),
            }),
        Image::File(path) => std::fs::read(path)
            .map(|b| (path.display().to_string(), b))
            .map_err(|err| LoadError::Read {
                path: path.clone(),
                err,
            }),
    }
}

/// Loads an ELF image; returns its entry point.
pub fn load_elf(mem: &GuestMemoryMmap, name: &str, bytes: &[u8]) -> Result<u64, LoadError> {
    let result = Elf::load(
        mem,
        None,
        &mut Cursor::new(bytes),
        Some(GuestAddress(HIMEM_START)),
    )
    .map_err(|err| LoadError::Elf {
        path: name.to_string(),
        err,
    })?;
    Ok(result.kernel_load.0)
}

/// Writes the command line and the boot-info block; returns the block's address.
pub fn write_boot_info(
    mem: &GuestMemoryMmap,
    cmdline: &str,
    cpus: u8,
    ram: (u64, u64),
    tsc_khz: u64,
) -> Result<u64, LoadError> {
    if cmdline.len() >= CMDLINE_MAX {
        return Err(LoadError::CmdlineTooLong(cmdline.len()));
    }
    mem.write_slice(cmdline.as_bytes(), GuestAddress(CMDLINE_ADDR))?;
    mem.write_obj(0u8, GuestAddress(CMDLINE_ADDR + cmdline.len() as u64))?;
    let info = BootInfo {
        magic: BOOT_INFO_MAGIC,
        version: BOOT_INFO_VERSION,
        cpus: u32::from(cpus),
        mem_below_4g: ram.0,
        mem_above_4g: ram.1,
        cmdline_addr: CMDLINE_ADDR,
        cmdline_len: cmdline.len() as u64,
        tsc_khz,
    };
    // SAFETY: BootInfo is repr(C) plain data with no padding (u64/u32 fields in order).
    let raw = unsafe {
        std::slice::from_raw_parts((&raw const info).cast::<u8>(), size_of::<BootInfo>())
    };
    mem.write_slice(raw, GuestAddress(BOOT_INFO_ADDR))?;
    Ok(BOOT_INFO_ADDR)
}
