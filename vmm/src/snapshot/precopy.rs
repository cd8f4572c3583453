//! Pre-copy pieces shared by live migration (`ctl migrate --live`) and live snapshots (`ctl
//! snapshot --live`): where the rounds go ([`Sink`]: a migration stream or the snapshot's
//! files), the RAM pages of a round (KVM's dirty bitmaps, one per RAM region, plus the pages the
//! virtual GPU wrote, which KVM does not see) sent with a record of which pages went before,
//! and the per-round report ("how much was copied twice", issue 17).

use serde::Serialize;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::ram::RamError;

const PAGE: u64 = 4096;
/// Most pages per RAM run handed to a sink (1 MiB).
pub const MAX_RUN_PAGES: u64 = 256;

/// Where pre-copy rounds go.
pub trait Sink {
    /// Whole pages of RAM at `off` in the RAM file's layout (a later write of a page wins).
    fn ram(&mut self, off: u64, bytes: &[u8]) -> std::io::Result<()>;
    /// Whole pages of VRAM from partition page `page`, sent in pre-copy round `round`.
    fn vram(&mut self, round: u32, page: u64, bytes: &[u8]) -> std::io::Result<()>;
    /// Whether the other end is ready for the paused round, waiting at most `wait` to hear it
    /// (a migration's destination making its GPU engine, [`super::ready`]).
    fn readiness(&mut self, _wait: std::time::Duration) -> std::io::Result<Readiness> {
        Ok(Readiness::NotAsked)
    }
}

/// What a sink knows of its other end's readiness for the paused round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Readiness {
    /// Nothing to wait for (a snapshot's files, a migration without VRAM pre-copy).
    NotAsked,
    /// Not heard yet; `hello`: the other end said it will tell.
    Waiting { hello: bool },
    /// Ready: its engine made and holding what was sent (`prepared`), or none made during the
    /// rounds.
    Ready { prepared: bool, engine_us: u64 },
}

/// A live migration's wait, after its rounds converged, for the destination's engine
/// (docs/snapshot.md, "The source waits for the destination's engine").
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DestReadyWait {
    /// How it ended: "prepared" (the destination's engine made, with the VRAM so far),
    /// "fallback" (it makes none during the rounds), "no hello" (an older destination: no
    /// line within `HELLO_WAIT`), "timeout" (none within `READY_WAIT`).
    pub outcome: String,
    /// The ready line had arrived before the paused round started.
    pub before_paused_round: bool,
    /// From the rounds' convergence to the end of the wait (the guest running), ms.
    pub src_wait_dest_ready_ms: f64,
    /// Rounds run during the wait.
    pub rounds_while_waiting: u32,
    /// The destination's time to make its engine (its line), ms.
    pub dest_engine_ms: f64,
}

/// What one round sent (bytes; "resent": pages an earlier round had sent already).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Round {
    pub round: u32,
    /// The last round, sent with the VM (and its GPU) paused.
    pub paused: bool,
    pub ms: f64,
    pub ram_bytes: u64,
    pub ram_resent_bytes: u64,
    pub vram_bytes: u64,
    pub vram_resent_bytes: u64,
    /// Where the round's time went (ms): taking the dirty logs (KVM's, the GPU's RAM writes),
    /// reading and sending RAM, finding the VRAM pages (round 0: the scan for non-zero pages;
    /// later: the harvest) and reading and sending them.
    pub harvest_ms: f64,
    pub ram_ms: f64,
    pub vram_find_ms: f64,
    pub vram_read_ms: f64,
    /// Pages KVM's dirty log reported for this round (round 0: none, everything is sent):
    /// each was one write-protection fault of a vCPU since the previous round.
    pub kvm_dirty_pages: u64,
    /// How long this round stopped the guest's GPU queue (ms): round 0 the pre-copy's start
    /// (the running job preempted while the log starts), the paused round all of it; the
    /// other rounds never stop it (their reads run beside the guest's jobs).
    pub gpu_blocked_ms: f64,
}

