//! The worker's copy path: a COPY method's job run like any other, its time and bytes counted
//! by destination (guest system memory, VRAM, or not classified) in the path timings.

use std::time::{Duration, Instant};

use pgpu::{CopyJob, Job};

use super::{Fault, Turn, Worker};
impl Worker {
    /// Runs `job` for channel `ch` and counts it in `counters.path.copy_*`.
    pub(super) fn run_copy(&mut self, ch: usize, job: CopyJob) -> Result<Turn, Fault> {
        let to_sysmem = self
            .direct
            .as_ref()
            .and_then(|d| d.maps_to_sysmem(job.space, job.dst));
        let len = job.len;
        let t0 = Instant::now();
        let r = self.run_job(ch, Job::Copy(job), None, Duration::ZERO);
        let ns = t0.elapsed().as_nanos() as u64;
        let mut g = self.shared.lock();
        let p = &mut g.counters.path;
        let (lat, bytes) = match to_sysmem {
            Some(true) => (&mut p.copy_to_sysmem, &mut p.copy_to_sysmem_bytes),
            Some(false) => (&mut p.copy_to_vram, &mut p.copy_to_vram_bytes),
            None => (&mut p.copy_unclassified, &mut p.copy_unclassified_bytes),
        };
        lat.add(ns);
        *bytes += len;
        r
    }
}
