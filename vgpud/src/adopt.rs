//! A restart of the daemon: the VMs of an earlier instance re-register (`Hello::resume`) and
//! this instance rebuilds its partitions and scheduler from their claims.
//!
//! Each instance has a random boot id, sent in every version-3 `Welcome`: a VM whose connection
//! ends (the daemon was killed or crashed) keeps its engine, contexts and mapped partition,
//! connects to the same socket again and claims what it holds — the boot id it knew, its
//! partition's offset (the size, weight, priority and channels are its `Hello`'s) — with the
//! VRAM memory object attached. On sim that object is where the VRAM lives: the VMs' mappings
//! keep the earlier instance's memfd alive after it died.
//!
//! What this instance checks: the claim names another instance (not this one), a GPU this
//! instance has (`Resume::gpu`: the GPU the VM was on, the one it was moved to last; a claim
//! naming an index beyond `--gpus` is refused), a 2 MiB-aligned range inside `--vram`, a memory
//! object that is a vgpud VRAM memfd large enough for it, not adopted on another GPU already,
//! and a range no other VM of this instance holds on that GPU (that GPU's pool range at that
//! offset is reserved: placement is kept). Anything else is refused (fatal): the VM then
//! reports `GPU_LOST`. Adopted memory objects are kept apart from this instance's own (one per
//! GPU): a range of an adopted object is only ever the claimer's (a VM of the earlier instance
//! that has not come back may still map its range there), new VMs get ranges of their GPU's own
//! memfd, and an adopted object is dropped when the last VM on it has gone. A departed adopted
//! VM's range is zeroed in its object once its process has exited, like any other; a VM moved
//! to another GPU leaves its adopted range (zeroed) for its new GPU's own memfd.
//!
//! The adoption window (`--adopt-ms`): when this instance replaced a stale socket at start (the
//! previous one did not exit cleanly), first registrations wait until the window has passed, so
//! that returning VMs get their ranges back before anyone else takes space; claims are served
//! at once, and also after the window while their range is free.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use scheduler::{VmId, VmParams};

use crate::daemon::Daemon;
use crate::partition::GRANULE;
use crate::proto::{self, Hello, Resume, ToVm, monotonic_ns};
use crate::report::VmReport;
use crate::session::{Limits, Registered, validate_hello};

/// Identity of a memory object: (device, inode) of its descriptor.
pub(crate) type ObjectKey = (u64, u64);

/// A VRAM memory object adopted from re-registering VMs.
struct Object {
    key: ObjectKey,
    /// The GPU its VMs' partitions are on (the earlier instance had one memfd per GPU).
    gpu: usize,
    fd: OwnedFd,
    /// VMs of this instance on it (registered or quarantined).
    users: u32,
}

/// This instance's restart state (see the module documentation).
pub(crate) struct Adoption {
    /// The random id of this instance (`Welcome::boot`).
    pub boot: String,
    /// The identity of this instance's own VRAM memory object of each GPU, in index order.
    own: Vec<ObjectKey>,
    /// First registrations wait until this monotonic instant (`None`: no window, or over).
    pub window_until_ns: Option<u64>,
    /// First registrations waiting for the window's end, in arrival order.
    pub(crate) deferred: Vec<(u64, Hello)>,
    objects: Vec<Object>,
    /// When the socket was listening.
    listen_ns: u64,
}

/// The boot id: 16 random bytes in hex.
fn boot_id() -> String {
    let mut b = [0u8; 16];
    // SAFETY: getrandom writes at most `b.len()` bytes into our buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        // No entropy source: the time and pid still tell instances apart.
        let t = monotonic_ns() ^ (u64::from(std::process::id()) << 40);
        b[..8].copy_from_slice(&t.to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The (device, inode) of a descriptor, and its size.
fn identity(fd: BorrowedFd<'_>) -> Option<(ObjectKey, u64)> {
    // SAFETY: stat is plain data; all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the stat we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return None;
    }
    Some(((st.st_dev, st.st_ino), st.st_size as u64))
}

/// Whether `fd` is a VRAM memory object a vgpud made (a memfd named `vgpud-vram`).
fn is_vram_memfd(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|p| p.to_string_lossy().starts_with("/memfd:vgpud-vram"))
}

