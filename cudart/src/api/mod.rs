//! The exported runtime API, one file per area. Every function here is `extern "C"`, checks
//! what the program passes, and returns CUDA's `cudaError_t` (recorded as the thread's last
//! error); see `unsupported.rs` for the exports that are not implemented.

pub mod compat;
pub mod device;
pub mod exec;
pub mod memory;
pub mod misc;
pub mod register;
pub mod stream;

use crate::context::STREAM_PER_THREAD;
use crate::driver::Handle;

/// The stream a `_ptsz` entry point means: its default stream is the per-thread one.
pub fn per_thread(stream: Handle) -> Handle {
    if stream.is_null() {
        STREAM_PER_THREAD as Handle
    } else {
        stream
    }
}
