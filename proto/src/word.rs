//! The grant word (protocol version 4): one 64-bit word of memory shared by the daemon and one
//! VM process, through which the daemon takes back a grant the VM has not started yet, or a
//! turn's grant it keeps between two jobs, without the VM process being scheduled (issue 25:
//! with 64 VMs booting on 16 cores, the VM's threads that would take or give back such a grant
//! waited 2–18 ms for a core).
//!
//! The word is `seq << 3 | state` for the grant `seq` it speaks of. The daemon writes `Granted`
//! before it sends the grant `seq`; the VM's worker, taking it, moves `Granted → Running`
//! (compare-and-swap), writes `Kept` after the `Progress` of a job when it goes on under the
//! same grant, and moves `Kept → Running` before it starts its next job under it. The daemon,
//! when the grant's stop is due, moves `Granted → Revoked` (the grant ends with nothing run: the
//! VM finds `Revoked` when it takes it, sends nothing for it and asks again) or `Kept →
//! Revoked` (the grant ends at once, as if `Done { preempted, more }` had come; the VM finds
//! `Revoked` at its next job and asks for a new grant). Whichever swap comes first wins; the
//! other side sees the winner's value. Only those exact transitions of the current grant's
//! `seq` mean anything to the daemon: any other value (a stale grant's, a scribbled one) sends
//! it to the messages as before (the preempt and its revocation deadline), so a VM that writes
//! nonsense can only lose its own turn early or keep it as long as it could without the word.
//! To the VM, a word naming a later grant than the one it holds or was sent means that one is
//! over too (only the daemon writes a later `seq`: the `Granted` of its next grant).
//!
//! The memory is a sealed memfd of one page the daemon creates (`GrantWord::create`: it cannot
//! shrink, so no access of the daemon's ever faults whatever the VM does with its descriptor)
//! and hands over with `ToVm::GrantWord` (`SCM_RIGHTS`); the VM maps it (`GrantWord::map`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// The size of the shared object (one page: the smallest mapping).
pub const SIZE: usize = 4096;

/// The largest grant `seq` a word can name (the daemon's sequence stays far below it; a grant
/// beyond it is simply not taken back through the word).
pub const MAX_SEQ: u64 = (1 << 61) - 1;

/// The bits of the state, below the `seq`.
const STATE_BITS: u32 = 3;

/// What the word says of grant `seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing (a fresh word, or a grant given back by message).
    Free = 0,
    /// A job of the grant runs (or the VM is about to start one): only a preempt stops it.
    Running = 1,
    /// Between two jobs of a turn: the daemon may take the grant back.
    Kept = 2,
    /// The daemon took the grant back: the VM must not run under it again.
    Revoked = 3,
    /// The daemon sent the grant and the VM has not taken it yet: the daemon may take it back.
    Granted = 4,
    /// A value neither side writes (states 5–7: a scribbled word). Never encoded; nothing
    /// acts on it.
    Invalid = 7,
}

/// The word of `(seq, state)`; `None` for a `seq` above [`MAX_SEQ`] or `State::Invalid`.
pub fn encode(seq: u64, state: State) -> Option<u64> {
    (seq <= MAX_SEQ && state != State::Invalid).then_some(seq << STATE_BITS | state as u64)
}

/// The grant and state a word names (every value names one; states 5–7 are `Invalid`).
pub fn decode(word: u64) -> (u64, State) {
    let state = match word & ((1 << STATE_BITS) - 1) {
        0 => State::Free,
        1 => State::Running,
        2 => State::Kept,
        3 => State::Revoked,
        4 => State::Granted,
        _ => State::Invalid,
    };
    (word >> STATE_BITS, state)
}

/// To the VM: whether a word found instead of what it expected says that its grant `seq` is
/// over: `Revoked` for it, or any later grant (the daemon wrote the `Granted` of its next one).
pub fn ended(word: u64, seq: u64) -> bool {
    let (s, state) = decode(word);
    (s == seq && state == State::Revoked) || s > seq
}

/// Errors making or mapping the shared object.
#[derive(Debug, thiserror::Error)]
pub enum WordError {
    #[error("grant word: {op}: {err}")]
    Os {
        op: &'static str,
        err: std::io::Error,
    },
    #[error("grant word: the object is {0} bytes, not sealed at {SIZE} or more")]
    Unsealed(i64),
}

fn os(op: &'static str) -> WordError {
    WordError::Os {
        op,
        err: std::io::Error::last_os_error(),
    }
}

/// One side's mapping of a grant word.
pub struct GrantWord {
    ptr: NonNull<AtomicU64>,
}

