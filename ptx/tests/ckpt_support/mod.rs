//! Running `suite` workloads on the interpreter from a given PTX text (original, printed or
//! transformed), for the checkpoint tests.
#![allow(dead_code)]

use std::sync::Arc;

use ptx::{FlatMemory, Launch, LaunchConfig, Limits, RunControl, RunOutcome, Stats};

/// Base of the flat memory the tests use.
pub const BASE: u64 = 0x10_0000;

/// Buffers of an instance placed in one flat memory (256-byte aligned, in order).
pub struct Placed {
    pub mem: FlatMemory,
    pub addrs: Vec<u64>,
    /// First free address after the buffers (for save areas and flags).
    pub free: u64,
}

/// Place the buffers of `inst` plus `extra` free bytes.
pub fn place(inst: &suite::Instance, extra: usize) -> Placed {
    let mut addrs = Vec::new();
    let mut a = BASE;
    for b in &inst.buffers {
        addrs.push(a);
        a += (b.init.len() as u64).next_multiple_of(256).max(256);
    }
    let free = a;
    let size = (a - BASE) as usize + extra + 4096;
    let mem = FlatMemory::new(BASE, size);
    for (b, &addr) in inst.buffers.iter().zip(&addrs) {
        assert!(mem.write(addr, &b.init));
    }
    Placed { mem, addrs, free }
}

/// Read back every buffer of `inst`.
pub fn buffers(inst: &suite::Instance, p: &Placed) -> Vec<Vec<u8>> {
    inst.buffers
        .iter()
        .zip(&p.addrs)
        .map(|(b, &a)| p.mem.read(a, b.init.len()).expect("in memory"))
        .collect()
}

/// Check the outputs of `inst` against its reference.
pub fn check(inst: &suite::Instance, outs: &[Vec<u8>]) -> Result<(), String> {
    let read: Vec<&[u8]> = outs.iter().map(Vec::as_slice).collect();
    inst.check(&read).map(|_| ()).map_err(|e| format!("{e:?}"))
}

/// Run every launch of `inst` with the module parsed from `text` to completion; returns the
/// buffers and the summed stats.
pub fn run_plain(inst: &suite::Instance, text: &str, workers: usize) -> (Vec<Vec<u8>>, Stats) {
    let module = Arc::new(ptx::parse(text).expect("parses"));
    let p = place(inst, 0);
    let mut total = Stats::default();
    for l in &inst.launches {
        let params = suite::layout_params(&l.params, &p.addrs).expect("params");
        let cfg = LaunchConfig {
            grid: l.grid,
            block: l.block,
            dynamic_shared: l.shared_bytes,
            params,
        };
        let mut launch =
            Launch::new(module.clone(), l.entry, cfg, &Limits::default()).expect("launch");
        match launch.run(&p.mem, &RunControl::new(workers)) {
            RunOutcome::Completed(s) => add(&mut total, &s),
            other => panic!("{}: {other:?}", inst.workload),
        }
    }
    (buffers(inst, &p), total)
}

pub fn add(total: &mut Stats, s: &Stats) {
    total.thread_instructions += s.thread_instructions;
    total.warp_instructions += s.warp_instructions;
}

/// Deterministic xorshift.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Result of a checkpointed run of an instance.
pub struct CkRun {
    pub outs: Vec<Vec<u8>>,
    /// Rounds in which the flag was raised while the kernel ran.
    pub flags_raised: u64,
    /// Resume launches.
    pub relaunches: u64,
    /// Records found preempted at a point (status >= 3) after a round.
    pub saved_threads: u64,
    /// Summed instruction counts of every launch and relaunch.
    pub stats: Stats,
    /// Register bytes the saves of this run would store without the incremental scheme
    /// (per the plan's per-point numbers).
    pub full_bytes: u64,
    /// Register bytes the saves of this run stored (per the plan's per-resume-point numbers).
    pub incremental_bytes: u64,
    /// Status words found in the mirror (`run_ckpt_mirror`), each equal to its record's.
    pub mirror_words: u64,
}

/// Run every launch of `inst` with the transformed module `t`: each launch (and relaunch)
/// is stopped by the interpreter after a random number of warp-instructions (when `rng` is
/// given and fewer than `preempt_rounds` rounds were preempted), the flag is raised, the
/// kernel runs on until its threads have saved and exited, and it is relaunched with
/// `__ck_resume = 1` until every record says done.
pub fn run_ckpt(
    inst: &suite::Instance,
    t: &ptx::ckpt::Transformed,
    workers: usize,
    rng: Option<&mut Rng>,
    preempt_rounds: u64,
) -> Result<CkRun, String> {
    run_ckpt_with(inst, t, workers, rng, preempt_rounds, false)
}

/// As [`run_ckpt`], with a status mirror set at `__ck_flag + MIRROR_OFF`: after every round
/// each record whose status word this round stored (every record not done before it, every
/// record a fresh round left not done) must have its word, marked, in the mirror, and no
/// other mirror word may be set; the mirror is cleared between rounds (as the engine does).
pub fn run_ckpt_mirror(
    inst: &suite::Instance,
    t: &ptx::ckpt::Transformed,
    workers: usize,
    rng: Option<&mut Rng>,
    preempt_rounds: u64,
) -> Result<CkRun, String> {
    run_ckpt_with(inst, t, workers, rng, preempt_rounds, true)
}

