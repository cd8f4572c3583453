//! Strip-mining of counted loops (one back branch, forward branches inside), so that a never-preempted kernel keeps its
//! tight loops as fast as the original: instead of counting every crossing of the loop's
//! point down (a second exit that stops `ptxas` from unrolling the loop, and three more
//! instructions per iteration), the point polls the flag once per *chunk* of `k` iterations
//! and the chunk runs as an inner loop that is the original loop with its bound clamped:
//!
//! ```text
//! L: <point: poll>                       L: <point: poll>
//!    body; add i, i, s                      lim = min(n, i + k*s)   (max for s < 0)
//!    setp.lt p, i, n           ==>       I: body; add i, i, s
//!    @p bra L                               setp.lt p, i, lim; @p bra I
//!                                           setp.lt p, i, n; @p bra L   (the original test)
//! ```
//!
//! The inner loop only ever exits early (its test implies the original's), and the original
//! test runs after it, so the loop does exactly what it did; the inner loop has one entry,
//! one exit and a bound in a register, which is what `ptxas` unrolls. Loops this does not
//! recognise keep the counted poll.

use super::flow::{Exit, Flow, Regs, base};
use super::module::StmtEntry;
use crate::decode::{ROp, RawInst, Stmt};
use crate::ir::Ty;

/// How the loop continues: `iv OP bound` after the increment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Ne,
    Eq,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "lt" | "lo" => Op::Lt,
            "le" | "ls" => Op::Le,
            "gt" | "hi" => Op::Gt,
            "ge" | "hs" => Op::Ge,
            "ne" => Op::Ne,
            "eq" => Op::Eq,
            _ => return None,
        })
    }

    /// `b OP' a` equivalent to `a OP b`.
    fn swapped(self) -> Op {
        match self {
            Op::Lt => Op::Gt,
            Op::Le => Op::Ge,
            Op::Gt => Op::Lt,
            Op::Ge => Op::Le,
            o => o,
        }
    }

    fn negated(self) -> Op {
        match self {
            Op::Lt => Op::Ge,
            Op::Le => Op::Gt,
            Op::Gt => Op::Le,
            Op::Ge => Op::Lt,
            Op::Ne => Op::Eq,
            Op::Eq => Op::Ne,
        }
    }
}

/// Longest loop (instructions) the strip-miner looks at.
const MAX_LOOP: usize = 4096;

/// A loop the emitter strip-mines (node indices of the entry's flow).
#[derive(Debug, Clone)]
pub(crate) struct Strip {
    /// The compare that decides whether the loop goes on.
    pub setp: usize,
    /// The back branch.
    pub back: usize,
    /// Iterations per chunk.
    pub chunk: u32,
    /// Induction register, bound (register or immediate), step.
    pub(crate) iv: String,
    pub(crate) bound: ROp,
    pub(crate) step: i64,
    /// Integer type of the compare: `s32`, `u32`, `s64` or `u64`.
    pub(crate) ty: &'static str,
    /// A `Thread` loop whose induction register is read only by its own step and the
    /// compare: whole chunks also run as a copy with a constant trip count (`fast`).
    pub(crate) fast: bool,
}

/// The clamped bound's register, by width.
pub(crate) fn lim_reg(wide: bool) -> &'static str {
    if wide { "%__ck_l64" } else { "%__ck_l32" }
}

/// Registers the strip-mined loops use (added to every transformed entry): the clamped
/// bounds and the trip counter of the constant-trip copies (`fast`).
pub(crate) const REGS: [(&str, Ty); 3] = [
    ("%__ck_l32", Ty::B32),
    ("%__ck_l64", Ty::B64),
    ("%__ck_k", Ty::U32),
];

impl Strip {
    pub(crate) fn wide(&self) -> bool {
        self.ty.ends_with("64")
    }

    /// The bound of the chunk, computed at the point from the induction register's value
    /// there: `lim = min(bound, iv + chunk*step)` (`max` and `-` for a negative step).
    pub(crate) fn lim(&self, pos: crate::error::Pos) -> Vec<Stmt> {
        let l = lim_reg(self.wide());
        let span = self.step.unsigned_abs() * u64::from(self.chunk);
        let (arith, clamp) = if self.step > 0 {
            ("add", "min")
        } else {
            ("sub", "max")
        };
        if self.step < 0 && self.ty.starts_with('u') {
            // Counting an unsigned register down (often to 0): `iv - span` must not wrap
            // below 0, or every chunk of the last `span` iterations would be one iteration.
            // lim = max(bound, iv - min(iv, span)).
            return vec![
                inst(
                    pos,
                    &format!("min.{}", self.ty),
                    vec![name(l), name(&self.iv), ROp::Int(span)],
                ),
                inst(
                    pos,
                    &format!("sub.{}", self.ty),
                    vec![name(l), name(&self.iv), name(l)],
                ),
                inst(
                    pos,
                    &format!("max.{}", self.ty),
                    vec![name(l), name(l), self.bound.clone()],
                ),
            ];
        }
        vec![
            inst(
                pos,
                &format!("{arith}.{}", self.ty),
                vec![name(l), name(&self.iv), ROp::Int(span)],
            ),
            inst(
                pos,
                &format!("{clamp}.{}", self.ty),
                vec![name(l), name(l), self.bound.clone()],
            ),
        ]
    }

