//! Code generation: the transformed entry body (prologue, polls at the points, the save,
//! "never started" and resume paths, the completion path) as statements of the parser's IR,
//! and the entry's new parameters and registers. The contract it implements is in
//! `docs/ptx-subset.md`, "Preemptible kernels".

use std::collections::HashMap;

use super::flow::Regs;
use super::layout::Layout;
use super::module::StmtEntry;
use super::points::{Class, Site};
use crate::decode::{ROp, RawInst, Stmt, VarDecl};
use crate::error::Pos;
use crate::ir::Ty;
use crate::module::ParamInfo;

/// Names of the parameters appended to every transformed entry, in order.
pub const PARAMS: [&str; 4] = ["__ck_flag", "__ck_save", "__ck_resume", "__ck_dyn_smem"];

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
    ("%__ck_from", Ty::U32),
    ("%__ck_pt", Ty::U32),
    ("%__ck_f", Ty::U32),
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
}

struct Gen {
    out: Vec<Stmt>,
    pos: Pos,
    labels: u32,
}

fn r(n: &str) -> ROp {
    ROp::Name(n.to_string(), Pos::default())
}

fn imm(v: u64) -> ROp {
    ROp::Int(v)
}

fn at(base: &str, off: i64) -> ROp {
    ROp::Addr {
        base: Some(base.to_string()),
        off,
        pos: Pos::default(),
    }
}

impl Gen {
    fn i(&mut self, op: &str, ops: Vec<ROp>) {
        self.out.push(Stmt::Inst(RawInst {
            pos: self.pos,
            guard: None,
            opcode: op.to_string(),
            ops,
        }));
    }

    fn g(&mut self, guard: &str, neg: bool, op: &str, ops: Vec<ROp>) {
        self.out.push(Stmt::Inst(RawInst {
            pos: self.pos,
            guard: Some((guard.to_string(), neg, Pos::default())),
            opcode: op.to_string(),
            ops,
        }));
    }

    fn label(&mut self, l: &str) {
        self.out.push(Stmt::Label(l.to_string(), self.pos));
    }

    fn fresh(&mut self) -> String {
        self.labels += 1;
        format!("$__ck_L{}", self.labels)
    }

