//! A virtio-blk device on the virtio-mmio transport (version 2, "modern"): the register file
//! the guest driver programs (features, status, one virtqueue), the block configuration
//! space, and the queue's processing at the guest's notify, on the vCPU thread that wrote it;
//! the used-buffer interrupt goes out through an irqfd (an edge on an ISA line of KVM's PIC).

use std::fs::File;
use std::sync::Arc;

use mmio::BusDevice;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_mmio as reg;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::request::{self, Backend, SECTOR, SEG_MAX, SIZE_MAX};

/// "virt", the virtio-mmio magic value.
const MAGIC: u32 = 0x7472_6976;
/// The transport version implemented (1 is the legacy layout).
const MMIO_VERSION: u32 = 2;
/// The vendor id reported ("VGPU").
const VENDOR: u32 = 0x5550_4756;
/// Entries of the one queue.
pub const QUEUE_SIZE: u16 = 256;

/// The device's registers and queue: what a snapshot saves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regs {
    pub status: u32,
    pub driver_features: u64,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub queue_sel: u32,
    pub interrupt_status: u32,
    pub config_generation: u32,
}

/// See the module documentation.
pub struct BlockDevice {
    file: Arc<File>,
    sectors: u64,
    read_only: bool,
    serial: String,
    pub(super) regs: Regs,
    pub(super) queue: Queue,
    pub(super) mem: GuestMemoryMmap,
    irq: EventFd,
    buf: Vec<u8>,
    /// Requests completed and data bytes moved, notifies that found work, and the time spent
    /// handling them (logged when the device is dropped).
    pub(super) completed: u64,
    bytes: u64,
    notifies: u64,
    busy: std::time::Duration,
}

impl BlockDevice {
    /// A device over `file` of `bytes` bytes (whole sectors only are visible).
    pub fn new(
        file: Arc<File>,
        bytes: u64,
        read_only: bool,
        serial: String,
        mem: GuestMemoryMmap,
        irq: EventFd,
    ) -> Self {
        BlockDevice {
            file,
            sectors: bytes / SECTOR,
            read_only,
            serial,
            regs: Regs::reset(),
            queue: new_queue(),
            mem,
            irq,
            buf: Vec::new(),
            completed: 0,
            bytes: 0,
            notifies: 0,
            busy: std::time::Duration::ZERO,
        }
    }

    /// The features offered.
    pub fn device_features(&self) -> u64 {
        let mut f = (1u64 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_BLK_F_SIZE_MAX)
            | (1 << VIRTIO_BLK_F_SEG_MAX);
        f |= if self.read_only {
            1 << VIRTIO_BLK_F_RO
        } else {
            1 << VIRTIO_BLK_F_FLUSH
        };
        f
    }

    /// The block configuration space (`struct virtio_blk_config`, the fields offered).
    fn config(&self) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[0..8].copy_from_slice(&self.sectors.to_le_bytes());
        c[8..12].copy_from_slice(&SIZE_MAX.to_le_bytes());
        c[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        c
    }

    fn reset(&mut self) {
        self.regs = Regs::reset();
        self.queue = new_queue();
    }

    fn read_reg(&self, off: u32) -> u32 {
        let r = &self.regs;
        match off {
            reg::VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            reg::VIRTIO_MMIO_VERSION => MMIO_VERSION,
            reg::VIRTIO_MMIO_DEVICE_ID => VIRTIO_ID_BLOCK,
            reg::VIRTIO_MMIO_VENDOR_ID => VENDOR,
            reg::VIRTIO_MMIO_DEVICE_FEATURES => match r.device_features_sel {
                0 => self.device_features() as u32,
                1 => (self.device_features() >> 32) as u32,
                _ => 0,
            },
            reg::VIRTIO_MMIO_QUEUE_NUM_MAX if r.queue_sel == 0 => u32::from(QUEUE_SIZE),
            reg::VIRTIO_MMIO_QUEUE_READY if r.queue_sel == 0 => u32::from(self.queue.ready()),
            reg::VIRTIO_MMIO_INTERRUPT_STATUS => r.interrupt_status,
            reg::VIRTIO_MMIO_STATUS => r.status,
            reg::VIRTIO_MMIO_CONFIG_GENERATION => r.config_generation,
            _ => 0,
        }
    }

