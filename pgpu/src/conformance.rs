//! Conformance checks every `Engine` must pass, written against the trait only, so that the sim
//! engine and the cuda engine are held to the same contract. Each check returns a message
//! naming what broke instead of panicking; `tests/conformance.rs` runs them on the sim engine,
//! `tests/cuda.rs` on the cuda engine. Page sizes follow `info().page_sizes` (the largest page is
//! the unit). Two properties of a real GPU are declared in [`Setup`] rather than assumed: spaces
//! of one process share one VA space (their windows must not overlap) and a kernel fault loses
//! the whole context ([`check_fatal_kernel_fault`] checks that such an engine refuses further
//! work instead).

use std::time::Duration;

use crate::engine::*;

/// A kernel that stores each thread's global index: `out[i] = i` for `i < n`.
const FILL_PTX: &str = r#"
.version 7.8
.target sm_80
.address_size 64

.visible .entry fill(
	.param .u64 fill_param_0,
	.param .u32 fill_param_1
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<5>;

	ld.param.u64 	%rd1, [fill_param_0];
	ld.param.u32 	%r2, [fill_param_1];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	mov.u32 	%r5, %tid.x;
	mad.lo.s32 	%r1, %r3, %r4, %r5;
	setp.ge.u32 	%p1, %r1, %r2;
	@%p1 bra 	$L__done;
	cvta.to.global.u64 	%rd2, %rd1;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r1;
$L__done:
	ret;
}
"#;

/// Elements the fill kernel writes in the checks.
const N: u32 = 4096;

fn ensure(ok: bool, what: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what.to_string()) }
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// What the checks need from the caller: a VA window the engine accepts (a cuda engine can only
/// reserve some addresses) and VRAM of at least four of the engine's largest pages.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// Window base for the spaces the checks create.
    pub window_base: u64,
    /// Window size (0: eight of the engine's largest pages). CUDA honours the address of a VA
    /// reservation only for large ones (1 GiB came back exact, 16 MiB did not).
    pub window_size: u64,
    /// Spaces alive at the same time get disjoint windows (`window_base + i * 8 pages`), for
    /// engines whose spaces share one VA space (cuda: one context per process). When false
    /// (sim), they get the same window, which also checks that spaces are independent.
    pub distinct_windows: bool,
    /// A kernel fault loses the engine (cuda: sticky errors poison the context): the fault part
    /// of "kernels and faults" is left to [`check_fatal_kernel_fault`], run last (or in a child
    /// process).
    pub fatal_kernel_faults: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            window_base: 0x4_0200_0000,
            window_size: 0,
            distinct_windows: false,
            fatal_kernel_faults: false,
        }
    }
}

/// One named check.
type Check = fn(&Ctx) -> Result<(), String>;

struct Ctx<'a> {
    e: &'a dyn Engine,
    page: PageSize,
    window: VaWindow,
    setup: Setup,
}

impl Ctx<'_> {
    /// The window of the `i`-th space alive at once.
    fn window(&self, i: u64) -> VaWindow {
        if self.setup.distinct_windows {
            VaWindow {
                base: self.window.base + i * self.window.size,
                size: self.window.size,
            }
        } else {
            self.window
        }
    }

    /// A space (the `i`-th alive at once) with its first page mapped to `pa`; returns its base.
    fn space_at(&self, i: u64, pa: u64, perm: Perm) -> Result<(SpaceId, u64), String> {
        let w = self.window(i);
        let s = self.e.create_space(w).map_err(err("create_space"))?;
        let m = Mapping {
            va: w.base,
            len: self.page.bytes(),
            target: MapTarget::Vram { pa },
            perm,
            page_size: self.page,
        };
        self.e.map(s, &m).map_err(err("map"))?;
        Ok((s, w.base))
    }

    fn space_with(&self, pa: u64, perm: Perm) -> Result<SpaceId, String> {
        let s = self
            .e
            .create_space(self.window)
            .map_err(err("create_space"))?;
        let m = Mapping {
            va: self.window.base,
            len: self.page.bytes(),
            target: MapTarget::Vram { pa },
            perm,
            page_size: self.page,
        };
        self.e.map(s, &m).map_err(err("map"))?;
        Ok(s)
    }

    fn fill_job(&self, space: SpaceId, module: ModuleId, out: u64) -> Job {
        let mut params = out.to_le_bytes().to_vec();
        params.extend_from_slice(&N.to_le_bytes());
        Job::Launch(LaunchJob {
            space,
            module,
            entry: "fill".into(),
            grid: [N / 128, 1, 1],
            block: [128, 1, 1],
            dynamic_shared: 0,
            params,
        })
    }

    fn filled(&self, space: SpaceId, out: u64) -> Result<bool, String> {
        let mut b = vec![0u8; N as usize * 4];
        self.e
            .copy_from_space(space, out, &mut b)
            .map_err(err("copy_from_space"))?;
        Ok(b.chunks(4)
            .enumerate()
            .all(|(i, w)| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) == i as u32))
    }
}

