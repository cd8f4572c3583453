//! `--gpu key=value,...`: the virtual GPU's runtime configuration.

pub mod keys;

use std::time::Duration;

/// How the guest drives the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Full virtualization: every BAR access traps; shadows rebuilt at TLB flush.
    Full,
    /// Para-virtualization: the guest changes its GPU address space with hypercalls (BAR3),
    /// validated once at map time; no guest page tables are walked.
    Para,
    /// Pass-through-like baseline (`mode=pt`), a **trusted guest with no isolation**: one VM
    /// per GPU, its partition at physical VRAM 0 (guest VRAM address = device address), the
    /// whole VRAM aperture mapped into the guest where the backend allows it (sim), no watching
    /// or trapping of page-table and instance pages, no guard below the partition. The guest's
    /// tables are still read into the engine's MMU at the first run after a TLB flush (no engine
    /// here walks the guest's format itself). Refused with `host=` and by snapshots.
    /// docs/architecture.md, "Pass-through baseline".
    Pt,
}

/// The physical GPU behind the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The built-in software GPU.
    Sim,
    /// An NVIDIA GPU through the CUDA driver API (`pgpu::cuda`): 2 MiB pages, no BAR remap,
    /// guest RAM allocated by the engine (the VMM asks `Vgpu::cuda_engine` first).
    Cuda,
}

/// How the guest rings doorbells (`doorbell=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doorbell {
    /// Only the trapped `GP_PUT[n]` registers (CAPS bit 5 clear).
    Mmio,
    /// The doorbell page too (CAPS bit 5): the worker polls it for `spin` after activity.
    Poll,
}

/// Configuration of one virtual GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuConfig {
    pub mode: Mode,
    pub backend: Backend,
    /// Guest VRAM in bytes (power of two, 2 MiB … 64 GiB).
    pub vram: u64,
    /// Channels the guest may use (1 … 32).
    pub channels: u32,
    /// Per-job time limit (loading the job's module included); work running longer is stopped
    /// with a TIMEOUT fault.
    pub job_timeout: Duration,
    /// Host memory the device may hold for the guest around its GPU work (`hostmem=`): loaded
    /// modules and their variables, module caches, shadow page tables. See `budget`.
    pub hostmem: u64,
    /// GPU VA window.
    pub va_base: u64,
    pub va_size: u64,
    /// Worker threads of the software GPU.
    pub workers: usize,
    /// Lazy shadowing: a TLB flush only marks the shadows stale; a stale shadow is brought up
    /// to date (by difference) when a channel using it next runs. Off (`opt=none`): every flush
    /// rebuilds every shadow from scratch at once, as GPUvm's naive full virtualization does.
    pub lazy_shadowing: bool,
    /// BAR remap: the VRAM aperture is mapped straight into the guest (memory slots), except
    /// pages holding instance blocks and page tables, which keep trapping (`opt=remap|all`).
    pub bar_remap: bool,
    /// Bytes of physical VRAM below and above the VM's partition (and of a host buffer that is
    /// not guest RAM) filled with a sentinel pattern and checked at exit: a host-side proof that
    /// nothing the guest did reached memory outside its partition.
    pub guard: u64,
    /// Page sizes of the sim engine (`pages=4k+2m`, default, or `pages=2m`: the 2 MiB-only
    /// GPU a cuda backend is, so the guest driver's big-page path can be exercised anywhere).
    pub sim_pages_2m_only: bool,
    /// How the engine preempts kernels (`preempt=slice|checkpoint|restart|auto`; default
    /// slice: the sim interpreter stops between instructions, cuda runs sliced sub-launches;
    /// checkpoint: compiler-directed checkpoints; restart and auto: `pgpu::PreemptMethod`).
    pub preempt: pgpu::PreemptMethod,
    /// `preempt=auto`'s wait budget (`preempt_wait_us=`, default
    /// `pgpu::ckwait::DEFAULT_WAIT_BUDGET`, 0: never wait): `pgpu::ckwait`.
    pub preempt_wait: Duration,
    /// cuda: how each checkpointed kernel run's preemption request path is chosen
    /// (`ck_path=fixed|adaptive|adaptive:US`, default adaptive): `pgpu::cuda::CkPathChoice`.
    pub ck_path: pgpu::cuda::CkPathChoice,
    /// cuda: bytes of each bulk staging slot made when the engine is (`copy_slots=`, 0: none,
    /// the default): `pgpu::cuda::CudaConfig::bulk_slot_bytes`.
    pub copy_slots: u64,
    /// Share a GPU owned by `vgpud` (`host=SOCKET`); `None`: this VM owns its GPU alone.
    pub host: Option<crate::host::HostConfig>,
    /// Doorbells: trapped registers only, or the polled doorbell page as well (`doorbell=`).
    pub doorbell: Doorbell,
    /// How long the worker keeps polling the doorbell page after its last activity before it
    /// sleeps and asks the guest to ring the trapped register (`spin_us=`, 0 … 10000, default
    /// [`default_spin`]): the CPU time polling may spend per idle period.
    pub spin: Duration,
    /// Stop polling early when a yield between two looks lost the core (another thread needed
    /// it: a poller competes with the vCPUs there, a sleeper is woken at once): `backoff=on`,
    /// the default; `off` polls for the whole `spin` regardless (a host with a core to spare
    /// per worker, tests).
    pub spin_backoff: bool,
    /// The worker reads GPFIFO entries, pushbuffers, launch data and semaphores that live in
    /// guest RAM straight from it, not through the engine (`direct=on|off`).
    pub direct: bool,
    /// Live snapshots track what the GPU writes with per-job write sets from the kernels' PTX
    /// even where the engine keeps an exact dirty log (`dirtylog=writesets`; default
    /// `engine`: the engine's log, write sets only where it has none). Not guest-visible.
    pub dirty_writesets: bool,
}