/// All rounds of a pre-copy and their sums.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    /// Whether the GPU ran during the pre-copy (its VRAM pre-copied through an exact dirty
    /// log); otherwise it was paused for it and its VRAM sent in the paused round.
    pub gpu_running: bool,
    /// What told which GPU pages were written: "engine" (its exact dirty log), "write sets"
    /// (the device's per-job write sets from the kernels' PTX), "none" (no GPU, or the GPU
    /// paused for the pre-copy).
    pub gpu_dirty_log: String,
    /// The pre-copy's start preempted a running kernel (one that did not end within
    /// `vgpu::snapshot::live::START_DRAIN`; with write sets it then runs on unchecked and marks
    /// everything once).
    pub gpu_start_preempted: bool,
    /// With write sets: how their speculation was validated (`None` otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_sets: Option<WriteSetValidation>,
    pub rounds: Vec<Round>,
    /// What the guest did while the rounds ran (the GPU's counters over the live window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<super::source_report::GuestWindow>,
    /// A live snapshot of a VM that runs on: what the guest did from the resume after the
    /// paused round to the end of the operation (KVM's dirty log switched off, the files
    /// synced, the state written), work the snapshot does while the guest runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_tail: Option<super::source_report::GuestWindow>,
    /// A live migration's wait for the destination's engine before the paused round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dest_ready: Option<DestReadyWait>,
    /// The source's parts of the paused round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downtime: Option<super::source_report::SrcDowntime>,
    /// A live snapshot: syncing its files and writing the state and the manifest, after the
    /// paused round (the VM running again unless it stays paused), ms.
    #[serde(skip_serializing_if = "is_zero")]
    pub sync_ms: f64,
    /// Switching KVM's dirty log of the RAM slots on (in the live window, before round 0) and
    /// off (a live snapshot: after the resume, in the tail), ms: memory-slot updates.
    #[serde(skip_serializing_if = "is_zero")]
    pub kvm_log_on_ms: f64,
    #[serde(skip_serializing_if = "is_zero")]
    pub kvm_log_off_ms: f64,
    pub ram_bytes: u64,
    pub ram_resent_bytes: u64,
    pub vram_bytes: u64,
    pub vram_resent_bytes: u64,
}

/// How the GPU's write sets were validated during a pre-copy (docs/snapshot.md).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct WriteSetValidation {
    /// Kernel runs that ran bounds-checked.
    pub checked_runs: u64,
    /// Kernel runs with a bounded write set that could not run checked (marked everything).
    pub unchecked_runs: u64,
    /// Rounds made conservative (everything dirty) because a checked kernel stored outside
    /// its extents.
    pub outside_rounds: u64,
    /// Write-set pointers of checked launches inside a declared allocation, and not.
    pub declared_extents: u64,
    pub undeclared_extents: u64,
    /// `ALLOC_DECLARE` writes the device refused.
    pub declarations_refused: u64,
    /// Milliseconds the GPU worker spent on the write sets between the guest's jobs (the
    /// checked twin chosen and loaded, extents marked), and the jobs it did that for.
    pub worker_ms: f64,
    pub worker_jobs: u64,
    /// Twins made and loaded before the log started, off the GPU worker, and the
    /// milliseconds that took (on the thread that started the copy, the guest running).
    pub twins_prepared: u64,
    pub prepare_ms: f64,
    /// Launches that loaded their twin into the VM's module cache: the one prepared (no JIT
    /// at the launch), or one transformed and loaded by the worker at the launch.
    pub twin_loads_ready: u64,
    pub twin_loads_cold: u64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl Report {
    /// Adds a round (and its bytes to the sums).
    pub fn push(&mut self, r: Round) {
        self.ram_bytes += r.ram_bytes;
        self.ram_resent_bytes += r.ram_resent_bytes;
        self.vram_bytes += r.vram_bytes;
        self.vram_resent_bytes += r.vram_resent_bytes;
        self.rounds.push(r);
    }
}

/// Pages set in per-region dirty bitmaps.
pub fn count(dirty: &[Vec<u64>]) -> u64 {
    dirty
        .iter()
        .flatten()
        .map(|w| u64::from(w.count_ones()))
        .sum()
}

/// The pages of RAM the first round looks at, as a dirty bitmap per region: with anonymous
/// backing only those present or swapped out (/proc/self/pagemap; a page never touched is
/// zero, and the destination's RAM starts zeroed), else every page. KVM's dirty log must be
/// on already: a page first touched after this is in the next round's log (or, written by
/// the GPU, in its own).
pub fn first_round(mem: &GuestMemoryMmap, backing: super::ram::Backing) -> Vec<Vec<u64>> {
    let pagemap = match backing {
        super::ram::Backing::Anonymous => std::fs::File::open("/proc/self/pagemap").ok(),
        super::ram::Backing::Other => None,
    };
    mem.iter()
        .map(|r| {
            let words = (r.len() / PAGE).div_ceil(64) as usize;
            let present = pagemap.as_ref().and_then(|p| {
                let host = r.get_host_address(vm_memory::MemoryRegionAddress(0)).ok()?;
                super::ram::touched(p, host as usize, r.len() as usize)
            });
            match present {
                Some(t) => {
                    let mut bits = vec![0u64; words];
                    for (i, present) in t.iter().enumerate() {
                        if *present {
                            bits[i / 64] |= 1 << (i % 64);
                        }
                    }
                    bits
                }
                None => vec![u64::MAX; words],
            }
        })
        .collect()
}

