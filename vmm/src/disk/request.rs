//! One virtio-blk request: its descriptor chain parsed (header, data, status byte), checked
//! as hostile input (chain length, guest addresses, sector range, data size, read-only disk)
//! and carried out on the disk file. Every failure ends as a status byte, never a panic.

use std::fs::File;
use std::io::{Read, Write};
use std::ops::Deref;
use std::os::unix::fs::FileExt;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_queue::{DescriptorChain, Reader, Writer};
use vm_memory::GuestMemoryMmap;

/// Bytes of a sector (virtio-blk's unit, whatever the disk's block size).
pub const SECTOR: u64 = 512;
/// The largest data segment the device accepts (`size_max`, advertised).
pub const SIZE_MAX: u32 = 64 << 10;
/// The most data segments in one request (`seg_max`, advertised).
pub const SEG_MAX: u32 = 32;
/// The most data bytes one request may move: a request larger than what was advertised is
/// refused (IOERR) before any buffer is sized by it.
pub const MAX_REQUEST_BYTES: usize = (SIZE_MAX as usize) * (SEG_MAX as usize);
/// The most descriptors in one chain: the segments, the header and the status byte, with room
/// for a header or status split over two descriptors.
pub const MAX_DESCRIPTORS: usize = SEG_MAX as usize + 4;
/// Bytes of the request header (type, reserved, sector).
const HEADER: usize = 16;

/// The disk a request works on.
pub struct Backend<'a> {
    pub file: &'a File,
    /// Capacity in sectors.
    pub sectors: u64,
    pub read_only: bool,
    /// What `GET_ID` answers (at most 20 bytes are sent).
    pub serial: &'a str,
}

/// What a request did: the used-ring length (bytes written into the guest's buffers,
/// status included) and the status byte written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub used_len: u32,
    pub status: u8,
}

/// Why a request failed (logged at debug level; the guest sees only the status).
#[derive(Debug, thiserror::Error)]
enum Fault {
    #[error("the chain has more than {MAX_DESCRIPTORS} descriptors")]
    TooLong,
    #[error("descriptor chain: {0}")]
    Chain(virtio_queue::Error),
    #[error("the header is shorter than {HEADER} bytes")]
    ShortHeader,
    #[error("no writable status byte")]
    NoStatus,
    #[error("{0} data bytes are not whole sectors")]
    Partial(usize),
    #[error("{0} data bytes, more than the {MAX_REQUEST_BYTES} a request may move")]
    TooLarge(usize),
    #[error("sectors {sector}+{count} beyond the disk's {capacity}")]
    Range {
        sector: u64,
        count: u64,
        capacity: u64,
    },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("guest memory: {0}")]
    Memory(std::io::Error),
    #[error("disk file: {0}")]
    File(std::io::Error),
}

impl Fault {
    fn status(&self) -> u8 {
        VIRTIO_BLK_S_IOERR as u8
    }
}

/// Carries out the request in `chain` on `disk` (`buf` is a scratch buffer reused between
/// requests) and writes its status byte when the chain has one.
pub fn handle<M>(
    chain: DescriptorChain<M>,
    mem: &GuestMemoryMmap,
    disk: &Backend<'_>,
    buf: &mut Vec<u8>,
) -> Done
where
    M: Deref<Target = GuestMemoryMmap> + Clone,
{
    // Bounded by the queue size (or an indirect table's) in the iterator itself; a chain
    // longer than a request can need is refused before anything is mapped.
    if chain.clone().take(MAX_DESCRIPTORS + 1).count() > MAX_DESCRIPTORS {
        log::debug!("virtio-blk: {}", Fault::TooLong);
        return Done {
            used_len: 0,
            status: VIRTIO_BLK_S_IOERR as u8,
        };
    }
    let writer = Writer::<()>::new(mem, chain.clone());
    let mut writer = match writer {
        Ok(w) if w.available_bytes() >= 1 => w,
        Ok(_) | Err(_) => {
            // Without a status byte the guest cannot be told; nothing is done.
            let why = writer.err().map_or(Fault::NoStatus, Fault::Chain);
            log::debug!("virtio-blk: {why}");
            return Done {
                used_len: 0,
                status: VIRTIO_BLK_S_IOERR as u8,
            };
        }
    };
    let status_at = writer.available_bytes() - 1;
    let mut status_w = match writer.split_at(status_at) {
        Ok(s) => s,
        Err(e) => {
            log::debug!("virtio-blk: {}", Fault::Chain(e));
            return Done {
                used_len: 0,
                status: VIRTIO_BLK_S_IOERR as u8,
            };
        }
    };
    let (status, data_len) = match Reader::<()>::new(mem, chain).map_err(Fault::Chain) {
        Ok(mut reader) => match execute(&mut reader, &mut writer, disk, buf) {
            Ok((status, n)) => (status, n),
            Err(f) => {
                log::debug!("virtio-blk: {f}");
                (f.status(), 0)
            }
        },
        Err(f) => {
            log::debug!("virtio-blk: {f}");
            (f.status(), 0)
        }
    };
    if let Err(e) = status_w.write_all(&[status]) {
        log::debug!("virtio-blk: status byte: {e}");
        return Done {
            used_len: data_len,
            status,
        };
    }
    Done {
        used_len: data_len.saturating_add(1),
        status,
    }
}