/// Runs every check; returns how many passed, or the first failure.
pub fn check_engine(e: &dyn Engine, setup: Setup) -> Result<usize, String> {
    let info = e.info();
    ensure(!info.page_sizes.is_empty(), "no page size")?;
    ensure(
        info.page_sizes.windows(2).all(|w| w[0] < w[1]),
        "page sizes not sorted",
    )?;
    let page = info.largest_page();
    ensure(
        info.vram_size >= 4 * page.bytes(),
        "VRAM smaller than four large pages",
    )?;
    let c = Ctx {
        e,
        page,
        window: VaWindow {
            base: setup.window_base,
            size: if setup.window_size == 0 {
                8 * page.bytes()
            } else {
                setup.window_size
            },
        },
        setup,
    };
    let checks: [(&str, Check); 7] = [
        ("windows", windows),
        ("mappings", mappings),
        ("host copies", host_copies),
        ("kernels and faults", kernels_and_faults),
        ("preempt and resume", preempt_and_resume),
        ("module errors", module_errors),
        ("copy jobs", copy_jobs),
    ];
    for (name, check) in checks {
        check(&c).map_err(|m| format!("{name}: {m}"))?;
    }
    Ok(checks.len())
}

fn windows(c: &Ctx) -> Result<(), String> {
    let p = c.page.bytes();
    let bad = [
        VaWindow {
            base: c.window.base + 4096,
            size: p,
        },
        VaWindow {
            base: c.window.base,
            size: 0,
        },
    ];
    for w in bad {
        ensure(
            matches!(c.e.create_space(w), Err(EngineError::BadWindow { .. })),
            "bad window accepted",
        )?;
    }
    let s = c.e.create_space(c.window).map_err(err("create_space"))?;
    c.e.destroy_space(s).map_err(err("destroy_space"))?;
    ensure(
        c.e.destroy_space(s) == Err(EngineError::UnknownSpace(s)),
        "destroyed twice",
    )
}

fn mappings(c: &Ctx) -> Result<(), String> {
    let (e, p, base) = (c.e, c.page.bytes(), c.window.base);
    let s = c.space_with(p, Perm::ReadWrite)?;
    let t = e.lookup(s, base + 5).map_err(err("lookup"))?;
    ensure(
        t.map(|t| t.target) == Some(MapTarget::Vram { pa: p + 5 }),
        "lookup target",
    )?;
    let m = |va, pa| Mapping {
        va,
        len: p,
        target: MapTarget::Vram { pa },
        perm: Perm::ReadWrite,
        page_size: c.page,
    };
    let overlap = e.map(s, &m(base, 0));
    ensure(
        matches!(overlap, Err(EngineError::BadMapping(MapError::Overlap(_)))),
        "overlap accepted",
    )?;
    let outside = e.map(s, &m(base + c.window.size, 0));
    ensure(
        matches!(
            outside,
            Err(EngineError::BadMapping(MapError::OutOfWindow { .. }))
        ),
        "out-of-window map accepted",
    )?;
    let beyond = e.map(s, &m(base + p, e.info().vram_size));
    ensure(
        matches!(
            beyond,
            Err(EngineError::BadMapping(MapError::TargetRange { .. }))
        ),
        "PA outside VRAM accepted",
    )?;
    let batch = e.map_batch(s, &[m(base + p, 0), m(base, 0)]);
    ensure(
        matches!(batch, Err(EngineError::BatchEntry { index: 1, .. })),
        "bad batch accepted",
    )?;
    ensure(
        e.lookup(s, base + p).map_err(err("lookup"))?.is_none(),
        "failed batch left a mapping",
    )?;
    ensure(e.unmap(s, base, p) == Ok(p), "unmap count")?;
    ensure(
        e.lookup(s, base).map_err(err("lookup"))?.is_none(),
        "unmapped page still there",
    )?;
    e.destroy_space(s).map_err(err("destroy_space"))
}