/// Every page of RAM, as a dirty bitmap per region.
pub fn all_dirty(mem: &GuestMemoryMmap) -> Vec<Vec<u64>> {
    mem.iter()
        .map(|r| vec![u64::MAX; (r.len() / PAGE).div_ceil(64) as usize])
        .collect()
}

/// Sets guest-physical pages `pages` (addresses / 4096) in the per-region bitmaps `dirty`;
/// pages outside RAM are ignored.
pub fn add_pages(mem: &GuestMemoryMmap, dirty: &mut [Vec<u64>], pages: &[u64]) {
    for &p in pages {
        let gpa = p.saturating_mul(PAGE);
        for (r, bits) in mem.iter().zip(dirty.iter_mut()) {
            let start = r.start_addr().0;
            if (start..start + r.len()).contains(&gpa) {
                let i = (gpa - start) / PAGE;
                if let Some(w) = bits.get_mut((i / 64) as usize) {
                    *w |= 1 << (i % 64);
                }
                break;
            }
        }
    }
}

/// The RAM pages sent so far (one bitmap per region).
#[derive(Debug)]
pub struct RamSent {
    sent: Vec<Vec<u64>>,
}

impl RamSent {
    pub fn new(mem: &GuestMemoryMmap) -> Self {
        RamSent {
            sent: mem
                .iter()
                .map(|r| vec![0; (r.len() / PAGE).div_ceil(64) as usize])
                .collect(),
        }
    }

    /// Distinct pages sent.
    pub fn pages(&self) -> u64 {
        self.sent
            .iter()
            .flatten()
            .map(|w| u64::from(w.count_ones()))
            .sum()
    }

    /// Sends the pages of `mem` whose bits are set in `dirty` (one bitmap per region, as
    /// KVM_GET_DIRTY_LOG returns them), copied with volatile reads so that the guest may run
    /// meanwhile (a page it writes again is dirty again and sent again). All-zero pages are
    /// sent too unless `skip_zero` (the first round: the destination's RAM starts zeroed).
    /// Returns (pages sent, of which sent before).
    pub fn send(
        &mut self,
        mem: &GuestMemoryMmap,
        dirty: &[Vec<u64>],
        skip_zero: bool,
        sink: &mut dyn Sink,
    ) -> Result<(u64, u64), RamError> {
        let io = |err| RamError::Io {
            what: "send RAM",
            err,
        };
        let (mut sent, mut resent) = (0, 0);
        let mut file_off = 0u64;
        let mut buf = vec![0u8; (MAX_RUN_PAGES * PAGE) as usize];
        for ((region, bits), done) in mem.iter().zip(dirty).zip(self.sent.iter_mut()) {
            let npages = region.len() / PAGE;
            let is_dirty = |p: u64| {
                bits.get((p / 64) as usize)
                    .is_some_and(|w| w >> (p % 64) & 1 == 1)
            };
            let mut note = |first: u64, n: u64| {
                for q in first..first + n {
                    let (w, bit) = ((q / 64) as usize, 1u64 << (q % 64));
                    if done[w] & bit != 0 {
                        resent += 1;
                    }
                    done[w] |= bit;
                }
                sent += n;
            };
            let mut p = 0;
            while p < npages {
                if !is_dirty(p) {
                    p += 1;
                    continue;
                }
                let first = p;
                while p < npages && is_dirty(p) && p - first < MAX_RUN_PAGES {
                    p += 1;
                }
                let n = ((p - first) * PAGE) as usize;
                let gpa = GuestAddress(region.start_addr().0 + first * PAGE);
                mem.read_slice(&mut buf[..n], gpa)
                    .map_err(|e| RamError::Map(e.to_string()))?;
                let base = file_off + first * PAGE;
                if !skip_zero {
                    sink.ram(base, &buf[..n]).map_err(io)?;
                    note(first, p - first);
                    continue;
                }
                // Runs of non-zero pages within the run.
                let mut i = 0;
                while i < n {
                    if all_zero(&buf[i..i + PAGE as usize]) {
                        i += PAGE as usize;
                        continue;
                    }
                    let s = i;
                    while i < n && !all_zero(&buf[i..i + PAGE as usize]) {
                        i += PAGE as usize;
                    }
                    sink.ram(base + s as u64, &buf[s..i]).map_err(io)?;
                    note(first + s as u64 / PAGE, (i - s) as u64 / PAGE);
                }
            }
            file_off += region.len();
        }
        Ok((sent, resent))
    }
}