/// The request's status and the data bytes written into the guest's buffers.
fn execute(
    reader: &mut Reader<'_>,
    data_in: &mut Writer<'_>,
    disk: &Backend<'_>,
    buf: &mut Vec<u8>,
) -> Result<(u8, u32), Fault> {
    if reader.available_bytes() < HEADER {
        return Err(Fault::ShortHeader);
    }
    let header: [u8; HEADER] = reader.read_obj().map_err(Fault::Memory)?;
    let kind = u32::from_le_bytes(header[0..4].try_into().unwrap_or_default());
    let sector = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    let ok = VIRTIO_BLK_S_OK as u8;
    match kind {
        VIRTIO_BLK_T_IN => {
            let len = data_in.available_bytes();
            let off = check_range(sector, len, disk.sectors)?;
            buf.resize(len, 0);
            disk.file
                .read_exact_at(&mut buf[..len], off)
                .map_err(Fault::File)?;
            data_in.write_all(&buf[..len]).map_err(Fault::Memory)?;
            Ok((ok, len as u32))
        }
        VIRTIO_BLK_T_OUT => {
            if disk.read_only {
                return Err(Fault::ReadOnly);
            }
            let len = reader.available_bytes();
            let off = check_range(sector, len, disk.sectors)?;
            buf.resize(len, 0);
            reader.read_exact(&mut buf[..len]).map_err(Fault::Memory)?;
            disk.file
                .write_all_at(&buf[..len], off)
                .map_err(Fault::File)?;
            Ok((ok, 0))
        }
        VIRTIO_BLK_T_FLUSH => {
            if !disk.read_only {
                disk.file.sync_data().map_err(Fault::File)?;
            }
            Ok((ok, 0))
        }
        VIRTIO_BLK_T_GET_ID => {
            let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
            let s = disk.serial.as_bytes();
            let n = s.len().min(id.len());
            id[..n].copy_from_slice(&s[..n]);
            let n = id.len().min(data_in.available_bytes());
            data_in.write_all(&id[..n]).map_err(Fault::Memory)?;
            Ok((ok, n as u32))
        }
        other => {
            log::debug!("virtio-blk: request type {other} not supported");
            Ok((VIRTIO_BLK_S_UNSUPP as u8, 0))
        }
    }
}

/// The byte offset of `len` bytes at `sector`, if they are whole sectors, no more than a
/// request may move, and inside a disk of `capacity` sectors.
fn check_range(sector: u64, len: usize, capacity: u64) -> Result<u64, Fault> {
    if len > MAX_REQUEST_BYTES {
        return Err(Fault::TooLarge(len));
    }
    if !(len as u64).is_multiple_of(SECTOR) {
        return Err(Fault::Partial(len));
    }
    let count = len as u64 / SECTOR;
    match sector.checked_add(count) {
        Some(end) if end <= capacity => Ok(sector * SECTOR),
        _ => Err(Fault::Range {
            sector,
            count,
            capacity,
        }),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
