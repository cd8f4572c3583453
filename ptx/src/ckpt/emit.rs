//! Code generation: the transformed entry body (prologue, polls at the points, the save,
//! "never started" and resume paths, the completion path) as statements of the parser's IR,
//! and the entry's new parameters and registers. The contract it implements is in
//! `docs/ptx-subset.md`, "Preemptible kernels".

use std::collections::HashMap;

use super::build::{Gen, at, imm, r};
use super::flow::Regs;
use super::layout::Layout;
use super::module::StmtEntry;
use super::points::{Class, Site};
use crate::decode::{ROp, RawInst, Stmt, VarDecl};
use crate::ir::Ty;
use crate::module::ParamInfo;

/// Names of the parameters appended to every transformed entry, in order.
pub const PARAMS: [&str; 4] = ["__ck_flag", "__ck_save", "__ck_resume", "__ck_dyn_smem"];

/// Offset from `__ck_flag` of the status mirror's address (a `u64`; 0: no mirror). Where it
/// is not 0, every status word a thread stores in its record is also stored, with
/// [`MIRROR_MARK`] set, at `mirror + 4 * g` (`g` the thread's linear index in the grid): the
/// host reads a preempted launch's statuses from there (host-pinned memory) without a copy.
pub const MIRROR_OFF: i64 = 8;
/// Set in every status word stored in the mirror (a 0 word: not stored by this launch).
pub const MIRROR_MARK: u32 = 0x8000_0000;

/// Status word values of a record (point `k` >= 1 is stored as `k + 2`).
pub const STATUS_DONE: u32 = 0;
/// The thread exited at the entry point without doing any work.
pub const STATUS_NOT_STARTED: u32 = 1;

/// `%__ck_from` of a thread that started from the beginning.
const FROM_FRESH: u64 = 0xFFFF_FFFF;
/// `%__ck_from` of a thread restarted from the beginning by a resume launch.
const FROM_RESTART: u64 = 0xFFFF_FFFE;

/// The registers the transformation adds.
const REGS: &[(&str, Ty)] = &[
    ("%__ck_flagp", Ty::U64),
    ("%__ck_rec", Ty::U64),
    ("%__ck_w", Ty::U64),
    ("%__ck_sh", Ty::U64),
    ("%__ck_mv", Ty::U64),
    ("%__ck_mw", Ty::U64),
    ("%__ck_from", Ty::U32),
    ("%__ck_pt", Ty::U32),
    ("%__ck_f", Ty::U32),
    ("%__ck_n", Ty::U32),
    ("%__ck_t", Ty::U32),
    ("%__ck_u", Ty::U32),
    ("%__ck_tl", Ty::U32),
    ("%__ck_nt", Ty::U32),
    ("%__ck_cl", Ty::U32),
    ("%__ck_i", Ty::U32),
    ("%__ck_a", Ty::U32),
    ("%__ck_step", Ty::U32),
    ("%__ck_dyn", Ty::U32),
    ("%__ck_m", Ty::B32),
    ("%__ck_p", Ty::Pred),
    ("%__ck_q", Ty::Pred),
];

/// Shared variables the CTA saves, with their offsets in the CTA's shared save block.
pub(crate) struct SharedPlan {
    /// (name, offset in the block, size, copy width 4 or 1).
    pub statics: Vec<(String, u32, u64, u32)>,
    /// Bytes of the static part (multiple of 8).
    pub static_bytes: u32,
    /// The dynamic (`.extern`) area's variable name, if any.
    pub dynamic: Option<String>,
}

impl SharedPlan {
    pub(crate) fn new(module_shared: &[VarDecl], entry_shared: &[VarDecl]) -> SharedPlan {
        let mut off = 0u64;
        let mut statics = Vec::new();
        let mut dynamic = None;
        for v in module_shared.iter().chain(entry_shared) {
            if v.is_extern {
                dynamic.get_or_insert_with(|| v.name.clone());
                continue;
            }
            off = off.next_multiple_of(8);
            let w = if v.size % 4 == 0 && v.align % 4 == 0 {
                4
            } else {
                1
            };
            statics.push((v.name.clone(), off as u32, v.size, w));
            off += v.size;
        }
        SharedPlan {
            statics,
            static_bytes: off.next_multiple_of(8) as u32,
            dynamic,
        }
    }
}

