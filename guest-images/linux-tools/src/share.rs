//! The bookkeeping that lets several processes of one guest drive the virtual GPU at once (CUDA
//! programs: docs/architecture.md, "CUDA programs in the guest"): a lock word in a shared
//! file mapping ([`DeviceLock`]) and a small state file ([`State`]) in `/run/vgpu-cuda` (ramfs:
//! gone at the next boot, like the device's state) that splits the device into slots — slot
//! *k* is channel *k*, the *k*-th VRAM range and the *k*-th range of the `memmap=` memory — and
//! records which live process leases which slot. A lease of a process that is gone (its pid
//! no longer runs the same process: the start time in `/proc/PID/stat` differs) is taken back
//! by the next process that attaches ([`crate::session`]).
//!
//! The state file is text, rewritten whole under the lock (write a temporary file, rename);
//! it is parsed as untrusted input: a malformed one is an error naming the file, never a panic.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ToolError;

/// Where the lock and state files live (`VGPU_CUDA_STATE_DIR` overrides).
pub const STATE_DIR: &str = "/run/vgpu-cuda";
/// Format line of the state file.
const MAGIC: &str = "vgpu-cuda-share 1";
/// Granule of every range (2 MiB pages map them).
pub const GRANULE: u64 = 2 << 20;
/// Most slots (channel ids of the device are below 32).
pub const MAX_SLOTS: u32 = 32;

/// The state directory in use.
pub fn state_dir() -> PathBuf {
    std::env::var_os("VGPU_CUDA_STATE_DIR").map_or_else(|| PathBuf::from(STATE_DIR), PathBuf::from)
}

/// How long a waiter sleeps between looks at the lock word.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// The device lock: a 64-bit word in a small file of the state directory, mapped shared by
/// every process, holding its owner's pid (high half) and the low 32 bits of the owner's start
/// time (0: free); taken by compare-and-swap, with a depth count (the driver nests its own lock
/// calls inside the session's). The guest kernel has no file locking (`flock` and `fcntl`
/// locks are configured out), and a word in shared memory also lets a waiter take the lock over
/// from an owner that died holding it: it swaps the dead owner's value for its own, which only
/// one waiter can do.
#[derive(Debug)]
pub struct DeviceLock {
    word: *const AtomicU64,
    me: u64,
    depth: u32,
    _file: File,
}

// SAFETY: the mapping is owned by this object and valid process-wide; the word is only reached
// atomically.
unsafe impl Send for DeviceLock {}

/// The lock word's value for process `pid` started at `start`.
fn owner_value(pid: u32, start: u64) -> u64 {
    u64::from(pid) << 32 | (start & 0xffff_ffff) | u64::from(start & 0xffff_ffff == 0)
}

/// Whether the process a lock word names still runs.
fn owner_alive(v: u64) -> bool {
    let pid = (v >> 32) as u32;
    start_time(pid).is_some_and(|s| owner_value(pid, s) == v)
}

impl DeviceLock {
    /// Opens (creating) the lock file in `dir` and maps its word, not yet locked.
    pub fn open(dir: &Path) -> Result<Self, ToolError> {
        fs::create_dir_all(dir).map_err(ToolError::io(format!("create {}", dir.display())))?;
        let path = dir.join("lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(ToolError::io(format!("open {}", path.display())))?;
        if file.metadata().map(|m| m.len()).unwrap_or(0) < 4096 {
            file.set_len(4096)
                .map_err(ToolError::io(format!("size {}", path.display())))?;
        }
        // SAFETY: a fresh shared mapping of 4096 bytes of the file; the kernel picks the
        // address. The object keeps the file open; the mapping is never unmapped before exit
        // (a process holds its lock object for its life).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ToolError::io(format!("map {}", path.display()))(
                std::io::Error::last_os_error(),
            ));
        }
        let me = std::process::id();
        let start =
            start_time(me).ok_or_else(|| ToolError::Bad("cannot read /proc/self/stat".into()))?;
        Ok(Self {
            word: p.cast(),
            me: owner_value(me, start),
            depth: 0,
            _file: file,
        })
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: `word` points at the start of a live, page-aligned shared mapping (so 8-byte
        // aligned), reached only atomically by every process.
        unsafe { &*self.word }
    }

    /// Takes the lock (waiting) unless this object holds it already; takes it over from an
    /// owner that is gone.
    pub fn lock(&mut self) {
        if self.depth == 0 {
            let w = self.word();
            loop {
                match w.compare_exchange(0, self.me, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    // (Another lock object of this process holding it is waited for too.)
                    Err(owner) => {
                        if !owner_alive(owner)
                            && w.compare_exchange(
                                owner,
                                self.me,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            )
                            .is_ok()
                        {
                            break;
                        }
                        std::thread::sleep(LOCK_POLL);
                    }
                }
            }
        }
        self.depth += 1;
    }

    /// Releases one level of the lock; the word is cleared with the last.
    pub fn unlock(&mut self) {
        match self.depth {
            0 => {}
            1 => {
                self.depth = 0;
                let _ =
                    self.word()
                        .compare_exchange(self.me, 0, Ordering::AcqRel, Ordering::Acquire);
            }
            _ => self.depth -= 1,
        }
    }
}

