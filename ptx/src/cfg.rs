//! Control-flow analysis at decode time: immediate post-dominators of every instruction,
//! used as SIMT reconvergence points for divergent branches. Computed with the
//! Cooper–Harvey–Kennedy iterative algorithm on the reversed CFG with a virtual exit node.

use crate::ir::{Inst, Op};

/// Successors of instruction `i` (`n` = the virtual exit).
fn succs(code: &[Op], i: usize, out: &mut Vec<usize>) {
    let n = code.len();
    out.clear();
    let op = &code[i];
    match op.inst {
        Inst::Bra { target } => {
            out.push((target as usize).min(n));
            if op.guard.is_some() && i + 1 < n {
                out.push(i + 1);
            }
        }
        Inst::Exit | Inst::Trap => {
            out.push(n);
            if op.guard.is_some() && i + 1 < n {
                out.push(i + 1);
            }
        }
        _ => out.push(if i + 1 < n { i + 1 } else { n }),
    }
}

/// Immediate post-dominator of each instruction; `code.len()` means "only at exit" (also used
/// for instructions from which no exit is reachable).
pub(crate) fn ipdoms(code: &[Op]) -> Vec<u32> {
    let n = code.len();
    let root = n;
    // Original predecessors = successors in the reversed graph.
    let mut preds: Vec<Vec<u32>> = vec![Vec::new(); n + 1];
    let mut succ_lists: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut tmp = Vec::new();
    for i in 0..n {
        succs(code, i, &mut tmp);
        for &s in &tmp {
            preds[s].push(i as u32);
        }
        succ_lists.push(tmp.clone());
    }
    // Iterative DFS postorder from the exit over reversed edges.
    let mut order = Vec::with_capacity(n + 1);
    let mut seen = vec![false; n + 1];
    let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
    seen[root] = true;
    while let Some(top) = stack.last_mut() {
        let (v, k) = *top;
        if let Some(&p) = preds[v].get(k) {
            top.1 += 1;
            let p = p as usize;
            if !seen[p] {
                seen[p] = true;
                stack.push((p, 0));
            }
        } else {
            order.push(v);
            stack.pop();
        }
    }
    let mut rank = vec![usize::MAX; n + 1];
    for (k, &v) in order.iter().enumerate() {
        rank[v] = k;
    }
    const UNDEF: usize = usize::MAX;
    let mut idom = vec![UNDEF; n + 1];
    idom[root] = root;
    let intersect = |idom: &[usize], mut a: usize, mut b: usize| {
        while a != b {
            while rank[a] < rank[b] {
                a = idom[a];
            }
            while rank[b] < rank[a] {
                b = idom[b];
            }
        }
        a
    };
    let mut changed = true;
    while changed {
        changed = false;
        for &v in order.iter().rev() {
            if v == root {
                continue;
            }
            let mut new = UNDEF;
            for &s in &succ_lists[v] {
                if idom[s] == UNDEF {
                    continue;
                }
                new = if new == UNDEF {
                    s
                } else {
                    intersect(&idom, s, new)
                };
            }
            if new != UNDEF && idom[v] != new {
                idom[v] = new;
                changed = true;
            }
        }
    }
    (0..n)
        .map(|i| {
            let d = idom[i];
            if d == UNDEF { n as u32 } else { d as u32 }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Inst, Op};

    fn op(inst: Inst, guarded: bool) -> Op {
        Op {
            inst,
            guard: guarded.then_some((0, false)),
        }
    }

    #[test]
    fn if_else_reconverges_at_join() {
        // 0: @p bra 3; 1: nop; 2: bra 4; 3: nop; 4: nop; 5: exit
        let code = vec![
            op(Inst::Bra { target: 3 }, true),
            op(Inst::Nop, false),
            op(Inst::Bra { target: 4 }, false),
            op(Inst::Nop, false),
            op(Inst::Nop, false),
            op(Inst::Exit, false),
        ];
        let d = ipdoms(&code);
        assert_eq!(d[0], 4);
        assert_eq!(d[1], 2);
        assert_eq!(d[4], 5);
        assert_eq!(d[5], 6);
    }

    #[test]
    fn loop_and_infinite_loop() {
        // 0: nop; 1: @p bra 0; 2: exit ; 3: bra 3 (unreachable infinite loop)
        let code = vec![
            op(Inst::Nop, false),
            op(Inst::Bra { target: 0 }, true),
            op(Inst::Exit, false),
            op(Inst::Bra { target: 3 }, false),
        ];
        let d = ipdoms(&code);
        assert_eq!(d[1], 2);
        assert_eq!(d[3], 4);
    }
}