    /// `%__ck_tl`, `%__ck_nt`, `%__ck_cl`: linear thread id, threads per CTA, linear CTA id.
    fn ids(&mut self) {
        self.i("mov.u32", vec![r("%__ck_t"), r("%tid.z")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%ntid.y")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_tl"), r("%__ck_t"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%tid.y")]);
        self.i("add.u32", vec![r("%__ck_tl"), r("%__ck_tl"), r("%__ck_t")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%ntid.x")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_tl"), r("%__ck_tl"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%tid.x")]);
        self.i("add.u32", vec![r("%__ck_tl"), r("%__ck_tl"), r("%__ck_t")]);
        self.i("mov.u32", vec![r("%__ck_nt"), r("%ntid.x")]);
        self.i("mov.u32", vec![r("%__ck_t"), r("%ntid.y")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_nt"), r("%__ck_nt"), r("%__ck_t")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ntid.z")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_nt"), r("%__ck_nt"), r("%__ck_t")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ctaid.z")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.y")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_cl"), r("%__ck_t"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ctaid.y")]);
        self.i("add.u32", vec![r("%__ck_cl"), r("%__ck_cl"), r("%__ck_t")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.x")]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_cl"), r("%__ck_cl"), r("%__ck_u")],
        );
        self.i("mov.u32", vec![r("%__ck_t"), r("%ctaid.x")]);
        self.i("add.u32", vec![r("%__ck_cl"), r("%__ck_cl"), r("%__ck_t")]);
    }

    /// `%__ck_rec` = save + (cl * nt + tl) * stride (after [`Gen::ids`]).
    fn record(&mut self, stride: u32) {
        self.i(
            "mul.wide.u32",
            vec![r("%__ck_w"), r("%__ck_cl"), r("%__ck_nt")],
        );
        self.i("cvt.u64.u32", vec![r("%__ck_rec"), r("%__ck_tl")]);
        self.i("add.u64", vec![r("%__ck_w"), r("%__ck_w"), r("%__ck_rec")]);
        self.i(
            "mul.lo.u64",
            vec![r("%__ck_w"), r("%__ck_w"), imm(u64::from(stride))],
        );
        self.i("ld.param.u64", vec![r("%__ck_rec"), at(PARAMS[1], 0)]);
        self.i(
            "add.u64",
            vec![r("%__ck_rec"), r("%__ck_rec"), r("%__ck_w")],
        );
    }

    /// `%__ck_sh` = the CTA's shared save block (after [`Gen::ids`]): after every thread
    /// record, `cl * (static + align8(dyn))`.
    fn shared_base(&mut self, stride: u32, sp: &SharedPlan) {
        self.i("mov.u32", vec![r("%__ck_t"), r("%nctaid.x")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.y")]);
        self.i("mul.lo.u32", vec![r("%__ck_t"), r("%__ck_t"), r("%__ck_u")]);
        self.i("mov.u32", vec![r("%__ck_u"), r("%nctaid.z")]);
        self.i("mul.lo.u32", vec![r("%__ck_t"), r("%__ck_t"), r("%__ck_u")]);
        self.i(
            "mul.wide.u32",
            vec![r("%__ck_w"), r("%__ck_t"), r("%__ck_nt")],
        );
        self.i(
            "mul.lo.u64",
            vec![r("%__ck_w"), r("%__ck_w"), imm(u64::from(stride))],
        );
        self.i("ld.param.u64", vec![r("%__ck_sh"), at(PARAMS[1], 0)]);
        self.i("add.u64", vec![r("%__ck_sh"), r("%__ck_sh"), r("%__ck_w")]);
        self.i("ld.param.u32", vec![r("%__ck_dyn"), at(PARAMS[3], 0)]);
        self.i("add.u32", vec![r("%__ck_u"), r("%__ck_dyn"), imm(7)]);
        self.i(
            "and.b32",
            vec![r("%__ck_u"), r("%__ck_u"), imm(!7u64 & 0xFFFF_FFFF)],
        );
        self.i(
            "add.u32",
            vec![r("%__ck_u"), r("%__ck_u"), imm(u64::from(sp.static_bytes))],
        );
        self.i(
            "mul.wide.u32",
            vec![r("%__ck_w"), r("%__ck_cl"), r("%__ck_u")],
        );
        self.i("add.u64", vec![r("%__ck_sh"), r("%__ck_sh"), r("%__ck_w")]);
    }

    /// Cooperative copy of one shared variable to (`save`) or from its save block slot.
    fn copy_var(&mut self, var: &str, off: u32, size: Option<u64>, w: u32, save: bool) {
        let (lp, end) = (self.fresh(), self.fresh());
        let (ty, wimm) = if w == 4 { ("b32", 4) } else { ("u8", 1) };
        self.i("mul.lo.u32", vec![r("%__ck_i"), r("%__ck_tl"), imm(wimm)]);
        self.i(
            "mul.lo.u32",
            vec![r("%__ck_step"), r("%__ck_nt"), imm(wimm)],
        );
        self.label(&lp);
        let limit = size.map_or(r("%__ck_dyn"), imm);
        self.i("setp.ge.u32", vec![r("%__ck_q"), r("%__ck_i"), limit]);
        self.g("%__ck_q", false, "bra", vec![r(&end)]);
        self.i("mov.u32", vec![r("%__ck_a"), r(var)]);
        self.i("add.u32", vec![r("%__ck_a"), r("%__ck_a"), r("%__ck_i")]);
        self.i("cvt.u64.u32", vec![r("%__ck_w"), r("%__ck_i")]);
        self.i("add.u64", vec![r("%__ck_w"), r("%__ck_w"), r("%__ck_sh")]);
        if save {
            self.i(
                &format!("ld.shared.{ty}"),
                vec![r("%__ck_t"), at("%__ck_a", 0)],
            );
            self.i(
                &format!("st.global.{ty}"),
                vec![at("%__ck_w", i64::from(off)), r("%__ck_t")],
            );
        } else {
            self.i(
                &format!("ld.global.{ty}"),
                vec![r("%__ck_t"), at("%__ck_w", i64::from(off))],
            );
            self.i(
                &format!("st.shared.{ty}"),
                vec![at("%__ck_a", 0), r("%__ck_t")],
            );
        }
        self.i("add.u32", vec![r("%__ck_i"), r("%__ck_i"), r("%__ck_step")]);
        self.i("bra", vec![r(&lp)]);
        self.label(&end);
    }

    fn copy_shared(&mut self, sp: &SharedPlan, save: bool) {
        for (name, off, size, w) in &sp.statics {
            self.copy_var(name, *off, Some(*size), *w, save);
        }
        if let Some(d) = &sp.dynamic {
            self.copy_var(d, sp.static_bytes, None, 1, save);
        }
    }

    /// Copy the thread's local variables to (`save`) or from the record.
    fn copy_locals(&mut self, layout: &Layout, save: bool) {
        for (name, off, size, w) in &layout.locals {
            let ty = if *w == 4 { "b32" } else { "u8" };
            for o in (0..*size).step_by(*w as usize) {
                let rec = at("%__ck_rec", i64::from(off + o));
                let var = ROp::Addr {
                    base: Some(name.clone()),
                    off: i64::from(o),
                    pos: Pos::default(),
                };
                if save {
                    self.i(&format!("ld.local.{ty}"), vec![r("%__ck_t"), var]);
                    self.i(&format!("st.global.{ty}"), vec![rec, r("%__ck_t")]);
                } else {
                    self.i(&format!("ld.global.{ty}"), vec![r("%__ck_t"), rec]);
                    self.i(&format!("st.local.{ty}"), vec![var, r("%__ck_t")]);
                }
            }
        }
    }

    fn store_reg(&mut self, regs: &Regs, reg: u32, off: u32) {
        let name = regs.names[reg as usize].as_str();
        let t = regs.tys[reg as usize];
        if t == Ty::Pred {
            self.i("selp.u32", vec![r("%__ck_t"), imm(1), imm(0), r(name)]);
            self.i(
                "st.global.u8",
                vec![at("%__ck_rec", i64::from(off)), r("%__ck_t")],
            );
        } else {
            let op = format!("st.global.b{}", t.bits());
            self.i(&op, vec![at("%__ck_rec", i64::from(off)), r(name)]);
        }
    }

    fn load_reg(&mut self, regs: &Regs, reg: u32, off: u32) {
        let name = regs.names[reg as usize].as_str();
        let t = regs.tys[reg as usize];
        if t == Ty::Pred {
            self.i(
                "ld.global.u8",
                vec![r("%__ck_t"), at("%__ck_rec", i64::from(off))],
            );
            self.i("setp.ne.u32", vec![r(name), r("%__ck_t"), imm(0)]);
        } else {
            let op = format!("ld.global.b{}", t.bits());
            self.i(&op, vec![r(name), at("%__ck_rec", i64::from(off))]);
        }
    }

    /// Read the flag and decide (per thread, warp or CTA) into `%__ck_p`.
    fn poll(&mut self, class: Class, mask: Option<ROp>) {
        self.i(
            "ld.volatile.global.u32",
            vec![r("%__ck_f"), at("%__ck_flagp", 0)],
        );
        self.decide(class, mask);
    }

    /// Decide on `%__ck_f != 0` (per thread, warp or CTA) into `%__ck_p`. `arg` is the
    /// member mask of a warp decision, or the reduction opcode of a CTA decision.
    fn decide(&mut self, class: Class, arg: Option<ROp>) {
        let mask = arg;
        self.i("setp.ne.u32", vec![r("%__ck_p"), r("%__ck_f"), imm(0)]);
        match class {
            Class::Thread => {}
            Class::Cta => {
                // `barrier.sync` without `.aligned` may run in divergent warps: keep its form.
                let op = match mask {
                    Some(ROp::Name(op, _)) => op,
                    _ => "bar.red.or.pred".to_string(),
                };
                self.i(&op, vec![r("%__ck_p"), imm(0), r("%__ck_p")]);
            }
            Class::Warp => {
                let m = match mask {
                    Some(m) => m,
                    None => {
                        self.i("activemask.b32", vec![r("%__ck_m")]);
                        r("%__ck_m")
                    }
                };
                self.i("vote.sync.any.pred", vec![r("%__ck_p"), r("%__ck_p"), m]);
            }
        }
    }
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
    for (n, t) in REGS {
        d.regs.insert((*n).to_string(), *t);
    }
    let site_at: HashMap<usize, usize> = plan
        .sites
        .iter()
        .enumerate()
        .map(|(k, s)| (s.node, k))
        .collect();
    let body = std::mem::take(&mut e.body);
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
            let arg = match plan.class {
                Class::Cta => {
                    let non_aligned = super::flow::base(&i.opcode) == "barrier"
                        && !i.opcode.split('.').any(|m| m == "aligned");
                    non_aligned.then(|| r("barrier.red.or.pred"))
                }
                _ => masks.get(&k).cloned(),
            };
            // Software-pipelined poll: decide on the flag value loaded at the previous point
            // (or the prologue), then load it again for the next one, so no instruction
            // waits for the load. A resumed thread enters after the decision and loads.
            g.decide(plan.class, arg);
            g.g(
                "%__ck_p",
                false,
                "bra",
                vec![r(&format!("$__ck_save{}", pid(sk)))],
            );
            g.label(&format!("$__ck_at{}", pid(sk)));
            g.i(
                "ld.volatile.global.u32",
                vec![r("%__ck_f"), at("%__ck_flagp", 0)],
            );
            if plan.class == Class::Cta {
                // The barrier is the bar.red of the poll.
                continue;
            }
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
    g.i("ret", vec![]);
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
    g.i("ret", vec![]);
    // Save paths: each point records its id, then the common part.
    for k in 0..plan.sites.len() {
        g.label(&format!("$__ck_save{}", pid(k)));
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
        g.i("bra", vec![r(&format!("$__ck_at{}", pid(k)))]);
    }
    e.body = g.out;
}
