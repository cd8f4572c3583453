//! A disk device's snapshot state (one state-file section per disk, in `--disk` order): the
//! transport's registers and the virtqueue's position and addresses, encoded little-endian
//! with a version byte, decoded as hostile input (every field checked before it is used).
//! The disk's contents are not saved: only read-only disks may be snapshotted, and the file's
//! path and size are checked at restore (`super::DiskSpec` in the manifest).

use virtio_queue::{Queue, QueueState, QueueT};
use vm_memory::GuestMemoryMmap;

use super::device::{BlockDevice, QUEUE_SIZE, Regs};

/// The encoding's version byte.
const VERSION: u8 = 1;
/// Bytes of an encoded state.
pub const BYTES: usize = 1 + 4 + 8 + 4 * 5 + 2 + 2 + 2 + 1 + 1 + 8 * 3;

/// Why a saved state is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("disk state of {0} bytes, expected {BYTES}")]
    Length(usize),
    #[error("disk state version {0}, this build reads {VERSION}")]
    Version(u8),
    #[error("disk queue: {0}")]
    Queue(String),
    #[error("disk queue is ready but its rings are not in guest RAM")]
    Rings,
    #[error("disk status {0:#x} has unknown bits")]
    Status(u32),
}

/// The device's state as bytes.
pub fn save(dev: &BlockDevice) -> Vec<u8> {
    let r = &dev.regs;
    let q = dev.queue.state();
    let mut out = Vec::with_capacity(BYTES);
    out.push(VERSION);
    out.extend_from_slice(&r.status.to_le_bytes());
    out.extend_from_slice(&r.driver_features.to_le_bytes());
    for v in [
        r.device_features_sel,
        r.driver_features_sel,
        r.queue_sel,
        r.interrupt_status,
        r.config_generation,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [q.size, q.next_avail, q.next_used] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.push(u8::from(q.ready));
    out.push(u8::from(q.event_idx_enabled));
    for v in [q.desc_table, q.avail_ring, q.used_ring] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    debug_assert_eq!(out.len(), BYTES);
    out
}

/// Puts a saved state back into `dev` (a freshly built device over the same disk).
pub fn restore(
    dev: &mut BlockDevice,
    bytes: &[u8],
    mem: &GuestMemoryMmap,
) -> Result<(), StateError> {
    let (regs, queue) = decode(bytes)?;
    if queue.ready() && !queue.is_valid(mem) {
        return Err(StateError::Rings);
    }
    dev.regs = regs;
    dev.queue = queue;
    Ok(())
}

/// Decodes a state: the registers and the queue it describes.
pub fn decode(bytes: &[u8]) -> Result<(Regs, Queue), StateError> {
    if bytes.len() != BYTES {
        return Err(StateError::Length(bytes.len()));
    }
    if bytes[0] != VERSION {
        return Err(StateError::Version(bytes[0]));
    }
    let mut at = 1;
    let mut take = |n: usize| {
        let s = &bytes[at..at + n];
        at += n;
        s
    };
    let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or_default());
    let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
    let u16_ = |s: &[u8]| u16::from_le_bytes(s.try_into().unwrap_or_default());
    let status = u32_(take(4));
    if status > 0xff {
        return Err(StateError::Status(status));
    }
    let regs = Regs {
        status,
        driver_features: u64_(take(8)),
        device_features_sel: u32_(take(4)),
        driver_features_sel: u32_(take(4)),
        queue_sel: u32_(take(4)),
        interrupt_status: u32_(take(4)) & 0b11,
        config_generation: u32_(take(4)),
    };
    let size = u16_(take(2));
    let next_avail = u16_(take(2));
    let next_used = u16_(take(2));
    let ready = take(1)[0] != 0;
    let event_idx_enabled = take(1)[0] != 0;
    let state = QueueState {
        max_size: QUEUE_SIZE,
        next_avail,
        next_used,
        event_idx_enabled,
        size,
        ready,
        desc_table: u64_(take(8)),
        avail_ring: u64_(take(8)),
        used_ring: u64_(take(8)),
    };
    let queue = Queue::try_from(state).map_err(|e| StateError::Queue(e.to_string()))?;
    Ok((regs, queue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_truncation_and_bad_version_is_refused() {
        let mut good = vec![VERSION];
        good.resize(BYTES, 0);
        // size 0 is "not set up": a fresh queue's size is its maximum.
        good[1 + 4 + 8 + 20..][..2].copy_from_slice(&QUEUE_SIZE.to_le_bytes());
        assert!(decode(&good).is_ok());
        for n in 0..BYTES {
            assert_eq!(decode(&good[..n]).err(), Some(StateError::Length(n)));
        }
        let mut bad = good.clone();
        bad[0] = 9;
        assert_eq!(decode(&bad).err(), Some(StateError::Version(9)));
        let mut bad = good.clone();
        bad[2] = 1; // status 0x100
        assert!(matches!(decode(&bad), Err(StateError::Status(_))));
        // A queue size that is not a power of two, or larger than the device's.
        for size in [3u16, 512, 0xffff] {
            let mut bad = good.clone();
            bad[1 + 4 + 8 + 20..][..2].copy_from_slice(&size.to_le_bytes());
            assert!(matches!(decode(&bad), Err(StateError::Queue(_))), "{size}");
        }
        // Misaligned rings.
        let mut bad = good.clone();
        bad[BYTES - 24] = 1;
        assert!(matches!(decode(&bad), Err(StateError::Queue(_))));
    }
}
