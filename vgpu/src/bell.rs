//! The doorbell page of exitless submission (docs/hardware.md, "Exitless submission"): the
//! page of guest RAM the guest named in `BELL_PAGE_LO/_HI`, read and written with atomic
//! accesses (the guest changes it at any time). The worker polls `PUT[n]` while it is active
//! (`Shared::poll_bell`); the device mirrors GP_GET and CHAN_STATUS into it and raises `WAKE`
//! while nobody polls. Every value read here is the guest's and is validated like the trapped
//! `GP_PUT[n]` write it stands for.

use std::sync::atomic::Ordering;

use vgpu_hw::bell;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::regs::MAX_CHANNELS;

/// A doorbell page in use (its address checked to be one page inside one RAM region).
#[derive(Debug)]
pub struct BellPage {
    ram: GuestMemoryMmap,
    addr: u64,
    /// `PUT[n]` as the worker last acted on it: a doorbell is a change of this word.
    pub seen: [u32; MAX_CHANNELS as usize],
    /// Whether `WAKE` is set now (as the device last wrote it).
    pub wake: bool,
}

impl BellPage {
    /// A page at `addr` of `ram` (the caller validated the address). Every `PUT[n]` the page
    /// holds now counts as seen; `WAKE` starts set (nobody polls until the worker looks).
    pub fn new(ram: GuestMemoryMmap, addr: u64) -> Self {
        let mut b = BellPage {
            ram,
            addr,
            seen: [0; MAX_CHANNELS as usize],
            wake: false,
        };
        for n in 0..MAX_CHANNELS {
            b.seen[n as usize] = b.load(bell::put(n));
        }
        b.set_wake(true);
        b
    }

    /// Guest-physical address of the page.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    fn load(&self, off: u64) -> u32 {
        self.ram
            .load::<u32>(GuestAddress(self.addr + off), Ordering::Acquire)
            .unwrap_or(0)
    }

    fn store(&self, off: u64, v: u32) {
        if let Err(e) = self
            .ram
            .store(v, GuestAddress(self.addr + off), Ordering::Release)
        {
            log::debug!("vgpu: doorbell page store at {:#x}: {e}", self.addr + off);
        }
    }

    /// `PUT[n]` now.
    pub fn put(&self, n: u32) -> u32 {
        self.load(bell::put(n))
    }

    /// Sets `PUT[n]` (to 0 when the channel is bound again) and counts it as seen.
    pub fn reset_put(&mut self, n: u32) {
        self.store(bell::put(n), 0);
        self.seen[n as usize] = 0;
    }

    /// Mirrors channel `n`'s GP_GET and CHAN_STATUS.
    pub fn mirror(&self, n: u32, gp_get: u32, status: u32) {
        self.store(bell::get(n), gp_get);
        self.store(bell::status(n), status);
    }

    /// Sets or clears `WAKE`; when setting it, orders the store before the loads of `PUT[n]`
    /// that follow (the guest stores `PUT[n]` and then loads `WAKE`: one of the two sides
    /// sees the other's store).
    pub fn set_wake(&mut self, on: bool) {
        if self.wake == on {
            return;
        }
        self.wake = on;
        self.store(bell::WAKE, u32::from(on));
        if on {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
    }
}