/// Everything code generation needs about one entry.
pub(crate) struct Plan<'a> {
    pub class: Class,
    pub sites: &'a [Site],
    /// Live registers at each site (sorted).
    pub lives: &'a [Vec<u32>],
    /// `stores[r][p]`: registers to store at `p` for a thread resumed from `r`.
    pub stores: &'a [Vec<Vec<u32>>],
    pub layout: &'a Layout,
    pub regs: &'a Regs,
    pub shared: Option<&'a SharedPlan>,
    /// Points crossed per flag load (1: load at every point, software-pipelined).
    pub poll_interval: u32,
    /// Per site: the strip-mining of the loop it heads (polled at every crossing).
    pub strips: &'a [Option<super::strip::Strip>],
    /// Stopped threads save nothing and are rerun from the start (status "not started").
    pub restart: bool,
    /// Constant-trip copies of whole chunks (`fast.rs`).
    pub fast_chunks: bool,
}

/// Puts point `n`'s constant-trip copy before its clamped chunk (emitted from `at` to the
/// end of the output, ending in the inner back branch), and the label of the loop's test
/// after it; leaves the loop as it is when the copy does not apply.
fn insert_fast(g: &mut Gen, st: &super::strip::Strip, n: u64, at: usize, pos: crate::error::Pos) {
    let inner = format!("$__ck_in{n}");
    let Some(body) = g.out[at..]
        .iter()
        .position(|s| matches!(s, Stmt::Label(l, _) if *l == inner))
        .map(|p| at + p + 1)
    else {
        return;
    };
    let Some(copy) = super::fast::copy(st, n, &g.out[body..], pos) else {
        return;
    };
    let mut ins = super::fast::head(st, n, pos);
    ins.extend(copy);
    ins.push(Stmt::Label(super::fast::slow_label(n), pos));
    g.out.splice(at..at, ins);
    g.label(&super::fast::test_label(n));
}

/// Point id of site `k` (the entry point is 0).
fn pid(k: usize) -> u64 {
    k as u64 + 1
}