    fn write_reg(&mut self, off: u32, v: u32) {
        // Queue registers may change only while the driver sets the device up.
        let setting_up = self.regs.status & VIRTIO_CONFIG_S_DRIVER_OK == 0;
        let q0 = self.regs.queue_sel == 0 && setting_up;
        match off {
            reg::VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.regs.device_features_sel = v,
            reg::VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.regs.driver_features_sel = v,
            reg::VIRTIO_MMIO_DRIVER_FEATURES
                if self.regs.status & VIRTIO_CONFIG_S_FEATURES_OK == 0 =>
            {
                let f = &mut self.regs.driver_features;
                match self.regs.driver_features_sel {
                    0 => *f = (*f & !0xffff_ffff) | u64::from(v),
                    1 => *f = (*f & 0xffff_ffff) | (u64::from(v) << 32),
                    _ => {}
                }
            }
            reg::VIRTIO_MMIO_QUEUE_SEL => self.regs.queue_sel = v,
            reg::VIRTIO_MMIO_QUEUE_NUM if q0 => {
                // An invalid size (zero, not a power of two, too large) is ignored by the
                // queue; the driver's ready check then fails.
                if let Ok(n) = u16::try_from(v) {
                    self.queue.set_size(n);
                }
            }
            reg::VIRTIO_MMIO_QUEUE_READY if q0 => {
                // Ready only with rings inside guest RAM (`is_valid` checks a ready queue).
                self.queue.set_ready(v == 1);
                if v == 1 && !self.queue.is_valid(&self.mem) {
                    log::warn!("virtio-blk {}: queue set up outside guest RAM", self.serial);
                    self.queue.set_ready(false);
                }
            }
            reg::VIRTIO_MMIO_QUEUE_DESC_LOW if q0 => {
                self.queue.set_desc_table_address(Some(v), None)
            }
            reg::VIRTIO_MMIO_QUEUE_DESC_HIGH if q0 => {
                self.queue.set_desc_table_address(None, Some(v))
            }
            reg::VIRTIO_MMIO_QUEUE_AVAIL_LOW if q0 => {
                self.queue.set_avail_ring_address(Some(v), None)
            }
            reg::VIRTIO_MMIO_QUEUE_AVAIL_HIGH if q0 => {
                self.queue.set_avail_ring_address(None, Some(v))
            }
            reg::VIRTIO_MMIO_QUEUE_USED_LOW if q0 => {
                self.queue.set_used_ring_address(Some(v), None)
            }
            reg::VIRTIO_MMIO_QUEUE_USED_HIGH if q0 => {
                self.queue.set_used_ring_address(None, Some(v))
            }
            reg::VIRTIO_MMIO_QUEUE_NOTIFY => {
                if v == 0 {
                    self.process_queue();
                }
            }
            reg::VIRTIO_MMIO_INTERRUPT_ACK => self.regs.interrupt_status &= !v,
            reg::VIRTIO_MMIO_STATUS => self.write_status(v),
            _ => log::debug!("virtio-blk: write {v:#x} to register {off:#x} ignored"),
        }
    }

