//! The `--gpu` keys, each declared once: its name, the values it takes, its default, what it
//! does, how it is parsed into a [`GpuConfig`] and printed back out of one. The parser
//! ([`GpuConfig::parse`]), the known-keys error, the help text (`vgpu-vmm --help`, checked
//! against the README by `tests/docs.rs`) and the snapshot manifest ([`spec`]) are all made
//! from [`KEYS`].

use std::time::Duration;

use vgpu_proto::units::parse_size;

use super::{Backend, Doorbell, GpuConfig, HOSTMEM_MAX, HOSTMEM_MIN, Mode, SPIN_US_MAX};
use crate::host::HostConfig;

/// One `--gpu` key.
pub struct Key {
    /// The key (`vram`).
    pub name: &'static str,
    /// The values it takes, as the help shows them (`full|para|pt`, `SIZE`).
    pub values: &'static str,
    /// The default, as the help shows it; [`GpuConfig::default`] has it (a test checks the two
    /// agree wherever the text is a value).
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
    /// Sets the key's field of the configuration being parsed; `Err(why)` refuses the value.
    parse: fn(&mut Draft, &str) -> Result<(), &'static str>,
    /// The key's value in a configuration, `None` where it does not apply (the vgpud keys
    /// without `host=`).
    print: fn(&GpuConfig) -> Option<String>,
}

/// A configuration being parsed: the vgpud keys may come before `host=`, so they wait here
/// until all keys are read.
#[derive(Default)]
pub(super) struct Draft {
    pub cfg: GpuConfig,
    pub weight: Option<u32>,
    pub priority: Option<u8>,
    pub name: Option<String>,
    pub reconnect: Option<Duration>,
    pub gpu: Option<u32>,
    pub nice: Option<i32>,
    pub rt: Option<u8>,
    pub slice_us: Option<u32>,
    pub cpus: Option<(u16, u16)>,
}

/// A size as the manifest has always written it: in KiB (`65536K`), exact for every size
/// the keys accept, and what snapshots of earlier builds hold.
fn kib(bytes: u64) -> String {
    format!("{}K", bytes >> 10)
}

/// A decimal number in `lo..=hi`.
fn num<T: std::str::FromStr + PartialOrd>(v: &str, lo: T, hi: T) -> Option<T> {
    v.parse().ok().filter(|n| (lo..=hi).contains(n))
}

