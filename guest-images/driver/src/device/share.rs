//! Sharing one device among several drivers (several processes of one guest, each with its own
//! [`Gpu`]): what each driver owns (its channels, a VRAM range, its address space) and the
//! device-wide state they coordinate through the platform's device lock (the runlist, the
//! doorbell page, the para-virtual argument area and page-directory selection, fault records).
//! docs/architecture.md, "CUDA programs in the guest", has the whole scheme.

use super::*;

/// What a shared driver is given ([`Gpu::attach`]).
#[derive(Debug)]
pub struct Attach {
    /// This driver does the device-wide set-up (clears the fault record and interrupts,
    /// enables the doorbell page): the first driver of the device since boot.
    pub first: bool,
    /// Bit *n*: channel id *n* is this driver's.
    pub channels: u32,
    /// Guest VRAM this driver allocates from: [vram_base, vram_base + vram_len).
    pub vram_base: u64,
    pub vram_len: u64,
    /// The runlist page (guest VRAM, 4 KiB), the same for every driver of the device.
    pub runlist_vram: u64,
    /// The doorbell page, the same for every driver (`None`: trapped doorbells). The first
    /// driver enables it; later ones use it if the device has it enabled.
    pub bell: Option<DmaBuf>,
}

/// A shared driver's view of the others.
#[derive(Debug)]
pub(crate) struct Share {
    channels: u32,
    /// Channel ids of the other drivers, kept in the runlist this driver submits.
    pub(crate) peers: Vec<u32>,
}

impl Share {
    pub(crate) fn new(channels: u32) -> Self {
        Self {
            channels,
            peers: Vec::new(),
        }
    }

    /// Whether channel `id` is this driver's.
    pub(crate) fn owns(&self, id: u32) -> bool {
        id < 32 && self.channels & (1 << id) != 0
    }
}

/// How long [`Gpu::release_peer_channel`] waits for a running job of the channel to end.
const RELEASE_WAIT_NS: u64 = 10_000_000_000;

impl<P: Platform> Gpu<P> {
    /// Whether this driver shares the device ([`Gpu::attach`]).
    pub fn is_shared(&self) -> bool {
        self.share.is_some()
    }

    /// Whether channel `id` may be created by this driver.
    pub(crate) fn channel_allowed(&self, id: u32) -> bool {
        self.share.as_ref().is_none_or(|s| s.owns(id))
    }

    /// The channels of the other drivers of a shared device (the caller knows them from its
    /// own bookkeeping, under the device lock): they stay in every runlist this driver
    /// submits. Ids of this driver's own channels and ids ≥ CHANNELS are ignored.
    pub fn set_peers(&mut self, ids: &[u32]) {
        let channels = self.info.channels;
        if let Some(s) = &mut self.share {
            s.peers = ids
                .iter()
                .copied()
                .filter(|&i| i < channels && !(i < 32 && s.channels & (1 << i) != 0))
                .collect();
            s.peers.sort_unstable();
            s.peers.dedup();
        }
    }

    /// Takes back channel `id` of a driver that is gone (a process that died): unbinds it,
    /// waits (bounded) until it no longer runs, drops a fault record naming it, and takes it
    /// out of the peers. The caller submits the runlist afterwards. Not for own channels.
    pub fn release_peer_channel(&mut self, id: u32) -> Result<(), Error> {
        if id >= self.info.channels || self.share.as_ref().is_none_or(|s| s.owns(id)) {
            return Err(Error::BadChannel(id));
        }
        if let Some(s) = &mut self.share {
            s.peers.retain(|&p| p != id);
        }
        self.mmio += 4;
        unbind_channel(&mut self.p, id, RELEASE_WAIT_NS)
    }

