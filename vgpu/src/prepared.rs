//! An engine made before its device (issue 24, "destination ready before the switch-over"): an
//! `--incoming` VM makes its GPU's engine (the cuda context, its VRAM and its own modules, or
//! the sim engine's VRAM) as soon as the migration stream's manifest names the configuration,
//! and writes each pre-copy round's VRAM pages into the partition while the rounds run; the
//! device is built on it after the switch-over (`Vgpu::with_prepared`), and the paused round
//! applies only the last dirty pages (`Vgpu::restore_live_applied`).

use std::sync::Arc;

use pgpu::EngineSnapshot;
use pgpu::sim::SimEngine;

use crate::{GpuConfig, HostRegistration, IrqSink, Vgpu, VgpuError, config, remap};

/// An engine made before its device, with its partition's VRAM zero until the caller writes it.
pub enum PreparedEngine {
    /// A sim engine (a GPU of its own; not `host=`).
    Sim(Arc<SimEngine>),
    /// A cuda engine, with its vgpud registration when shared (`host=`); it backs guest RAM.
    Cuda(Arc<dyn EngineSnapshot>, Option<Box<HostRegistration>>),
}

impl std::fmt::Debug for PreparedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PreparedEngine::Sim(_) => f.write_str("PreparedEngine::Sim"),
            PreparedEngine::Cuda(_, reg) => {
                write!(f, "PreparedEngine::Cuda(shared: {})", reg.is_some())
            }
        }
    }
}

impl PreparedEngine {
    /// The engine.
    pub fn engine(&self) -> &dyn EngineSnapshot {
        match self {
            PreparedEngine::Sim(e) => &**e,
            PreparedEngine::Cuda(e, _) => &**e,
        }
    }

    /// Writes `data` (whole pages) at byte `off` of the partition of `cfg`, checked against
    /// the partition's size.
    pub fn write_partition(&self, cfg: &GpuConfig, off: u64, data: &[u8]) -> Result<(), VgpuError> {
        let end = off.checked_add(data.len() as u64);
        if end.is_none_or(|e| e > cfg.vram) {
            return Err(VgpuError::Vram(format!(
                "{} bytes at {off:#x}: outside the {} bytes of the partition",
                data.len(),
                cfg.vram
            )));
        }
        self.engine()
            .vram_write(cfg.partition_base() + off, data)
            .map_err(|e| VgpuError::Vram(e.to_string()))
    }
}

/// Why an engine made for `prepared` cannot serve a GPU of configuration `wanted` (a
/// standby's engine and a snapshot's GPU, `vgpu-vmm --standby`): the keys the engine is made
/// from that differ, in `--gpu` syntax (`backend`, `vram`, `guard`, `mode`, `preempt`,
/// `preempt_wait_us`, the cuda engine's `ck_path`, the sim engine's `workers` and `pages`, the
/// vgpud's `host` and the
/// `channels` it registered). The
/// device's other keys (job limits, doorbell, host memory, ...) are the device's, set when it
/// is built on the engine, and may differ.
pub fn engine_misfit(prepared: &GpuConfig, wanted: &GpuConfig) -> Option<String> {
    let mut diff = Vec::new();
    let mut key = |name: &str, same: bool, p: String, w: String| {
        if !same {
            diff.push(format!("{name} (prepared {p}, the snapshot's {w})"));
        }
    };
    let (p, w) = (prepared, wanted);
    key(
        "backend",
        p.backend == w.backend,
        format!("{:?}", p.backend),
        format!("{:?}", w.backend),
    );
    key(
        "mode",
        p.mode == w.mode,
        format!("{:?}", p.mode),
        format!("{:?}", w.mode),
    );
    key("vram", p.vram == w.vram, mib(p.vram), mib(w.vram));
    key("guard", p.guard == w.guard, mib(p.guard), mib(w.guard));
    key(
        "preempt",
        p.preempt == w.preempt,
        format!("{:?}", p.preempt),
        format!("{:?}", w.preempt),
    );
    key(
        "preempt_wait_us",
        p.preempt_wait == w.preempt_wait,
        p.preempt_wait.as_micros().to_string(),
        w.preempt_wait.as_micros().to_string(),
    );
    if p.backend == config::Backend::Cuda {
        key(
            "ck_path",
            p.ck_path == w.ck_path,
            p.ck_path.to_string(),
            w.ck_path.to_string(),
        );
    }
    if p.backend == config::Backend::Sim {
        key(
            "workers",
            p.workers == w.workers,
            p.workers.to_string(),
            w.workers.to_string(),
        );
        let pages = |c: &GpuConfig| if c.sim_pages_2m_only { "2m" } else { "4k+2m" };
        key(
            "pages",
            p.sim_pages_2m_only == w.sim_pages_2m_only,
            pages(p).into(),
            pages(w).into(),
        );
    }
    key(
        "host",
        p.host == w.host,
        format!("{:?}", p.host.as_ref().map(|h| &h.socket)),
        format!("{:?}", w.host.as_ref().map(|h| &h.socket)),
    );
    if p.host.is_some() {
        key(
            "channels",
            p.channels == w.channels,
            p.channels.to_string(),
            w.channels.to_string(),
        );
    }
    (!diff.is_empty()).then(|| diff.join(", "))
}

