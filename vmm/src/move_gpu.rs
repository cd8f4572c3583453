//! `ctl SOCKET move-gpu N`: moves a running VM's virtual GPU to GPU N of its vgpud (same host)
//! while the guest runs, like a live migration between two devices of one process: the daemon
//! reserves the target partition first, VRAM is pre-copied in rounds while the guest and its
//! GPU run, then the vCPUs and the GPU pause for the last dirty pages and the switch
//! (`vgpu::Vgpu::move_commit`) and run on, now on the target GPU. On any failure before the
//! switch the VM runs on where it was.

use std::time::Instant;

use serde::Serialize;

use crate::control::{ControlError, Controller, lock};

/// Most pre-copy rounds after the first full pass.
const MAX_ROUNDS: usize = 8;
/// A round that copied at most this much ends pre-copy (1 MiB).
const SMALL_ROUND: u64 = 1 << 20;

/// The `move_gpu` answer.
#[derive(Debug, Serialize)]
pub struct MoveGpuDone {
    pub from: u32,
    pub to: u32,
    pub device: u32,
    /// Time from the request to the VM running on the target, in ms.
    pub ms: f64,
    /// Of which the guest was paused (vCPUs and GPU): the downtime.
    pub downtime_ms: f64,
    /// VRAM bytes per pre-copy round, then in the last round (paused).
    pub precopy_bytes: Vec<u64>,
    pub last_round_bytes: u64,
}

impl Controller {
    /// Moves the VM's GPU to the daemon's GPU `gpu` (see the module documentation).
    pub fn move_gpu(&self, gpu: u32) -> Result<MoveGpuDone, ControlError> {
        let _op = lock(&self.op);
        let start = Instant::now();
        let Some(dev) = self.gpu()? else {
            return Err(ControlError::Move(vgpu::MoveError::NotShared));
        };
        if self.gate.is_paused() {
            return Err(ControlError::AlreadyPaused);
        }
        let mut plan = dev.move_prepare(gpu)?;
        let mut pre = match dev.precopy_start() {
            Ok(p) => p,
            Err(e) => {
                dev.move_abort(plan);
                return Err(ControlError::Move(e.into()));
            }
        };
        for round in 0..=MAX_ROUNDS {
            match dev.move_round(&mut plan, &mut pre) {
                Ok(n) if round > 0 && n <= SMALL_ROUND => break,
                Ok(_) => {}
                Err(e) => {
                    drop(pre);
                    dev.move_abort(plan);
                    return Err(e.into());
                }
            }
        }
        if let Err(e) = self.pause_now() {
            drop(pre);
            dev.move_abort(plan);
            return Err(e);
        }
        let paused = Instant::now();
        let moved = match dev.pause() {
            Ok(()) => dev.move_commit(plan, pre).map_err(ControlError::from),
            Err(e) => {
                drop(pre);
                dev.move_abort(plan);
                Err(e.into())
            }
        };
        self.resume_gpu();
        self.gate.resume();
        let downtime_ms = paused.elapsed().as_secs_f64() * 1e3;
        let r = moved?;
        log::info!(
            "VM moved from gpu {} to gpu {} in {:.1} ms ({downtime_ms:.2} ms paused)",
            r.from,
            r.to,
            start.elapsed().as_secs_f64() * 1e3
        );
        Ok(MoveGpuDone {
            from: r.from,
            to: r.to,
            device: r.device,
            ms: start.elapsed().as_secs_f64() * 1e3,
            downtime_ms,
            precopy_bytes: r.precopy_bytes,
            last_round_bytes: r.last_round_bytes,
        })
    }
}