// SAFETY: the mapping is shared memory accessed only through `AtomicU64`; it lives until `Drop`.
unsafe impl Send for GrantWord {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for GrantWord {}

impl std::fmt::Debug for GrantWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GrantWord({:#x})", self.load())
    }
}

impl GrantWord {
    /// The daemon's side: a fresh sealed object (it can neither shrink nor grow, and the seals
    /// cannot be lifted), mapped, and its descriptor for the VM.
    pub fn create() -> Result<(GrantWord, OwnedFd), WordError> {
        // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"vgpud-grant-word".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on the memfd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) } < 0 {
            return Err(os("ftruncate"));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on the memfd we own; the result is checked.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(os("seal"));
        }
        Ok((Self::map_fd(&fd)?, fd))
    }

    /// The VM's side: maps the object the daemon sent, after checking that it is sealed at its
    /// size (a broken peer's object is refused rather than risking a fault).
    pub fn map(fd: &OwnedFd) -> Result<GrantWord, WordError> {
        // SAFETY: fcntl on a descriptor we own; the result is checked.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        // SAFETY: fstat into a zeroed stat we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(os("fstat"));
        }
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 || (st.st_size as u64) < SIZE as u64 {
            return Err(WordError::Unsealed(st.st_size));
        }
        Self::map_fd(fd)
    }

    fn map_fd(fd: &OwnedFd) -> Result<GrantWord, WordError> {
        // SAFETY: a fresh shared mapping of SIZE bytes of an object at least that large; the
        // result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        // A mapping is page aligned: aligned for an AtomicU64; never null on success.
        let ptr = NonNull::new(p.cast::<AtomicU64>()).ok_or_else(|| os("mmap"))?;
        Ok(GrantWord { ptr })
    }

    fn atom(&self) -> &AtomicU64 {
        // SAFETY: `ptr` is an aligned, live mapping of at least 8 bytes until `Drop`; the
        // object is sealed against shrinking, so the page is always backed.
        unsafe { self.ptr.as_ref() }
    }

    /// The word as it is now.
    pub fn load(&self) -> u64 {
        self.atom().load(Ordering::SeqCst)
    }

    /// Writes `(seq, state)` (the VM: `Running` at a grant, `Kept` after a `Progress`). False
    /// when `seq` cannot be named (the word is left alone).
    pub fn store(&self, seq: u64, state: State) -> bool {
        match encode(seq, state) {
            Some(w) => {
                self.atom().store(w, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Moves `(seq, from)` to `(seq, to)` if the word holds exactly that; otherwise returns
    /// the value found (nothing written).
    pub fn swap(&self, seq: u64, from: State, to: State) -> Result<(), u64> {
        let (Some(f), Some(t)) = (encode(seq, from), encode(seq, to)) else {
            return Err(self.load());
        };
        self.atom()
            .compare_exchange(f, t, Ordering::SeqCst, Ordering::SeqCst)
            .map(|_| ())
    }

    /// Writes any value, as a broken or hostile VM may (tests).
    pub fn store_raw(&self, word: u64) {
        self.atom().store(word, Ordering::SeqCst);
    }

    /// The daemon, before it sends grant `seq`: `(seq, Granted)` whatever the word held (the
    /// VM's previous grant is over). False when `seq` cannot be named (such a grant is never
    /// taken back unstarted).
    pub fn grant(&self, seq: u64) -> bool {
        self.store(seq, State::Granted)
    }

    /// The daemon: takes back grant `seq` if the VM keeps it between two jobs
    /// (`Kept → Revoked`). False for any other value (the messages decide).
    pub fn revoke(&self, seq: u64) -> bool {
        self.swap(seq, State::Kept, State::Revoked).is_ok()
    }

    /// The daemon: takes back grant `seq` if the VM has not taken it yet
    /// (`Granted → Revoked`). False for any other value (the messages decide).
    pub fn revoke_unstarted(&self, seq: u64) -> bool {
        self.swap(seq, State::Granted, State::Revoked).is_ok()
    }

    /// The VM, taking grant `seq` (`Granted → Running`), or before a job under the kept grant
    /// `seq` (`Kept → Running`). What it found otherwise.
    pub fn resume(&self, seq: u64, from: State) -> Resumed {
        match self.swap(seq, from, State::Running) {
            Ok(()) => Resumed::Go,
            Err(w) if ended(w, seq) => Resumed::Revoked,
            Err(w) => Resumed::Other(w),
        }
    }
}

/// What the VM found when it moved its grant to `Running` (`GrantWord::resume`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// The grant is still the VM's: run.
    Go,
    /// The daemon took it back (it counts it as ended, preempted), or the word names a later
    /// grant: the VM must not run under it.
    Revoked,
    /// Neither (not written by this protocol): the word is not trusted; the messages decide.
    Other(u64),
}

impl Drop for GrantWord {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_fd`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), SIZE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_decodes_and_only_exact_transitions_of_the_grant_apply() {
        let (d, fd) = GrantWord::create().unwrap();
        let v = GrantWord::map(&fd).unwrap();
        assert_eq!(decode(d.load()), (0, State::Free));
        // The VM takes grant 7 and keeps it after a job.
        assert!(d.grant(7));
        assert_eq!(v.resume(7, State::Granted), Resumed::Go);
        assert!(
            !d.revoke(7) && !d.revoke_unstarted(7),
            "a running job is stopped by the preempt message"
        );
        assert!(v.store(7, State::Kept));
        assert!(!d.revoke_unstarted(7), "kept is not unstarted");
        assert!(!d.revoke(6), "a stale grant's seq");
        assert!(!d.revoke(8), "a later grant's seq");
        assert!(d.revoke(7));
        assert!(!d.revoke(7), "taken back once");
        assert_eq!(v.resume(7, State::Kept), Resumed::Revoked);
        // The VM wins the race: the daemon's swap fails and it preempts by message.
        v.store(9, State::Kept);
        assert_eq!(v.resume(9, State::Kept), Resumed::Go);
        assert!(!d.revoke(9));
        // A grant not taken yet: the daemon takes it back once; the VM then finds it over.
        assert!(d.grant(10));
        assert!(
            !d.revoke_unstarted(9) && !d.revoke_unstarted(11),
            "another grant's seq"
        );
        assert!(d.revoke_unstarted(10));
        assert!(!d.revoke_unstarted(10), "taken back once");
        assert_eq!(v.resume(10, State::Granted), Resumed::Revoked);
        // The VM takes it first: the daemon's swap fails.
        assert!(d.grant(12));
        assert_eq!(v.resume(12, State::Granted), Resumed::Go);
        assert!(!d.revoke_unstarted(12));
        // A kept grant whose word names a later grant (the daemon's next `Granted`) is over.
        assert!(d.grant(13));
        assert_eq!(v.resume(12, State::Kept), Resumed::Revoked);
        assert!(ended(d.load(), 12) && !ended(d.load(), 13) && !ended(d.load(), 14));
        // Hostile values: whatever the VM writes, the daemon acts only on `Kept` or `Granted`
        // of its grant.
        let kept = encode(9, State::Kept).unwrap();
        let granted = encode(9, State::Granted).unwrap();
        for w in [
            0,
            1,
            2,
            3,
            4,
            5,
            7,
            u64::MAX,
            u64::MAX - 1,
            9 << 3,
            (9 << 3) | 3,
            (9 << 3) | 6,
            (8 << 3) | 4,
            (10 << 3) | 4,
            (9 << 2) | 2,
            1 << 63,
            kept,
            granted,
        ] {
            v.store_raw(w);
            let took = d.revoke(9);
            assert_eq!(took, w == kept, "{w:#x}");
            if !took {
                assert_eq!(d.load(), w, "nothing written on a failed swap");
            }
            v.store_raw(w);
            let took = d.revoke_unstarted(9);
            assert_eq!(took, w == granted, "{w:#x}");
            if !took {
                assert_eq!(d.load(), w, "nothing written on a failed swap");
            }
        }
        assert_eq!(decode(u64::MAX), (MAX_SEQ, State::Invalid));
        assert_eq!(decode(5), (0, State::Invalid));
        assert_eq!(encode(1, State::Invalid), None);
        // A seq beyond the word's range is never named.
        assert!(!v.store(MAX_SEQ + 1, State::Kept));
        assert!(!d.grant(MAX_SEQ + 1));
        assert!(!d.revoke(MAX_SEQ + 1));
        assert!(!d.revoke_unstarted(MAX_SEQ + 1));
        assert!(matches!(
            v.resume(MAX_SEQ + 1, State::Kept),
            Resumed::Other(_)
        ));
    }

    #[test]
    fn the_vm_cannot_shrink_the_object_under_the_daemon() {
        let (d, fd) = GrantWord::create().unwrap();
        // SAFETY: ftruncate on our own descriptor (the VM's copy); expected to be refused.
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), 0) };
        assert!(r < 0, "a sealed object shrank");
        // SAFETY: as above, growing.
        let r = unsafe { libc::ftruncate(fd.as_raw_fd(), 2 * SIZE as libc::off_t) };
        assert!(r < 0, "a sealed object grew");
        // SAFETY: fcntl on our descriptor; removing seals is impossible (F_SEAL_SEAL).
        let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
        assert!(r < 0, "seals were added after F_SEAL_SEAL");
        // Still readable by the daemon.
        assert_eq!(d.load(), 0);
    }

    #[test]
    fn an_unsealed_object_is_refused() {
        // SAFETY: memfd_create with a static name; checked below.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our memfd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as i64) }, 0);
        assert!(matches!(GrantWord::map(&fd), Err(WordError::Unsealed(_))));
    }
}
