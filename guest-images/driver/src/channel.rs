//! Channels: instance block, GPFIFO ring and stream buffer (pushbuffers and staged data) in
//! system memory, binding (CHAN_INST, runlist), submission (one doorbell: the doorbell page,
//! or a register write), fences
//! (a semaphore release with a timestamp after every submission) and recovery after a fault.

use crate::device::{Gpu, SysAlloc};
use crate::error::Error;
use crate::mmu::PAGE_4K;
use crate::platform::Platform;
use crate::push::PushBuf;
use crate::regs;

/// GPFIFO entries per channel.
const RING_ENTRIES: u32 = 512;
/// Bytes of the stream buffer (pushbuffers + staged parameters).
const STREAM_BYTES: u64 = 1 << 20;
/// Semaphore slots (16 bytes each: payload u32, timestamp u64 at +8); slot 0 is the fence.
pub const SEM_SLOTS: u64 = 64;

/// Completion of everything submitted up to a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub seq: u32,
}

/// How [`Channel::wait`] waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Spin on the semaphore in system memory, looking at CHAN_STATUS now and then.
    Poll,
    /// Sleep until the GPU's interrupt (release with the interrupt flag, or a fault).
    Interrupt,
}

/// A bound channel.
#[derive(Debug)]
pub struct Channel {
    id: u32,
    inst: u64,
    ring: SysAlloc,
    put: u32,
    ring_used: u32,
    stream: SysAlloc,
    stream_off: u64,
    batch_start: u64,
    sem: SysAlloc,
    seq: u32,
}

fn reached(value: u32, seq: u32) -> bool {
    (value.wrapping_sub(seq) as i32) >= 0
}

impl<P: Platform> Gpu<P> {
    /// Creates channel `id`: instance block, ring, stream, semaphores; binds it and adds it to
    /// the runlist.
    pub fn create_channel(&mut self, id: u32) -> Result<Channel, Error> {
        if id >= self.info().channels
            || self.channels_in_use & (1 << id) != 0
            || !self.channel_allowed(id)
        {
            return Err(Error::BadChannel(id));
        }
        if u64::from(RING_ENTRIES) * 8 > STREAM_BYTES {
            return Err(Error::BadInfo("ring size"));
        }
        let inst = self.vram_alloc_raw(PAGE_4K, PAGE_4K)?;
        let ring = self.sys_alloc(u64::from(RING_ENTRIES) * 8)?;
        let stream = self.sys_alloc(STREAM_BYTES)?;
        let sem = self.sys_alloc(SEM_SLOTS * 16)?;
        let mut ch = Channel {
            id,
            inst,
            ring,
            put: 0,
            ring_used: 0,
            stream,
            stream_off: 0,
            batch_start: 0,
            sem,
            seq: 0,
        };
        self.write_instance(&ch, ring.va, RING_ENTRIES)?;
        self.flush_if_needed();
        self.bind(&mut ch)?;
        self.channels_in_use |= 1 << id;
        self.runlist_set(id, true)?;
        Ok(ch)
    }

    /// Writes an instance block (4 traps).
    pub fn write_instance(
        &mut self,
        ch: &Channel,
        gpfifo_va: u64,
        entries: u32,
    ) -> Result<(), Error> {
        let pdb = self.pdb();
        self.vram_write64(ch.inst + regs::inst::PDB, pdb)?;
        self.vram_write64(ch.inst + regs::inst::GPFIFO_BASE, gpfifo_va)?;
        self.vram_write64(ch.inst + regs::inst::GPFIFO_ENTRIES, u64::from(entries))?;
        self.vram_write64(ch.inst + regs::inst::ENGINE_CTX, 0)
    }

    fn bind(&mut self, ch: &mut Channel) -> Result<(), Error> {
        let v = regs::CHAN_INST_VALID | ((ch.inst >> 12) as u32 & regs::CHAN_INST_ADDR_MASK);
        self.reg_write(regs::chan_inst(ch.id), v);
        self.check_device_fault()?;
        let get = self.reg_read(regs::gp_get(ch.id));
        ch.put = if get < RING_ENTRIES { get } else { 0 };
        Ok(())
    }