/// One lease: the process holding a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat` when the lease was taken (pid reuse check).
    pub start: u64,
}

/// The device split into slots, and who holds each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub slots: u32,
    /// Guest-physical start of the `memmap=` range: its first 2 MiB are shared (the doorbell
    /// page at its start), slot *k*'s memory follows at `dma_base + GRANULE + k * dma_slot`.
    pub dma_base: u64,
    pub dma_slot: u64,
    /// Guest VRAM: the first 2 MiB shared (the runlist at 0), slot *k* at
    /// `GRANULE + k * vram_slot`.
    pub vram_slot: u64,
    pub leases: Vec<Option<Lease>>,
}

impl State {
    /// Splits `dma` (guest-physical start, length) and `vram` bytes into `slots` slots; an
    /// error when a slot would get less than 6 MiB of memory or 4 MiB of VRAM.
    pub fn layout(slots: u32, dma: (u64, u64), vram: u64) -> Result<Self, ToolError> {
        let slots = slots.clamp(1, MAX_SLOTS);
        let n = u64::from(slots);
        let dma_slot = dma.1.saturating_sub(GRANULE) / n / GRANULE * GRANULE;
        let vram_slot = vram.saturating_sub(GRANULE) / n / GRANULE * GRANULE;
        if dma_slot < 3 * GRANULE || vram_slot < 2 * GRANULE || !dma.0.is_multiple_of(GRANULE) {
            return Err(ToolError::Bad(format!(
                "the GPU cannot be split into {slots} CUDA slots: {} MiB of memmap= memory at \
                 {:#x} and {} MiB of VRAM leave {} MiB / {} MiB per slot (at least 6 / 4; set \
                 VGPU_CUDA_SLOTS lower)",
                dma.1 >> 20,
                dma.0,
                vram >> 20,
                dma_slot >> 20,
                vram_slot >> 20
            )));
        }
        Ok(Self {
            slots,
            dma_base: dma.0,
            dma_slot,
            vram_slot,
            leases: vec![None; slots as usize],
        })
    }

    /// Slot `k`'s memory: (guest-physical start, length).
    pub fn dma_range(&self, k: u32) -> (u64, u64) {
        (
            self.dma_base + GRANULE + u64::from(k) * self.dma_slot,
            self.dma_slot,
        )
    }

    /// Slot `k`'s VRAM: (start, length).
    pub fn vram_range(&self, k: u32) -> (u64, u64) {
        (GRANULE + u64::from(k) * self.vram_slot, self.vram_slot)
    }

    /// The text of the state file.
    pub fn format(&self) -> String {
        let mut s = format!(
            "{MAGIC}\nslots {}\ndma {:#x} {:#x}\nvram {:#x}\n",
            self.slots, self.dma_base, self.dma_slot, self.vram_slot
        );
        for (k, l) in self.leases.iter().enumerate() {
            if let Some(l) = l {
                s += &format!("lease {k} {} {}\n", l.pid, l.start);
            }
        }
        s
    }

    /// Parses a state file's text (untrusted).
    pub fn parse(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let mut field = |name: &str| -> Option<Vec<u64>> {
            let l = lines.next()?;
            let mut w = l.split_whitespace();
            (w.next()? == name).then_some(())?;
            w.map(crate::args::parse_num).collect()
        };
        let slots = u32::try_from(*field("slots")?.first()?).ok()?;
        let dma = field("dma")?;
        let vram = field("vram")?;
        let (&[dma_base, dma_slot], &[vram_slot]) = (dma.as_slice(), vram.as_slice()) else {
            return None;
        };
        if slots == 0 || slots > MAX_SLOTS {
            return None;
        }
        let mut st = Self {
            slots,
            dma_base,
            dma_slot,
            vram_slot,
            leases: vec![None; slots as usize],
        };
        // Ranges must not wrap, and stay 2 MiB aligned.
        dma_base
            .checked_add(GRANULE)?
            .checked_add(u64::from(slots).checked_mul(dma_slot)?)
            .filter(|_| (dma_base | dma_slot | vram_slot).is_multiple_of(GRANULE))?;
        GRANULE
            .checked_add(u64::from(slots).checked_mul(vram_slot)?)
            .filter(|_| vram_slot > 0 && dma_slot > 0)?;
        for l in lines {
            let w: Vec<u64> = l
                .strip_prefix("lease ")?
                .split_whitespace()
                .map(crate::args::parse_num)
                .collect::<Option<_>>()?;
            let &[k, pid, start] = w.as_slice() else {
                return None;
            };
            let slot = st.leases.get_mut(usize::try_from(k).ok()?)?;
            *slot = Some(Lease {
                pid: u32::try_from(pid).ok()?,
                start,
            });
        }
        Some(st)
    }