/// The value of `v` in `choices`, or `why`.
fn choice<T: Copy>(v: &str, choices: &[(&str, T)], why: &'static str) -> Result<T, &'static str> {
    choices
        .iter()
        .find(|(name, _)| *name == v)
        .map(|(_, t)| *t)
        .ok_or(why)
}

/// The name of `t` in `choices`.
fn named<T: PartialEq>(t: T, choices: &[(&'static str, T)]) -> Option<String> {
    choices
        .iter()
        .find(|(_, c)| *c == t)
        .map(|(name, _)| (*name).to_string())
}

const MODES: &[(&str, Mode)] = &[("full", Mode::Full), ("para", Mode::Para), ("pt", Mode::Pt)];
const BACKENDS: &[(&str, Backend)] = &[("sim", Backend::Sim), ("cuda", Backend::Cuda)];
/// `opt=`: (lazy shadowing, BAR remap).
const OPTS: &[(&str, (bool, bool))] = &[
    ("none", (false, false)),
    ("lazy", (true, false)),
    ("remap", (false, true)),
    ("all", (true, true)),
];
/// `pages=`: 2 MiB pages only.
const PAGES: &[(&str, bool)] = &[("4k+2m", false), ("2m", true)];
const DOORBELLS: &[(&str, Doorbell)] = &[("mmio", Doorbell::Mmio), ("poll", Doorbell::Poll)];
const ON_OFF: &[(&str, bool)] = &[("on", true), ("off", false)];
/// `dirtylog=`: write sets even where the engine keeps a dirty log.
const DIRTYLOGS: &[(&str, bool)] = &[("engine", false), ("writesets", true)];

/// Every `--gpu` key, in the order the help and the manifest list them.
pub static KEYS: &[Key] = &[
    Key {
        name: "mode",
        values: "full|para|pt",
        default: "full",
        help: "full virtualization, para-virtualization (the guest maps its GPU address space \
               with hypercalls) or pt, the pass-through baseline: a trusted guest without \
               isolation, not with host= (docs/architecture.md \"Pass-through baseline\")",
        parse: |d, v| {
            d.cfg.mode = choice(v, MODES, "supported: full, para, pt")?;
            Ok(())
        },
        print: |c| named(c.mode, MODES),
    },
    Key {
        name: "backend",
        values: "sim|cuda",
        default: "sim",
        help: "the software GPU, or an NVIDIA GPU through the CUDA driver API",
        parse: |d, v| {
            d.cfg.backend = choice(v, BACKENDS, "supported: sim, cuda")?;
            Ok(())
        },
        print: |c| named(c.backend, BACKENDS),
    },
    Key {
        name: "vram",
        values: "SIZE",
        default: "256M",
        help: "guest VRAM, a power of two from 2M to 64G",
        parse: |d, v| {
            d.cfg.vram = parse_size(v)
                .filter(|v| v.is_power_of_two() && (2 << 20..=64 << 30).contains(v))
                .ok_or("a power of two from 2M to 64G, e.g. 256M")?;
            Ok(())
        },
        print: |c| Some(kib(c.vram)),
    },
    Key {
        name: "channels",
        values: "N",
        default: "8",
        help: "channels the guest may use, 1 to 32",
        parse: |d, v| {
            d.cfg.channels = num(v, 1, 32).ok_or("1 to 32")?;
            Ok(())
        },
        print: |c| Some(c.channels.to_string()),
    },
    Key {
        name: "timeout_ms",
        values: "MS",
        default: "2000",
        help: "the per-job time limit (loading the job's module included), 1 to 600000",
        parse: |d, v| {
            let ms = num(v, 1u64, 600_000).ok_or("1 to 600000")?;
            d.cfg.job_timeout = Duration::from_millis(ms);
            Ok(())
        },
        print: |c| Some(c.job_timeout.as_millis().to_string()),
    },
    Key {
        name: "hostmem",
        values: "SIZE",
        default: "256M",
        help: "host memory for the VM's PTX modules and shadow page tables, 16M to 64G \
               (docs/hardware.md \"Host limits\")",
        parse: |d, v| {
            d.cfg.hostmem = parse_size(v)
                .filter(|v| (HOSTMEM_MIN..=HOSTMEM_MAX).contains(v))
                .ok_or("a size from 16M to 64G, e.g. 256M")?;
            Ok(())
        },
        print: |c| Some(kib(c.hostmem)),
    },
    Key {
        name: "workers",
        values: "N",
        default: "1",
        help: "threads of the software GPU, 1 to 64",
        parse: |d, v| {
            d.cfg.workers = num(v, 1, 64).ok_or("1 to 64")?;
            Ok(())
        },
        print: |c| Some(c.workers.to_string()),
    },
    Key {
        name: "opt",
        values: "none|lazy|remap|all",
        default: "all",
        help: "full-virtualization optimizations: lazy shadowing, BAR remap, or both",
        parse: |d, v| {
            (d.cfg.lazy_shadowing, d.cfg.bar_remap) = choice(v, OPTS, "none, lazy, remap or all")?;
            Ok(())
        },
        print: |c| named((c.lazy_shadowing, c.bar_remap), OPTS),
    },
    Key {
        name: "pages",
        values: "4k+2m|2m",
        default: "4k+2m",
        help: "page sizes of the sim engine (2m: the 2 MiB-only GPU of the cuda backend)",
        parse: |d, v| {
            d.cfg.sim_pages_2m_only = choice(v, PAGES, "4k+2m or 2m")?;
            Ok(())
        },
        print: |c| named(c.sim_pages_2m_only, PAGES),
    },
    Key {
        name: "preempt",
        values: "slice|checkpoint|restart|auto",
        default: "slice",
        help: "how kernels are preempted (checkpoint: compiler-directed checkpoints; restart: \
               idempotent kernels rerun, others checkpoint; auto: per kernel; pgpu/README.md)",
        parse: |d, v| {
            d.cfg.preempt = v
                .parse()
                .map_err(|_| "slice, checkpoint, restart or auto")?;
            Ok(())
        },
        print: |c| Some(c.preempt.to_string()),
    },
    Key {
        name: "preempt_wait_us",
        values: "US",
        default: "40",
        help: "with preempt=auto: a preemption request for a kernel expected (from its \
               earlier runs) to end within US µs is not acted on, the kernel completes; one \
               that outlasts its estimate is stopped after US µs; 0 to 100000 (0: never wait; \
               pgpu/src/ckwait.rs)",
        parse: |d, v| {
            let us = num(v, 0, 100_000).ok_or("0 to 100000")?;
            d.cfg.preempt_wait = Duration::from_micros(us);
            Ok(())
        },
        print: |c| Some(c.preempt_wait.as_micros().to_string()),
    },
    Key {
        name: "ck_path",
        values: "fixed|adaptive|adaptive:US",
        default: "adaptive",
        help: "backend=cuda with preempt=checkpoint, restart or auto: how a preemption request \
               reaches each checkpointed kernel run: fixed (driver calls at the request, the \
               least host work when none comes) or adaptive (a kernel not yet measured, or \
               expected from its earlier runs to run at least US µs, default 1000, takes the \
               path with no synchronous driver call, about 3x faster to stop; the others the \
               fixed one); US 0 to 10000000 (docs/architecture.md \"The request path on \
               cuda\")",
        parse: |d, v| {
            d.cfg.ck_path = v
                .parse()
                .map_err(|_| "fixed, adaptive or adaptive:US (US 0 to 10000000)")?;
            Ok(())
        },
        // Only the cuda engine has a request path: a sim configuration neither writes nor keeps
        // one (`GpuConfig::parse` resets it), so its manifest is what builds before the key read.
        print: |c| (c.backend == Backend::Cuda).then(|| c.ck_path.to_string()),
    },
    Key {
        name: "copy_slots",
        values: "0|SIZE",
        default: "0",
        help: "backend=cuda: make the two staging slots of snapshot and migration copies \
               (SIZE of pinned host memory and SIZE of device memory each, a power of two \
               from 1M to 64M) when the VM starts, not in its first snapshot or live copy, \
               whose allocation stalls the guest's copies meanwhile; 0: sized to the first \
               copy (docs/snapshot.md, the VRAM transfer table)",
        parse: |d, v| {
            d.cfg.copy_slots = match v {
                "0" => 0,
                v => parse_size(v)
                    .filter(|v| v.is_power_of_two() && (1 << 20..=64 << 20).contains(v))
                    .ok_or("0, or a power of two from 1M to 64M, e.g. 64M")?,
            };
            Ok(())
        },
        // Written for cuda only (the sim engine has no slots; `GpuConfig::parse` resets it); a
        // manifest without it (older builds) meant 0.
        print: |c| {
            (c.backend == Backend::Cuda).then(|| match c.copy_slots {
                0 => "0".to_string(),
                n => kib(n),
            })
        },
    },
    Key {
        name: "host",
        values: "SOCKET",
        default: "none",
        help: "share the GPU of the vgpud daemon at SOCKET",
        parse: |d, v| {
            if v.is_empty() {
                return Err("the path of vgpud's socket");
            }
            d.cfg.host = Some(HostConfig {
                reconnect: crate::host::RECONNECT_DEFAULT,
                nice: crate::host::NICE_DEFAULT,
                slice_us: crate::host::SLICE_US_DEFAULT,
                ..HostConfig::plain(v.into(), &format!("vm-{}", std::process::id()))
            });
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.socket.display().to_string()),
    },
    Key {
        name: "weight",
        values: "W",
        default: "1",
        help: "with host=: the VM's weight, 1 to 10000",
        parse: |d, v| {
            d.weight = Some(num(v, 1, 10_000).ok_or("1 to 10000")?);
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.weight.to_string()),
    },
    Key {
        name: "priority",
        values: "P",
        default: "0",
        help: "with host=: the VM's priority class, 0 to 255",
        parse: |d, v| {
            d.priority = Some(v.parse().map_err(|_| "0 to 255")?);
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.priority.to_string()),
    },
    Key {
        name: "name",
        values: "NAME",
        default: "vm-PID",
        help: "with host=: the VM's name, 1 to 64 printable characters",
        parse: |d, v| {
            let ok = (1..=64).contains(&v.len()) && v.chars().all(|ch| ch.is_ascii_graphic());
            if !ok {
                return Err("1 to 64 printable characters");
            }
            d.name = Some(v.to_string());
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.name.clone()),
    },
    Key {
        name: "reconnect_ms",
        values: "MS",
        default: "10000",
        help: "with host=: how long GPU work waits for a vgpud that went away to come back on \
               SOCKET (the VM then re-registers and goes on) before the guest sees GPU_LOST, 0 \
               to 600000 (0: at once)",
        parse: |d, v| {
            let ms = num(v, 0u64, 600_000).ok_or("0 to 600000")?;
            d.reconnect = Some(Duration::from_millis(ms));
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.reconnect.as_millis().to_string()),
    },
    Key {
        name: "gpu",
        values: "N",
        default: "placed by vgpud",
        help: "with host=: pin the VM to the daemon's GPU N (0 to 63; vgpud --gpus); without it \
               the daemon places the VM (most free VRAM, then least load)",
        parse: |d, v| {
            d.gpu = Some(num(v, 0, 63).ok_or("0 to 63")?);
            Ok(())
        },
        print: |c| c.host.as_ref().and_then(|h| h.gpu.map(|g| g.to_string())),
    },
    Key {
        name: "nice",
        values: "N",
        default: "-10",
        help: "with host=: the nice value of the device's worker thread while it holds the \
               GPU (a grant), -20 to 0 (0: unchanged); raising needs CAP_SYS_NICE, and where \
               it is refused the VM says so once and runs on",
        parse: |d, v| {
            d.nice = Some(num(v, -20, 0).ok_or("-20 to 0")?);
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.nice.to_string()),
    },
    Key {
        name: "rt",
        values: "N",
        default: "0",
        help: "with host=: the device's worker thread runs real-time (SCHED_FIFO at \
               priority N, 1 to 99) while it waits for or holds a grant, instead of at `nice` \
               (0: off), meant for the timeslice policy; where real-time is refused (no \
               CAP_SYS_NICE, or a cgroup without real-time runtime) the VM says so once and \
               uses `nice`",
        parse: |d, v| {
            d.rt = Some(num(v, 0, 99).ok_or("0 to 99")?);
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.rt.to_string()),
    },
    Key {
        name: "slice_us",
        values: "US",
        default: "0",
        help: "with host=: the device's worker thread asks the kernel's fair scheduler for \
               slices of US microseconds (EEVDF's custom slice, sched_setattr's \
               sched_runtime; 100 to 100000, 0: the kernel's) while it waits for or holds a \
               grant, beside `nice`: a short slice puts its deadline before other threads' \
               (needs Linux 6.12 and no privilege; where refused the VM says so once)",
        parse: |d, v| {
            let us = num(v, 0, 100_000).ok_or("0, or 100 to 100000")?;
            if us != 0 && us < 100 {
                return Err("0, or 100 to 100000");
            }
            d.slice_us = Some(us);
            Ok(())
        },
        print: |c| c.host.as_ref().map(|h| h.slice_us.to_string()),
    },
    Key {
        name: "cpus",
        values: "N|N-M",
        default: "none",
        help: "with host=: the device's worker thread moves onto these CPUs while it waits \
               for (at its own level) or holds (raised) a grant, and back when the grant ends: \
               on sim the thread holding the grant is the GPU, and CPUs kept free of vCPUs \
               (taskset, cpusets) keep it on a core; a set outside the process's cpuset is \
               refused once and the thread stays where it was",
        parse: |d, v| {
            d.cpus = Some(crate::host::parse_cpus(v).ok_or("a CPU or a range N-M, 0 to 1023")?);
            Ok(())
        },
        print: |c| {
            c.host
                .as_ref()
                .and_then(|h| h.cpus.map(crate::host::print_cpus))
        },
    },
    Key {
        name: "doorbell",
        values: "poll|mmio",
        default: "poll",
        help: "exitless submission through a doorbell page the device polls, or trapped \
               doorbells only",
        parse: |d, v| {
            d.cfg.doorbell = choice(v, DOORBELLS, "mmio or poll")?;
            Ok(())
        },
        print: |c| named(c.doorbell, DOORBELLS),
    },
    Key {
        name: "spin_us",
        values: "US",
        default: "1000, 0 on hosts with fewer than 4 CPUs",
        help: "how long the device polls the doorbell page after activity, 0 to 10000",
        parse: |d, v| {
            let us = num(v, 0, SPIN_US_MAX).ok_or("0 to 10000")?;
            d.cfg.spin = Duration::from_micros(us);
            Ok(())
        },
        print: |c| Some(c.spin.as_micros().to_string()),
    },
    Key {
        name: "backoff",
        values: "on|off",
        default: "on",
        help: "stop polling early when the host's cores are contended",
        parse: |d, v| {
            d.cfg.spin_backoff = choice(v, ON_OFF, "on or off")?;
            Ok(())
        },
        print: |c| named(c.spin_backoff, ON_OFF),
    },
    Key {
        name: "direct",
        values: "on|off",
        default: "on",
        help: "the device reads GPFIFOs, pushbuffers and fences in guest RAM without engine \
               copies",
        parse: |d, v| {
            d.cfg.direct = choice(v, ON_OFF, "on or off")?;
            Ok(())
        },
        print: |c| named(c.direct, ON_OFF),
    },
    Key {
        name: "dirtylog",
        values: "engine|writesets",
        default: "engine",
        help: "how live snapshots track what the GPU writes: the engine's dirty log, or \
               per-job write sets from the kernels' PTX (not guest-visible)",
        parse: |d, v| {
            d.cfg.dirty_writesets = choice(v, DIRTYLOGS, "engine or writesets")?;
            Ok(())
        },
        print: |c| named(c.dirty_writesets, DIRTYLOGS),
    },
];

/// The key called `name`.
pub(super) fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

impl Key {
    pub(super) fn set(&self, d: &mut Draft, value: &str) -> Result<(), &'static str> {
        (self.parse)(d, value)
    }

    /// This key's value in `cfg`, `None` where it does not apply.
    pub fn value(&self, cfg: &GpuConfig) -> Option<String> {
        (self.print)(cfg)
    }
}

/// The names of all keys, comma-separated (the unknown-key error).
pub fn names() -> String {
    KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
}

/// Keys newer than the snapshot manifest's `gpu`, with the value their omission means: written
/// only when not at it, so that a configuration that does not use them is read by builds that
/// do not know them (they refuse unknown keys). The value is part of the manifest format and
/// never changes; it was each key's default when the key came, but a default may move on
/// (`ck_path`: omitted means `fixed`, the default is `adaptive` since session 13, so a default
/// configuration writes `ck_path=adaptive`), which is why a manifest is read with
/// [`apply_omitted`].
const WRITTEN_UNLESS_DEFAULT: &[(&str, &str)] = &[
    ("preempt_wait_us", "40"),
    ("rt", "0"),
    ("ck_path", "fixed"),
    ("copy_slots", "0"),
];

/// `cfg` as a manifest that left out (`spec` holds no `KEY=`) keys of
/// [`WRITTEN_UNLESS_DEFAULT`] means it: each such key whose omitted value is not today's
/// default takes the omitted value (`GpuConfig::parse_written`).
pub(super) fn apply_omitted(cfg: GpuConfig, spec: &str) -> Result<GpuConfig, &'static str> {
    let today = GpuConfig::default();
    let mut d = Draft {
        cfg,
        ..Draft::default()
    };
    for &(name, omitted) in WRITTEN_UNLESS_DEFAULT {
        let present = vgpu_proto::units::pairs(spec).any(|p| matches!(p, Ok((k, _)) if k == name));
        let k = find(name).ok_or("a key of the manifest format is missing")?;
        let applies = k.value(&d.cfg).is_some();
        if !present && applies && k.value(&today).is_none_or(|v| v != omitted) {
            k.set(&mut d, omitted)?;
        }
    }
    Ok(d.cfg)
}

/// `cfg` in `--gpu` syntax, every key that applies written out (but those of
/// [`WRITTEN_UNLESS_DEFAULT`] at the value their omission means), so that it does not depend on
/// the defaults of the build or host that reads it (the snapshot manifest's `gpu`, read back
/// with `GpuConfig::parse_written`).
pub fn spec(cfg: &GpuConfig) -> String {
    KEYS.iter()
        .filter_map(|k| {
            let v = k.value(cfg)?;
            let default = WRITTEN_UNLESS_DEFAULT
                .iter()
                .any(|&(n, d)| n == k.name && d == v);
            (!default).then(|| format!("{}={v}", k.name))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The help of `--gpu`: every key with its values, default and what it does.
pub fn help() -> String {
    let keys: Vec<String> = KEYS
        .iter()
        .map(|k| {
            format!(
                "{}={} (default {}): {}",
                k.name, k.values, k.default, k.help
            )
        })
        .collect();
    format!(
        "Attach a virtual GPU: --gpu, or --gpu key=value,... with the keys {}",
        keys.join("; ")
    )
}
