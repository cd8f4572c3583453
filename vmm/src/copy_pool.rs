//! The threads that copy and checksum snapshot and migration data: rayon's global pool, which
//! runs the VRAM section's lanes (`vgpu::snapshot`), the CRC-32 lanes of `snapfmt` (guest RAM
//! and device state) and the sim engine's bulk VRAM calls. How many there are and their nice
//! value are set here, once, before anything uses the pool (`--copy-threads`, `--copy-nice`).
//!
//! Why: while a live snapshot or a live migration copies, the guest runs, and its vCPU and GPU
//! worker threads compete with these for the host's cores (a live migration's source and a
//! standby destination on one host run two such pools, each as wide as the host). A positive
//! nice value makes the copy yield to the guest (and to other VMs); the copy then takes what
//! the guest leaves, and the paused round of a migration, when the guest's threads are idle,
//! runs at full speed anyway. Raising a thread's nice value needs no privilege.

use std::sync::atomic::{AtomicBool, Ordering};

/// Errors setting up the pool.
#[derive(Debug, thiserror::Error)]
pub enum CopyPoolError {
    #[error("the copy threads' pool was already made (set it up before any snapshot work)")]
    Built(#[from] rayon::ThreadPoolBuildError),
}

/// Most copy threads.
pub const MAX_THREADS: usize = 1024;

/// A failed `setpriority` is logged once.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Makes the global pool: `threads` workers (`None`: one per CPU this process may use, as
/// rayon's default), each `nice` steps below the thread that made it (its nice value plus
/// `nice`, at most 19; 0: unchanged), named `vgpu-copy-N`. Relative, so that the copy never
/// runs above the VMM's own threads (an absolute value below the VMM's would raise it where
/// the process may, as root, and be refused where it may not).
pub fn init(threads: Option<usize>, nice: i32) -> Result<(), CopyPoolError> {
    let mut b = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("vgpu-copy-{i}"));
    if let Some(n) = threads {
        b = b.num_threads(n.clamp(1, MAX_THREADS));
    }
    if nice != 0 {
        b = b.start_handler(move |_| set_nice(nice));
    }
    b.build_global()?;
    Ok(())
}

/// Lowers the calling thread's priority by `nice` steps (Linux: nice values are per thread; a
/// new thread starts at its creator's).
fn set_nice(nice: i32) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as libc::id_t;
    // getpriority returns the nice value, which may be -1: errno tells a failure apart.
    // SAFETY: errno of this thread, then getpriority on this thread's id; no memory passed.
    let cur = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, tid)
    };
    // SAFETY: this thread's errno.
    if cur == -1 && unsafe { *libc::__errno_location() } != 0 {
        // Unknown level: setting one could raise the thread above the VMM (as root).
        if !WARNED.swap(true, Ordering::Relaxed) {
            log::warn!(
                "copy threads: their nice value is unknown ({}); left as it is",
                std::io::Error::last_os_error()
            );
        }
        return;
    }
    let target = cur.saturating_add(nice).min(19);
    // SAFETY: setpriority on this thread's id; no memory is passed.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, target) };
    if r != 0 && !WARNED.swap(true, Ordering::Relaxed) {
        log::warn!(
            "copy threads: nice {target} refused ({}); they run at the process's level",
            std::io::Error::last_os_error()
        );
    }
}
