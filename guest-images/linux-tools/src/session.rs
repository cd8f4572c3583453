//! One process's share of the virtual GPU ([`Session`]): under the device lock, take back the
//! slots of processes that are gone, lease a free slot, map only that slot's memory, attach a
//! driver to it ([`gpu_driver::Gpu::attach`]: the first process since boot also sets the
//! device up) and create the slot's channel with every live process's channel in the runlist.
//! Dropping the session gives the slot back. docs/architecture.md, "CUDA programs in the
//! guest", has the whole scheme; [`crate::share`] the files.

use std::fs::OpenOptions;
use std::path::PathBuf;

use gpu_driver::{Attach, Channel, Config, DmaBuf, Gpu, Platform, regs};

use crate::ToolError;
use crate::dma::{DmaPool, reserved_range};
use crate::lazymap::LazyMap;
use crate::platform::LinuxGpu;
use crate::share::{self, DeviceLock, GRANULE, Lease, State};

/// Slots the first process splits the device into unless `VGPU_CUDA_SLOTS` says otherwise.
pub const DEFAULT_SLOTS: u32 = 4;
/// How long taking back a dead process's channel waits for its running job.
const UNBIND_WAIT_NS: u64 = 10_000_000_000;

/// A process's slot of the device, with its driver and channel.
pub struct Session {
    pub gpu: Gpu<LinuxGpu>,
    channel: Option<Channel>,
    /// The slot (= channel id).
    pub slot: u32,
    /// Whether this process set the device up (the first since boot).
    pub first: bool,
    /// Slots taken back from processes that were gone.
    pub reclaimed: Vec<u32>,
    dir: PathBuf,
    /// Keeps the shared doorbell page mapped.
    _bell: Option<LazyMap>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("slot", &self.slot)
            .field("first", &self.first)
            .finish_non_exhaustive()
    }
}

/// Maps the first page of the `memmap=` range (the doorbell page) on its own.
fn map_bell(gpa: u64) -> Result<(LazyMap, DmaBuf), ToolError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mem")
        .map_err(ToolError::io("open /dev/mem"))?;
    let page = regs::bell::PAGE_BYTES as usize;
    let mut m = LazyMap::new(f, gpa, page).map_err(ToolError::io("reserve the doorbell page"))?;
    let p = m
        .ensure(0, page)
        .ok_or_else(|| ToolError::Bad("cannot map the doorbell page".into()))?;
    // SAFETY: the page stays mapped while the returned LazyMap lives (the session keeps it
    // next to the driver that uses the buffer), and it is guest-physical `gpa`.
    let b = unsafe { DmaBuf::from_raw(p, gpa, page) }
        .ok_or_else(|| ToolError::Bad("doorbell page".into()))?;
    Ok((m, b))
}

/// The first process's split of the device: the `memmap=` range and the VRAM the BAR shows.
fn first_layout(p: &mut LinuxGpu) -> Result<State, ToolError> {
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").map_err(ToolError::io("read /proc/cmdline"))?;
    let dma = reserved_range(&cmdline).ok_or_else(|| {
        ToolError::Bad(
            "no memmap=SIZE$ADDR on the kernel command line: no memory for the GPU".into(),
        )
    })?;
    let vram = (u64::from(p.reg_read(regs::VRAM_SIZE_LO))
        | u64::from(p.reg_read(regs::VRAM_SIZE_HI)) << 32)
        .min(p.vram_aperture());
    let channels = p.reg_read(regs::CHANNELS).min(regs::MAX_CHANNELS);
    let want = match std::env::var("VGPU_CUDA_SLOTS") {
        Ok(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=share::MAX_SLOTS).contains(n))
            .ok_or_else(|| ToolError::Bad(format!("VGPU_CUDA_SLOTS={v}: 1 to 32")))?,
        Err(_) => DEFAULT_SLOTS,
    };
    State::layout(want.min(channels.max(1)), dma, vram)
}

