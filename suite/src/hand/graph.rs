//! graph: breadth-first search over a random CSR graph, one frontier-expansion launch per level.

use alloc::collections::VecDeque;
use alloc::vec;
use alloc::vec::Vec;

use crate::{Buffer, Elem, Instance, Launch, Param, Rng, Size, Workload, u32_bytes};

/// The workload.
pub const WORKLOAD: Workload = Workload::new(
    "graph",
    include_str!("../../kernels/graph.ptx"),
    "graph",
    "BFS levels over a CSR graph: divergent edge loops, atom.cas claims, atom.add counts",
    build,
);

/// Level of a node not reached.
pub const UNREACHED: u32 = u32::MAX;
/// CTA size.
pub const BLOCK: u32 = 128;

/// A directed graph in CSR form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Csr {
    /// `row_ptr[v]..row_ptr[v + 1]` indexes `cols` for node v's out-edges.
    pub row_ptr: Vec<u32>,
    /// Edge targets.
    pub cols: Vec<u32>,
}

/// Random graph: each node gets 0..=7 out-edges (node 0 gets 4) to uniform random targets.
pub fn random_graph(n: u32, rng: &mut Rng) -> Csr {
    let mut row_ptr = Vec::with_capacity(n as usize + 1);
    let mut cols = Vec::new();
    row_ptr.push(0);
    for v in 0..n {
        let deg = if v == 0 { 4 } else { rng.below(8) };
        cols.extend((0..deg).map(|_| rng.below(n)));
        row_ptr.push(cols.len() as u32);
    }
    Csr { row_ptr, cols }
}

/// BFS levels from node 0 ([`UNREACHED`] for nodes not reached).
pub fn bfs(g: &Csr) -> Vec<u32> {
    let n = g.row_ptr.len() - 1;
    let mut level = vec![UNREACHED; n];
    let mut queue = VecDeque::new();
    if n > 0 {
        level[0] = 0;
        queue.push_back(0usize);
    }
    while let Some(v) = queue.pop_front() {
        for &u in &g.cols[g.row_ptr[v] as usize..g.row_ptr[v + 1] as usize] {
            if level[u as usize] == UNREACHED {
                level[u as usize] = level[v] + 1;
                queue.push_back(u as usize);
            }
        }
    }
    level
}

fn build(size: Size) -> Instance {
    let n: u32 = size.pick(1024, 4096, 1 << 17, 1 << 20);
    let mut rng = Rng::for_workload(WORKLOAD.name, size.tag());
    let g = random_graph(n, &mut rng);
    let levels = bfs(&g);
    let depth = levels
        .iter()
        .copied()
        .filter(|&l| l != UNREACHED)
        .max()
        .unwrap_or(0);
    // counts[l] = nodes at level l; the kernel adds to counts[cur + 1], counts[0] starts at 1.
    let mut counts = vec![0u32; depth as usize + 1];
    for &l in levels.iter().filter(|&&l| l != UNREACHED) {
        counts[l as usize] += 1;
    }
    let mut init_levels = vec![UNREACHED; n as usize];
    init_levels[0] = 0;
    let mut init_counts = vec![0u32; counts.len()];
    init_counts[0] = 1;
    let grid = n.div_ceil(BLOCK);
    let launches = (0..depth)
        .map(|cur| {
            Launch::linear(
                WORKLOAD.entry,
                grid,
                BLOCK,
                vec![
                    Param::Buffer(0),
                    Param::Buffer(1),
                    Param::Buffer(2),
                    Param::Buffer(3),
                    Param::U32(n),
                    Param::U32(cur),
                ],
            )
        })
        .collect();
    Instance {
        workload: WORKLOAD.name,
        size,
        ptx: WORKLOAD.ptx,
        buffers: vec![
            Buffer::input("row_ptr", u32_bytes(&g.row_ptr)),
            Buffer::input("cols", u32_bytes(&g.cols)),
            Buffer::exact(
                "levels",
                u32_bytes(&init_levels),
                Elem::U32,
                u32_bytes(&levels),
            ),
            Buffer::exact(
                "counts",
                u32_bytes(&init_counts),
                Elem::U32,
                u32_bytes(&counts),
            ),
        ],
        launches,
        // ~17 per thread per level, ~12 per edge of a frontier node, ~12 per frontier node.
        approx_thread_instrs: u64::from(grid * BLOCK) * 17 * u64::from(depth)
            + 12 * (g.cols.len() as u64 + u64::from(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bfs_on_a_known_graph() {
        // 0 -> 1, 0 -> 2, 1 -> 3, 3 -> 1, node 4 unreachable.
        let g = Csr {
            row_ptr: vec![0, 2, 3, 3, 4, 4],
            cols: vec![1, 2, 3, 1],
        };
        assert_eq!(bfs(&g), [0, 1, 1, 2, UNREACHED]);
    }

    #[test]
    fn instance_launches_once_per_level() {
        let i = WORKLOAD.instance(Size::Small);
        let depth = i.launches.len();
        assert!(depth >= 3, "random graph too shallow: {depth}");
        assert_eq!(i.buffers[3].init.len(), (depth + 1) * 4);
    }
}