fn mib(b: u64) -> String {
    format!("{}M", b >> 20)
}

impl Vgpu {
    /// The engine of `cfg` made now, before the device and guest RAM: a cuda engine (as
    /// [`Vgpu::cuda_engine`]), or a sim engine of its own. `None` where the engine cannot come
    /// first: a sim GPU shared through vgpud (its VRAM is the daemon's, handed over at
    /// registration) and pass-through (`mode=pt`, which is never migrated).
    pub fn prepare_engine(cfg: &GpuConfig) -> Result<Option<PreparedEngine>, VgpuError> {
        if cfg.mode == config::Mode::Pt {
            return Ok(None);
        }
        match cfg.backend {
            config::Backend::Cuda => {
                let (e, reg) = Self::cuda_engine(cfg)?;
                Ok(Some(PreparedEngine::Cuda(e, reg.map(Box::new))))
            }
            config::Backend::Sim if cfg.host.is_none() => Ok(Some(PreparedEngine::Sim(Arc::new(
                SimEngine::new(crate::sim_config(cfg))?,
            )))),
            config::Backend::Sim => Ok(None),
        }
    }

    /// A virtual GPU on a sim engine made by [`Vgpu::prepare_engine`] (as
    /// [`Vgpu::with_mapper`] otherwise). A cuda one goes through [`Vgpu::with_engine`], which
    /// also takes the host regions backing guest RAM.
    pub fn with_prepared_sim(
        cfg: GpuConfig,
        engine: Arc<SimEngine>,
        ram: vm_memory::GuestMemoryMmap,
        irq: Arc<dyn IrqSink>,
        mapper: Option<Arc<dyn remap::ApertureMapper>>,
    ) -> Result<Self, VgpuError> {
        if cfg.host.is_some() {
            return Err(VgpuError::Vram(
                "a sim GPU shared through vgpud takes the daemon's VRAM, not a prepared engine"
                    .into(),
            ));
        }
        Self::build(cfg, None, Some(engine), ram, irq, mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_sim_engine_takes_writes_inside_its_partition_only() {
        let cfg = GpuConfig::parse("vram=8M").unwrap();
        let p = Vgpu::prepare_engine(&cfg).unwrap().expect("a sim engine");
        let page = vec![0xabu8; 4096];
        p.write_partition(&cfg, 4096, &page).unwrap();
        let mut back = vec![0u8; 4096];
        p.engine()
            .vram_read(cfg.partition_base() + 4096, &mut back)
            .unwrap();
        assert_eq!(back, page);
        // Hostile offsets: past the end, wrapping.
        let e = p.write_partition(&cfg, cfg.vram, &page).unwrap_err();
        assert!(e.to_string().contains("outside the"), "{e}");
        assert!(p.write_partition(&cfg, u64::MAX - 10, &page).is_err());
        // Shared sim GPUs and pass-through get none.
        let shared = GpuConfig::parse("vram=8M,host=/nonexistent.sock").unwrap();
        assert!(Vgpu::prepare_engine(&shared).unwrap().is_none());
    }

    #[test]
    fn an_engine_fits_only_the_configurations_it_is_made_from() {
        let p = GpuConfig::parse("vram=64M,backend=cuda").unwrap();
        // The device's keys may differ.
        let w = GpuConfig::parse("vram=64M,backend=cuda,timeout_ms=900,doorbell=mmio").unwrap();
        assert_eq!(engine_misfit(&p, &w), None);
        let w = GpuConfig::parse("vram=128M").unwrap();
        let why = engine_misfit(&p, &w).unwrap();
        assert!(
            why.contains("backend") && why.contains("vram (prepared 64M, the snapshot's 128M)"),
            "{why}"
        );
        let s = GpuConfig::parse("vram=64M,pages=2m").unwrap();
        let why = engine_misfit(&s, &GpuConfig::parse("vram=64M").unwrap()).unwrap();
        assert!(why.starts_with("pages"), "{why}");
        let a = GpuConfig::parse("vram=64M,preempt=auto,preempt_wait_us=0").unwrap();
        let why = engine_misfit(&a, &GpuConfig::parse("vram=64M,preempt=auto").unwrap()).unwrap();
        assert!(
            why.contains("preempt_wait_us (prepared 0, the snapshot's 40)"),
            "{why}"
        );
        // A standby of today's default against a snapshot of a build before it (no ck_path).
        let c = GpuConfig::parse("vram=64M,backend=cuda,preempt=auto").unwrap();
        let w = GpuConfig::parse_written("vram=64M,backend=cuda,preempt=auto").unwrap();
        let why = engine_misfit(&c, &w).unwrap();
        assert_eq!(why, "ck_path (prepared adaptive, the snapshot's fixed)");
        assert_eq!(
            engine_misfit(&c, &GpuConfig::parse_written(&c.spec()).unwrap()),
            None
        );
        // The sim engine has no request path: not a misfit there.
        let s = GpuConfig::parse("vram=64M,ck_path=fixed").unwrap();
        assert_eq!(
            engine_misfit(&s, &GpuConfig::parse("vram=64M").unwrap()),
            None
        );
    }
}
