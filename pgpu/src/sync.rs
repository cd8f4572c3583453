//! The engine's one mutex helper: locking never fails on poison. A thread that panicked while
//! holding one of the engine's locks left its data consistent (every critical section keeps
//! its invariants at each step, and a job's panic is reported as the job's failure), so the
//! next user takes the data as it is rather than propagating the panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data of a poisoned lock as it is.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