    /// Unbinds a channel and frees what it used.
    pub fn destroy_channel(&mut self, ch: Channel) -> Result<(), Error> {
        self.runlist_set(ch.id, false)?;
        self.reg_write(regs::chan_inst(ch.id), 0);
        self.channels_in_use &= !(1 << ch.id);
        self.vram_free_raw(ch.inst, PAGE_4K);
        self.sys_free(ch.ring);
        self.sys_free(ch.stream);
        self.sys_free(ch.sem);
        Ok(())
    }
}

impl Channel {
    /// Channel id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Guest VRAM address of the instance block.
    pub fn instance(&self) -> u64 {
        self.inst
    }

    /// GPU VA of the GPFIFO ring.
    pub fn ring_va(&self) -> u64 {
        self.ring.va
    }

    /// GPU VA of semaphore slot `k` (16-byte aligned; timestamp at +8).
    pub fn slot_va(&self, k: u64) -> u64 {
        self.sem.va + 16 * (k % SEM_SLOTS)
    }

    /// Payload of semaphore slot `k` as the GPU last wrote it.
    pub fn slot_value<P: Platform>(&self, gpu: &Gpu<P>, k: u64) -> Result<u32, Error> {
        gpu.sys_read_u32(&self.sem, 16 * (k % SEM_SLOTS))
    }

    /// Timestamp (device TIMER, ns) of the last release to slot `k` with TIMESTAMP.
    pub fn slot_time<P: Platform>(&self, gpu: &Gpu<P>, k: u64) -> Result<u64, Error> {
        gpu.sys_read_u64(&self.sem, 16 * (k % SEM_SLOTS) + 8)
    }

    /// Sets slot `k`'s payload from the CPU.
    pub fn set_slot<P: Platform>(&self, gpu: &mut Gpu<P>, k: u64, v: u32) -> Result<(), Error> {
        let off = 16 * (k % SEM_SLOTS);
        let old = gpu.sys_read_u64(&self.sem, off)?;
        gpu.sys_write_u64(&self.sem, off, (old & !0xffff_ffff) | u64::from(v))
    }

    fn idle<P: Platform>(&self, gpu: &Gpu<P>) -> bool {
        self.slot_value(gpu, 0).is_ok_and(|v| reached(v, self.seq))
    }