fn host_copies(c: &Ctx) -> Result<(), String> {
    let e = c.e;
    let (s, base) = c.space_at(0, 0, Perm::ReadWrite)?;
    e.copy_to_space(s, base + 100, b"round trip")
        .map_err(err("copy_to_space"))?;
    let mut b = [0u8; 10];
    e.vram_read(100, &mut b).map_err(err("vram_read"))?;
    ensure(&b == b"round trip", "vram_read after copy_to_space")?;
    let unmapped = base + c.page.bytes();
    match e.copy_from_space(s, unmapped, &mut b) {
        Err(EngineError::CopyFault(f)) => ensure(
            f.kind == FaultKind::Unmapped && f.va == unmapped && f.access == Some(AccessKind::Read),
            "copy fault fields",
        )?,
        other => return Err(format!("copy from unmapped: {other:?}")),
    }
    let (ro, ro_base) = c.space_at(1, 0, Perm::ReadOnly)?;
    let w = e.copy_to_space(ro, ro_base, b"x");
    ensure(
        matches!(
            w,
            Err(EngineError::CopyFault(JobFault {
                kind: FaultKind::ReadOnly,
                ..
            }))
        ),
        "write to read-only",
    )?;
    e.destroy_space(ro).map_err(err("destroy_space"))?;
    e.destroy_space(s).map_err(err("destroy_space"))
}

fn kernels_and_faults(c: &Ctx) -> Result<(), String> {
    let (e, p) = (c.e, c.page.bytes());
    let module = e
        .load_module(FILL_PTX, &crate::LoadLimits::default())
        .map(|m| m.id)
        .map_err(err("load_module"))?;
    let (a, abase) = c.space_at(0, 0, Perm::ReadWrite)?;
    let (b, bbase) = c.space_at(1, p, Perm::ReadWrite)?;
    let h = PreemptHandle::new();
    if !c.setup.fatal_kernel_faults {
        // Space a writes past its single page: a typed fault, nothing else affected.
        let bad = c.fill_job(a, module, abase + p - 4 * u64::from(N) / 2);
        match e.execute(&bad, &h).map_err(err("execute"))? {
            Outcome::Faulted { fault, .. } => ensure(
                fault.kind == FaultKind::Unmapped
                    && fault.access == Some(AccessKind::Write)
                    && fault.va >= abase + p,
                "kernel fault fields",
            )?,
            other => return Err(format!("overrunning kernel: {other:?}")),
        }
    }
    let out = e
        .execute(&c.fill_job(b, module, bbase), &h)
        .map_err(err("execute"))?;
    ensure(
        matches!(out, Outcome::Completed { .. }),
        "kernel in the other space",
    )?;
    ensure(c.filled(b, bbase)?, "kernel output in the other space")?;
    let out = e
        .execute(&c.fill_job(a, module, abase), &h)
        .map_err(err("execute"))?;
    ensure(
        matches!(out, Outcome::Completed { .. }),
        "kernel after a fault",
    )?;
    ensure(c.filled(a, abase)?, "kernel output after a fault")?;
    for s in [a, b] {
        e.destroy_space(s).map_err(err("destroy_space"))?;
    }
    e.unload_module(module).map_err(err("unload_module"))
}

fn preempt_and_resume(c: &Ctx) -> Result<(), String> {
    let (e, base) = (c.e, c.window.base);
    let module = e
        .load_module(FILL_PTX, &crate::LoadLimits::default())
        .map(|m| m.id)
        .map_err(err("load_module"))?;
    for through_bytes in [false, true] {
        let s = c.space_with(0, Perm::ReadWrite)?;
        e.copy_to_space(s, base, &vec![0xff; N as usize * 4])
            .map_err(err("copy_to_space"))?;
        let h = PreemptHandle::new();
        h.request();
        let out = e
            .execute(&c.fill_job(s, module, base), &h)
            .map_err(err("execute"))?;
        let Outcome::Preempted { context, .. } = out else {
            return Err(format!("requested before start, got {out:?}"));
        };
        ensure(
            matches!(
                e.map(
                    s,
                    &Mapping {
                        va: base + c.page.bytes(),
                        len: c.page.bytes(),
                        target: MapTarget::Vram { pa: 0 },
                        perm: Perm::ReadOnly,
                        page_size: c.page
                    }
                ),
                Ok(())
            ),
            "map while preempted (not running)",
        )?;
        h.clear();
        let ctx = if through_bytes {
            SavedContext::from_bytes(context.into_bytes())
        } else {
            context
        };
        let out = e.resume(ctx, &h).map_err(err("resume"))?;
        ensure(
            matches!(out, Outcome::Completed { .. }),
            "resumed job completes",
        )?;
        ensure(out.gpu_time() > Duration::ZERO, "gpu time reported")?;
        ensure(c.filled(s, base)?, "resumed kernel output")?;
        e.destroy_space(s).map_err(err("destroy_space"))?;
    }
    e.unload_module(module).map_err(err("unload_module"))
}