/// The default `spin_us=`: 1000 µs on a host with at least 4 CPUs; 0 on smaller ones, where
/// a polling worker takes a core from the vCPUs (and from the sim engine's threads): measured
/// on a 2-CPU host, polling there cost more throughput than the exits it saved.
pub fn default_spin() -> Duration {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    Duration::from_micros(if cpus >= 4 { 1000 } else { 0 })
}

/// Largest `spin_us=`.
pub const SPIN_US_MAX: u64 = 10_000;

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            mode: Mode::Full,
            backend: Backend::Sim,
            vram: 256 << 20,
            channels: 8,
            job_timeout: Duration::from_secs(2),
            hostmem: 256 << 20,
            va_base: 0x10_0000_0000,
            va_size: 4 << 30,
            workers: 1,
            lazy_shadowing: true,
            bar_remap: true,
            guard: 2 << 20,
            sim_pages_2m_only: false,
            preempt: pgpu::PreemptMethod::Slice,
            preempt_wait: pgpu::ckwait::DEFAULT_WAIT_BUDGET,
            ck_path: pgpu::cuda::DEFAULT_CK_PATH,
            copy_slots: 0,
            host: None,
            doorbell: Doorbell::Poll,
            spin: default_spin(),
            direct: true,
            spin_backoff: true,
            dirty_writesets: false,
        }
    }
}

impl GpuConfig {
    /// Physical VRAM address of guest VRAM address 0: after the lower guard area, or 0 in
    /// `mode=pt` (guest VRAM address = device address).
    pub fn partition_base(&self) -> u64 {
        match self.mode {
            Mode::Pt => 0,
            Mode::Full | Mode::Para => self.guard,
        }
    }

    /// Physical VRAM the engine needs: the partition and the guard areas around it (only the
    /// one above it in `mode=pt`).
    pub fn physical_vram(&self) -> u64 {
        self.partition_base() + self.vram + self.guard
    }
}

/// Smallest `hostmem=`: room for a few modules and shadows of the default VA window.
pub const HOSTMEM_MIN: u64 = 16 << 20;
/// Largest `hostmem=`.
pub const HOSTMEM_MAX: u64 = 64 << 30;

/// Errors in a `--gpu` option string.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--gpu: unknown key {0:?} (known: {known})", known = keys::names())]
    UnknownKey(String),
    #[error("--gpu: {0}")]
    Syntax(#[from] vgpu_proto::units::SyntaxError),
    #[error("--gpu: {key}={value}: {why}")]
    BadValue {
        key: String,
        value: String,
        why: &'static str,
    },
}