    /// Reads the state file in `dir`: `None` when there is none yet (nobody attached since
    /// boot), an error when it is unreadable or malformed.
    pub fn load(dir: &Path) -> Result<Option<Self>, ToolError> {
        let path = dir.join("state");
        match fs::read_to_string(&path) {
            Ok(t) => Self::parse(&t).map(Some).ok_or_else(|| {
                ToolError::Bad(format!(
                    "{} is malformed (remove it only if no CUDA program runs)",
                    path.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ToolError::io(format!("read {}", path.display()))(e)),
        }
    }

    /// Writes the state file in `dir` (a temporary file renamed over it).
    pub fn save(&self, dir: &Path) -> Result<(), ToolError> {
        let tmp = dir.join(format!("state.{}", std::process::id()));
        fs::write(&tmp, self.format())
            .map_err(ToolError::io(format!("write {}", tmp.display())))?;
        fs::rename(&tmp, dir.join("state")).map_err(ToolError::io("rename the state file"))
    }
}

/// Field 22 (start time) of `/proc/PID/stat`, `None` when the process does not exist.
pub fn start_time(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything: skip past it.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the lease's process still runs.
pub fn alive(l: &Lease) -> bool {
    start_time(l.pid) == Some(l.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_and_bad_files_are_refused() {
        let mut st = State::layout(4, (0x800_0000, 64 << 20), 256 << 20).unwrap();
        assert_eq!(st.dma_slot, 14 << 20);
        assert_eq!(st.vram_slot, 62 << 20);
        assert_eq!(
            st.dma_range(1),
            (0x800_0000 + (2 << 20) + (14 << 20), 14 << 20)
        );
        assert_eq!(st.vram_range(3), ((2 << 20) + 3 * (62 << 20), 62 << 20));
        assert!(st.vram_range(3).0 + st.vram_slot <= 256 << 20);
        st.leases[2] = Some(Lease {
            pid: 77,
            start: 12345,
        });
        assert_eq!(State::parse(&st.format()), Some(st.clone()));
        assert!(State::layout(32, (0x800_0000, 64 << 20), 256 << 20).is_err());
        for bad in [
            "",
            "vgpu-cuda-share 2\n",
            "vgpu-cuda-share 1\nslots 0\ndma 0 0x200000\nvram 0x200000\n",
            "vgpu-cuda-share 1\nslots 4\ndma 0x8000000 0xe00000\nvram 0x3e00000\nlease 9 1 1\n",
            "vgpu-cuda-share 1\nslots 4\ndma 0xffffffffffffffff 0xe00000\nvram 0x3e00000\n",
            "vgpu-cuda-share 1\nslots 4\ndma 0x8000000\nvram 0x3e00000\n",
            "vgpu-cuda-share 1\nslots 4\ndma 0x8000000 0xe00000\nvram 0x3e00000\nlease 1 x 1\n",
        ] {
            assert_eq!(State::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn liveness_by_pid_and_start_time() {
        let me = std::process::id();
        let start = start_time(me).expect("own stat");
        assert!(alive(&Lease { pid: me, start }));
        assert!(!alive(&Lease {
            pid: me,
            start: start + 1
        }));
        assert!(!alive(&Lease {
            pid: u32::MAX,
            start
        }));
    }

    #[test]
    fn lock_nests_and_is_taken_over_from_a_dead_owner() {
        let dir = std::env::temp_dir().join(format!("vgpu-share-{}", std::process::id()));
        let mut l = DeviceLock::open(&dir).unwrap();
        l.lock();
        l.lock();
        assert_eq!(l.word().load(Ordering::Acquire), l.me);
        l.unlock();
        assert_eq!(l.depth, 1);
        l.unlock();
        assert_eq!(
            l.word().load(Ordering::Acquire),
            0,
            "free after the last unlock"
        );
        l.unlock();
        assert_eq!(l.depth, 0);
        // Another process's word: a live owner is waited for (here: our own parent), a dead
        // one (a pid that does not run) is taken over.
        let dead = owner_value(u32::MAX >> 1, 12345);
        assert!(!owner_alive(dead));
        assert!(owner_alive(l.me));
        l.word().store(dead, Ordering::Release);
        l.lock();
        assert_eq!(l.word().load(Ordering::Acquire), l.me);
        l.unlock();
        // Two lock objects of one process share the word through the file.
        let mut l2 = DeviceLock::open(&dir).unwrap();
        l2.lock();
        assert_eq!(l.word().load(Ordering::Acquire), l2.me);
        l2.unlock();
        let st = State::layout(2, (0, 64 << 20), 64 << 20).unwrap();
        st.save(&dir).unwrap();
        assert_eq!(State::load(&dir).unwrap(), Some(st));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