impl Adoption {
    /// `own`: this instance's VRAM memory object of each GPU; `window_ns`: the adoption window, applied
    /// only when `stale` (a stale socket was replaced at start).
    pub fn new(own: &[BorrowedFd<'_>], stale: bool, window_ns: u64) -> Self {
        let listen_ns = monotonic_ns();
        let boot = boot_id();
        let window_until_ns = (stale && window_ns > 0).then(|| listen_ns + window_ns);
        if stale {
            log::info!(
                "vgpud: instance {boot} replaced a stale socket: VMs of the previous instance \
                 may re-register{}",
                if window_ns > 0 {
                    format!("; first registrations wait {} ms", window_ns / 1_000_000)
                } else {
                    String::new()
                }
            );
        } else {
            log::info!("vgpud: instance {boot}");
        }
        Adoption {
            boot,
            own: own
                .iter()
                .map(|fd| identity(fd.as_fd()).map_or((0, 0), |(k, _)| k))
                .collect(),
            window_until_ns,
            deferred: Vec::new(),
            objects: Vec::new(),
            listen_ns,
        }
    }

    /// Nanoseconds since the socket was listening, at `now_ns`.
    pub fn since_listen(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.listen_ns)
    }
}

impl Daemon {
    /// The identity of this instance's own VRAM memory object of GPU `g` (its pool's).
    pub(crate) fn own_object(&self, g: usize) -> ObjectKey {
        self.adoption.own.get(g).copied().unwrap_or((0, 0))
    }

    /// A first registration during the adoption window waits for its end; true when `reg`
    /// was put aside.
    pub(crate) fn defer_hello(&mut self, c: u64, reg: &Hello) -> bool {
        let a = &mut self.adoption;
        if a.window_until_ns.is_none_or(|t| monotonic_ns() >= t) {
            return false;
        }
        if a.deferred.iter().any(|(d, _)| *d == c) {
            self.report.refused += 1;
            if let Some(s) = self.sessions.get_mut(&c) {
                s.refuse("already waiting for registration".into(), false);
            }
            return true;
        }
        log::info!(
            "vgpud: {} waits for the end of the adoption window",
            reg.name
        );
        a.deferred.push((c, reg.clone()));
        self.report.restart.deferred += 1;
        true
    }

    /// Ends the adoption window when it has passed: the first registrations that waited are
    /// handled in arrival order.
    pub(crate) fn adopt_tick(&mut self, now_ns: u64) {
        if self.adoption.window_until_ns.is_none_or(|t| now_ns < t) {
            return;
        }
        self.adoption.window_until_ns = None;
        let waiting = std::mem::take(&mut self.adoption.deferred);
        log::info!(
            "vgpud: adoption window over: {} VMs re-registered, {} first registrations waited",
            self.report.restart.adopted,
            waiting.len()
        );
        for (c, reg) in waiting {
            if self.sessions.get(&c).is_some_and(|s| !s.closing) {
                self.hello(c, reg);
            }
        }
    }

    /// Records the first grant and the first engine run since the socket listened (how soon
    /// the GPU is in use again after a restart).
    pub(crate) fn note_use(&mut self, granted_ns: Option<u64>, run_start_ns: Option<u64>) {
        let r = &mut self.report.restart;
        if let Some(t) = granted_ns
            && r.listen_to_first_grant_ns.is_none()
        {
            r.listen_to_first_grant_ns = Some(self.adoption.since_listen(t));
        }
        if let Some(t) = run_start_ns
            && r.listen_to_first_run_ns.is_none()
        {
            r.listen_to_first_run_ns = Some(self.adoption.since_listen(t));
        }
    }

    /// A re-registration (`Hello` with `resume`, the VRAM memory object in `fd`).
    pub(crate) fn resume(&mut self, c: u64, reg: Hello, fd: Option<OwnedFd>) {
        match self.check_claim(&reg, fd) {
            Ok((g, offset, object)) => self.admit(c, reg, g, offset, object),
            Err(why) => {
                self.report.restart.claims_refused += 1;
                self.report.refused += 1;
                if let Some(s) = self.sessions.get_mut(&c) {
                    s.refuse(format!("re-registration refused: {why}"), true);
                }
            }
        }
    }

