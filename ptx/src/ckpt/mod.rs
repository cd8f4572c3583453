//! Compiler-directed, incremental checkpoints in PTX (TripleC-style): a PTX-to-PTX
//! transformation that makes a kernel preemptible at compiler-chosen points, with save and
//! restore of the live registers (and the CTA's shared memory) in a save area, so that one
//! long CTA can be stopped and resumed by relaunching the same kernel.
//!
//! Pipeline, on the parser's own statement-level IR (never on text): `module` loads and
//! inlines, `flow` builds the CFG and liveness, `points` classifies the kernel and picks the
//! preemption points, `layout` fixes the per-thread record, `incremental` finds the registers
//! whose saved copy is still valid, `emit` rewrites the body (with the instruction builders
//! of `build`) and `print` prints PTX. The contract (parameters, save area, flag, resume, the
//! barrier/warp rules) is in `docs/ptx-subset.md`, "Preemptible kernels".

pub mod bounds;
mod budget;
mod build;
mod emit;
mod fast;
mod flow;
mod idem;
mod incremental;
mod layout;
mod module;
mod names;
mod points;
mod print;
mod strip;

pub use budget::Unsupported;
pub use emit::{MIRROR_MARK, MIRROR_OFF, PARAMS, STATUS_DONE, STATUS_NOT_STARTED};
pub use idem::Idempotence;
pub use layout::HEADER_BYTES;
pub use points::{Class, PointKind};

use crate::error::PtxError;
use crate::load::LoadOptions;

/// Parse `text` (within the budgets of `opts`), inline its `.func` calls and print it back as
/// PTX: the same kernels, accepted by this crate's parser and by `ptxas`.
pub fn print_module(text: &str, opts: &LoadOptions) -> Result<String, PtxError> {
    let m = module::load(text, opts)?;
    Ok(print::module(&m))
}

/// [`Options::atomic_weight`]'s default: what a global atomic or reduction counts as, in
/// instructions, when a strip-mined loop's chunk is sized.
pub const DEFAULT_ATOMIC_WEIGHT: u32 = 8;

/// Options of [`transform`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Most instructions on a straight-line path between two points (where the kernel's
    /// class allows a point there). Default 64.
    pub max_gap: u32,
    /// Points a thread crosses per flag load (default 64): the other crossings only count
    /// down a register, so a tight loop does not hammer one L2 line with volatile loads (on
    /// an H100 a load per iteration made a 4-instruction loop 100x slower). 1 loads at every
    /// point, software-pipelined. Preemption latency grows with it.
    pub poll_interval: u32,
    /// Strip-mining of single-block counted loops (`Thread` kernels): about this many of
    /// the loop's instructions run between two polls of its point, as an inner loop with a
    /// clamped bound that `ptxas` can unroll, and the point loads the flag at every crossing
    /// (no countdown). Default 512; 0 keeps the counted poll in every loop.
    pub chunk_instructions: u32,
    /// What one global atomic or reduction of a strip-mined loop counts as when its chunk is
    /// sized (instructions). Contended, it takes far longer than an ALU instruction, and a
    /// chunk is meant to be a short time. Default [`DEFAULT_ATOMIC_WEIGHT`] (the interpreter's
    /// view: an atomic costs it a few instructions); the cuda engine sets its own
    /// (`CudaConfig::ckpt_atomic_weight`), sized on the GPU.
    pub atomic_weight: u32,
    /// Whole chunks of strip-mined `Thread` loops whose induction register only steps and
    /// tests also run as a copy with a constant trip count (`fast.rs`), which `ptxas` unrolls
    /// without a remainder loop per chunk. Default true.
    pub fast_chunks: bool,
    /// Most points per entry. Default 256.
    pub max_points: u32,
    /// Largest per-thread record (bytes). Default 4096.
    pub max_record_bytes: u32,
    /// Most `.local` bytes per thread (variables and inlined calls' `.param` buffers), which
    /// every save copies whole. Default 1024.
    pub max_local_bytes: u32,
    /// Incremental saves (default true); false stores every live register at every point.
    pub incremental: bool,
    /// Restart idempotent entries instead of checkpointing them (default false): a thread
    /// stopped at a point saves nothing and reruns from the start on the resume launch
    /// (status `STATUS_NOT_STARTED`); entries that are not idempotent still checkpoint.
    /// [`EntryPlan::restart`] says which.
    pub restart: bool,
    /// Analysis work budget (units of about one bit-set word operation). Default 2^27.
    pub max_work: u64,
    /// Analysis tables budget (bytes). Default 64 MiB.
    pub max_analysis_bytes: u64,
    /// Budgets of loading the text (and the cancel flag and deadline of the whole
    /// transformation).
    pub load: LoadOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_gap: 64,
            poll_interval: 64,
            chunk_instructions: 512,
            atomic_weight: DEFAULT_ATOMIC_WEIGHT,
            fast_chunks: true,
            max_points: 256,
            max_record_bytes: 4096,
            max_local_bytes: 1024,
            incremental: true,
            restart: false,
            max_work: 1 << 27,
            max_analysis_bytes: 64 << 20,
            load: LoadOptions::default(),
        }
    }
}