/// Rewrite `e` (in place): parameters, registers and body.
pub(crate) fn rewrite(e: &mut StmtEntry, plan: &Plan) {
    // Masks of warp points, from the original body.
    let mut masks: HashMap<usize, ROp> = HashMap::new();
    if plan.class == Class::Warp {
        let insts = e.body.iter().filter_map(|s| match s {
            Stmt::Inst(i) => Some(i),
            Stmt::Label(..) => None,
        });
        for (k, i) in insts.enumerate() {
            if let Some(m) = super::points::warp_site_mask(e, i) {
                masks.insert(k, m.clone());
            }
        }
    }
    let d = &mut e.decls;
    // Parameters.
    for (k, name) in PARAMS.iter().enumerate() {
        let (size, align) = if k < 2 { (8u32, 8u32) } else { (4, 4) };
        let off = d.param_size.next_multiple_of(align);
        d.params.push(ParamInfo {
            name: (*name).to_string(),
            offset: off,
            size,
            align,
        });
        d.param_size = off + size;
    }
    for (n, t) in REGS.iter().chain(&super::strip::REGS) {
        d.regs.insert((*n).to_string(), *t);
    }
    // Strip-mined loops: the compare and back branch of each, by node.
    let mut strip_at: HashMap<usize, (usize, &super::strip::Strip)> = HashMap::new();
    for (k, s) in plan.strips.iter().enumerate() {
        if let Some(s) = s {
            strip_at.insert(s.setp, (k, s));
            strip_at.insert(s.back, (k, s));
        }
    }
    let site_at: HashMap<usize, usize> = plan
        .sites
        .iter()
        .enumerate()
        .map(|(k, s)| (s.node, k))
        .collect();
    let body = std::mem::take(&mut e.body);
    // The original compares of strip-mined loops (re-run after each inner loop).
    let setps: HashMap<usize, Stmt> = {
        let insts: Vec<&Stmt> = body.iter().filter(|s| matches!(s, Stmt::Inst(_))).collect();
        plan.strips
            .iter()
            .flatten()
            .filter_map(|st| insts.get(st.setp).map(|s| (st.setp, (*s).clone())))
            .collect()
    };
    let mut g = Gen {
        out: Vec::with_capacity(body.len() * 2),
        pos: d.pos,
        labels: 0,
    };
    let stride = plan.layout.stride;
    // Prologue: one test covers both a resume launch and a raised flag (the slow path
    // below tells them apart).
    g.i("ld.param.u64", vec![r("%__ck_flagp"), at(PARAMS[0], 0)]);
    g.i("mov.u32", vec![r("%__ck_from"), imm(FROM_FRESH)]);
    if plan.poll_interval > 1 {
        g.i(
            "mov.u32",
            vec![r("%__ck_n"), imm(u64::from(plan.poll_interval))],
        );
    }
    g.i(
        "ld.volatile.global.u32",
        vec![r("%__ck_f"), at("%__ck_flagp", 0)],
    );
    g.i("ld.param.u32", vec![r("%__ck_t"), at(PARAMS[2], 0)]);
    g.i("or.b32", vec![r("%__ck_f"), r("%__ck_f"), r("%__ck_t")]);
    g.decide(plan.class, None);
    g.g("%__ck_p", false, "bra", vec![r("$__ck_slow")]);
    g.label("$__ck_body");
    // Body.
    let mut node = 0usize;
    let mut checks = Vec::new();
    // Where each strip-mined point's chunk code starts in the output.
    let mut fast_at: HashMap<usize, usize> = HashMap::new();
    let last = body
        .iter()
        .rposition(|s| matches!(s, Stmt::Inst(_)))
        .map(|p| {
            body[..p]
                .iter()
                .filter(|s| matches!(s, Stmt::Inst(_)))
                .count()
        });
    let last = last.filter(|_| matches!(body.last(), Some(Stmt::Inst(_))));
    for s in body {
        let Stmt::Inst(i) = s else {
            g.out.push(s);
            continue;
        };
        g.pos = i.pos;
        let k = node;
        node += 1;
        if let Some(&sk) = site_at.get(&k) {
            // Resumed threads (and flag checks done out of line) come back before the poll,
            // at the same program point as the original labels here: a loop is never entered
            // past its header's poll (no irreducible loop when the point is the header).
            g.label(&format!("$__ck_at{}", pid(sk)));
            let strip = plan.strips.get(sk).and_then(Option::as_ref);
            let arg = match plan.class {
                Class::Cta => {
                    // A barrier added at a strip-mined loop's header takes the non-aligned
                    // form (the loop's own barriers may be `barrier.sync`).
                    let non_aligned = strip.is_some()
                        || (super::flow::base(&i.opcode) == "barrier"
                            && !i.opcode.split('.').any(|m| m == "aligned"));
                    non_aligned.then(|| r("barrier.red.or.pred"))
                }
                _ => masks.get(&k).cloned(),
            };
            if plan.poll_interval <= 1 || strip.is_some() {
                // Software-pipelined poll: decide on the flag value loaded at the previous
                // point (or the prologue), then load it again for the next one, so no
                // instruction waits for the load (a resumed thread enters with it 0).
                g.decide(plan.class, arg);
                g.g(
                    "%__ck_p",
                    false,
                    "bra",
                    vec![r(&format!("$__ck_save{}", pid(sk)))],
                );
                g.i(
                    "ld.volatile.global.u32",
                    vec![r("%__ck_f"), at("%__ck_flagp", 0)],
                );
            } else {
                // Count the points down; every `poll_interval`-th one checks the flag out of
                // line (with the same warp or CTA agreement, on the count reaching zero).
                g.i("sub.u32", vec![r("%__ck_n"), r("%__ck_n"), imm(1)]);
                g.i("setp.eq.u32", vec![r("%__ck_p"), r("%__ck_n"), imm(0)]);
                g.agree(plan.class, arg.clone());
                g.g(
                    "%__ck_p",
                    false,
                    "bra",
                    vec![r(&format!("$__ck_chk{}", pid(sk)))],
                );
                checks.push((sk, arg));
            }
            if plan.class == Class::Cta && strip.is_none() {
                // The barrier is the bar.red of the poll.
                continue;
            }
            if let Some(st) = strip {
                // The chunk's bound, then the inner loop (the original with that bound); a
                // constant-trip copy goes before them once the loop is emitted (`fast`).
                fast_at.insert(sk, g.out.len());
                g.out.extend(st.lim(i.pos));
                g.label(&format!("$__ck_in{}", pid(sk)));
            }
        }
        if let Some(&(sk, st)) = strip_at.get(&k) {
            if k == st.setp {
                g.out.push(Stmt::Inst(st.inner_test(&i)));
                continue;
            }
            // The back branch: round the inner loop while the chunk lasts, then the
            // original test and branch (back to the point).
            let guard = i.guard.as_ref().map(|(p, _, pos)| (p.clone(), false, *pos));
            g.out.push(Stmt::Inst(RawInst {
                pos: i.pos,
                guard,
                opcode: "bra".into(),
                ops: vec![r(&format!("$__ck_in{}", pid(sk)))],
            }));
            if let Some(at) = fast_at.remove(&sk).filter(|_| st.fast && plan.fast_chunks) {
                insert_fast(&mut g, st, pid(sk), at, i.pos);
            }
            if let Stmt::Inst(orig) = &setps[&st.setp] {
                g.out.push(Stmt::Inst(orig.clone()));
            }
            g.out.push(Stmt::Inst(i));
            continue;
        }
        if matches!(super::flow::base(&i.opcode), "ret" | "exit") {
            if i.guard.is_none() && last == Some(k) {
                // Falls into the completion path.
                continue;
            }
            g.out.push(Stmt::Inst(RawInst {
                opcode: "bra".into(),
                ops: vec![r("$__ck_done")],
                ..i
            }));
            continue;
        }
        g.out.push(Stmt::Inst(i));
    }
    g.pos = d.pos;
    // Completion: a resumed (or restarted) thread marks its record done.
    g.label("$__ck_done");
    g.i(
        "setp.eq.u32",
        vec![r("%__ck_p"), r("%__ck_from"), imm(FROM_FRESH)],
    );
    g.g("%__ck_p", false, "ret", vec![]);
    g.i("mov.u32", vec![r("%__ck_t"), imm(u64::from(STATUS_DONE))]);
    g.i("st.global.u32", vec![at("%__ck_rec", 0), r("%__ck_t")]);
    g.mirror(Some(STATUS_DONE));
    g.i("ret", vec![]);
    // Out-of-line flag checks of counted points.
    for (sk, arg) in checks {
        g.label(&format!("$__ck_chk{}", pid(sk)));
        g.i(
            "mov.u32",
            vec![r("%__ck_n"), imm(u64::from(plan.poll_interval))],
        );
        g.poll(plan.class, arg);
        g.g(
            "%__ck_p",
            false,
            "bra",
            vec![r(&format!("$__ck_save{}", pid(sk)))],
        );
        g.i("bra", vec![r(&format!("$__ck_at{}", pid(sk)))]);
    }
    // Slow path of the prologue: a resume launch, or the flag raised before the start.
    g.label("$__ck_slow");
    g.i("ld.param.u32", vec![r("%__ck_t"), at(PARAMS[2], 0)]);
    g.i("setp.ne.u32", vec![r("%__ck_q"), r("%__ck_t"), imm(0)]);
    g.g("%__ck_q", false, "bra", vec![r("$__ck_resume")]);
    g.i("bra", vec![r("$__ck_never")]);
    // A thread restarted by a resume launch polls like a fresh one.
    g.label("$__ck_start");
    g.poll(plan.class, None);
    g.g("%__ck_p", false, "bra", vec![r("$__ck_never")]);
    g.i("bra", vec![r("$__ck_body")]);
    // Exit at the entry point: nothing done, nothing saved.
    g.label("$__ck_never");
    g.ids();
    g.record(stride);
    g.i(
        "mov.u32",
        vec![r("%__ck_t"), imm(u64::from(STATUS_NOT_STARTED))],
    );
    g.i("st.global.u32", vec![at("%__ck_rec", 0), r("%__ck_t")]);
    g.mirror(Some(STATUS_NOT_STARTED));
    g.i("ret", vec![]);
    // Save paths: each point records its id, then the common part.
    for k in 0..plan.sites.len() {
        g.label(&format!("$__ck_save{}", pid(k)));
        if plan.restart {
            // Restart: the thread stops as if it had never started.
            g.i("bra", vec![r("$__ck_never")]);
            continue;
        }
        g.i("mov.u32", vec![r("%__ck_pt"), imm(pid(k))]);
        g.i("bra", vec![r("$__ck_save")]);
    }
    g.label("$__ck_save");
    g.ids();
    g.record(stride);
    g.copy_locals(plan.layout, true);
    if let Some(sp) = plan.shared {
        g.shared_base(stride, sp);
        g.copy_shared(sp, true);
    }
    for k in 0..plan.sites.len() {
        g.i(
            "setp.eq.u32",
            vec![r("%__ck_q"), r("%__ck_pt"), imm(pid(k))],
        );
        g.g(
            "%__ck_q",
            false,
            "bra",
            vec![r(&format!("$__ck_store{}", pid(k)))],
        );
    }
    g.i("trap", vec![]);
    for (k, live) in plan.lives.iter().enumerate() {
        let done = format!("$__ck_stored{}", pid(k));
        g.label(&format!("$__ck_store{}", pid(k)));
        // Incremental variants: a thread resumed from point `rp` skips still-valid copies.
        let mut variants = Vec::new();
        for (rp, st) in plan.stores.iter().enumerate() {
            if st[k].len() < live.len() {
                let l = format!("$__ck_store{}_from{}", pid(k), pid(rp));
                g.i(
                    "setp.eq.u32",
                    vec![r("%__ck_q"), r("%__ck_from"), imm(pid(rp))],
                );
                g.g("%__ck_q", false, "bra", vec![r(&l)]);
                variants.push((l, &st[k]));
            }
        }
        for &reg in live {
            g.store_reg(plan.regs, reg, plan.layout.slot[&reg]);
        }
        g.i("bra", vec![r(&done)]);
        for (l, set) in variants {
            g.label(&l);
            for &reg in set {
                g.store_reg(plan.regs, reg, plan.layout.slot[&reg]);
            }
            g.i("bra", vec![r(&done)]);
        }
        g.label(&done);
        g.i("add.u32", vec![r("%__ck_t"), r("%__ck_pt"), imm(2)]);
        g.i("st.global.u32", vec![at("%__ck_rec", 0), r("%__ck_t")]);
        g.mirror(None);
        g.i("ret", vec![]);
    }
    // Resume: read the record, then restart, return, or restore and jump to the point.
    g.label("$__ck_resume");
    g.ids();
    g.record(stride);
    g.i("ld.global.u32", vec![r("%__ck_pt"), at("%__ck_rec", 0)]);
    g.i(
        "setp.eq.u32",
        vec![r("%__ck_q"), r("%__ck_pt"), imm(u64::from(STATUS_DONE))],
    );
    g.g("%__ck_q", false, "ret", vec![]);
    g.i("mov.u32", vec![r("%__ck_from"), imm(FROM_RESTART)]);
    g.i(
        "setp.eq.u32",
        vec![
            r("%__ck_q"),
            r("%__ck_pt"),
            imm(u64::from(STATUS_NOT_STARTED)),
        ],
    );
    g.g("%__ck_q", false, "bra", vec![r("$__ck_start")]);
    g.copy_locals(plan.layout, false);
    if let Some(sp) = plan.shared {
        g.shared_base(stride, sp);
        g.copy_shared(sp, false);
        g.i("bar.sync", vec![imm(0)]);
    }
    for k in 0..plan.sites.len() {
        g.i(
            "setp.eq.u32",
            vec![r("%__ck_q"), r("%__ck_pt"), imm(pid(k) + 2)],
        );
        g.g(
            "%__ck_q",
            false,
            "bra",
            vec![r(&format!("$__ck_restore{}", pid(k)))],
        );
    }
    g.i("trap", vec![]);
    for (k, live) in plan.lives.iter().enumerate() {
        g.label(&format!("$__ck_restore{}", pid(k)));
        for &reg in live {
            g.load_reg(plan.regs, reg, plan.layout.slot[&reg]);
        }
        g.i("mov.u32", vec![r("%__ck_from"), imm(pid(k))]);
        g.i("mov.u32", vec![r("%__ck_f"), imm(0)]);
        g.i(
            "mov.u32",
            vec![r("%__ck_n"), imm(u64::from(plan.poll_interval.max(1)))],
        );
        g.i("bra", vec![r(&format!("$__ck_at{}", pid(k)))]);
    }
    e.body = g.out;
}