    /// Checks a claim and takes its range; the GPU index, the offset and the adopted object's
    /// identity. The claim's GPU is `Resume::gpu` (a `Hello::gpu` pin beside it is not
    /// looked at: a pinned VM may have been moved since).
    fn check_claim(
        &mut self,
        reg: &Hello,
        fd: Option<OwnedFd>,
    ) -> Result<(usize, u64, ObjectKey), String> {
        let Some(Resume {
            boot,
            vm,
            gpu,
            vram_offset: offset,
        }) = &reg.resume
        else {
            return Err("no claim".into());
        };
        let Some(g) = usize::try_from(*gpu).ok().filter(|g| *g < self.gpus.len()) else {
            let n = self.gpus.len();
            return Err(format!(
                "GPU {gpu}: this daemon has {n} GPU{} (0..={})",
                if n == 1 { "" } else { "s" },
                n.saturating_sub(1)
            ));
        };
        let limits = Limits {
            vram_free: self.gpus[g].pool.free_bytes(),
            channels_free: self.gpus[g].channels - self.gpus[g].channels_used,
        };
        validate_hello(reg, &limits)?;
        if reg.version < proto::RESUME_VERSION {
            return Err(format!(
                "a claim needs protocol version {}",
                proto::RESUME_VERSION
            ));
        }
        if boot.is_empty() || boot.len() > 64 || !boot.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err("the boot id must be 1..=64 hexadecimal digits".into());
        }
        if *boot == self.adoption.boot {
            return Err(format!(
                "this daemon instance ({boot}) is the one the VM registered with: it did not \
                 restart (a VM it let go registers only as a new VM)"
            ));
        }
        let pool_size = self.gpus[g].pool.size();
        let end = offset.checked_add(reg.vram).filter(|e| *e <= pool_size);
        if !offset.is_multiple_of(GRANULE) || end.is_none() {
            return Err(format!(
                "range {offset:#x}+{:#x} is not 2 MiB aligned inside the {} MiB of VRAM of GPU {g}",
                reg.vram,
                pool_size >> 20
            ));
        }
        let fd = fd.ok_or("no VRAM memory object attached")?;
        if !is_vram_memfd(fd.as_fd()) {
            return Err("the descriptor attached is not a vgpud VRAM memory object".into());
        }
        let (key, size) = identity(fd.as_fd()).ok_or("fstat of the memory object failed")?;
        if self.adoption.own.contains(&key) {
            return Err(
                "the memory object is this instance's own: a migration or a new VM, not a restart"
                    .into(),
            );
        }
        if end.is_some_and(|e| e > size) {
            return Err(format!(
                "range {offset:#x}+{:#x} lies beyond the memory object ({size} bytes)",
                reg.vram
            ));
        }
        if let Some(o) = self.adoption.objects.iter().find(|o| o.key == key)
            && o.gpu != g
        {
            return Err(format!(
                "the memory object was adopted on GPU {} (the claim names GPU {g})",
                o.gpu
            ));
        }
        if let Err(e) = self.gpus[g].pool.reserve(*offset, reg.vram) {
            let holder = self
                .sessions
                .values()
                .filter_map(|s| s.reg.as_ref())
                .find(|r| {
                    r.gpu == g
                        && r.report.vram_offset < offset + reg.vram
                        && *offset < r.report.vram_offset + r.report.vram_size
                })
                .map(|r| format!(" (held by {}, vm {})", r.report.name, r.id.0))
                .unwrap_or_default();
            return Err(format!("{e}{holder}: a conflicting claim"));
        }
        match self.adoption.objects.iter_mut().find(|o| o.key == key) {
            Some(o) => o.users += 1,
            None => {
                log::info!(
                    "vgpud: adopted VRAM memory object (inode {}, {} MiB) of gpu {g} from vm {vm} \
                     of instance {boot}",
                    key.1,
                    size >> 20
                );
                self.adoption.objects.push(Object {
                    key,
                    gpu: g,
                    fd,
                    users: 1,
                });
            }
        }
        Ok((g, *offset, key))
    }

    /// Registers connection `c` on GPU `g` with its partition at `offset` (of the adopted
    /// `object`, or of that GPU's own memfd): scheduler entry, channels, `Welcome`.
    pub(crate) fn admit(&mut self, c: u64, reg: Hello, g: usize, offset: u64, object: ObjectKey) {
        let adopted = object != self.own_object(g);
        let id = VmId(self.next_vm);
        let now_ns = monotonic_ns();
        let params = VmParams {
            weight: reg.weight,
            priority: reg.priority,
        };
        let now = self.at(now_ns);
        if let Err(e) = self.gpus[g].sched.register(id, params, now) {
            self.gpus[g].pool.release(offset, reg.vram);
            if adopted {
                self.release_object(object, None);
            }
            return self.refuse_fatal(c, e.to_string());
        }
        self.next_vm += 1;
        let gpu = &mut self.gpus[g];
        gpu.channels_used += reg.channels;
        gpu.weights += u64::from(reg.weight);
        self.by_vm.insert(id, c);
        let v3 = reg.version >= proto::RESUME_VERSION;
        let welcome = ToVm::Welcome {
            // The VM's own version (validated): an older VM is served in its version.
            version: reg.version,
            vm: id.0,
            vram_offset: offset,
            vram_size: reg.vram,
            // Older VMs are told nothing new (they would refuse the fields).
            boot: v3.then(|| self.adoption.boot.clone()),
            gpu: v3.then_some(proto::Placement {
                index: gpu.index,
                device: gpu.device,
            }),
        };
        let registered_ns = now.as_nanos() as u64;
        let fd = match self.adoption.objects.iter().find(|o| o.key == object) {
            Some(o) => o.fd.as_fd(),
            None => self.gpus[g].pool.fd(),
        };
        let sent = self.sessions.get_mut(&c).map(|s| {
            let r = s.conn.send(&proto::encode(&welcome), Some(fd));
            s.reg = Some(Registered {
                id,
                gpu: g,
                moving: None,
                pending: false,
                want_since_ns: 0,
                object,
                word: None,
                unstarted_streak: 0,
                report: VmReport {
                    id: id.0,
                    name: reg.name.clone(),
                    pid: s.pid,
                    weight: reg.weight,
                    priority: reg.priority,
                    vram_offset: offset,
                    vram_size: reg.vram,
                    channels: reg.channels,
                    gpu: g as u32,
                    registered_ns,
                    resumed_from: reg.resume.as_ref().map(|r| r.vm),
                    ..VmReport::default()
                },
            });
            r
        });
        if adopted {
            self.report.restart.adopted += 1;
        }
        if let Some(Ok(())) = sent {
            // Version 4: the grant word follows the welcome, if the VM asked for it.
            let word = self.give_word(c, reg.version, reg.word);
            if let Some(r) = self.sessions.get_mut(&c).and_then(|s| s.reg.as_mut()) {
                r.word = word;
            }
        }
        match sent {
            Some(Ok(())) => log::info!(
                "vgpud: {} {} as vm {} on gpu {g}{} (weight {}, priority {}, VRAM {} MiB at {:#x}, \
                 {} channels)",
                if adopted {
                    "re-registered"
                } else {
                    "registered"
                },
                reg.name,
                id.0,
                if reg.gpu.is_some() && !adopted {
                    " (pinned)"
                } else {
                    ""
                },
                reg.weight,
                reg.priority,
                reg.vram >> 20,
                offset,
                reg.channels
            ),
            _ => {
                if let Some(s) = self.sessions.get_mut(&c) {
                    s.closing = true;
                }
            }
        }
    }

    fn refuse_fatal(&mut self, c: u64, why: String) {
        self.report.refused += 1;
        if let Some(s) = self.sessions.get_mut(&c) {
            s.refuse(why, true);
        }
    }

    /// The range `(offset, size)` of a departed VM on `object` is free again: zeroed there
    /// (`range`: none when it was never used), and the object dropped when nobody is left on
    /// it. This instance's own object is the pool's business.
    pub(crate) fn release_object(&mut self, object: ObjectKey, range: Option<(u64, u64)>) {
        let Some(i) = self.adoption.objects.iter().position(|o| o.key == object) else {
            return;
        };
        let o = &mut self.adoption.objects[i];
        if let Some((offset, size)) = range
            && let Err(e) = crate::partition::punch(o.fd.as_fd(), offset, size)
        {
            log::error!("vgpud: zeroing adopted VRAM {offset:#x}+{size:#x} failed: {e}");
        }
        o.users -= 1;
        if o.users == 0 {
            log::info!(
                "vgpud: the last VM on adopted memory object (inode {}) is gone: dropped",
                o.key.1
            );
            self.adoption.objects.remove(i);
        }
    }
}
