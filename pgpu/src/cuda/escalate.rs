//! Progress for restarting launches on the cuda engine (`preempt=restart|auto`): a run of a
//! restarting launch that finished no thread (`crate::ckpt::stalled`) makes its next run
//! continue in the entry's checkpoint form (loaded beside the restarting one), its threads
//! that are not done starting afresh; with no such form, or a save area over the limit, the
//! launch runs sliced from its first block (the entry is idempotent: rerunning finished
//! blocks writes the same bytes). Counted in `CkptStats::escalated_launches`.

use std::sync::Arc;

use super::context::{CkLive, LaunchState};
use super::engine::CudaEngine;
use super::modules::CkLoaded;
use crate::ckpt::{area_bytes, status_area};
use crate::engine::EngineError;
use crate::sync::lock;

/// Where a stalled launch goes next.
pub(crate) enum Escalated {
    /// The checkpoint form, its plan and the launch's state in it.
    Checkpoint(Arc<CkLoaded>, usize, CkLive),
    /// Sliced from the first block.
    Sliced(LaunchState),
}

impl CudaEngine {
    /// The next run of the stalled restarting launch `l` (state `state`, see the module doc).
    pub(crate) fn escalate(
        &self,
        mut l: LaunchState,
        state: CkLive,
    ) -> Result<Escalated, EngineError> {
        let save = lock(&self.modules).ck_save(l.module)?;
        let found = save
            .as_ref()
            .and_then(|s| s.plan(&l.entry).map(|(i, p)| (i, p.clone())));
        let Some((save, (idx, plan))) = save.zip(found) else {
            self.ckpt.escalated(&l.entry, "sliced (no checkpoint form)");
            l.next_block = 0;
            return Ok(Escalated::Sliced(l));
        };
        let need = area_bytes(&plan, l.grid, l.block, l.dynamic_shared);
        if need > self.cfg.max_save_area_bytes {
            self.ckpt
                .escalated(&l.entry, "sliced (checkpoint save area over the limit)");
            l.next_block = 0;
            return Ok(Escalated::Sliced(l));
        }
        let area = status_area(&state.statuses, plan.record_bytes, need);
        // The restarting form's buffer is freed (not clean: the pool keeps only zeroed ones).
        drop(state.buf);
        let buf = self.ck_pool.take(need).map_err(|e| self.drv(e))?;
        buf.write_area(&area).map_err(|e| self.drv(e))?;
        let statuses = state
            .statuses
            .iter()
            .map(|&s| {
                if s == ptx::ckpt::STATUS_DONE {
                    s
                } else {
                    ptx::ckpt::STATUS_NOT_STARTED
                }
            })
            .collect();
        self.ckpt
            .escalated(&l.entry, "continues in its checkpoint form");
        Ok(Escalated::Checkpoint(
            save,
            idx,
            CkLive {
                buf,
                area_len: need,
                statuses,
                stalled: false,
                escalated: true,
            },
        ))
    }
}
