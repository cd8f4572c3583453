//! Moving a shared VM's GPU to another GPU of its vgpud (`vgpu-vmm ctl SOCKET move-gpu N`),
//! built on the live-snapshot machinery: the daemon reserves a partition on the target first
//! (`move_prepare`); VRAM is pre-copied there while the VM runs, in rounds of what the GPU
//! dirtied meanwhile (`Precopy`: the engine's dirty log, the aperture trapping); with the VM
//! and its GPU paused, the last dirty pages go (`move_commit`), the engine's VRAM mapping is
//! switched to the target partition at the same address (`VramRegion::rebind`: every pointer
//! the engine, the shadows and the guest's aperture slots hold stays valid), and the daemon
//! moves the VM to the target's scheduler and frees the source partition. Modules, contexts
//! and preempted jobs live in the VM process and need no copy.
//!
//! Sim: each of the daemon's GPUs is a VRAM memory object, written with `pwrite`, and the
//! switch is a remap of the engine's VRAM. Cuda (`cuda`): the VM owns its CUDA context, so
//! the target is a second cuda engine on the target device, made and given guest RAM and the
//! modules before the pre-copy (`pgpu::switch::SwitchEngine::stage`), written through its
//! VRAM calls, and swapped in at the switch (`SwitchEngine::commit`: the spaces rebuilt
//! there, preempted jobs re-targeted when they resume).

mod cuda;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, PoisonError};
use std::time::Instant;

pub(crate) use cuda::CudaShared;
use pgpu::sim::SimEngine;
use serde::Serialize;
use vgpu_proto::proto::Placement;

use crate::Vgpu;
use crate::host::{HostError, MoveGrant};
use crate::snapshot::SnapshotError;
use crate::snapshot::live::Precopy;

/// Bytes of a VRAM page (the dirty log's unit).
const PAGE: u64 = 4096;