/// One preemption point of a transformed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// Point id (1-based; the entry point is 0 and has no record); a thread preempted here
    /// has status `id + 2`.
    pub id: u32,
    /// Why the point is there.
    pub kind: PointKind,
    /// Source line of the instruction the point stands before.
    pub line: u32,
    /// Live registers (predicates included) saved here by a full save.
    pub live_regs: u32,
    /// Bytes a full save stores here.
    pub live_bytes: u32,
}

/// A transformed entry: its class, points, and save-area layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPlan {
    /// Entry name.
    pub name: String,
    /// How its threads agree to stop.
    pub class: Class,
    /// Points, in id order (ids 1..).
    pub points: Vec<Point>,
    /// Per-thread record stride in bytes (header + one slot per register live anywhere +
    /// local memory).
    pub record_bytes: u32,
    /// Bytes of `.local` memory every save copies (not counted in the per-point numbers).
    pub local_bytes: u32,
    /// Bytes of static shared memory each CTA saves (0 for classes other than `Cta`).
    pub shared_static_bytes: u32,
    /// Whether each CTA also saves its dynamic shared memory (`__ck_dyn_smem` bytes).
    pub saves_shared: bool,
    /// `incremental[r][p]`: bytes stored at point `p+1` by a thread resumed from point `r+1`.
    pub incremental: Vec<Vec<u32>>,
    /// Whether the entry may be rerun from the start (see [`Idempotence`]).
    pub idempotence: Idempotence,
    /// Whether its threads restart instead of saving ([`Options::restart`] and idempotent):
    /// its records hold only the status word.
    pub restart: bool,
}

impl EntryPlan {
    /// Bytes of save area a launch of `grid` x `block` with `dynamic_shared` bytes of dynamic
    /// shared memory needs: every thread's record, then (class `Cta`) every CTA's shared
    /// block of `shared_static_bytes + align8(dynamic_shared)` bytes.
    pub fn save_area_bytes(&self, grid: [u32; 3], block: [u32; 3], dynamic_shared: u32) -> u64 {
        let ctas: u64 = grid.iter().map(|&x| u64::from(x)).product();
        let threads: u64 = block.iter().map(|&x| u64::from(x)).product();
        let mut total = ctas * threads * u64::from(self.record_bytes);
        if self.saves_shared {
            let per =
                u64::from(self.shared_static_bytes) + u64::from(dynamic_shared).next_multiple_of(8);
            total += ctas * per;
        }
        total
    }

    /// Bytes a full save stores at point `id` (0 for an unknown id).
    pub fn full_bytes(&self, id: u32) -> u32 {
        self.points
            .iter()
            .find(|p| p.id == id)
            .map_or(0, |p| p.live_bytes)
    }

    /// Bytes stored at point `at` by a thread resumed from point `from`.
    pub fn incremental_bytes(&self, from: u32, at: u32) -> u32 {
        let (f, a) = (from as usize, at as usize);
        if f == 0 || a == 0 {
            return self.full_bytes(at);
        }
        self.incremental
            .get(f - 1)
            .and_then(|row| row.get(a - 1))
            .copied()
            .unwrap_or(0)
    }
}

/// The transformed module.
#[derive(Debug, Clone)]
pub struct Transformed {
    /// PTX text of the whole module, every entry transformed.
    pub ptx: String,
    /// One plan per entry, in module order.
    pub entries: Vec<EntryPlan>,
}

