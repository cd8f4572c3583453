//! Copy engine of the sim backend: VA → VA copies through the MMU, in chunks with a preemption
//! check between chunks, and the synchronous host ↔ VA copies the hypervisor uses.
//!
//! Faults stop the copy at the first byte that cannot be translated; bytes before it are copied.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::{AccessKind, JobFault};

use super::atomic_copy;
use super::mmu::Mmu;

/// How a run of the copy engine ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyEnd {
    /// All bytes copied.
    Done,
    /// Stopped at a preemption request with `done` bytes copied.
    Preempted { done: u64 },
    /// Stopped at a fault.
    Faulted(JobFault),
}

fn fault(kind: crate::engine::FaultKind, va: u64, access: AccessKind) -> JobFault {
    JobFault {
        kind,
        va,
        access: Some(access),
        site: None,
    }
}

/// Copies `len` bytes from `src` to `dst` (VAs of `mmu`), starting `done` bytes in, checking
/// `preempt` before every chunk of `chunk` bytes. The caller checked that neither range wraps.
pub fn run(
    mmu: &Mmu,
    src: u64,
    dst: u64,
    len: u64,
    mut done: u64,
    chunk: u64,
    preempt: &AtomicBool,
) -> CopyEnd {
    let chunk = chunk.max(1);
    while done < len {
        if preempt.load(Ordering::Acquire) {
            return CopyEnd::Preempted { done };
        }
        let stop = done + chunk.min(len - done);
        while done < stop {
            let (s, d) = (src + done, dst + done);
            let (hs, ls) = match mmu.translate(s, AccessKind::Read) {
                Ok(t) => t,
                Err(k) => return CopyEnd::Faulted(fault(k, s, AccessKind::Read)),
            };
            let (hd, ld) = match mmu.translate(d, AccessKind::Write) {
                Ok(t) => t,
                Err(k) => return CopyEnd::Faulted(fault(k, d, AccessKind::Write)),
            };
            let n = (ls.min(ld) as u64).min(stop - done);
            // SAFETY: the MMU returned host ranges of at least `n` bytes inside VRAM or a
            // registered host region, both valid while the job holds its space (mappings are
            // frozen and regions cannot be unregistered while mapped); all concurrent access to
            // them is atomic.
            unsafe { atomic_copy::copy(hs as *mut u8, hd as *mut u8, n as usize) };
            done += n;
        }
    }
    CopyEnd::Done
}

/// Copies `data` to `va` through `mmu`.
pub fn host_to_space(mmu: &Mmu, va: u64, data: &[u8]) -> Result<(), JobFault> {
    let mut done = 0usize;
    while done < data.len() {
        let v = va.wrapping_add(done as u64);
        let (h, l) = mmu
            .translate(v, AccessKind::Write)
            .map_err(|k| fault(k, v, AccessKind::Write))?;
        let n = l.min(data.len() - done);
        // SAFETY: as in `run`: `h..h+n` is mapped memory valid while the space is held.
        unsafe { atomic_copy::store(&data[done..done + n], h as *mut u8) };
        done += n;
    }
    Ok(())
}

/// Copies from `va` through `mmu` into `buf`.
pub fn space_to_host(mmu: &Mmu, va: u64, buf: &mut [u8]) -> Result<(), JobFault> {
    let mut done = 0usize;
    while done < buf.len() {
        let v = va.wrapping_add(done as u64);
        let (h, l) = mmu
            .translate(v, AccessKind::Read)
            .map_err(|k| fault(k, v, AccessKind::Read))?;
        let n = l.min(buf.len() - done);
        // SAFETY: as in `run`.
        unsafe { atomic_copy::load(h as *mut u8, &mut buf[done..done + n]) };
        done += n;
    }
    Ok(())
}