    /// The inner loop's test, replacing the loop's compare (same destination predicate).
    pub(crate) fn inner_test(&self, setp: &RawInst) -> RawInst {
        let cmp = if self.step > 0 { "lt" } else { "gt" };
        RawInst {
            pos: setp.pos,
            guard: None,
            opcode: format!("setp.{cmp}.{}", self.ty),
            ops: vec![
                setp.ops[0].clone(),
                name(&self.iv),
                name(lim_reg(self.wide())),
            ],
        }
    }
}

fn name(n: &str) -> ROp {
    ROp::Name(n.to_string(), crate::error::Pos::default())
}

fn inst(pos: crate::error::Pos, op: &str, ops: Vec<ROp>) -> Stmt {
    Stmt::Inst(RawInst {
        pos,
        guard: None,
        opcode: op.to_string(),
        ops,
    })
}

fn node_inst<'a>(e: &'a StmtEntry, flow: &Flow, k: usize) -> &'a RawInst {
    match &e.body[flow.nodes[k].stmt] {
        Stmt::Inst(i) => i,
        Stmt::Label(..) => unreachable!("nodes index instructions"),
    }
}

fn reg_name(o: &ROp) -> Option<&str> {
    match o {
        ROp::Name(n, _) => Some(n),
        _ => None,
    }
}

/// Width in bits of an integer type suffix the strip-miner handles (`None` for others).
fn int_width(ty: &str) -> Option<(u32, bool)> {
    Some(match ty {
        "u32" | "b32" => (32, false),
        "s32" => (32, true),
        "u64" | "b64" => (64, false),
        "s64" => (64, true),
        _ => return None,
    })
}