fn run_ckpt_with(
    inst: &suite::Instance,
    t: &ptx::ckpt::Transformed,
    workers: usize,
    mut rng: Option<&mut Rng>,
    preempt_rounds: u64,
    mirror: bool,
) -> Result<CkRun, String> {
    let module = Arc::new(ptx::parse(&t.ptx).map_err(|e| e.to_string())?);
    let mut need = 0u64;
    for l in &inst.launches {
        let plan = t.entry(l.entry).ok_or("no plan")?;
        need = need.max(plan.save_area_bytes(l.grid, l.block, l.shared_bytes));
    }
    let most_threads = inst.launches.iter().map(|l| l.threads()).max().unwrap_or(0);
    let p = place(inst, need as usize + 512 + 4 * most_threads as usize + 256);
    let flag = p.free;
    let save = p.free + 256;
    let mirror_at = (save + need).next_multiple_of(256);
    if mirror {
        let off = ptx::ckpt::MIRROR_OFF as u64;
        assert!(p.mem.write(flag + off, &mirror_at.to_le_bytes()));
    }
    let mut run = CkRun {
        outs: Vec::new(),
        flags_raised: 0,
        relaunches: 0,
        saved_threads: 0,
        stats: Stats::default(),
        full_bytes: 0,
        incremental_bytes: 0,
        mirror_words: 0,
    };
    let warp_instrs = (inst.approx_thread_instrs / 32 / inst.launches.len() as u64).max(2);
    for l in &inst.launches {
        let plan = t.entry(l.entry).ok_or("no plan")?;
        let info = module.entry(l.entry).ok_or("no entry")?;
        let orig = suite::layout_params(&l.params, &p.addrs).map_err(|e| format!("{e:?}"))?;
        let mut params = vec![0u8; info.param_size as usize];
        params[..orig.len()].copy_from_slice(&orig);
        let n = info.params.len();
        let off = |k: usize| info.params[n - 4 + k].offset as usize;
        params[off(0)..off(0) + 8].copy_from_slice(&flag.to_le_bytes());
        params[off(1)..off(1) + 8].copy_from_slice(&save.to_le_bytes());
        params[off(3)..off(3) + 4].copy_from_slice(&l.shared_bytes.to_le_bytes());
        let bytes = plan.save_area_bytes(l.grid, l.block, l.shared_bytes) as usize;
        assert!(p.mem.write(save, &vec![0u8; bytes]));
        let threads = l.threads();
        // Point each thread was resumed from in the current round (0: started fresh).
        let mut from = vec![0u32; threads as usize];
        let mut resume = 0u32;
        let mut rounds = 0u64;
        // Status words before the round (all done before a fresh launch).
        let mut before = vec![0u32; threads as usize];
        loop {
            rounds += 1;
            if rounds > preempt_rounds + 4 {
                return Err(format!("{}: not done after {rounds} rounds", inst.workload));
            }
            assert!(p.mem.write(flag, &0u32.to_le_bytes()));
            params[off(2)..off(2) + 4].copy_from_slice(&resume.to_le_bytes());
            let cfg = LaunchConfig {
                grid: l.grid,
                block: l.block,
                dynamic_shared: l.shared_bytes,
                params: params.clone(),
            };
            let mut launch = Launch::new(module.clone(), l.entry, cfg, &Limits::default())
                .map_err(|e| e.to_string())?;
            let mut ctl = RunControl::new(workers);
            if let Some(r) = rng.as_deref_mut()
                && rounds <= preempt_rounds
            {
                ctl.step_limit = Some(1 + r.below(warp_instrs));
            }
            loop {
                match launch.run(&p.mem, &ctl) {
                    RunOutcome::Completed(s) => {
                        add(&mut run.stats, &s);
                        break;
                    }
                    RunOutcome::Preempted(s) => {
                        add(&mut run.stats, &s);
                        assert!(p.mem.write(flag, &1u32.to_le_bytes()));
                        run.flags_raised += 1;
                        ctl.step_limit = None;
                    }
                    RunOutcome::Faulted(f) => return Err(format!("{}: {f}", inst.workload)),
                }
            }
            let mut pending = 0u64;
            for g in 0..threads {
                let st = p
                    .mem
                    .read_u32s(save + g * u64::from(plan.record_bytes), 1)
                    .ok_or("record outside memory")?[0];
                if mirror {
                    let at = mirror_at + 4 * g;
                    let m = p.mem.read_u32s(at, 1).ok_or("mirror outside memory")?[0];
                    // Stored this round: every record not done before a resumed round, and
                    // every record a round leaves not done.
                    let stored = st != 0 || (resume == 1 && before[g as usize] != 0);
                    match (stored, m) {
                        (true, m) if m == st | ptx::ckpt::MIRROR_MARK => run.mirror_words += 1,
                        (false, 0) => {}
                        (_, m) => {
                            return Err(format!(
                                "{}: thread {g}: mirror {m:#x}, record {st} (before {})",
                                inst.workload, before[g as usize]
                            ));
                        }
                    }
                    assert!(p.mem.write(at, &0u32.to_le_bytes()));
                    before[g as usize] = st;
                }
                if st != 0 {
                    pending += 1;
                }
                if st >= 3 {
                    run.saved_threads += 1;
                    let at = st - 2;
                    run.full_bytes += u64::from(plan.full_bytes(at));
                    run.incremental_bytes +=
                        u64::from(plan.incremental_bytes(from[g as usize], at));
                    from[g as usize] = at;
                } else {
                    from[g as usize] = 0;
                }
            }
            if pending == 0 {
                break;
            }
            resume = 1;
            run.relaunches += 1;
        }
    }
    run.outs = buffers(inst, &p);
    Ok(run)
}
