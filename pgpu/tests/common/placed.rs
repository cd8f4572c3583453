//! A suite instance placed in an address space, and the jobs of its launches there: shared by
//! the sim tests (`common::runner`) and the cuda ones (`cuda/support.rs`, included by path).

use pgpu::*;

/// A suite instance placed in an address space.
pub struct Placed {
    pub space: SpaceId,
    pub module: ModuleId,
    pub addrs: Vec<u64>,
}

impl Placed {
    /// The job of launch `l` of the instance placed here.
    pub fn job(&self, l: &suite::Launch) -> Job {
        Job::Launch(LaunchJob {
            space: self.space,
            module: self.module,
            entry: l.entry.to_string(),
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params: suite::layout_params(&l.params, &self.addrs).unwrap(),
        })
    }
}