/// The strip-mining of the loop whose first instruction is the point at `site`, if it is a
/// counted loop: instructions `site..=back` ending in a guarded branch back to `site`, with
/// only forward branches inside it, none leaving it and none from outside into it; its
/// predicate set once, by an unguarded
/// integer `setp` of the induction register against a loop-invariant bound; the induction
/// register set once before it, by `add`/`sub` of an immediate. `chunk_instructions` sets
/// the chunk: that many instructions of the loop per poll (at least 1 iteration), an atomic or
/// reduction counting as `atomic_weight`. `cta`:
/// the loop of a `Cta` kernel, which may hold barriers and must hold one on its spine (its
/// point moves to the header: the poll's `bar.red` there is one extra barrier per chunk).
pub(crate) fn find(
    e: &StmtEntry,
    flow: &Flow,
    regs: &Regs,
    site: usize,
    (chunk_instructions, atomic_weight): (u32, u32),
    cta: bool,
) -> Option<Strip> {
    // The loop: instructions `site..=back`, whose only backward branch is the back branch;
    // forward branches stay inside it and nothing outside branches into it.
    let n = flow.nodes.len();
    let mut back = None;
    let mut barriers = Vec::new();
    for k in site..n.min(site + MAX_LOOP) {
        let i = node_inst(e, flow, k);
        match base(&i.opcode) {
            "call" => return None,
            "bar" | "barrier" => {
                let plain = !i.opcode.split('.').any(|m| m == "red" || m == "warp");
                if !cta || !plain || i.guard.is_some() {
                    return None;
                }
                barriers.push(k);
            }
            _ => {}
        }
        match flow.nodes[k].exit {
            Exit::Next => {}
            Exit::Branch(t) if t == site && flow.nodes[k].guarded => {
                back = Some(k);
                break;
            }
            Exit::Branch(t) if t > k => {}
            _ => return None,
        }
    }
    let back = back?;
    let mut inner = Vec::new();
    for (k, nd) in flow.nodes.iter().enumerate() {
        let Exit::Branch(t) = nd.exit else { continue };
        let from_inside = (site..back).contains(&k);
        if from_inside && !(site < t && t <= back) {
            return None;
        }
        if !from_inside && k != back && site < t && t <= back {
            return None;
        }
        if from_inside {
            inner.push((k, t));
        }
    }
    // Whether instruction `k` runs on every iteration (no inner branch jumps over it).
    let every = |k: usize| inner.iter().all(|&(j, t)| j >= k || t <= k);
    let br = node_inst(e, flow, back);
    let (pred, neg, _) = br.guard.as_ref()?;
    let pred_ix = regs.get(pred)?;
    // The predicate: defined once in the loop, read only by the back branch.
    let mut setp = None;
    for k in site..back {
        let nd = &flow.nodes[k];
        if nd.uses.contains(&pred_ix) {
            return None;
        }
        if nd.defs.contains(&pred_ix) {
            if setp.is_some() {
                return None;
            }
            setp = Some(k);
        }
    }
    let setp = setp.filter(|&k| every(k))?;
    // A CTA loop runs the same iterations in every thread only if a barrier is on its spine:
    // then a barrier added at its header (the point's) is met by the whole CTA.
    if cta && !barriers.iter().any(|&k| every(k)) {
        return None;
    }
    let si = node_inst(e, flow, setp);
    let parts: Vec<&str> = si.opcode.split('.').collect();
    if si.guard.is_some() || parts.len() != 3 || parts[0] != "setp" || si.ops.len() != 3 {
        return None;
    }
    let (width, signed) = int_width(parts[2])?;
    let mut op = Op::parse(parts[1])?;
    let (a, b) = (&si.ops[1], &si.ops[2]);
    let defined_in_loop = |r: u32| (site..=back).any(|k| flow.nodes[k].defs.contains(&r));
    // Which operand is the induction register (defined in the loop); the other is the bound.
    let (iv, bound) = match (
        reg_name(a).and_then(|n| regs.get(n)),
        reg_name(b).and_then(|n| regs.get(n)),
    ) {
        (Some(x), y) if defined_in_loop(x) && y.is_none_or(|y| !defined_in_loop(y)) => (x, b),
        (x, Some(y)) if defined_in_loop(y) && x.is_none_or(|x| !defined_in_loop(x)) => {
            op = op.swapped();
            (y, a)
        }
        _ => return None,
    };
    if !matches!(bound, ROp::Name(..) | ROp::Int(_)) {
        return None;
    }
    if *neg {
        op = op.negated();
    }
    let iv_ty = regs.tys[iv as usize];
    if iv_ty.bits() != width {
        return None;
    }
    // The induction register: set once in the loop, before the compare, by add/sub of an
    // immediate.
    let defs: Vec<usize> = (site..=back)
        .filter(|&k| flow.nodes[k].defs.contains(&iv))
        .collect();
    let [d] = defs.as_slice() else { return None };
    if *d > setp || !every(*d) {
        return None;
    }
    let di = node_inst(e, flow, *d);
    let dp: Vec<&str> = di.opcode.split('.').collect();
    if di.guard.is_some() || dp.len() != 2 || di.ops.len() != 3 {
        return None;
    }
    let (w2, _) = int_width(dp[1])?;
    if w2 != width || reg_name(&di.ops[0]) != Some(&regs.names[iv as usize]) {
        return None;
    }
    let imm = match (&di.ops[1], &di.ops[2]) {
        (x, ROp::Int(v)) if reg_name(x) == Some(&regs.names[iv as usize]) => *v,
        (ROp::Int(v), x) if dp[0] == "add" && reg_name(x) == Some(&regs.names[iv as usize]) => *v,
        _ => return None,
    };
    let raw = if width == 32 {
        i64::from(imm as u32 as i32)
    } else {
        imm as i64
    };
    let step = match dp[0] {
        "add" => raw,
        "sub" => raw.checked_neg()?,
        _ => return None,
    };
    // The loop must run towards its bound: up while below it, down while above it.
    let ok = match op {
        Op::Lt | Op::Le | Op::Ne => step > 0,
        Op::Gt | Op::Ge => step < 0,
        Op::Eq => false,
    } || (op == Op::Ne && step < 0);
    if !ok || step == 0 || step.unsigned_abs() > 1 << 16 {
        return None;
    }
    // A global atomic or reduction counts as `atomic_weight` instructions (`Options`).
    let len: u32 = (site..=back)
        .map(|k| match base(&node_inst(e, flow, k).opcode) {
            "atom" | "red" => atomic_weight.max(1),
            _ => 1,
        })
        .fold(0u32, u32::saturating_add);
    let chunk = (chunk_instructions / len.max(1)).clamp(1, 4096);
    let fast = !cta
        && (site..=back)
            .filter(|&k| k != *d && k != setp)
            .all(|k| !flow.nodes[k].uses.contains(&iv));
    let ty = match (width, signed) {
        (32, true) => "s32",
        (32, false) => "u32",
        (64, true) => "s64",
        _ => "u64",
    };
    Some(Strip {
        setp,
        back,
        chunk,
        iv: regs.names[iv as usize].clone(),
        bound: bound.clone(),
        step,
        ty,
        fast,
    })
}