    fn write_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        let mut v = v & 0xff;
        // FEATURES_OK only for a subset of the offered features that includes VERSION_1 (the
        // legacy interface is not offered); the driver reads the status back to check.
        if v & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && self.regs.status & VIRTIO_CONFIG_S_FEATURES_OK == 0
        {
            let f = self.regs.driver_features;
            if f & !self.device_features() != 0 || f & (1 << VIRTIO_F_VERSION_1) == 0 {
                log::warn!("virtio-blk {}: driver features {f:#x} refused", self.serial);
                v &= !VIRTIO_CONFIG_S_FEATURES_OK;
            }
        }
        // Bits are only ever added until a reset (NEEDS_RESET is the device's own).
        self.regs.status |= v & !VIRTIO_CONFIG_S_NEEDS_RESET;
    }

    /// Handles every request the driver has made available, then interrupts it.
    fn process_queue(&mut self) {
        if self.regs.status & VIRTIO_CONFIG_S_DRIVER_OK == 0
            || self.regs.status & VIRTIO_CONFIG_S_NEEDS_RESET != 0
            || !self.queue.ready()
        {
            return;
        }
        let mem = self.mem.clone();
        // The avail index is read once: at most a queue's worth of chains per notify.
        let chains: Vec<_> = match self.queue.iter(&mem) {
            Ok(it) => it.collect(),
            Err(e) => return self.broken(&e.to_string()),
        };
        if chains.is_empty() {
            return;
        }
        let start = std::time::Instant::now();
        self.notifies += 1;
        let disk = Backend {
            file: &self.file,
            sectors: self.sectors,
            read_only: self.read_only,
            serial: &self.serial,
        };
        let mut buf = std::mem::take(&mut self.buf);
        for chain in chains {
            let head = chain.head_index();
            let done = request::handle(chain, &mem, &disk, &mut buf);
            if let Err(e) = self.queue.add_used(&mem, head, done.used_len) {
                self.buf = buf;
                return self.broken(&e.to_string());
            }
            self.completed += 1;
            self.bytes += u64::from(done.used_len.saturating_sub(1));
        }
        self.busy += start.elapsed();
        // Large reads leave a large buffer: keep at most one segment's worth between
        // notifies.
        buf.truncate(SIZE_MAX as usize);
        buf.shrink_to(SIZE_MAX as usize);
        self.buf = buf;
        // Unless the driver asked for no interrupt (VRING_AVAIL_F_NO_INTERRUPT).
        if self.queue.needs_notification(&mem).unwrap_or(true) {
            self.interrupt();
        }
    }

    fn interrupt(&mut self) {
        self.regs.interrupt_status |= reg::VIRTIO_MMIO_INT_VRING;
        if let Err(e) = self.irq.write(1) {
            log::warn!("virtio-blk {}: interrupt not sent: {e}", self.serial);
        }
    }

    /// The driver broke the queue's rules: the device stops until it is reset.
    fn broken(&mut self, why: &str) {
        log::warn!(
            "virtio-blk {}: {why}; the device needs a reset",
            self.serial
        );
        self.regs.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
        self.regs.interrupt_status |= reg::VIRTIO_MMIO_INT_CONFIG;
        let _ = self.irq.write(1);
    }

    /// Whether the guest may write the disk.
    pub fn read_only(&self) -> bool {
        self.read_only
    }
}

impl BlockDevice {
    /// Logs the device's counters (at debug level).
    pub fn log_counters(&self) {
        log::debug!(
            "virtio-blk {}: {} requests in {} notifies, {} bytes read, {:.2} ms in the device \
             ({:.1} us per request)",
            self.serial,
            self.completed,
            self.notifies,
            self.bytes,
            self.busy.as_secs_f64() * 1e3,
            self.busy.as_secs_f64() * 1e6 / self.completed.max(1) as f64
        );
    }
}

impl Regs {
    fn reset() -> Self {
        Regs {
            status: 0,
            driver_features: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            queue_sel: 0,
            interrupt_status: 0,
            config_generation: 0,
        }
    }
}

fn new_queue() -> Queue {
    // QUEUE_SIZE is a power of two below the maximum: `new` cannot fail.
    Queue::new(QUEUE_SIZE).unwrap_or_else(|_| unreachable!("queue size {QUEUE_SIZE} is valid"))
}

impl BusDevice for BlockDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let cfg = u64::from(reg::VIRTIO_MMIO_CONFIG);
        if offset >= cfg {
            // The configuration space: any width.
            let c = self.config();
            let start = (offset - cfg) as usize;
            for (i, b) in data.iter_mut().enumerate() {
                *b = start
                    .checked_add(i)
                    .and_then(|j| c.get(j))
                    .copied()
                    .unwrap_or(0);
            }
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            return;
        }
        data.copy_from_slice(&self.read_reg(offset as u32).to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Ok(raw) = <[u8; 4]>::try_from(data) else {
            return;
        };
        if offset >= u64::from(reg::VIRTIO_MMIO_CONFIG) || !offset.is_multiple_of(4) {
            // The block configuration space offered is read-only.
            return;
        }
        self.write_reg(offset as u32, u32::from_le_bytes(raw));
    }
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
