//! A process-wide pool of helper threads for [`crate::Launch::run`], so that a run with several
//! workers does not pay thread creation and teardown (tens of µs per thread) on every call,
//! which matters to time-slice schedulers that run kernels in short slices.
//!
//! `scope_run(k, f)` runs `f` on the calling thread and on up to `k` helpers, and returns only
//! after every helper that started `f` has finished it (also when the caller's own call
//! panics), which is what makes lending `f`'s borrowed data to the helpers sound. Helper calls
//! not yet started when the caller's own `f` returns are withdrawn (`f` must be a work-sharing
//! loop for which that is harmless, as the launch workers are).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

/// Most helper threads the pool keeps.
const MAX_HELPERS: usize = 255;

/// A type-erased call of a borrowed `Fn()`.
struct Task {
    call: unsafe fn(*const ()),
    data: *const (),
    done: *const Done,
}

// SAFETY: the pointers refer to data that `scope_run` keeps alive (and does not move) until
// the task has signalled `done`; the pointee closure is `Sync`, so calling it from another
// thread is allowed.
unsafe impl Send for Task {}

/// Completion counter of one `scope_run`.
struct Done {
    left: Mutex<usize>,
    cv: Condvar,
    panicked: AtomicBool,
}

struct Pool {
    queue: Mutex<VecDeque<Task>>,
    cv: Condvar,
    helpers: Mutex<usize>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        queue: Mutex::new(VecDeque::new()),
        cv: Condvar::new(),
        helpers: Mutex::new(0),
    })
}

fn helper_loop(p: &'static Pool) {
    loop {
        let task = {
            let mut q = lock(&p.queue);
            loop {
                if let Some(t) = q.pop_front() {
                    break t;
                }
                q = p.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        // SAFETY: `scope_run` keeps `data` and `done` alive until `done` reaches zero, which
        // happens only below, after the call.
        let done = unsafe { &*task.done };
        let ok = std::panic::catch_unwind(|| {
            // SAFETY: `call` was created for the type behind `data` (see `scope_run`).
            unsafe { (task.call)(task.data) }
        });
        if ok.is_err() {
            done.panicked.store(true, Ordering::Relaxed);
        }
        let mut left = lock(&done.left);
        *left -= 1;
        done.cv.notify_all();
    }
}

/// Make sure the pool has at least `n` helpers (fewer if threads cannot be created).
fn ensure_helpers(n: usize) -> usize {
    let p = pool();
    let mut count = lock(&p.helpers);
    while *count < n.min(MAX_HELPERS) {
        let spawned = std::thread::Builder::new()
            .name(format!("ptx-helper-{}", *count))
            .spawn(move || helper_loop(p));
        if let Err(e) = spawned {
            log::warn!("ptx: could not start helper thread: {e}");
            break;
        }
        *count += 1;
    }
    *count
}

/// Waits for the helpers on drop, so borrowed data outlives them even if the caller unwinds.
struct WaitGuard<'a>(&'a Done);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut left = lock(&self.0.left);
        while *left > 0 {
            left = self.0.cv.wait(left).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Run `f` on the calling thread and on up to `helpers` pool threads; return when all are done.
/// Returns false if a helper's call panicked.
pub(crate) fn scope_run<F: Fn() + Sync>(helpers: usize, f: &F) -> bool {
    unsafe fn call<F: Fn()>(data: *const ()) {
        // SAFETY: `data` points to an `F` kept alive by `scope_run` (see `Task`).
        let f = unsafe { &*data.cast::<F>() };
        f();
    }
    let k = if helpers == 0 {
        0
    } else {
        ensure_helpers(helpers).min(helpers)
    };
    let done = Done {
        left: Mutex::new(k),
        cv: Condvar::new(),
        panicked: AtomicBool::new(false),
    };
    let guard = WaitGuard(&done);
    if k > 0 {
        let p = pool();
        let mut q = lock(&p.queue);
        for _ in 0..k {
            q.push_back(Task {
                call: call::<F>,
                data: (f as *const F).cast(),
                done: &done,
            });
        }
        drop(q);
        p.cv.notify_all();
    }
    f();
    if k > 0 {
        // Tasks that no helper has started yet (all busy, e.g. with another launch) are
        // withdrawn: the caller's own `f` already did the work, and waiting for them would tie
        // this run's latency to other runs.
        let p = pool();
        let mut q = lock(&p.queue);
        let before = q.len();
        let me: *const Done = &done;
        q.retain(|t| !std::ptr::eq(t.done, me));
        let withdrawn = before - q.len();
        drop(q);
        if withdrawn > 0 {
            let mut left = lock(&done.left);
            *left -= withdrawn;
        }
    }
    drop(guard);
    !done.panicked.load(Ordering::Relaxed)
}