impl Session {
    /// Attaches this process to the device (see the module documentation). `cfg` gives the
    /// driver's settings; its pool sizes are the slot's.
    pub fn attach(mut cfg: Config) -> Result<Self, ToolError> {
        let dir = share::state_dir();
        let lock = DeviceLock::open(&dir)?;
        let mut p = LinuxGpu::open(false)?;
        p.set_lock(lock);
        p.lock_device();
        // On an error below the platform is dropped: closing the lock file releases it.
        let loaded = State::load(&dir)?;
        let first = loaded.is_none();
        let mut st = match loaded {
            Some(s) => s,
            None => first_layout(&mut p)?,
        };
        let mut reclaimed = Vec::new();
        for (k, l) in st.leases.iter_mut().enumerate() {
            if l.as_ref().is_some_and(|l| !share::alive(l)) {
                *l = None;
                reclaimed.push(k as u32);
            }
        }
        for &k in &reclaimed {
            // Before anyone reuses the slot's memory: the dead process's channel stops.
            gpu_driver::unbind_channel(&mut p, k, UNBIND_WAIT_NS)?;
        }
        let slot = st.leases.iter().position(Option::is_none).ok_or_else(|| {
            ToolError::Bad(format!(
                "all {} CUDA slots of the GPU are in use (the first process since boot chose the \
                 number: VGPU_CUDA_SLOTS)",
                st.slots
            ))
        })? as u32;
        let (dma_gpa, dma_len) = st.dma_range(slot);
        p.set_dma(DmaPool::map(dma_gpa, dma_len)?);
        let (bell_map, bell) = map_bell(st.dma_base)?;
        let (vram_base, vram_len) = st.vram_range(slot);
        cfg.sys_pool_bytes = dma_len - 2 * GRANULE;
        cfg.vram_pool_bytes = vram_len - GRANULE;
        cfg.use_interrupts = false;
        let a = Attach {
            first,
            channels: 1 << slot,
            vram_base,
            vram_len,
            runlist_vram: 0,
            bell: Some(bell),
        };
        let mut gpu = Gpu::attach(p, cfg, a)?;
        let me = std::process::id();
        let start = share::start_time(me)
            .ok_or_else(|| ToolError::Bad("cannot read /proc/self/stat".into()))?;
        st.leases[slot as usize] = Some(Lease { pid: me, start });
        gpu.set_peers(&live_slots(&st, slot));
        let made = gpu
            .create_channel(slot)
            .map_err(ToolError::from)
            .and_then(|ch| {
                st.save(&dir)?;
                Ok(ch)
            });
        gpu.platform().unlock_device();
        Ok(Self {
            gpu,
            channel: Some(made?),
            slot,
            first,
            reclaimed,
            dir,
            _bell: Some(bell_map),
        })
    }

    /// The driver and the process's channel.
    pub fn parts(&mut self) -> Option<(&mut Gpu<LinuxGpu>, &mut Channel)> {
        Some((&mut self.gpu, self.channel.as_mut()?))
    }

    /// Gives the slot back: the channel leaves the runlist (which keeps the other live
    /// processes' channels) and the lease is removed.
    fn detach(&mut self) -> Result<(), ToolError> {
        let Some(ch) = self.channel.take() else {
            return Ok(());
        };
        self.gpu.platform().lock_device();
        let r = (|| {
            let mut st = State::load(&self.dir)?
                .ok_or_else(|| ToolError::Bad("the CUDA state file is gone".into()))?;
            self.gpu.set_peers(&live_slots(&st, self.slot));
            self.gpu.destroy_channel(ch)?;
            if let Some(l) = st.leases.get_mut(self.slot as usize) {
                *l = None;
            }
            st.save(&self.dir)
        })();
        self.gpu.platform().unlock_device();
        r
    }
}

/// Channels of the leases other than `own` (whose processes are taken as alive: a dead one's
/// channel in the runlist costs nothing until its slot is taken back).
fn live_slots(st: &State, own: u32) -> Vec<u32> {
    st.leases
        .iter()
        .enumerate()
        .filter(|(k, l)| l.is_some() && *k as u32 != own)
        .map(|(k, _)| k as u32)
        .collect()
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Err(e) = self.detach() {
            eprintln!("vgpu-cuda: giving back GPU slot {}: {e}", self.slot);
        }
    }
}
