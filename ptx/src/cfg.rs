//! Control-flow analysis at decode time: immediate post-dominators of every instruction,
//! used as SIMT reconvergence points for divergent branches, computed with Lengauer–Tarjan on
//! the reversed CFG with a virtual exit node.

use crate::ir::{Inst, Op};

/// Estimated transient host bytes of [`ipdoms`] per instruction: the reversed graph (two
/// vectors per node and their edges), seven index arrays and the DFS stack and buckets.
pub(crate) const BYTES_PER_INST: u64 = 2 * 24 + 2 * 2 * 4 + 7 * 8 + 24 + 16 + 8;

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
///
/// Lengauer–Tarjan (path compression, iterative) on the reversed CFG rooted at the virtual
/// exit: O(n log n) whatever the branch structure (hostile PTX included).
pub(crate) fn ipdoms(code: &[Op]) -> Vec<u32> {
    const NONE: usize = usize::MAX;
    let n = code.len();
    let root = n;
    // Reversed graph: rsucc(v) = CFG predecessors of v; rpred(v) = CFG successors of v.
    let mut rsucc: Vec<Vec<u32>> = vec![Vec::new(); n + 1];
    let mut rpred: Vec<Vec<u32>> = Vec::with_capacity(n + 1);
    let mut tmp = Vec::new();
    for i in 0..n {
        succs(code, i, &mut tmp);
        for &s in &tmp {
            rsucc[s].push(i as u32);
        }
        rpred.push(tmp.iter().map(|&s| s as u32).collect());
    }
    rpred.push(Vec::new());
    // 1. Iterative DFS from the root: preorder numbers, parents.
    let mut dfnum = vec![NONE; n + 1];
    let mut vertex = Vec::with_capacity(n + 1);
    let mut parent = vec![NONE; n + 1];
    let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
    dfnum[root] = 0;
    vertex.push(root);
    while let Some(top) = stack.last_mut() {
        let (v, k) = *top;
        if let Some(&w) = rsucc[v].get(k) {
            top.1 += 1;
            let w = w as usize;
            if dfnum[w] == NONE {
                dfnum[w] = vertex.len();
                vertex.push(w);
                parent[w] = v;
                stack.push((w, 0));
            }
        } else {
            stack.pop();
        }
    }
    // 2. Semidominators with a path-compressed forest.
    let mut semi: Vec<usize> = dfnum.clone();
    let mut ancestor = vec![NONE; n + 1];
    let mut label: Vec<usize> = (0..=n).collect();
    let mut idom = vec![NONE; n + 1];
    let mut bucket: Vec<Vec<usize>> = vec![Vec::new(); n + 1];
    let mut path = Vec::new();
    let mut eval =
        |v: usize, ancestor: &mut Vec<usize>, label: &mut Vec<usize>, semi: &Vec<usize>| {
            if ancestor[v] == NONE {
                return v;
            }
            // Iterative path compression (nearest-to-root first, as the recursive form).
            path.clear();
            let mut x = v;
            while ancestor[ancestor[x]] != NONE {
                path.push(x);
                x = ancestor[x];
            }
            while let Some(x) = path.pop() {
                let a = ancestor[x];
                if semi[label[a]] < semi[label[x]] {
                    label[x] = label[a];
                }
                ancestor[x] = ancestor[a];
            }
            label[v]
        };
    for k in (1..vertex.len()).rev() {
        let w = vertex[k];
        for &v in &rpred[w] {
            let v = v as usize;
            if dfnum[v] == NONE {
                continue;
            }
            let u = eval(v, &mut ancestor, &mut label, &semi);
            if semi[u] < semi[w] {
                semi[w] = semi[u];
            }
        }
        bucket[vertex[semi[w]]].push(w);
        let p = parent[w];
        ancestor[w] = p;
        for v in std::mem::take(&mut bucket[p]) {
            let u = eval(v, &mut ancestor, &mut label, &semi);
            idom[v] = if semi[u] < semi[v] { u } else { p };
        }
    }
    // 3. Explicit immediate dominators in preorder.
    for &w in vertex.iter().skip(1) {
        if idom[w] != vertex[semi[w]] {
            idom[w] = idom[idom[w]];
        }
    }
    (0..n)
        .map(|i| {
            let d = idom[i];
            if d == NONE { n as u32 } else { d as u32 }
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
    fn long_backward_branch_ladder_is_fast() {
        // Every instruction branches back to the start: quadratic for naive algorithms.
        let n = 100_000;
        let mut code: Vec<Op> = (0..n).map(|_| op(Inst::Bra { target: 0 }, true)).collect();
        code.push(op(Inst::Exit, false));
        let t = std::time::Instant::now();
        let d = ipdoms(&code);
        assert!(t.elapsed().as_secs() < 10);
        assert!((0..n).all(|i| d[i] == i as u32 + 1));
    }

    #[test]
    fn diamond_chain_matches_brute_force() {
        // Random CFGs: compare with post-dominator sets computed by brute force.
        let mut seed = 7u64;
        let mut rnd = |m: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(m)) as u32
        };
        for _ in 0..200 {
            let n = 2 + rnd(30) as usize;
            let mut code: Vec<Op> = (0..n)
                .map(|_| match rnd(5) {
                    0 => op(
                        Inst::Bra {
                            target: rnd(n as u32),
                        },
                        true,
                    ),
                    1 => op(
                        Inst::Bra {
                            target: rnd(n as u32),
                        },
                        false,
                    ),
                    2 => op(Inst::Exit, true),
                    _ => op(Inst::Nop, false),
                })
                .collect();
            code.push(op(Inst::Exit, false));
            let n = code.len();
            let d = ipdoms(&code);
            // Brute force: p post-dominates i if removing p disconnects i from exit.
            let reaches_exit_without = |i: usize, p: usize| {
                let mut seen = vec![false; n + 1];
                let mut st = vec![i];
                let mut tmp = Vec::new();
                while let Some(v) = st.pop() {
                    if v == n {
                        return true;
                    }
                    if v == p || seen[v] {
                        continue;
                    }
                    seen[v] = true;
                    succs(&code, v, &mut tmp);
                    st.extend(tmp.iter().copied());
                }
                false
            };
            for (i, &di) in d.iter().enumerate() {
                if !reaches_exit_without(i, usize::MAX) {
                    assert_eq!(di as usize, n, "unreachable exit at {i}");
                    continue;
                }
                let pdoms: Vec<usize> = (0..n)
                    .filter(|&p| p != i && !reaches_exit_without(i, p))
                    .collect();
                // The immediate one is the post-dominator that all others post-dominate.
                let ipd = pdoms
                    .iter()
                    .copied()
                    .find(|&p| pdoms.iter().all(|&q| q == p || !reaches_exit_without(p, q)))
                    .unwrap_or(n);
                assert_eq!(di as usize, ipd, "instruction {i} of {n}");
            }
        }
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