    /// Uses the device's shared doorbell page: enables it when `first`; otherwise only if the
    /// device has exactly this page enabled (else doorbells stay trapped writes).
    pub(super) fn use_shared_bell(&mut self, b: DmaBuf, first: bool) -> Result<(), Error> {
        let page = regs::bell::PAGE_BYTES;
        if (b.len() as u64) < page || !b.gpa().is_multiple_of(page) {
            return Ok(());
        }
        let want = b.gpa() as u32 | regs::BELL_ENABLE;
        if first {
            self.reg_write(regs::BELL_PAGE_HI, (b.gpa() >> 32) as u32);
            self.reg_write(regs::BELL_PAGE_LO, want);
        }
        if self.reg_read(regs::BELL_PAGE_LO) == want {
            self.bell = Some(b);
            Ok(())
        } else if first {
            self.check_device_fault()
        } else {
            Ok(())
        }
    }

    /// Para mode, shared: removes every mapping of this driver's space on the device (the
    /// whole VA window; the driver's own record is empty at this point).
    /// A device without 4 KiB pages (the cuda backend's 2 MiB-only GPU) takes unmap entries
    /// only in 2 MiB pages (BIG): the window is 2 MiB aligned.
    pub(super) fn para_unmap_window(&mut self) -> Result<(), Error> {
        let (base, size) = (self.info.va_base, self.info.va_size);
        let big = self.info.page_sizes & regs::PAGE_4K == 0;
        let page = if big { PAGE_2M } else { PAGE_4K };
        let step = u64::from(u32::MAX / 2) * page;
        let mut entries = Vec::new();
        let mut at = base;
        while at < base + size {
            let n = (base + size - at).min(step);
            if big {
                if !(at | n).is_multiple_of(PAGE_2M) {
                    return Err(Error::Unaligned(at | n));
                }
                let pages = u32::try_from(n / PAGE_2M).map_err(|_| Error::OutOfRange(at))?;
                entries.push(para::Entry {
                    va: at,
                    pte: vgpu_hw::pte::BIG,
                    pages,
                });
            } else {
                entries.push(para::unmap_entry(at, n)?);
            }
            at += n;
        }
        self.para_batch(para::OP_UNMAP_BATCH, &entries, true)
    }

    /// Para mode, shared: registers this driver's argument area and selects its page
    /// directory again (another driver may have changed both) before a call. The caller
    /// holds the device lock.
    pub(super) fn para_select(&mut self, op: u32) -> Result<(), Error> {
        if self.share.is_none() || op == para::OP_SET_PD {
            return Ok(());
        }
        let pdb = self.pdb();
        let Some(pi) = self.para.as_mut() else {
            return Ok(());
        };
        pi.register(&mut self.p, None);
        let out = pi.call(&mut self.p, para::OP_SET_PD, pdb)?;
        self.mmio += 3;
        match out.status {
            para::ST_OK => Ok(()),
            status => Err(Error::ParaRefused {
                status,
                index: out.index,
            }),
        }
    }
}

/// Unbinds channel `id` through the platform alone (before a driver exists: a process taking
/// back a dead one's slot), waits up to `limit_ns` until it no longer runs, and clears a fault
/// record that names it.
pub fn unbind_channel<P: Platform>(p: &mut P, id: u32, limit_ns: u64) -> Result<(), Error> {
    if id >= regs::MAX_CHANNELS {
        return Err(Error::BadChannel(id));
    }
    p.reg_write(regs::chan_inst(id), 0);
    let start = p.now_ns();
    loop {
        let st = p.reg_read(regs::chan_status(id)) & 0xf;
        if st != regs::CHAN_RUNNING && st != regs::CHAN_PENDING {
            break;
        }
        let waited = p.now_ns().saturating_sub(start);
        if waited > limit_ns {
            return Err(Error::Timeout { waited_ns: waited });
        }
        p.relax();
    }
    if p.reg_read(regs::FAULT_STATUS) & regs::FAULT_VALID != 0
        && p.reg_read(regs::FAULT_CHANNEL) == id
    {
        p.reg_write(regs::FAULT_CLEAR, 1);
    }
    Ok(())
}
