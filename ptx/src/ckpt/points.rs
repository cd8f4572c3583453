//! Kernel classes and the choice of preemption points.
//!
//! - [`Class::Cta`] (barriers, possibly shared memory and warp collectives): points only at
//!   `bar.sync 0` sites, decided CTA-uniformly (the barrier becomes `bar.red.or.pred`).
//! - [`Class::Warp`] (warp collectives, no barriers): points only before full-mask
//!   collectives (`shfl`/`vote`/`redux`/`match` `.sync` with mask 0xffffffff), decided
//!   warp-uniformly with `vote.sync.any.pred` over the same mask.
//! - [`Class::Thread`] (neither): points anywhere, decided per thread.
//!
//! Every candidate barrier of a `Cta` kernel outside loops is a point (the barrier already
//! synchronizes the CTA, the poll adds three instructions to it), and inside loops the first
//! one of each loop (a loop with two barriers polls once per iteration). Among the candidate
//! sites of the other classes, every loop (backward branch) gets one point (its first
//! candidate, the loop header for `Thread`), and straight-line code gets one more wherever a
//! path has run `max_gap` instructions since the last point. A site where the carry flag is
//! live is never a candidate, nor one where a bounds-checked twin's flag address is
//! (`bounds::FLAG_REG`: the address of the engine that ran it must not reach a save area).

use super::budget::{Budget, Unsupported};
use super::flow::{Exit, Flow, Regs, base, test};
use super::module::StmtEntry;
use crate::decode::{ROp, RawInst, Stmt};

/// How the threads of a kernel agree to stop (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Per thread, anywhere.
    Thread,
    /// Per warp, before full-mask warp collectives.
    Warp,
    /// Per CTA, at `bar.sync 0`.
    Cta,
}

/// Why a point is where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointKind {
    /// Before the kernel's first instruction (nothing saved: the thread restarts).
    Entry,
    /// In a loop (the header for `Thread` kernels).
    Loop,
    /// After `max_gap` instructions of straight-line code.
    Gap,
    /// A `bar.sync 0` (every barrier of a `Cta` kernel is a point).
    Barrier,
}

/// A chosen point: before instruction `node`.
#[derive(Debug, Clone)]
pub(crate) struct Site {
    pub node: usize,
    pub kind: PointKind,
}

fn inst<'a>(e: &'a StmtEntry, flow: &Flow, i: usize) -> &'a RawInst {
    match &e.body[flow.nodes[i].stmt] {
        Stmt::Inst(x) => x,
        Stmt::Label(..) => unreachable!("nodes index instructions"),
    }
}

fn is_barrier(i: &RawInst) -> bool {
    matches!(base(&i.opcode), "bar" | "barrier") && !i.opcode.split('.').any(|m| m == "warp")
}

fn is_warp_collective(i: &RawInst) -> bool {
    let b = base(&i.opcode);
    matches!(b, "shfl" | "vote" | "redux" | "match" | "activemask")
        || (b == "bar" && i.opcode.split('.').any(|m| m == "warp"))
}

fn all_ones(o: &ROp) -> bool {
    matches!(o, ROp::Int(v) if *v as u32 == u32::MAX)
}

/// Classify the entry, checking the rules of its class.
pub(crate) fn classify(
    e: &StmtEntry,
    flow: &Flow,
    module_shared: bool,
    b: &mut Budget,
) -> Result<Class, Unsupported> {
    let d = &e.decls;
    let entry = || d.name.clone();
    let mut barriers = false;
    let mut warp = false;
    let mut shared = module_shared || !d.shared.is_empty();
    for k in 0..flow.nodes.len() {
        b.work(1)?;
        let i = inst(e, flow, k);
        shared |= i.opcode.split('.').any(|m| m == "shared");
        warp |= is_warp_collective(i);
        if is_barrier(i) {
            barriers = true;
            let red = i.opcode.split('.').any(|m| m == "red");
            if !red && (i.guard.is_some() || !matches!(i.ops.as_slice(), [ROp::Int(0)])) {
                return Err(Unsupported::Barrier {
                    entry: entry(),
                    line: i.pos.line,
                    what: i.opcode.clone(),
                });
            }
        }
    }
    if barriers {
        Ok(Class::Cta)
    } else if shared {
        Err(Unsupported::SharedWithoutBarrier { entry: entry() })
    } else if warp {
        Ok(Class::Warp)
    } else {
        Ok(Class::Thread)
    }
}

