//! A disk device's snapshot state ([`crate::persist::Persist`] for [`BlockDevice`]: one
//! `DISK` state-file section per disk, in `--disk` order): the transport's registers and the
//! virtqueue's position and addresses, encoded little-endian, decoded as hostile input (every
//! field checked before it is used). The disk's contents are not saved: only read-only disks
//! may be snapshotted, and the file's path and size are checked at restore
//! (`super::DiskSpec` in the manifest).

use snapfmt::{Dec, Enc, Id};
use virtio_queue::{Queue, QueueState, QueueT};

use super::device::{BlockDevice, QUEUE_SIZE, Regs};
use crate::persist::{Persist, PersistError};
use crate::snapshot::format::{DecodeError, tag};

/// Bytes of an encoded state.
pub const BYTES: usize = 4 + 8 + 4 * 5 + 2 + 2 + 2 + 1 + 1 + 8 * 3;

/// Why a saved state does not go back into a device.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("disk queue: {0}")]
    Queue(String),
    #[error("disk queue is ready but its rings are not in guest RAM")]
    Rings,
}

/// What a snapshot saves of a disk device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskState {
    pub regs: Regs,
    pub queue: QueueState,
}

impl Persist for BlockDevice {
    type State = DiskState;
    const SECTION: Id = tag::DISK;
    const VERSION: u32 = 1;

    fn save(&self) -> DiskState {
        DiskState {
            regs: self.regs.clone(),
            queue: self.queue.state(),
        }
    }

    fn restore(&mut self, s: &DiskState) -> Result<(), PersistError> {
        let queue = Queue::try_from(s.queue).map_err(|e| StateError::Queue(e.to_string()))?;
        if queue.ready() && !queue.is_valid(&self.mem) {
            return Err(StateError::Rings.into());
        }
        self.regs = s.regs.clone();
        self.queue = queue;
        Ok(())
    }

    fn encode(s: &DiskState, e: &mut Enc) {
        let (r, q) = (&s.regs, &s.queue);
        e.u32(r.status).u64(r.driver_features);
        for v in [
            r.device_features_sel,
            r.driver_features_sel,
            r.queue_sel,
            r.interrupt_status,
            r.config_generation,
        ] {
            e.u32(v);
        }
        for v in [q.size, q.next_avail, q.next_used] {
            e.raw(&v.to_le_bytes());
        }
        e.u8(u8::from(q.ready)).u8(u8::from(q.event_idx_enabled));
        e.u64(q.desc_table).u64(q.avail_ring).u64(q.used_ring);
    }

    fn decode(d: &mut Dec<'_>) -> Result<DiskState, DecodeError> {
        let invalid = |what, detail: String| DecodeError::Invalid { what, detail };
        let status = d.at("disk status").u32()?;
        if status > 0xff {
            return Err(invalid(
                "disk status",
                format!("{status:#x} has unknown bits"),
            ));
        }
        let regs = Regs {
            status,
            driver_features: d.at("disk driver features").u64()?,
            device_features_sel: d.at("disk registers").u32()?,
            driver_features_sel: d.at("disk registers").u32()?,
            queue_sel: d.at("disk registers").u32()?,
            interrupt_status: d.at("disk registers").u32()? & 0b11,
            config_generation: d.at("disk registers").u32()?,
        };
        let mut u16_ = || Ok::<_, DecodeError>(u16::from_le_bytes(d.at("disk queue").array()?));
        let (size, next_avail, next_used) = (u16_()?, u16_()?, u16_()?);
        let queue = QueueState {
            max_size: QUEUE_SIZE,
            next_avail,
            next_used,
            size,
            ready: d.at("disk queue ready").bool()?,
            event_idx_enabled: d.at("disk queue event-idx").bool()?,
            desc_table: d.at("disk queue").u64()?,
            avail_ring: d.at("disk queue").u64()?,
            used_ring: d.at("disk queue").u64()?,
        };
        // The queue's own checks (a size the device could not take, misaligned rings).
        Queue::try_from(queue).map_err(|e| invalid("disk queue", e.to_string()))?;
        Ok(DiskState { regs, queue })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::{self, DeviceSection};

    fn good() -> Vec<u8> {
        let mut good = vec![0; BYTES];
        // size 0 is "not set up": a fresh queue's size is its maximum.
        good[4 + 8 + 20..][..2].copy_from_slice(&QUEUE_SIZE.to_le_bytes());
        good
    }

    #[test]
    fn every_truncation_and_bad_field_is_refused() {
        let good = good();
        let s = persist::decode::<BlockDevice>(1, &good).unwrap();
        assert_eq!(s.queue.size, QUEUE_SIZE);
        assert_eq!(persist::encode::<BlockDevice>(&s), good);
        for n in 0..BYTES {
            assert!(
                persist::decode::<BlockDevice>(1, &good[..n]).is_err(),
                "{n}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(persist::decode::<BlockDevice>(1, &long).is_err());
        assert!(persist::decode::<BlockDevice>(2, &good).is_err());
        let mut bad = good.clone();
        bad[1] = 1; // status 0x100
        assert!(persist::decode::<BlockDevice>(1, &bad).is_err());
        // A queue size that is not a power of two, or larger than the device's.
        for size in [3u16, 512, 0xffff] {
            let mut bad = good.clone();
            bad[4 + 8 + 20..][..2].copy_from_slice(&size.to_le_bytes());
            assert!(persist::decode::<BlockDevice>(1, &bad).is_err(), "{size}");
        }
        // Misaligned rings; a ready byte that is not 0 or 1.
        let mut bad = good.clone();
        bad[BYTES - 24] = 1;
        assert!(persist::decode::<BlockDevice>(1, &bad).is_err());
        let mut bad = good.clone();
        bad[4 + 8 + 20 + 6] = 2;
        assert!(persist::decode::<BlockDevice>(1, &bad).is_err());
        // The loader's check of a state file's section decodes it the same way.
        let section = |payload| DeviceSection {
            id: tag::DISK,
            version: 1,
            payload,
        };
        assert!(persist::check_section(&section(good)).is_ok());
        assert!(persist::check_section(&section(bad)).is_err());
    }
}
