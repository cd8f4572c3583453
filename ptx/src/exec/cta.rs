//! Execution state of one CTA: its warps (structure-of-arrays register files, SIMT
//! reconvergence stacks, barrier flags), shared memory and per-thread local memory.

/// One entry of a warp's SIMT reconvergence stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StackEntry {
    pub pc: u32,
    pub mask: u32,
    /// Reconvergence pc: the entry is popped when `pc` reaches it.
    pub rpc: u32,
}

/// Accumulated `bar.red` reduction of the barrier in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BarAcc {
    pub count: u32,
    pub all: bool,
    pub any: bool,
}

impl Default for BarAcc {
    fn default() -> Self {
        Self {
            count: 0,
            all: true,
            any: false,
        }
    }
}

/// Where a warp waiting in `bar.red` receives the result: (op, destination, lanes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BarDst {
    pub op: crate::ir::BarRedOp,
    pub d: u32,
    pub exec: u32,
}

/// One warp of 32 lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Warp {
    /// Registers, `regs[r * 32 + lane]`, each holding the zero-extended value of its width.
    pub regs: Vec<u64>,
    /// Predicate registers: one bit per lane.
    pub preds: Vec<u32>,
    /// Current pc, active mask and reconvergence pc (the top of the SIMT stack).
    pub pc: u32,
    pub mask: u32,
    pub rpc: u32,
    /// The rest of the SIMT stack (bottom first).
    pub stack: Vec<StackEntry>,
    /// Lanes that exist in this warp (the last warp of a CTA may be partial).
    pub valid: u32,
    /// Lanes that have exited.
    pub exited: u32,
    /// Blocked at `bar.sync` (pc already points after it).
    pub at_barrier: bool,
    /// Pending `bar.red` result destination.
    pub bar_dst: Option<BarDst>,
    /// Every lane has exited.
    pub done: bool,
    /// Local memory, `local_bytes` per lane, lane-major.
    pub local: Vec<u8>,
}

/// One CTA in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cta {
    /// Linear CTA index (x fastest).
    pub linear: u64,
    pub warps: Vec<Warp>,
    pub shared: Vec<u8>,
    /// Round-robin cursor: the warp to run next.
    pub cursor: u32,
    /// `bar.red` accumulator of the barrier in progress.
    pub bar: BarAcc,
    /// Rest of the quantum of the warp at `cursor` when the step limit cut it short (0: none).
    pub slice_left: u32,
}

/// Sentinel rpc meaning "never reconverges before exit".
pub(crate) const NO_RPC: u32 = u32::MAX;

impl Cta {
    /// Fresh CTA state: all threads at pc 0, registers zero, shared memory zero.
    pub(crate) fn new(
        linear: u64,
        threads: u32,
        nregs: u32,
        npreds: u32,
        shared_bytes: u32,
        local_bytes: u32,
    ) -> Cta {
        let nwarps = threads.div_ceil(32);
        let warps = (0..nwarps)
            .map(|w| {
                let lanes = (threads - w * 32).min(32);
                let valid = if lanes == 32 {
                    u32::MAX
                } else {
                    (1u32 << lanes) - 1
                };
                Warp {
                    regs: vec![0; nregs as usize * 32],
                    preds: vec![0; npreds as usize],
                    pc: 0,
                    mask: valid,
                    rpc: NO_RPC,
                    stack: Vec::new(),
                    valid,
                    exited: 0,
                    at_barrier: false,
                    bar_dst: None,
                    done: false,
                    local: vec![0; local_bytes as usize * 32],
                }
            })
            .collect();
        Cta {
            linear,
            warps,
            shared: vec![0; shared_bytes as usize],
            cursor: 0,
            slice_left: 0,
            bar: BarAcc::default(),
        }
    }
}

/// CTA coordinates of a linear index.
pub(crate) fn cta_coords(linear: u64, grid: [u32; 3]) -> [u32; 3] {
    let gx = u64::from(grid[0].max(1));
    let gy = u64::from(grid[1].max(1));
    [
        (linear % gx) as u32,
        ((linear / gx) % gy) as u32,
        (linear / (gx * gy)) as u32,
    ]
}

/// Thread coordinates of linear thread `t` in a block.
pub(crate) fn thread_coords(t: u32, block: [u32; 3]) -> [u32; 3] {
    let bx = block[0].max(1);
    let by = block[1].max(1);
    [t % bx, (t / bx) % by, t / (bx * by)]
}