    /// Copies `data` into the stream buffer and returns its GPU VA (valid until the work that
    /// uses it completed). `align` is a power of two ≤ 4096.
    pub fn stage<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        data: &[u8],
        align: u64,
    ) -> Result<u64, Error> {
        let align = align.clamp(8, 4096);
        let len = data.len() as u64;
        let mut off = self.stream_off.next_multiple_of(align);
        if off + len > self.stream.len {
            if self.batch_start != self.stream_off {
                return Err(Error::NoSysmem(len));
            }
            self.wait_idle(gpu)?;
            self.stream_off = 0;
            self.batch_start = 0;
            off = 0;
            if len > self.stream.len {
                return Err(Error::NoSysmem(len));
            }
        }
        gpu.sys_write(&self.stream, off, data)?;
        self.stream_off = off + len;
        Ok(self.stream.va + off)
    }

    /// Submits `pb` (after appending the fence release to it): copies its words into the
    /// stream, writes GPFIFO entries and rings the doorbell (one register write, plus a TLB
    /// flush if page tables changed).
    pub fn submit<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        pb: &mut PushBuf,
    ) -> Result<Fence, Error> {
        let seq = self.seq.wrapping_add(1);
        pb.release(self.slot_va(0), seq, gpu.interrupts_on(), true);
        let max = gpu.info().max_push_words.min(0xffff) as usize;
        let segs = pb.segments(max)?;
        let n = segs.len() as u32;
        if n >= RING_ENTRIES {
            return Err(Error::PushTooLong(pb.words().len()));
        }
        if self.ring_used + n >= RING_ENTRIES {
            self.wait_idle(gpu)?;
        }
        if self.idle(gpu) {
            self.ring_used = 0;
            if self.batch_start == self.stream_off {
                self.stream_off = 0;
                self.batch_start = 0;
            }
        }
        let mut bytes = alloc::vec::Vec::with_capacity(pb.words().len() * 4);
        pb.words()
            .iter()
            .for_each(|w| bytes.extend_from_slice(&w.to_le_bytes()));
        let base = self.stage(gpu, &bytes, 8)?;
        for (start, len) in segs {
            let va = base + 4 * start as u64;
            let entry = (va & 0xffff_ffff_ffff) | (len as u64) << 48;
            gpu.sys_write_u64(&self.ring, 8 * u64::from(self.put), entry)?;
            self.put = (self.put + 1) % RING_ENTRIES;
        }
        self.ring_used += n;
        self.seq = seq;
        self.batch_start = self.stream_off;
        gpu.flush_if_needed();
        gpu.ring(self.id, self.put);
        Ok(Fence { seq })
    }

    /// Copies `data` into a new VRAM pool buffer (staged in system memory, one copy-engine
    /// copy, waited for).
    pub fn upload_vram<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        data: &[u8],
    ) -> Result<crate::device::VramAlloc, Error> {
        let len = data.len() as u64;
        let v = gpu.vram_alloc(len)?;
        let staging = match gpu.sys_alloc(len) {
            Ok(s) => s,
            Err(e) => {
                gpu.vram_free(v);
                return Err(e);
            }
        };
        let r = gpu.sys_write(&staging, 0, data).and_then(|()| {
            let mut pb = PushBuf::new();
            pb.copy(staging.va, v.va, len);
            let f = self.submit(gpu, &mut pb)?;
            self.wait(gpu, f)
        });
        gpu.sys_free(staging);
        match r {
            Ok(()) => Ok(v),
            Err(e) => {
                gpu.vram_free(v);
                Err(e)
            }
        }
    }

    /// Waits for everything submitted so far.
    pub fn wait_idle<P: Platform>(&mut self, gpu: &mut Gpu<P>) -> Result<(), Error> {
        self.wait(gpu, Fence { seq: self.seq })
    }

    /// Waits until `fence` has passed: polls the semaphore (no trap), checking CHAN_STATUS
    /// after `fault_poll_ns`, then at doubling intervals up to 16 times that; or sleeps on the
    /// interrupt if the driver uses them. A fault of this channel ends the wait with the fault.
    pub fn wait<P: Platform>(&mut self, gpu: &mut Gpu<P>, fence: Fence) -> Result<(), Error> {
        let limit = gpu.cfg.wait_timeout_ns;
        self.wait_timeout(gpu, fence, limit)
    }

    /// [`Channel::wait`] with its own time limit.
    pub fn wait_timeout<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        fence: Fence,
        limit_ns: u64,
    ) -> Result<(), Error> {
        let mode = if gpu.interrupts_on() {
            WaitMode::Interrupt
        } else {
            WaitMode::Poll
        };
        let start = gpu.p.now_ns();
        let mut last_check = start;
        // Each look at CHAN_STATUS is a trap: look often at first, then back off (to 16×).
        let mut interval = gpu.cfg.fault_poll_ns;
        loop {
            if reached(self.slot_value(gpu, 0)?, fence.seq) {
                return Ok(());
            }
            let now = gpu.p.now_ns();
            let waited = now.saturating_sub(start);
            if waited > limit_ns {
                return Err(Error::Timeout { waited_ns: waited });
            }
            match mode {
                WaitMode::Interrupt => {
                    if reached(self.slot_value(gpu, 0)?, fence.seq) {
                        return Ok(());
                    }
                    let poll = gpu.cfg.fault_poll_ns.max(1_000_000) * 8;
                    gpu.p.wait_for_interrupt(poll);
                    let s = gpu.ack_interrupts();
                    if s & regs::INTR_FAULT != 0 {
                        self.check_faulted(gpu)?;
                        gpu.check_device_fault()?;
                    }
                }
                WaitMode::Poll => {
                    if now.saturating_sub(last_check) >= interval {
                        last_check = now;
                        interval = (interval * 2).min(gpu.cfg.fault_poll_ns.saturating_mul(16));
                        self.check_faulted(gpu)?;
                    }
                    gpu.p.relax();
                }
            }
        }
    }

    /// `Err` if CHAN_STATUS says this channel faulted (with the fault record, if one is held).
    pub fn check_faulted<P: Platform>(&self, gpu: &mut Gpu<P>) -> Result<(), Error> {
        let st = gpu.chan_status(self.id);
        if st & 0xf != regs::CHAN_FAULTED {
            return Ok(());
        }
        match gpu.take_fault() {
            Some(f) => Err(Error::Fault(f)),
            None => Err(Error::ChannelFaulted {
                channel: self.id,
                kind: (st >> 8) as u8,
            }),
        }
    }

    /// CHAN_STATUS state (bits 3:0) and fault kind (bits 15:8).
    pub fn status<P: Platform>(&self, gpu: &mut Gpu<P>) -> (u32, u8) {
        let st = gpu.reg_read(regs::chan_status(self.id));
        (st & 0xf, (st >> 8) as u8)
    }

    /// Makes a faulted channel usable again: turns the entries it did not run into no-ops,
    /// clears the fault record and rebinds it (writes CHAN_INST again).
    pub fn recover<P: Platform>(&mut self, gpu: &mut Gpu<P>) -> Result<(), Error> {
        let get = gpu.reg_read(regs::gp_get(self.id));
        if get < RING_ENTRIES {
            let mut i = get;
            while i != self.put {
                gpu.sys_write_u64(&self.ring, 8 * u64::from(i), 0)?;
                i = (i + 1) % RING_ENTRIES;
            }
        } else {
            for i in 0..RING_ENTRIES {
                gpu.sys_write_u64(&self.ring, 8 * u64::from(i), 0)?;
            }
        }
        let _ = gpu.take_fault();
        gpu.ack_interrupts();
        let ring_va = self.ring.va;
        gpu.write_instance(self, ring_va, RING_ENTRIES)?;
        gpu.flush_if_needed();
        let v = regs::CHAN_INST_VALID | ((self.inst >> 12) as u32 & regs::CHAN_INST_ADDR_MASK);
        gpu.reg_write(regs::chan_inst(self.id), v);
        gpu.check_device_fault()?;
        let after = gpu.reg_read(regs::gp_get(self.id));
        if after != get {
            self.put = if after < RING_ENTRIES { after } else { 0 };
        }
        let seq = self.seq;
        self.set_slot(gpu, 0, seq)?;
        self.ring_used = 0;
        self.stream_off = 0;
        self.batch_start = 0;
        Ok(())
    }

    /// Rings the doorbell with a raw value (device validation tests).
    pub fn doorbell_raw<P: Platform>(&self, gpu: &mut Gpu<P>, put: u32) {
        gpu.reg_write(regs::gp_put(self.id), put);
    }

    /// Writes one raw GPFIFO entry and rings the doorbell (device validation tests). The
    /// entry is not followed by a fence.
    pub fn submit_raw_entry<P: Platform>(
        &mut self,
        gpu: &mut Gpu<P>,
        entry: u64,
    ) -> Result<(), Error> {
        if self.ring_used + 1 >= RING_ENTRIES {
            self.wait_idle(gpu)?;
            self.ring_used = 0;
        }
        gpu.sys_write_u64(&self.ring, 8 * u64::from(self.put), entry)?;
        self.put = (self.put + 1) % RING_ENTRIES;
        self.ring_used += 1;
        gpu.flush_if_needed();
        gpu.reg_write(regs::gp_put(self.id), self.put);
        Ok(())
    }

    /// Rewrites the instance block with a raw GPFIFO base and size (device validation tests;
    /// [`Channel::recover`] restores the real ones).
    pub fn set_gpfifo_raw<P: Platform>(
        &self,
        gpu: &mut Gpu<P>,
        va: u64,
        entries: u32,
    ) -> Result<(), Error> {
        gpu.write_instance(self, va, entries)
    }
}
