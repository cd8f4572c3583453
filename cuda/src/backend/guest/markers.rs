//! Markers (`cuEventRecord`): a semaphore release with the device's timestamp into a slot of
//! this process's marker page, submitted in order with the rest of the work. A marker has
//! completed when its submission's fence has; its time is the timestamp the device wrote
//! (device TIMER, ns), kept once read.

use std::collections::BTreeMap;

use gpu_driver::{Fence, SysAlloc};
use vgpu_linux_tools::session::Session;

use crate::device::DeviceError;

/// Marker slots (16 bytes each: payload, timestamp at +8).
const SLOTS: u64 = 1024;
/// Most completed markers whose times are kept.
const KEEP: usize = 1 << 16;

fn reached(value: u32, seq: u32) -> bool {
    (value.wrapping_sub(seq) as i32) >= 0
}

/// See the module documentation.
pub(super) struct Markers {
    buf: SysAlloc,
    next: u64,
    /// Issued markers not yet seen complete: their submission's fence.
    pending: BTreeMap<u64, Fence>,
    /// Completed markers' times.
    times: BTreeMap<u64, u64>,
}

impl Markers {
    pub(super) fn new(
        gpu: &mut gpu_driver::Gpu<vgpu_linux_tools::platform::LinuxGpu>,
    ) -> Result<Self, gpu_driver::Error> {
        Ok(Self {
            buf: gpu.sys_alloc_aligned(SLOTS * 16, 4096)?,
            next: 1,
            pending: BTreeMap::new(),
            times: BTreeMap::new(),
        })
    }

    /// A new marker id and the GPU VA of its slot; a marker that still holds the slot (issued
    /// `SLOTS` markers ago) is waited for and its time kept first.
    pub(super) fn next_slot(&mut self, s: &mut Session) -> Result<(u64, u64), gpu_driver::Error> {
        let id = self.next;
        if let Some(old) = id.checked_sub(SLOTS)
            && let Some(&f) = self.pending.get(&old)
            && let Some((gpu, ch)) = s.parts()
        {
            ch.wait(gpu, f)?;
            self.capture(s, old)?;
        }
        self.next += 1;
        Ok((id, self.buf.va + 16 * (id % SLOTS)))
    }

    /// Records the fence of marker `id`'s submission.
    pub(super) fn issued(&mut self, id: u64, f: Fence) {
        self.pending.insert(id, f);
    }

    /// Reads a completed marker's timestamp out of its slot and keeps it.
    fn capture(&mut self, s: &mut Session, id: u64) -> Result<u64, gpu_driver::Error> {
        let off = 16 * (id % SLOTS);
        let payload = s.gpu.sys_read_u32(&self.buf, off)?;
        if payload != id as u32 {
            return Err(gpu_driver::Error::BadInfo(
                "a marker slot holds another marker",
            ));
        }
        let t = s.gpu.sys_read_u64(&self.buf, off + 8)?;
        self.pending.remove(&id);
        self.times.insert(id, t);
        while self.times.len() > KEEP {
            self.times.pop_first();
        }
        Ok(t)
    }

    /// Whether marker `id` was issued by this device.
    pub(super) fn known(&self, id: u64) -> bool {
        self.times.contains_key(&id) || self.pending.contains_key(&id)
    }

    /// Whether marker `id` has completed (a fault of the channel is an error).
    pub(super) fn done(&mut self, s: &mut Session, id: u64) -> Result<bool, gpu_driver::Error> {
        if self.times.contains_key(&id) {
            return Ok(true);
        }
        let Some(&f) = self.pending.get(&id) else {
            return Err(gpu_driver::Error::BadInfo("unknown marker"));
        };
        let Some((gpu, ch)) = s.parts() else {
            return Err(gpu_driver::Error::BadChannel(u32::MAX));
        };
        if reached(ch.slot_value(gpu, 0)?, f.seq) {
            self.capture(s, id)?;
            return Ok(true);
        }
        ch.check_faulted(gpu)?;
        Ok(false)
    }

    /// The fence to wait for marker `id` (`None`: already complete).
    pub(super) fn fence_of(&self, id: u64) -> Result<Option<Fence>, DeviceError> {
        if self.times.contains_key(&id) {
            return Ok(None);
        }
        self.pending
            .get(&id)
            .map(|f| Some(*f))
            .ok_or_else(|| DeviceError::InvalidValue(format!("unknown marker {id}")))
    }

    /// The time (device TIMER, ns) at which marker `id`'s work had finished.
    pub(super) fn time(&mut self, s: &mut Session, id: u64) -> Result<u64, DeviceError> {
        if let Some(&t) = self.times.get(&id) {
            return Ok(t);
        }
        match self.done(s, id) {
            Ok(true) => self
                .times
                .get(&id)
                .copied()
                .ok_or_else(|| DeviceError::InvalidValue(format!("marker {id}"))),
            Ok(false) => Err(DeviceError::InvalidValue(format!(
                "marker {id} has not completed"
            ))),
            Err(e) => Err(DeviceError::InvalidValue(format!("marker {id}: {e}"))),
        }
    }
}
