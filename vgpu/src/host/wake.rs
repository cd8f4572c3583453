//! The eventfd that wakes the link's worker while it waits for a grant (`HostLink::interrupt`,
//! `HostLink::close`): it sleeps on its socket and this descriptor instead of looking at its
//! `stop` every few milliseconds (with `cpus=`, 64 waiting workers' periodic looks took the
//! GPU's CPU from the holder).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// See the module documentation.
pub(super) struct Wake(OwnedFd);

impl Wake {
    pub fn new() -> std::io::Result<Wake> {
        // SAFETY: eventfd with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        Ok(Wake(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable (wakes a waiter; later ones too until drained).
    pub fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd; a full counter (EAGAIN)
        // already wakes the waiter.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Empties it (the waiter woke and looks at what it was woken for).
    pub fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd; the result
        // (EAGAIN when nothing was written) needs no handling.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&raw mut v).cast(), 8) };
    }
}

impl AsFd for Wake {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