/// The mask operand of a full-mask warp collective site, if `i` is one.
pub(crate) fn warp_site_mask<'a>(e: &StmtEntry, i: &'a RawInst) -> Option<&'a ROp> {
    if i.guard.is_some() || !i.opcode.split('.').any(|m| m == "sync") {
        return None;
    }
    if !matches!(base(&i.opcode), "shfl" | "vote" | "redux" | "match") {
        return None;
    }
    let mask = i.ops.last()?;
    match mask {
        o if all_ones(o) => Some(mask),
        ROp::Name(r, _) if e.decls.regs.contains_key(r) => {
            // Every definition of the register must be `mov r, 0xffffffff`.
            let mut defs = 0;
            for s in &e.body {
                let Stmt::Inst(x) = s else { continue };
                let defines = match x.ops.first() {
                    Some(ROp::Name(n, _)) => n == r,
                    Some(ROp::Pair(a, c, _)) => a == r || c == r,
                    Some(ROp::Vec(v)) => v.iter().any(|o| matches!(o, ROp::Name(n, _) if n == r)),
                    _ => false,
                };
                if defines && !matches!(base(&x.opcode), "st" | "red" | "bra") {
                    let ok = base(&x.opcode) == "mov"
                        && x.guard.is_none()
                        && x.ops.get(1).is_some_and(all_ones);
                    if !ok {
                        return None;
                    }
                    defs += 1;
                }
            }
            (defs > 0).then_some(mask)
        }
        _ => None,
    }
}

/// Candidate sites of a class (instruction indices), in order.
fn candidates(
    e: &StmtEntry,
    flow: &Flow,
    class: Class,
    live: &super::flow::BitRows,
    regs: &Regs,
) -> Vec<bool> {
    // Only in a bounds-checked twin (the entry has the flag parameter).
    let flag = e
        .decls
        .params
        .iter()
        .any(|p| p.name == super::bounds::FLAG_PARAM)
        .then(|| regs.get(super::bounds::FLAG_REG))
        .flatten();
    (0..flow.nodes.len())
        .map(|k| {
            if test(live.row(k), regs.cf()) || flag.is_some_and(|f| test(live.row(k), f)) {
                return false;
            }
            let i = inst(e, flow, k);
            match class {
                Class::Thread => true,
                Class::Cta => is_barrier(i) && !i.opcode.split('.').any(|m| m == "red"),
                Class::Warp => warp_site_mask(e, i).is_some(),
            }
        })
        .collect()
}

/// Choose the points (without the entry point), sorted by instruction index.
pub(crate) fn choose(
    e: &StmtEntry,
    flow: &Flow,
    class: Class,
    live: &super::flow::BitRows,
    regs: &Regs,
    max_gap: u32,
    b: &mut Budget,
) -> Result<Vec<Site>, Unsupported> {
    let n = flow.nodes.len();
    b.memory(n as u64 * 16)?;
    let cand = candidates(e, flow, class, live, regs);
    let mut kind: Vec<Option<PointKind>> = vec![None; n];
    // Loops: innermost (shortest) first; one point per loop range.
    let mut loops: Vec<(usize, usize)> = flow
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, nd)| match nd.exit {
            Exit::Branch(t) if t <= i => Some((t, i)),
            _ => None,
        })
        .collect();
    loops.sort_by_key(|&(t, i)| (i - t, t));
    if class == Class::Cta {
        // Every barrier outside loops (each runs once per thread); inside a loop only the
        // first one (below), so a loop with several barriers polls once per iteration.
        b.work(n as u64 + loops.len() as u64)?;
        // Loop depth of each instruction, by a sweep over the loop starts and ends.
        let mut depth = vec![0i64; n + 1];
        for &(t, i) in &loops {
            depth[t] += 1;
            depth[i + 1] -= 1;
        }
        let mut d = 0i64;
        for k in 0..n {
            d += depth[k];
            if cand[k] && d == 0 {
                kind[k] = Some(PointKind::Barrier);
            }
        }
    }
    // Prefix counts of chosen points, rebuilt lazily: ranges are checked by a scan, charged.
    for (t, i) in loops {
        b.work((i - t + 1) as u64)?;
        if (t..=i).any(|k| kind[k].is_some()) {
            continue;
        }
        if let Some(k) = (t..=i).find(|&k| cand[k]) {
            kind[k] = Some(if class == Class::Cta {
                PointKind::Barrier
            } else {
                PointKind::Loop
            });
        }
    }
    // Straight-line gaps: longest forward path since the last point.
    let preds = flow.preds(b)?;
    let mut dist = vec![0u32; n];
    for i in 0..n {
        b.work(1 + preds[i].len() as u64)?;
        let d = preds[i]
            .iter()
            .filter(|&&p| (p as usize) < i)
            .map(|&p| dist[p as usize].saturating_add(1))
            .max()
            .unwrap_or(0);
        dist[i] = if kind[i].is_some() {
            0
        } else if d >= max_gap.max(1) && cand[i] {
            kind[i] = Some(PointKind::Gap);
            0
        } else {
            d
        };
    }
    Ok(kind
        .into_iter()
        .enumerate()
        .filter_map(|(node, k)| k.map(|kind| Site { node, kind }))
        .collect())
}