/// Errors of a move.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("the GPU is not shared through vgpud (host=): there is no other GPU to move to")]
    NotShared,
    #[error("this GPU cannot move: backend=cuda without host= has no daemon to move within")]
    Cuda,
    #[error("the target engine: {0}")]
    Engine(pgpu::EngineError),
    #[error("vgpud: {0}")]
    Host(#[from] HostError),
    #[error("pre-copy: {0}")]
    Precopy(#[from] SnapshotError),
    #[error("copy VRAM to the target partition: {0}")]
    Copy(std::io::Error),
    #[error("switch to the target partition: {0}")]
    Map(String),
}

/// The shared VRAM of a sim VM: its engine and the memory object its partition is in.
pub(crate) struct SharedVram {
    pub engine: Arc<SimEngine>,
    /// The VRAM memory object of the GPU the partition is on, and the partition's offset.
    pub fd: OwnedFd,
    pub offset: u64,
    pub gpu: Placement,
}

/// What a move switches: a sim VM's VRAM object, or a cuda VM's engine (boxed: its
/// configuration is most of its size).
pub(crate) enum Shared {
    Sim(SharedVram),
    Cuda(Box<CudaShared>),
}

impl Shared {
    fn gpu(&self) -> Placement {
        match self {
            Shared::Sim(s) => s.gpu,
            Shared::Cuda(c) => c.gpu,
        }
    }
}

/// A move in progress: the partition reserved on the target.
pub struct MovePlan {
    grant: MoveGrant,
    /// cuda: the new engine, staged.
    cuda: Option<cuda::CudaTarget>,
    /// VRAM bytes copied so far (pre-copy rounds, guards, last round).
    copied: u64,
    rounds: Vec<u64>,
}

/// What a move did.
#[derive(Debug, Clone, Serialize)]
pub struct MoveReport {
    pub from: u32,
    pub to: u32,
    /// The target's CUDA device ordinal (as the daemon names it).
    pub device: u32,
    /// VRAM bytes copied per pre-copy round (the guest running), then in the last round (paused).
    pub precopy_bytes: Vec<u64>,
    pub last_round_bytes: u64,
    /// Milliseconds of the paused part in this device: the last round, the switch, the
    /// daemon's confirmation.
    pub switch_ms: f64,
}

impl MovePlan {
    /// The target GPU.
    pub fn target(&self) -> Placement {
        self.grant.gpu
    }
}

impl Vgpu {
    fn shared(&self) -> Result<std::sync::MutexGuard<'_, Option<Shared>>, MoveError> {
        if self.link.is_none() {
            return Err(MoveError::NotShared);
        }
        let g = self.moving.lock().unwrap_or_else(PoisonError::into_inner);
        if g.is_none() {
            return Err(MoveError::Cuda);
        }
        Ok(g)
    }

    /// The GPU this VM runs on (its daemon's index and device), when shared.
    pub fn placement(&self) -> Option<Placement> {
        self.moving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Shared::gpu)
    }

    /// Asks the daemon for a partition on its GPU `gpu` (the VM keeps running); cuda: makes
    /// the engine on its device and stages it (guest RAM, modules).
    pub fn move_prepare(&self, gpu: u32) -> Result<MovePlan, MoveError> {
        drop(self.shared()?);
        let link = self.link.as_ref().ok_or(MoveError::NotShared)?;
        let grant = link.request_move(gpu)?;
        if grant.vram_size != self.cfg.physical_vram() {
            link.abort_move();
            return Err(MoveError::Map(format!(
                "the daemon reserved {} bytes, the VM has {}",
                grant.vram_size,
                self.cfg.physical_vram()
            )));
        }
        let mut plan = MovePlan {
            grant,
            cuda: None,
            copied: 0,
            rounds: Vec::new(),
        };
        // The guard areas never change: copied now, outside the pause.
        let ready = {
            let shared = self.shared()?;
            match shared.as_ref() {
                Some(Shared::Sim(sv)) => self.copy_guards(&*sv.engine, &plan),
                Some(Shared::Cuda(c)) => match c.stage(plan.grant.gpu.device) {
                    Ok(t) => {
                        plan.cuda = Some(t);
                        self.copy_guards(&*c.switch, &plan)
                    }
                    Err(e) => Err(e),
                },
                None => Err(MoveError::Cuda),
            }
        };
        if let Err(e) = ready {
            link.abort_move();
            return Err(e);
        }
        Ok(plan)
    }

    /// Gives the reservation back (after a failed move; the VM stays where it is).
    pub fn move_abort(&self, plan: MovePlan) {
        if let Some(l) = &self.link {
            l.abort_move();
        }
        log::warn!("vgpu: move to gpu {} abandoned", plan.grant.gpu.index);
    }

    /// Writes partition pages (page index in the partition, bytes) to the target: the target
    /// GPU's VRAM object (sim) or the staged engine's VRAM (cuda).
    fn target_sink<'a>(
        &self,
        plan: &'a MovePlan,
        copied: &'a mut u64,
    ) -> impl FnMut(u64, &[u8]) -> std::io::Result<()> + 'a {
        let fd = plan.grant.vram_fd.as_raw_fd();
        let base = plan.grant.vram_offset + self.vram_base;
        let vram_base = self.vram_base;
        let cuda = plan.cuda.as_ref();
        move |page: u64, b: &[u8]| {
            match cuda {
                Some(t) => t.write(vram_base + page * PAGE, b)?,
                None => pwrite_all(fd, b, base + page * PAGE)?,
            }
            *copied += b.len() as u64;
            Ok(())
        }
    }

    /// One pre-copy round with the VM running: the first copies every non-zero page of the
    /// partition, later ones what the GPU wrote since. Returns the bytes copied.
    pub fn move_round(&self, plan: &mut MovePlan, pre: &mut Precopy<'_>) -> Result<u64, MoveError> {
        let mut n = 0;
        {
            let mut sink = self.target_sink(plan, &mut n);
            pre.round(&mut sink)?;
        }
        plan.copied += n;
        plan.rounds.push(n);
        Ok(n)
    }

    /// With the VM's vCPUs and this device paused: the last dirty pages and the guard areas
    /// go to the target, the engine's VRAM is switched to it (cuda: the engine itself), and
    /// the daemon confirms. On an error before the switch the reservation is given back and
    /// the VM stays; after it (the daemon not confirming) the link is lost like any daemon
    /// failure.
    pub fn move_commit(
        &self,
        mut plan: MovePlan,
        mut pre: Precopy<'_>,
    ) -> Result<MoveReport, MoveError> {
        let t0 = Instant::now();
        let mut last = 0;
        let copied = {
            let mut sink = self.target_sink(&plan, &mut last);
            pre.final_round(&mut sink).map_err(MoveError::from)
        };
        let mut shared = self.shared()?;
        let Some(sh) = shared.as_mut() else {
            return Err(MoveError::Cuda);
        };
        let switched = copied.and_then(|_| match sh {
            Shared::Sim(sv) => sv
                .engine
                .vram()
                .rebind(plan.grant.vram_fd.as_fd(), plan.grant.vram_offset)
                .map_err(|e| MoveError::Map(e.to_string())),
            Shared::Cuda(c) => {
                let target = plan.cuda.take().ok_or(MoveError::Cuda)?;
                // Flag words live in the old engine's memory: given back (taken again from
                // the new engine at the next checked launch).
                self.write_log.release(&*self.engine);
                let old = c.switch.commit(target.staged).map_err(MoveError::Engine)?;
                c.cuda = target.cuda;
                c.cfg = c.cuda.config().clone();
                drop(old);
                Ok(())
            }
        });
        if let Err(e) = switched {
            drop(shared);
            drop(pre);
            self.move_abort(plan);
            return Err(e);
        }
        // The aperture and the engine's log follow the new mapping from here on.
        drop(pre);
        let from = sh.gpu().index;
        let link = self.link.as_ref().ok_or(MoveError::NotShared)?;
        plan.copied += last;
        let grant = plan.grant;
        // restart: the VRAM lives in the target partition from the switch on, so a
        // re-registration with a restarted daemon claims that one (GPU, offset, memory object),
        // also if the daemon goes away before it confirms.
        let claimed = grant
            .vram_fd
            .try_clone()
            .map_err(|e| MoveError::Map(format!("dup the target's VRAM descriptor: {e}")))?;
        link.set_partition(grant.gpu.index, grant.vram_offset, claimed);
        match sh {
            Shared::Sim(sv) => {
                sv.gpu = grant.gpu;
                sv.offset = grant.vram_offset;
                sv.fd = grant.vram_fd;
            }
            Shared::Cuda(c) => c.gpu = grant.gpu,
        }
        let confirmed = link.commit_move()?;
        match sh {
            Shared::Sim(sv) => sv.gpu = confirmed,
            Shared::Cuda(c) => c.gpu = confirmed,
        }
        let report = MoveReport {
            from,
            to: confirmed.index,
            device: confirmed.device,
            precopy_bytes: plan.rounds,
            last_round_bytes: last,
            switch_ms: t0.elapsed().as_secs_f64() * 1e3,
        };
        log::info!(
            "vgpu: moved from gpu {from} to gpu {} ({} bytes pre-copied, {last} in the last round)",
            report.to,
            plan.copied - last
        );
        Ok(report)
    }

    /// The guard areas around the partition (never written by the GPU: copied whole) from
    /// `engine` to the target.
    fn copy_guards(&self, engine: &dyn pgpu::Engine, to: &MovePlan) -> Result<(), MoveError> {
        let size = self.cfg.physical_vram();
        let ranges = [
            (0, self.vram_base),
            (
                self.vram_base + self.cfg.vram,
                size - self.vram_base - self.cfg.vram,
            ),
        ];
        let mut buf = vec![0u8; 1 << 20];
        for (start, len) in ranges {
            let mut at = start;
            while at < start + len {
                let n = (start + len - at).min(buf.len() as u64) as usize;
                engine
                    .vram_read(at, &mut buf[..n])
                    .map_err(|e| MoveError::Map(e.to_string()))?;
                match &to.cuda {
                    Some(t) => t
                        .staged
                        .engine()
                        .vram_write(at, &buf[..n])
                        .map_err(MoveError::Engine)?,
                    None => pwrite_all(
                        to.grant.vram_fd.as_raw_fd(),
                        &buf[..n],
                        to.grant.vram_offset + at,
                    )
                    .map_err(MoveError::Copy)?,
                }
                at += n as u64;
            }
        }
        Ok(())
    }
}

/// `pwrite` of all of `b` at `off` of `fd`.
fn pwrite_all(fd: i32, mut b: &[u8], mut off: u64) -> std::io::Result<()> {
    while !b.is_empty() {
        // SAFETY: writes from a live slice to a descriptor the caller owns.
        let n = unsafe { libc::pwrite(fd, b.as_ptr().cast(), b.len(), off as libc::off_t) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        b = &b[n as usize..];
        off += n as u64;
    }
    Ok(())
}
