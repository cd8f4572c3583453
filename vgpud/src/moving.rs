//! Moving a registered VM to another GPU of the daemon (protocol version 3): `Move {gpu}`
//! reserves a partition and channels on the target and answers `MoveReady` with the target's
//! VRAM object; the VM copies its VRAM there and switches its mapping while its GPU work is
//! paused, then sends `Moved`: the daemon takes it off the source's scheduler, registers it
//! on the target's (queued again if it was), frees the source partition (zeroed) and answers
//! `Moved`. A grant still in flight on the source (one that crossed the VM's pause) is waited
//! for: the commit happens at its `Done`. `MoveAbort`, or the VM leaving, gives the
//! reservation back (for a departed VM, once its process has exited, like its partition).

use scheduler::{VmId, VmParams};

use crate::daemon::Daemon;
use crate::proto::{self, Placement, ToVm, monotonic_ns};

/// A partition reserved for a VM's move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// Index of the target GPU.
    pub gpu: usize,
    pub offset: u64,
    /// `Moved` came while a grant of the VM was in flight: commit at its `Done`.
    pub commit_pending: bool,
}

impl Daemon {
    fn move_refuse(&mut self, c: u64, message: String) {
        self.report.refused += 1;
        if let Some(s) = self.sessions.get_mut(&c) {
            log::warn!("vgpud: {}: move refused: {message}", s.label());
            s.send(&ToVm::MoveRefused { message });
        }
    }

    /// `Move {gpu}` from connection `c`.
    pub(crate) fn move_request(&mut self, c: u64, target: u32) {
        let Some(reg) = self.sessions.get(&c).and_then(|s| s.reg.as_ref()) else {
            return;
        };
        let (src, size, channels) = (reg.gpu, reg.report.vram_size, reg.report.channels);
        if reg.moving.is_some() {
            return self.move_refuse(c, "a move is already in progress".into());
        }
        let t = target as usize;
        if t == src {
            return self.move_refuse(c, format!("the VM is on gpu {target} already"));
        }
        // The placement's own checks: an index the daemon has, room for the partition.
        let t = match crate::gpus::place(&self.gpus, Some(target), size, channels) {
            Ok(t) => t,
            Err(why) => return self.move_refuse(c, why),
        };
        let gpu = &mut self.gpus[t];
        let offset = match gpu.pool.alloc(size) {
            Ok(o) => o,
            Err(e) => return self.move_refuse(c, e.to_string()),
        };
        gpu.channels_used += channels;
        let placement = Placement {
            index: gpu.index,
            device: gpu.device,
        };
        let msg = ToVm::MoveReady {
            gpu: placement,
            vram_offset: offset,
            vram_size: size,
        };
        let fd = gpu.pool.fd();
        let Some(s) = self.sessions.get_mut(&c) else {
            return;
        };
        let sent = s.conn.send(&proto::encode(&msg), Some(fd));
        if let Some(r) = s.reg.as_mut() {
            r.moving = Some(Reservation {
                gpu: t,
                offset,
                commit_pending: false,
            });
        }
        match sent {
            Ok(()) => log::info!(
                "vgpud: {}: {} MiB reserved at {offset:#x} on gpu {t} for its move",
                s.label(),
                size >> 20
            ),
            Err(e) => {
                log::warn!("vgpud: {}: send failed ({e}); closing", s.label());
                s.closing = true;
            }
        }
    }

    /// `MoveAbort {}`: the reservation goes back at once (the VM process never used it, or it
    /// says so: it maps only its own range, as at registration).
    pub(crate) fn move_abort(&mut self, c: u64) {
        let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) else {
            return;
        };
        let Some(m) = reg.moving.take() else {
            return self.move_refuse(c, "move abort: no move in progress".into());
        };
        let (size, channels) = (reg.report.vram_size, reg.report.channels);
        let gpu = &mut self.gpus[m.gpu];
        gpu.pool.release(m.offset, size);
        gpu.channels_used -= channels;
        log::info!("vgpud: move of connection {c} aborted");
    }

    /// `Moved {}` (or the `Done` a pending commit waited for).
    pub(crate) fn move_commit(&mut self, c: u64) {
        let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) else {
            return;
        };
        let Some(mut m) = reg.moving else {
            return self.move_refuse(c, "moved: no move in progress".into());
        };
        let (vm, src) = (reg.id, reg.gpu);
        if self.gpus[src].run.as_ref().is_some_and(|r| r.vm == vm) {
            // A grant crossed the VM's pause: its (empty) `Done` comes next.
            m.commit_pending = true;
            reg.moving = Some(m);
            return;
        }
        reg.moving = None;
        let (weight, priority) = (reg.report.weight, reg.report.priority);
        let (old_offset, size, channels) = (
            reg.report.vram_offset,
            reg.report.vram_size,
            reg.report.channels,
        );
        let pending = reg.pending;
        let old_object = reg.object;
        let now = self.at(monotonic_ns());
        if let Err(e) = self.gpus[src].sched.remove(vm, now) {
            log::error!("vgpud: move: remove vm {} from gpu {src}: {e}", vm.0);
        }
        let params = VmParams { weight, priority };
        let dst = m.gpu;
        if let Err(e) = self.gpus[dst].sched.register(vm, params, now) {
            // The scheduler of another GPU took the same parameters at registration: this is a
            // bug, not a VM's doing. The VM cannot stay anywhere sensible: disconnect it.
            log::error!("vgpud: move: register vm {} on gpu {dst}: {e}", vm.0);
            if let Some(s) = self.sessions.get_mut(&c) {
                s.refuse(format!("move failed: {e}"), true);
            }
            return;
        }
        let source = &mut self.gpus[src];
        source.pool.release(old_offset, size);
        source.channels_used -= channels;
        source.weights -= u64::from(weight);
        // restart: a partition adopted from an earlier instance's memory object leaves it
        // (zeroed there); the VM is on the target's own memory object from now on.
        if old_object != self.own_object(src) {
            self.release_object(old_object, Some((old_offset, size)));
        }
        let new_object = self.own_object(dst);
        let target = &mut self.gpus[dst];
        target.weights += u64::from(weight);
        let placement = Placement {
            index: target.index,
            device: target.device,
        };
        if let Some(reg) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) {
            reg.gpu = dst;
            reg.object = new_object;
            reg.report.gpu = dst as u32;
            reg.report.vram_offset = m.offset;
            reg.report.moves += 1;
            // Queued on the source (a preempted job): queued on the target.
            if pending {
                reg.pending = false;
                self.requeue(c, vm);
            }
        }
        if let Some(s) = self.sessions.get_mut(&c) {
            s.send(&ToVm::Moved { gpu: placement });
            log::info!(
                "vgpud: {} moved from gpu {src} to gpu {dst} (VRAM at {:#x})",
                s.label(),
                m.offset
            );
        }
    }

    /// Queues `vm` (connection `c`) on its GPU again, unidentified.
    fn requeue(&mut self, c: u64, vm: VmId) {
        let g = self
            .sessions
            .get(&c)
            .and_then(|s| s.reg.as_ref())
            .map_or(0, |r| r.gpu);
        let now = self.at(monotonic_ns());
        if let Err(e) = self.gpus[g].sched.on_submit_kernel(vm, None, now) {
            log::error!("vgpud: move: queue vm {} on gpu {g}: {e}", vm.0);
            return;
        }
        if let Some(r) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) {
            r.pending = true;
            r.want_since_ns = monotonic_ns();
        }
    }
}
