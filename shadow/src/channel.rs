//! Shadow channels: the VM's quota of physical channels (`ChannelQuota`) and the record of one
//! bound guest channel (`ShadowChannel`).

use std::ops::Range;

use crate::fault::{FaultKind, GuestFault, Rule, ShadowError};
use crate::instance::Instance;
use crate::layout::GpuLayout;
use crate::mem::GuestMem;
use crate::types::{Aperture, Pdb};
use crate::watch::WatchKey;

/// Most channels a virtual GPU offers (CHANNELS ≤ 32).
pub const MAX_CHANNELS: u32 = 32;

/// Guest channel ids `0..count` → physical ids `phys_base..phys_base + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelQuota {
    count: u32,
    phys_base: u32,
}

impl ChannelQuota {
    /// A quota of `count` channels (1..=32) taken from the VM's physical range `phys` (which must
    /// hold at least `count` ids).
    pub fn new(count: u32, phys: Range<u32>) -> Result<Self, ShadowError> {
        if count == 0 || count > MAX_CHANNELS {
            return Err(ShadowError::Config("channel count must be 1..=32"));
        }
        if phys.end.saturating_sub(phys.start) < count {
            return Err(ShadowError::Config("physical channel range too small"));
        }
        Ok(Self {
            count,
            phys_base: phys.start,
        })
    }

    /// CHANNELS: guest ids `0..count` are usable.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The physical ids in use.
    pub fn phys_range(&self) -> Range<u32> {
        self.phys_base..self.phys_base + self.count
    }

    /// Whether `guest` is a usable guest channel id.
    pub fn contains(&self, guest: u32) -> bool {
        guest < self.count
    }

    /// The physical id of guest channel `guest`; ids ≥ CHANNELS fault with kind 13
    /// (BAD_CHANNEL, ADDR 0, INFO = the id).
    pub fn phys(&self, guest: u32) -> Result<u32, GuestFault> {
        if guest < self.count {
            Ok(self.phys_base + guest)
        } else {
            Err(GuestFault::new(
                FaultKind::BadChannel,
                Rule::ChannelRange,
                0,
                guest,
            ))
        }
    }
}

/// A bound guest channel: its ids, its validated instance block and what the device watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShadowChannel {
    /// Guest channel id.
    pub guest_id: u32,
    /// Physical channel id.
    pub phys_id: u32,
    /// Guest VRAM address of the instance block.
    pub inst_addr: u64,
    /// The validated instance block.
    pub instance: Instance,
    /// Key of the `ShadowSpace` the channel's work runs in (its page directory).
    pub space_key: Pdb,
    /// The instance block's page (in the watch set: a guest write there means `reload`).
    pub inst_page: WatchKey,
}

impl ShadowChannel {
    /// Binds guest channel `guest_id` to the instance block at guest VRAM `inst_addr` (a
    /// CHAN_INST write with VALID): checks the id (kind 13) and reads and validates the
    /// instance block (kinds 6/7).
    pub fn bind<M: GuestMem + ?Sized>(
        quota: &ChannelQuota,
        mem: &M,
        layout: &GpuLayout,
        guest_id: u32,
        inst_addr: u64,
    ) -> Result<Self, GuestFault> {
        let phys_id = quota.phys(guest_id)?;
        let instance = Instance::read(mem, layout, inst_addr)?;
        Ok(Self {
            guest_id,
            phys_id,
            inst_addr,
            instance,
            space_key: instance.pdb,
            inst_page: WatchKey::of(Aperture::Vram, inst_addr),
        })
    }

    /// Re-reads the instance block (after a guest write to its page). On success returns
    /// whether the page directory changed (the channel moves to another `ShadowSpace`); on a
    /// fault the record keeps its previous values and the channel must fault.
    pub fn reload<M: GuestMem + ?Sized>(
        &mut self,
        mem: &M,
        layout: &GpuLayout,
    ) -> Result<bool, GuestFault> {
        let instance = Instance::read(mem, layout, self.inst_addr)?;
        let moved = instance.pdb != self.space_key;
        self.instance = instance;
        self.space_key = instance.pdb;
        Ok(moved)
    }
}