impl GpuConfig {
    /// Parses `key=value,...` (an empty string gives the defaults); the keys are [`keys::KEYS`].
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut d = keys::Draft::default();
        for item in vgpu_proto::units::pairs(s) {
            let (key, value) = item?;
            let k = keys::find(key).ok_or_else(|| ConfigError::UnknownKey(key.into()))?;
            k.set(&mut d, value).map_err(|why| ConfigError::BadValue {
                key: key.into(),
                value: value.into(),
                why,
            })?;
        }
        let keys::Draft {
            cfg: mut c,
            weight,
            priority,
            name,
            reconnect,
            gpu,
            nice,
            rt,
            slice_us,
            cpus,
        } = d;
        match &mut c.host {
            Some(h) => {
                h.weight = weight.unwrap_or(h.weight);
                h.priority = priority.unwrap_or(h.priority);
                h.name = name.unwrap_or(std::mem::take(&mut h.name));
                h.reconnect = reconnect.unwrap_or(h.reconnect);
                h.gpu = gpu.or(h.gpu);
                h.nice = nice.unwrap_or(h.nice);
                h.rt = rt.unwrap_or(h.rt);
                h.slice_us = slice_us.unwrap_or(h.slice_us);
                h.cpus = cpus.or(h.cpus);
            }
            None if weight.is_some()
                || priority.is_some()
                || name.is_some()
                || reconnect.is_some()
                || gpu.is_some()
                || nice.is_some()
                || rt.is_some()
                || slice_us.is_some()
                || cpus.is_some() =>
            {
                return Err(ConfigError::BadValue {
                    key: "weight/priority/name/reconnect_ms/gpu/nice/rt/slice_us/cpus".into(),
                    value: String::new(),
                    why: "only with host=SOCKET",
                });
            }
            None => {}
        }
        if c.backend != Backend::Cuda {
            // The sim engine has no request path (the key is not written for it).
            c.ck_path = pgpu::cuda::DEFAULT_CK_PATH;
            c.copy_slots = 0;
        }
        if c.mode == Mode::Pt && c.host.is_some() {
            return Err(ConfigError::BadValue {
                key: "mode".into(),
                value: "pt".into(),
                why: "a pass-through GPU belongs to one VM: not with host= (vgpud sharing)",
            });
        }
        Ok(c)
    }

    /// A configuration [`GpuConfig::spec`] wrote (a snapshot manifest's `gpu`, perhaps of an
    /// older build): as [`GpuConfig::parse`], but a newer key the text leaves out means what
    /// its omission meant when it was written (`ck_path` left out: `fixed`), not today's
    /// default.
    pub fn parse_written(s: &str) -> Result<Self, ConfigError> {
        let c = Self::parse(s)?;
        keys::apply_omitted(c, s).map_err(|why| ConfigError::BadValue {
            key: "gpu".into(),
            value: s.into(),
            why,
        })
    }

    /// This configuration in `--gpu` syntax, every key that applies written out
    /// ([`keys::spec`]); [`GpuConfig::parse_written`] gives it back.
    pub fn spec(&self) -> String {
        keys::spec(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options_and_rejects_bad_ones() {
        assert_eq!(GpuConfig::parse("").unwrap(), GpuConfig::default());
        let c =
            GpuConfig::parse("mode=full,vram=64M,backend=sim,channels=4,timeout_ms=500").unwrap();
        assert_eq!(
            (c.vram, c.channels, c.job_timeout),
            (64 << 20, 4, Duration::from_millis(500))
        );
        assert!(matches!(
            GpuConfig::parse("vram=3M"),
            Err(ConfigError::BadValue { .. })
        ));
        assert!(matches!(
            GpuConfig::parse("vram=1G0"),
            Err(ConfigError::BadValue { .. })
        ));
        assert_eq!(GpuConfig::default().hostmem, 256 << 20);
        assert_eq!(
            GpuConfig::parse("preempt=checkpoint").unwrap().preempt,
            pgpu::PreemptMethod::Checkpoint
        );
        assert_eq!(GpuConfig::default().preempt, pgpu::PreemptMethod::Slice);
        assert_eq!(
            GpuConfig::parse("preempt=auto,preempt_wait_us=0")
                .unwrap()
                .preempt_wait,
            std::time::Duration::ZERO
        );
        assert!(matches!(
            GpuConfig::parse("preempt_wait_us=100001"),
            Err(ConfigError::BadValue { .. })
        ));
        assert_eq!(
            GpuConfig::parse("backend=cuda,preempt=auto,ck_path=adaptive")
                .unwrap()
                .ck_path,
            pgpu::cuda::CkPathChoice::adaptive()
        );
        assert_eq!(
            GpuConfig::parse("backend=cuda,ck_path=adaptive:250")
                .unwrap()
                .ck_path,
            pgpu::cuda::CkPathChoice::Adaptive {
                fast_from: Duration::from_micros(250)
            }
        );
        assert_eq!(
            GpuConfig::default().ck_path,
            pgpu::cuda::CkPathChoice::adaptive()
        );
        for bad in [
            "ck_path=fast",
            "ck_path=adaptive:",
            "ck_path=adaptive:1ms",
            "ck_path=adaptive:10000001",
            "ck_path=fixed:3",
        ] {
            let e = GpuConfig::parse(bad).unwrap_err();
            assert!(matches!(e, ConfigError::BadValue { .. }), "{bad}");
            assert!(
                e.to_string().contains("fixed, adaptive or adaptive:US"),
                "{e}"
            );
        }
        assert!(matches!(
            GpuConfig::parse("preempt=never"),
            Err(ConfigError::BadValue { .. })
        ));
        // copy_slots: cuda only, written back when set, bounded.
        let c = GpuConfig::parse("backend=cuda,copy_slots=64M").unwrap();
        assert_eq!(c.copy_slots, 64 << 20);
        assert!(c.spec().contains("copy_slots=65536K"), "{}", c.spec());
        assert_eq!(GpuConfig::parse(&c.spec()).unwrap().copy_slots, 64 << 20);
        assert_eq!(GpuConfig::parse("copy_slots=8M").unwrap().copy_slots, 0);
        assert!(
            !GpuConfig::parse("copy_slots=2M")
                .unwrap()
                .spec()
                .contains("copy_slots")
        );
        assert!(
            !GpuConfig::parse("backend=cuda")
                .unwrap()
                .spec()
                .contains("copy_slots")
        );
        for bad in [
            "copy_slots=128M",
            "copy_slots=512K",
            "copy_slots=3M",
            "copy_slots=x",
        ] {
            assert!(
                matches!(
                    GpuConfig::parse(&format!("backend=cuda,{bad}")),
                    Err(ConfigError::BadValue { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(GpuConfig::parse("hostmem=1G").unwrap().hostmem, 1 << 30);
        for bad in ["hostmem=8M", "hostmem=65G", "hostmem=lots"] {
            assert!(
                matches!(GpuConfig::parse(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            GpuConfig::parse("channels=0"),
            Err(ConfigError::BadValue { .. })
        ));
        assert_eq!(GpuConfig::parse("mode=para").unwrap().mode, Mode::Para);
        assert_eq!(GpuConfig::parse("mode=pt").unwrap().mode, Mode::Pt);
        let e = GpuConfig::parse("mode=pt,host=/run/g.sock").unwrap_err();
        assert!(e.to_string().contains("not with host="), "{e}");
        assert!(GpuConfig::parse("host=/run/g.sock,mode=pt").is_err());
        // The partition: after the lower guard, or at physical 0 in pt (guard above only).
        let full = GpuConfig::parse("vram=64M").unwrap();
        assert_eq!(
            (full.partition_base(), full.physical_vram()),
            (2 << 20, 68 << 20)
        );
        let pt = GpuConfig::parse("mode=pt,vram=64M").unwrap();
        assert_eq!((pt.partition_base(), pt.physical_vram()), (0, 66 << 20));
        assert!(matches!(
            GpuConfig::parse("mode=pv"),
            Err(ConfigError::BadValue { .. })
        ));
        assert_eq!(
            GpuConfig::parse("color=red"),
            Err(ConfigError::UnknownKey("color".into()))
        );
        let opt = |v: &str| {
            let c = GpuConfig::parse(&format!("opt={v}")).unwrap();
            (c.lazy_shadowing, c.bar_remap)
        };
        assert_eq!(
            [opt("none"), opt("lazy"), opt("remap"), opt("all")],
            [(false, false), (true, false), (false, true), (true, true)]
        );
        let c = GpuConfig::parse("doorbell=mmio,spin_us=20").unwrap();
        assert_eq!(
            (c.doorbell, c.spin),
            (Doorbell::Mmio, Duration::from_micros(20))
        );
        assert_eq!(GpuConfig::default().doorbell, Doorbell::Poll);
        assert!(!GpuConfig::parse("direct=off").unwrap().direct);
        assert!(!GpuConfig::parse("backoff=off").unwrap().spin_backoff);
        for bad in [
            "doorbell=ring",
            "spin_us=10001",
            "spin_us=-1",
            "direct=maybe",
        ] {
            assert!(
                matches!(GpuConfig::parse(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            GpuConfig::parse("opt=fast"),
            Err(ConfigError::BadValue { .. })
        ));
        let h = GpuConfig::parse("host=/run/g.sock,weight=4,priority=2,name=a1")
            .unwrap()
            .host
            .unwrap();
        assert_eq!(
            (h.socket.to_str(), h.weight, h.priority, h.name.as_str()),
            (Some("/run/g.sock"), 4, 2, "a1")
        );
        for bad in [
            "weight=2",
            "host=",
            "host=s,weight=0",
            "host=s,name=a b",
            "host=s,priority=256",
        ] {
            assert!(
                matches!(GpuConfig::parse(bad), Err(ConfigError::BadValue { .. })),
                "{bad}"
            );
        }
    }

    /// Every key: each value it takes parses, prints back the same, and parses again to the
    /// same configuration (parse → print → parse); the whole configuration too.
    #[test]
    fn every_key_round_trips() {
        // Sample values of the keys whose values are not a list of choices.
        let samples: &[(&str, &[&str])] = &[
            ("vram", &["2048K", "65536K", "1048576K", "67108864K"]),
            ("channels", &["1", "32"]),
            ("timeout_ms", &["1", "600000"]),
            ("hostmem", &["16384K", "102400K", "67108864K"]),
            ("workers", &["1", "64"]),
            ("host", &["/run/g.sock"]),
            ("weight", &["1", "10000"]),
            ("priority", &["0", "255"]),
            ("name", &["a1", "vm-x"]),
            ("reconnect_ms", &["0", "600000"]),
            ("gpu", &["0", "63"]),
            ("nice", &["-20", "0"]),
            ("rt", &["0", "99"]),
            ("slice_us", &["0", "100", "100000"]),
            ("cpus", &["0", "14", "2-3", "1023"]),
            ("spin_us", &["0", "10000"]),
            ("preempt_wait_us", &["0", "100000"]),
            ("copy_slots", &["0", "1024K", "65536K"]),
            (
                "ck_path",
                &["fixed", "adaptive", "adaptive:0", "adaptive:250"],
            ),
        ];
        for k in keys::KEYS {
            let values: Vec<&str> = match samples.iter().find(|(n, _)| *n == k.name) {
                Some((_, v)) => v.to_vec(),
                None => k.values.split('|').collect(),
            };
            assert!(
                values.len() > 1 || k.name == "host",
                "{}: no samples",
                k.name
            );
            for v in values {
                // The vgpud keys apply only with host=.
                let with = if [
                    "weight",
                    "priority",
                    "name",
                    "reconnect_ms",
                    "gpu",
                    "nice",
                    "rt",
                    "slice_us",
                    "cpus",
                ]
                .contains(&k.name)
                {
                    format!("host=/s,{}={v}", k.name)
                } else if k.name == "ck_path" || k.name == "copy_slots" {
                    format!("backend=cuda,{}={v}", k.name)
                } else {
                    format!("{}={v}", k.name)
                };
                let c = GpuConfig::parse(&with).unwrap_or_else(|e| panic!("{with}: {e}"));
                assert_eq!(k.value(&c).as_deref(), Some(v), "{with}");
                assert_eq!(GpuConfig::parse_written(&c.spec()).unwrap(), c, "{with}");
            }
        }
        let all = GpuConfig::parse(
            "mode=para,backend=cuda,vram=1G,channels=3,timeout_ms=7,hostmem=1G,workers=2,\
             opt=lazy,pages=2m,preempt=checkpoint,preempt_wait_us=7,ck_path=adaptive:500,copy_slots=2M,host=/a b,weight=3,priority=4,name=n,\
             reconnect_ms=250,gpu=1,nice=-3,rt=2,slice_us=300,cpus=4-5,doorbell=mmio,spin_us=9,backoff=off,direct=off,dirtylog=writesets",
        )
        .unwrap();
        assert_eq!(GpuConfig::parse_written(&all.spec()).unwrap(), all);
        assert_eq!(
            all.spec().split(',').count(),
            keys::KEYS.len(),
            "{}",
            all.spec()
        );
        let d = GpuConfig::default();
        assert_eq!(GpuConfig::parse_written(&d.spec()).unwrap(), d);
    }

    /// The keys newer than the manifest are written only when not at the value their omission
    /// means (their default when they came), so that builds that do not know them read the
    /// snapshots of configurations that do not use them; the spec still parses back to the
    /// same configuration either way. `ck_path`'s default moved to adaptive: a default
    /// configuration writes it, and a manifest without it (of the builds before) is `fixed`.
    #[test]
    fn spec_omits_the_newer_keys_at_their_default() {
        for (cfg, absent) in [
            ("preempt=auto", &["preempt_wait_us", "rt", "ck_path"][..]),
            (
                "preempt=auto,host=/s",
                &["preempt_wait_us", "rt", "ck_path"],
            ),
            // A sim configuration has no request path: never written, whatever is given.
            (
                "preempt=auto,preempt_wait_us=0,host=/s,rt=1,ck_path=fixed",
                &["ck_path"],
            ),
            ("backend=cuda,preempt=auto", &["preempt_wait_us", "rt"]),
            (
                "backend=cuda,preempt=auto,preempt_wait_us=40,host=/s,rt=0,ck_path=fixed",
                &["preempt_wait_us", "rt", "ck_path"],
            ),
            (
                "backend=cuda,preempt=auto,preempt_wait_us=0,host=/s,rt=1,ck_path=adaptive",
                &[],
            ),
        ] {
            let c = GpuConfig::parse(cfg).unwrap();
            let spec = c.spec();
            for k in ["preempt_wait_us", "rt", "ck_path"] {
                let written = spec.split(',').any(|kv| kv.starts_with(&format!("{k}=")));
                assert_eq!(written, !absent.contains(&k), "{cfg}: {spec}");
            }
            assert!(!spec.contains("host=") || spec.contains("nice="), "{spec}");
            assert_eq!(GpuConfig::parse_written(&spec).unwrap(), c, "{cfg}: {spec}");
        }
    }

    /// A manifest's `gpu` read back: a newer key left out means what its omission meant when
    /// it was written, whatever today's default (`ck_path`: `fixed`, default `adaptive`).
    #[test]
    fn a_manifest_without_ck_path_reads_as_fixed() {
        let old = "mode=full,backend=cuda,vram=64M,preempt=auto";
        assert_eq!(
            GpuConfig::parse_written(old).unwrap().ck_path,
            pgpu::cuda::CkPathChoice::Fixed
        );
        assert_eq!(
            GpuConfig::parse(old).unwrap().ck_path,
            pgpu::cuda::CkPathChoice::adaptive()
        );
        for given in ["ck_path=adaptive", "ck_path=adaptive:250", "ck_path=fixed"] {
            let c = GpuConfig::parse(&format!("{old},{given}")).unwrap();
            assert_eq!(GpuConfig::parse_written(&c.spec()).unwrap(), c, "{given}");
        }
        assert!(GpuConfig::parse_written("vram=3M").is_err());
        // A sim manifest (no ck_path) keeps today's default: the key does not apply there.
        assert_eq!(
            GpuConfig::parse_written("vram=64M,preempt=auto").unwrap(),
            GpuConfig::parse("vram=64M,preempt=auto").unwrap()
        );
    }

    /// The defaults the help shows are the defaults (where they are values: the others are
    /// exactly the two that depend on the host or the process).
    #[test]
    fn declared_defaults_are_the_defaults() {
        let mut described = Vec::new();
        let host = keys::KEYS.iter().find(|k| k.name == "host").unwrap();
        assert_eq!(
            (host.default, host.value(&GpuConfig::default())),
            ("none", None)
        );
        for k in keys::KEYS.iter().filter(|k| k.name != "host") {
            let with = if [
                "weight",
                "priority",
                "reconnect_ms",
                "nice",
                "rt",
                "slice_us",
            ]
            .contains(&k.name)
            {
                format!("host=/s,{}={}", k.name, k.default)
            } else {
                format!("{}={}", k.name, k.default)
            };
            match GpuConfig::parse(&with) {
                Ok(c) => {
                    let d = GpuConfig::parse(if with.starts_with("host=") {
                        "host=/s"
                    } else {
                        ""
                    })
                    .unwrap();
                    assert_eq!(k.value(&c), k.value(&d), "{}", k.name);
                }
                Err(_) => described.push(k.name),
            }
        }
        assert_eq!(described, ["name", "gpu", "cpus", "spin_us"]);
        let e = GpuConfig::parse("color=red").unwrap_err().to_string();
        for k in keys::KEYS {
            assert!(e.contains(k.name), "{e}");
        }
        assert!(keys::help().contains("dirtylog=engine|writesets (default engine)"));
        assert!(matches!(
            GpuConfig::parse("mode"),
            Err(ConfigError::Syntax(_))
        ));
    }
}
