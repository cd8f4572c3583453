//! The link's side of moving the VM to another GPU of its daemon (protocol version 3):
//! `request_move` reserves a partition on the target (`Move` → `MoveReady` with that GPU's VRAM
//! object), `commit_move` tells the daemon the VRAM now lives there (`Moved` → `Moved`),
//! `abort_move` gives the reservation back. The answers are read by whichever thread reads the
//! socket (`Inner::receive`) and waited for here.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use vgpu_proto::proto::{Placement, ToDaemon, ToVm};

use super::{HostError, HostLink};

/// How long the daemon may take to answer a move message.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A partition reserved on the target GPU.
#[derive(Debug)]
pub struct MoveGrant {
    pub gpu: Placement,
    pub vram_offset: u64,
    pub vram_size: u64,
    /// The target GPU's VRAM memory object.
    pub vram_fd: OwnedFd,
}

/// A move answer as received.
#[derive(Debug)]
pub(super) enum MoveAnswer {
    Ready(MoveGrant),
    Refused(String),
    Moved(Placement),
    /// Not a usable answer (a `MoveReady` without its descriptor).
    Bad(String),
}

impl MoveAnswer {
    pub(super) fn of(m: ToVm, fd: Option<OwnedFd>) -> Self {
        match (m, fd) {
            (
                ToVm::MoveReady {
                    gpu,
                    vram_offset,
                    vram_size,
                },
                Some(vram_fd),
            ) => MoveAnswer::Ready(MoveGrant {
                gpu,
                vram_offset,
                vram_size,
                vram_fd,
            }),
            (ToVm::MoveRefused { message }, _) => MoveAnswer::Refused(message),
            (ToVm::Moved { gpu }, _) => MoveAnswer::Moved(gpu),
            (other, _) => MoveAnswer::Bad(format!("unexpected move answer {other:?}")),
        }
    }
}

impl HostLink {
    /// Sends `msg` and waits for the daemon's move answer.
    fn move_exchange(&self, msg: &ToDaemon) -> Result<MoveAnswer, HostError> {
        let mut st = self.inner.lock();
        st.move_answer = None;
        self.inner.send(&mut st, msg);
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            if let Some(a) = st.move_answer.take() {
                return Ok(a);
            }
            if let Some(why) = &st.lost {
                return Err(HostError::Lost(why.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(HostError::Protocol(format!(
                    "no answer to {msg:?} within {ANSWER_TIMEOUT:?}"
                )));
            }
            st = self
                .inner
                .cv
                .wait_timeout(st, left.min(Duration::from_millis(50)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Reserves a partition of this VM's size on the daemon's GPU `gpu`.
    pub fn request_move(&self, gpu: u32) -> Result<MoveGrant, HostError> {
        match self.move_exchange(&ToDaemon::Move { gpu })? {
            MoveAnswer::Ready(g) if g.gpu.index == gpu => Ok(g),
            MoveAnswer::Refused(why) => Err(HostError::Refused(why)),
            MoveAnswer::Bad(why) => Err(HostError::Protocol(why)),
            other => {
                // Whatever was reserved goes back.
                self.abort_move();
                Err(HostError::Protocol(format!("move: unexpected {other:?}")))
            }
        }
    }

    /// The VM's VRAM lives in the reserved partition now and it holds no grant: the daemon
    /// schedules it on the target from here on. Returns the GPU the daemon confirms.
    pub fn commit_move(&self) -> Result<Placement, HostError> {
        match self.move_exchange(&ToDaemon::Moved {})? {
            MoveAnswer::Moved(p) => Ok(p),
            MoveAnswer::Refused(why) => Err(HostError::Refused(why)),
            MoveAnswer::Bad(why) => Err(HostError::Protocol(why)),
            other => Err(HostError::Protocol(format!("moved: unexpected {other:?}"))),
        }
    }

    /// Gives a reservation back (nothing is answered).
    pub fn abort_move(&self) {
        let mut st = self.inner.lock();
        self.inner.send(&mut st, &ToDaemon::MoveAbort {});
    }
}
