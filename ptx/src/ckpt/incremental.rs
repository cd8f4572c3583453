//! The incremental save (TripleC): a thread resumed at point `r` that is preempted again at
//! point `p` need not store a register whose saved copy is still valid, i.e. one that was
//! restored at `r` (live at `r`) and is defined on no path from `r` to `p`. For each resume
//! point `r` a forward may-define dataflow from `r` gives the registers possibly redefined
//! before each point; the stores at `p` for a thread resumed from `r` are
//! `live(p) − (live(r) − defined(r → p))`.

use super::budget::{Budget, Unsupported};
use super::flow::{BitRows, Flow, set, test};
use super::points::Site;

/// For each resume point `r` (index into `sites`) and each point `p`: the registers to store
/// at `p` for a thread resumed from `r` (a subset of `lives[p]`).
pub(crate) fn stores(
    flow: &Flow,
    preds: &[Vec<u32>],
    sites: &[Site],
    lives: &[Vec<u32>],
    nregs: usize,
    b: &mut Budget,
) -> Result<Vec<Vec<Vec<u32>>>, Unsupported> {
    let n = flow.nodes.len();
    let mut result = Vec::with_capacity(sites.len());
    let mut inn = BitRows::new(n, nregs, b)?;
    let words = inn.words;
    let mut reached = vec![false; n];
    let mut acc = vec![0u64; words];
    let mut tmp = Vec::new();
    for (ri, r) in sites.iter().enumerate() {
        inn.bits.iter_mut().for_each(|w| *w = 0);
        reached.iter_mut().for_each(|x| *x = false);
        // Instructions a thread resumed at r can reach after running r's own instruction
        // (r itself only around a cycle: the resume enters after r's poll).
        let start = r.node;
        flow.succs(start, &mut tmp);
        let mut stack: Vec<usize> = Vec::new();
        for &s in &tmp {
            if !reached[s] {
                reached[s] = true;
                stack.push(s);
            }
        }
        while let Some(i) = stack.pop() {
            b.work(2)?;
            flow.succs(i, &mut tmp);
            for &s in &tmp {
                if !reached[s] {
                    reached[s] = true;
                    stack.push(s);
                }
            }
        }
        // defined-before(i) = ∪ over reached preds (defined-before(p) ∪ defs(p)).
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..n {
                if !reached[i] {
                    continue;
                }
                b.work(words as u64 * (1 + preds[i].len() as u64))?;
                acc.iter_mut().for_each(|w| *w = 0);
                for &p in &preds[i] {
                    let p = p as usize;
                    if !reached[p] && p != start {
                        continue;
                    }
                    for (a, x) in acc.iter_mut().zip(inn.row(p)) {
                        *a |= x;
                    }
                    for &d in &flow.nodes[p].defs {
                        if (d as usize) < nregs {
                            set(&mut acc, d);
                        }
                    }
                }
                let row = inn.row_mut(i);
                if row != acc.as_slice() {
                    row.copy_from_slice(&acc);
                    changed = true;
                }
            }
        }
        let live_r = &lives[ri];
        // A point the thread cannot reach again gets no variant (its stores are the full set).
        let per_p = sites
            .iter()
            .zip(lives)
            .map(|(p, live_p)| {
                if !reached[p.node] {
                    return live_p.clone();
                }
                let dirty = inn.row(p.node);
                live_p
                    .iter()
                    .copied()
                    .filter(|&x| live_r.binary_search(&x).is_err() || test(dirty, x))
                    .collect()
            })
            .collect();
        result.push(per_p);
    }
    Ok(result)
}

/// Bound the code of the incremental variants (each is a store sequence at its point): keep
/// the re-save at the same point (`r == p`, a loop preempted again) first, then the others in
/// order, while their stores total at most twice the full saves' (and 4096); a dropped
/// variant stores everything, like a fresh thread.
pub(crate) fn prune(stores: &mut [Vec<Vec<u32>>], lives: &[Vec<u32>]) {
    let full: usize = lives.iter().map(Vec::len).sum();
    let mut budget = (2 * full).max(4096);
    let n = stores.len();
    let order = (0..n)
        .map(|k| (k, k))
        .chain((0..n).flat_map(|r| (0..n).filter(move |&p| p != r).map(move |p| (r, p))));
    let mut keep = vec![false; n * n];
    for (r, p) in order {
        let len = stores[r][p].len();
        if len < lives[p].len() && len <= budget {
            budget -= len;
            keep[r * n + p] = true;
        }
    }
    for (r, row) in stores.iter_mut().enumerate() {
        for (p, set) in row.iter_mut().enumerate() {
            if !keep[r * n + p] && set.len() < lives[p].len() {
                set.clone_from(&lives[p]);
            }
        }
    }
}