/// Whether `bytes` are all zero: words ORed 64 bytes at a time (vectorised), not a byte-wise
/// search (round 0 looks at every page of a cuda VM's RAM, which is all pinned, so present:
/// the byte-wise check ran at ~3 GB/s, 90-160 ms for 256 MiB on the GPU host).
fn all_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(64);
    let words = |c: &[u8]| {
        c.chunks_exact(8).fold(0u64, |a, w| {
            a | u64::from_ne_bytes(w.try_into().unwrap_or([0xff; 8]))
        })
    };
    blocks.all(|c| words(c) == 0) && blocks.remainder().iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_pages_are_told_from_pages_with_one_byte_set() {
        let mut page = vec![0u8; 4096];
        assert!(all_zero(&page));
        for at in [0, 7, 63, 64, 2049, 4095] {
            page[at] = 1;
            assert!(!all_zero(&page), "byte {at}");
            page[at] = 0;
        }
        // A length that is not a multiple of 64: the tail counts too.
        let mut odd = vec![0u8; 100];
        assert!(all_zero(&odd));
        odd[99] = 9;
        assert!(!all_zero(&odd));
        assert!(all_zero(&[]));
    }

    #[derive(Default)]
    struct Rec(Vec<(u64, usize)>);

    impl Sink for Rec {
        fn ram(&mut self, off: u64, bytes: &[u8]) -> std::io::Result<()> {
            self.0.push((off, bytes.len()));
            Ok(())
        }
        fn vram(&mut self, _: u32, _: u64, _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_first_round_looks_at_touched_pages_only() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
        mem.write_slice(&[7], GuestAddress(0x5000)).unwrap();
        mem.write_slice(&[9], GuestAddress(0x30_0000)).unwrap();
        let bits = first_round(&mem, super::super::ram::Backing::Anonymous);
        let set = |p: u64| bits[0][(p / 64) as usize] >> (p % 64) & 1 == 1;
        // The written pages are looked at; untouched ones are not (with transparent huge
        // pages a write makes its whole 2 MiB present: at most 2 × 512 of the 2048 pages).
        assert!(set(5) && set(0x300), "written pages missing");
        assert!(count(&bits) <= 1024, "{} pages looked at", count(&bits));
        assert!(!set(0x700), "an untouched page in the last 2 MiB");
        // Round 0 sends exactly the non-zero pages.
        let mut rec = Rec::default();
        let mut sent = RamSent::new(&mem);
        assert_eq!(sent.send(&mem, &bits, true, &mut rec).unwrap(), (2, 0));
        // Other backing: every page.
        let all = first_round(&mem, super::super::ram::Backing::Other);
        assert_eq!(count(&all), 2048);
    }

    #[test]
    fn rounds_count_pages_sent_twice() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 1 << 20),
            (GuestAddress(1 << 32), 1 << 20),
        ])
        .unwrap();
        mem.write_slice(&[1], GuestAddress(0x3000)).unwrap();
        mem.write_slice(&[1], GuestAddress((1 << 32) + 0x1000))
            .unwrap();
        let mut sent = RamSent::new(&mem);
        let mut rec = Rec::default();
        // Round 0: the two non-zero pages; the second region's at file offset 1 MiB + 4 KiB.
        assert_eq!(
            sent.send(&mem, &all_dirty(&mem), true, &mut rec).unwrap(),
            (2, 0)
        );
        assert_eq!(rec.0, vec![(0x3000, 4096), ((1 << 20) + 0x1000, 4096)]);
        // Round 1: pages 3 and 4 dirty (the GPU wrote page 4, given as a guest-physical page).
        let mut dirty = vec![vec![0u64; 4]; 2];
        dirty[0][0] = 1 << 3;
        add_pages(&mem, &mut dirty, &[4, 1 << 20, 1 << 40]);
        assert_eq!(dirty[1][0], 1, "second region's first page");
        rec.0.clear();
        assert_eq!(sent.send(&mem, &dirty, false, &mut rec).unwrap(), (3, 1));
        assert_eq!(rec.0, vec![(0x3000, 8192), (1 << 20, 4096)]);
        assert_eq!(sent.pages(), 4);
    }
}