fn module_errors(c: &Ctx) -> Result<(), String> {
    match c
        .e
        .load_module(
            ".version 7.8\n.target sm_80\n.address_size 64\nnot ptx;\n",
            &crate::LoadLimits::default(),
        )
        .map(|m| m.id)
    {
        Err(EngineError::ModuleLoad { log }) => ensure(!log.is_empty(), "empty load log"),
        other => Err(format!("garbage PTX: {other:?}")),
    }
}

fn copy_jobs(c: &Ctx) -> Result<(), String> {
    let (e, base) = (c.e, c.window.base);
    let s = c.space_with(0, Perm::ReadWrite)?;
    e.copy_to_space(s, base, b"copy engine")
        .map_err(err("copy_to_space"))?;
    let job = Job::Copy(CopyJob {
        space: s,
        src: base,
        dst: base + 4096,
        len: 11,
    });
    let out = e
        .execute(&job, &PreemptHandle::new())
        .map_err(err("execute"))?;
    ensure(
        matches!(out, Outcome::Completed { .. }),
        "copy job completes",
    )?;
    let mut b = [0u8; 11];
    e.copy_from_space(s, base + 4096, &mut b)
        .map_err(err("copy_from_space"))?;
    ensure(&b == b"copy engine", "copy job result")?;
    let bad = Job::Copy(CopyJob {
        space: s,
        src: base,
        dst: base + c.page.bytes(),
        len: 1,
    });
    let out = e
        .execute(&bad, &PreemptHandle::new())
        .map_err(err("execute"))?;
    ensure(
        matches!(
            out,
            Outcome::Faulted {
                fault: JobFault {
                    kind: FaultKind::Unmapped,
                    ..
                },
                ..
            }
        ),
        "copy job fault",
    )?;
    e.destroy_space(s).map_err(err("destroy_space"))
}

/// For engines with [`Setup::fatal_kernel_faults`]: a kernel that writes past its mapping ends
/// with `Outcome::Faulted` (`FaultKind::Kernel`), after which the engine refuses further work
/// with an error (no silent wrong results). Leaves the engine unusable: run it last or in a
/// process of its own.
pub fn check_fatal_kernel_fault(e: &dyn Engine, setup: Setup) -> Result<(), String> {
    let page = e.info().largest_page();
    let c = Ctx {
        e,
        page,
        window: VaWindow {
            base: setup.window_base,
            size: if setup.window_size == 0 {
                8 * page.bytes()
            } else {
                setup.window_size
            },
        },
        setup,
    };
    let p = page.bytes();
    let module = e
        .load_module(FILL_PTX, &crate::LoadLimits::default())
        .map(|m| m.id)
        .map_err(err("load_module"))?;
    let (a, abase) = c.space_at(0, 0, Perm::ReadWrite)?;
    let h = PreemptHandle::new();
    // The whole grid writes past the page (an overrun of a few KiB could land in the 2 MiB
    // granule the driver rounds up to on some GPUs).
    let job = c.fill_job(a, module, abase + p + (p / 2));
    match e.execute(&job, &h).map_err(err("execute"))? {
        Outcome::Faulted { fault, .. } => ensure(
            matches!(fault.kind, FaultKind::Kernel(_)),
            "fault kind of a lost context",
        )?,
        other => return Err(format!("overrunning kernel: {other:?}")),
    }
    let again = e.execute(&c.fill_job(a, module, abase), &h);
    ensure(
        matches!(again, Err(EngineError::Backend(_))),
        "work accepted after a fatal fault",
    )?;
    let w = c.window(1);
    ensure(
        e.create_space(w).is_err(),
        "space created after a fatal fault",
    )
}