impl Transformed {
    /// The plan of an entry.
    pub fn entry(&self, name: &str) -> Option<&EntryPlan> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// Make every entry of `text` preemptible (see `docs/ptx-subset.md`, "Preemptible kernels").
///
/// Bounded for hostile input: loading within `opts.load`, the analyses within
/// `opts.max_work`/`opts.max_analysis_bytes`, and the output is checked to load again.
pub fn transform(text: &str, opts: &Options) -> Result<Transformed, Unsupported> {
    let mut m = module::load(text, &opts.load)?;
    let meter = std::mem::replace(&mut m.meter, crate::load::Meter::new(&opts.load));
    let mut b = budget::Budget::new(meter, opts.max_work, opts.max_analysis_bytes);
    let module_shared = !m.shared.is_empty();
    let mut plans = Vec::with_capacity(m.entries.len());
    for e in &mut m.entries {
        plans.push(transform_entry(e, &m.shared, module_shared, opts, &mut b)?);
    }
    let insts: usize = m
        .entries
        .iter()
        .map(|e| {
            e.body
                .iter()
                .filter(|s| matches!(s, crate::decode::Stmt::Inst(_)))
                .count()
        })
        .sum();
    if insts > opts.load.max_instructions {
        return Err(Unsupported::Budget {
            what: "instructions of the transformed module (LoadOptions::max_instructions)",
            limit: opts.load.max_instructions as u64,
        });
    }
    let ptx = print::module(&m);
    crate::parse_with(&ptx, &opts.load).map_err(|e| Unsupported::Internal(e.to_string()))?;
    Ok(Transformed {
        ptx,
        entries: plans,
    })
}

fn reserved(n: &str) -> bool {
    n.trim_start_matches(['%', '$']).starts_with("__ck")
}

fn transform_entry(
    e: &mut module::StmtEntry,
    shared: &[crate::decode::VarDecl],
    module_shared: bool,
    opts: &Options,
    b: &mut budget::Budget,
) -> Result<EntryPlan, Unsupported> {
    let name = e.decls.name.clone();
    let d = &e.decls;
    let labels = e.body.iter().filter_map(|s| match s {
        crate::decode::Stmt::Label(l, _) => Some(l),
        crate::decode::Stmt::Inst(_) => None,
    });
    let taken = d
        .regs
        .keys()
        .chain(d.params.iter().map(|p| &p.name))
        .chain(d.shared.iter().map(|v| &v.name))
        .chain(shared.iter().map(|v| &v.name))
        .chain(labels)
        .find(|n| reserved(n));
    if let Some(n) = taken {
        return Err(Unsupported::ReservedName {
            entry: name,
            name: n.chars().take(80).collect(),
        });
    }
    let regs = flow::Regs::new(&e.decls);
    let fl = flow::Flow::build(&e.body, &regs, b)?;
    let class = points::classify(e, &fl, module_shared, b)?;
    let live = flow::liveness(&fl, &regs, b)?;
    let mut sites = points::choose(e, &fl, class, &live, &regs, opts.max_gap, b)?;
    let strips = strip_loops(e, &fl, class, &live, &regs, &mut sites, opts, b)?;
    if sites.len() as u64 > u64::from(opts.max_points) {
        return Err(Unsupported::TooManyPoints {
            entry: name,
            points: sites.len() as u64,
            limit: u64::from(opts.max_points),
        });
    }
    let idempotence = idem::analyse(e, 64);
    let restart = opts.restart && idempotence.idempotent;
    // A restarting entry saves nothing: no live registers, local or shared memory.
    let lives: Vec<Vec<u32>> = sites
        .iter()
        .map(|s| {
            if restart {
                Vec::new()
            } else {
                layout::live_at(&live, &regs, s)
            }
        })
        .collect();
    let locals: Vec<crate::decode::VarDecl> = e
        .decls
        .local
        .iter()
        .chain(&e.decls.call_params)
        .filter(|_| !restart)
        .cloned()
        .collect();
    let local_total: u64 = locals.iter().map(|v| v.size.next_multiple_of(8)).sum();
    if local_total > u64::from(opts.max_local_bytes) {
        return Err(Unsupported::LocalMemory {
            entry: name,
            name: locals[0].name.chars().take(80).collect(),
            bytes: local_total,
            limit: u64::from(opts.max_local_bytes),
        });
    }
    let lay = layout::build(&regs, &lives, &locals);
    if lay.stride > opts.max_record_bytes {
        return Err(Unsupported::TooManyLiveBytes {
            entry: name,
            bytes: u64::from(lay.stride),
            limit: u64::from(opts.max_record_bytes),
        });
    }
    let preds = fl.preds(b)?;
    let mut stores = if opts.incremental {
        incremental::stores(&fl, &preds, &sites, &lives, regs.names.len(), b)?
    } else {
        vec![lives.clone(); sites.len()]
    };
    incremental::prune(&mut stores, &lives);
    let sp =
        (class == Class::Cta && !restart).then(|| emit::SharedPlan::new(shared, &e.decls.shared));
    let points = sites
        .iter()
        .zip(&lives)
        .enumerate()
        .map(|(k, (s, l))| {
            let stmt = fl.nodes[s.node].stmt;
            let line = match &e.body[stmt] {
                crate::decode::Stmt::Inst(i) => i.pos.line,
                crate::decode::Stmt::Label(_, p) => p.line,
            };
            Point {
                id: k as u32 + 1,
                kind: s.kind,
                line,
                live_regs: l.len() as u32,
                live_bytes: layout::bytes_of(&regs, l),
            }
        })
        .collect();
    let incremental = stores
        .iter()
        .map(|row| row.iter().map(|s| layout::bytes_of(&regs, s)).collect())
        .collect();
    let plan = emit::Plan {
        class,
        sites: &sites,
        lives: &lives,
        stores: &stores,
        layout: &lay,
        regs: &regs,
        shared: sp.as_ref(),
        poll_interval: opts.poll_interval,
        strips: &strips,
        restart,
        fast_chunks: opts.fast_chunks,
    };
    emit::rewrite(e, &plan);
    Ok(EntryPlan {
        name,
        class,
        points,
        record_bytes: lay.stride,
        local_bytes: lay.local_bytes,
        shared_static_bytes: sp.as_ref().map_or(0, |s| s.static_bytes),
        saves_shared: sp.is_some(),
        incremental,
        idempotence,
        restart,
    })
}

/// The strip-mined loops, one entry per site (sites sorted again): a `Thread` kernel's loop
/// points where the loop is counted; a `Cta` kernel's barrier point in a loop moves to the
/// header of its innermost loop when that loop is counted (and the carry flag is dead there).
#[allow(clippy::too_many_arguments)]
fn strip_loops(
    e: &module::StmtEntry,
    fl: &flow::Flow,
    class: Class,
    live: &flow::BitRows,
    regs: &flow::Regs,
    sites: &mut Vec<points::Site>,
    opts: &Options,
    b: &mut budget::Budget,
) -> Result<Vec<Option<strip::Strip>>, Unsupported> {
    let chunk = opts.chunk_instructions;
    let loops: Vec<(usize, usize)> = fl
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, nd)| match nd.exit {
            flow::Exit::Branch(t) if t <= i => Some((t, i)),
            _ => None,
        })
        .collect();
    let mut out: Vec<(points::Site, Option<strip::Strip>)> = Vec::with_capacity(sites.len());
    for s in sites.drain(..) {
        b.work(1 + loops.len() as u64)?;
        if chunk == 0 {
            out.push((s, None));
            continue;
        }
        match class {
            Class::Thread if s.kind == PointKind::Loop => {
                let st = strip::find(e, fl, regs, s.node, (chunk, opts.atomic_weight), false);
                out.push((s, st));
            }
            Class::Cta => {
                let header = loops
                    .iter()
                    .filter(|&&(t, i)| t <= s.node && s.node <= i)
                    .min_by_key(|&&(t, i)| i - t)
                    .map(|&(t, _)| t)
                    .filter(|&t| !flow::test(live.row(t), regs.cf()));
                match header.and_then(|t| {
                    Some((
                        t,
                        strip::find(e, fl, regs, t, (chunk, opts.atomic_weight), true)?,
                    ))
                }) {
                    Some((t, st)) => out.push((
                        points::Site {
                            node: t,
                            kind: PointKind::Loop,
                        },
                        Some(st),
                    )),
                    None => out.push((s, None)),
                }
            }
            _ => out.push((s, None)),
        }
    }
    out.sort_by_key(|(s, _)| s.node);
    // Two barrier points of one loop both moved to its header: keep one.
    out.dedup_by_key(|(s, _)| s.node);
    let (s, st): (Vec<_>, Vec<_>) = out.into_iter().unzip();
    *sites = s;
    Ok(st)
}
