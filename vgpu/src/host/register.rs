//! Registering with the daemon (`HostLink::connect`): the first connection (retried while a
//! restarting daemon's socket refuses), the `Hello` of a protocol version, and the fall-back to
//! version 3 when an older daemon refuses this build's; the welcome maps the partition and
//! starts the reader thread.

use super::*;

/// Whether `refusal` is a daemon of an older protocol refusing this build's `hello`: a
/// version-3 daemon cannot decode its `word` field (serde's text: "malformed message: unknown
/// field `word`, expected one of ..."), and one that could would refuse the version itself
/// (`validate_hello`'s text). The link registers again as version 3, without a grant word (as a
/// version-3 VM would).
pub(super) fn older_daemon(version: u32, refusal: &str) -> bool {
    version > proto::RESUME_VERSION
        && (refusal.contains("unknown field `word`")
            || refusal.starts_with(&format!("protocol version {version} is not supported")))
}

/// The first message of a registration in protocol `version` (`resume`: of a
/// re-registration); a version-4 one asks for a grant word.
pub(super) fn hello(
    cfg: &HostConfig,
    vram: u64,
    channels: u32,
    resume: Option<proto::Resume>,
    version: u32,
) -> ToDaemon {
    ToDaemon::Hello(proto::Hello {
        version,
        name: cfg.name.clone(),
        weight: cfg.weight,
        priority: cfg.priority,
        vram,
        channels,
        resume,
        gpu: cfg.gpu,
        word: version >= proto::WORD_VERSION,
    })
}

/// The first connection to the daemon. A socket that exists but refuses (a daemon that died
/// and whose successor does not listen yet: a restart in progress) is tried again every
/// `reconnect::RETRY` for up to `reconnect_ms`, as a running VM does; no socket at all is an
/// error at once (a wrong path).
fn connect_first(cfg: &HostConfig) -> Result<Conn, HostError> {
    let until = std::time::Instant::now() + cfg.reconnect;
    loop {
        match Conn::connect(&cfg.socket) {
            Ok(c) => return Ok(c),
            Err(err) => {
                let restarting = std::fs::symlink_metadata(&cfg.socket)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
                let now = std::time::Instant::now();
                if !restarting || now >= until {
                    return Err(HostError::Connect {
                        path: cfg.socket.clone(),
                        err,
                    });
                }
                std::thread::sleep(reconnect::RETRY.min(until - now));
            }
        }
    }
}

impl HostLink {
    /// Registers with the daemon; `vram` is the partition size asked for. A daemon of protocol
    /// version 3 refuses this build's version: the link registers again as version 3 (no
    /// grant word; `older_daemon`).
    pub fn connect(
        cfg: &HostConfig,
        vram: u64,
        channels: u32,
    ) -> Result<(Self, Welcome), HostError> {
        let mut version = proto::VERSION;
        loop {
            match Self::register(cfg, vram, channels, version) {
                Err(HostError::Refused(m)) if older_daemon(version, &m) => {
                    log::warn!(
                        "vgpu: vgpud speaks an older protocol ({m}): registering as version {} \
                         (no grant word)",
                        proto::RESUME_VERSION
                    );
                    version = proto::RESUME_VERSION;
                }
                r => return r,
            }
        }
    }

    fn register(
        cfg: &HostConfig,
        vram: u64,
        channels: u32,
        version: u32,
    ) -> Result<(Self, Welcome), HostError> {
        let conn = connect_first(cfg)?;
        let hello = hello(cfg, vram, channels, None, version);
        let proto_err = |e: &dyn std::fmt::Display| HostError::Protocol(e.to_string());
        conn.send(&proto::encode(&hello), None)
            .map_err(|e| proto_err(&e))?;
        let mut buf = [0u8; proto::MAX_MESSAGE];
        let welcome = match conn.recv(&mut buf).map_err(|e| proto_err(&e))? {
            Received::Message(n, fd) => match (proto::decode::<ToVm>(&buf[..n]), fd) {
                (
                    Ok(ToVm::Welcome {
                        version: welcomed,
                        vm,
                        vram_offset,
                        vram_size,
                        boot,
                        gpu: Some(gpu),
                    }),
                    Some(vram_fd),
                ) if welcomed == version
                    && vram_size == vram
                    && cfg.gpu.is_none_or(|p| p == gpu.index) =>
                {
                    Welcome {
                        vm,
                        gpu,
                        vram_offset,
                        vram_size,
                        vram_fd,
                        boot,
                    }
                }
                (Ok(ToVm::Error { message, .. }), _) => return Err(HostError::Refused(message)),
                (other, _) => return Err(proto_err(&format!("unexpected answer {other:?}"))),
            },
            _ => return Err(HostError::Refused("connection closed".into())),
        };
        let kept = welcome
            .vram_fd
            .try_clone()
            .map_err(|e| proto_err(&format!("dup the VRAM descriptor: {e}")))?;
        let wake = wake::Wake::new().map_err(|e| proto_err(&format!("eventfd: {e}")))?;
        let inner = Arc::new(Inner {
            st: Mutex::new(St {
                conn: Arc::new(conn),
                epoch: 0,
                boot: welcome.boot.clone(),
                vm: welcome.vm,
                down: None,
                partition: Partition {
                    gpu: welcome.gpu.index,
                    offset: welcome.vram_offset,
                    fd: Arc::new(kept),
                },
                wanting: false,
                identified: false,
                grant: None,
                active: None,
                turn: false,
                held: false,
                lost: None,
                worker_reading: false,
                standby_until: None,
                move_answer: None,
                returned_late: false,
                boosted: None,
                pinned: None,
                reader_pinned: None,
                word: None,
                version,
            }),
            cv: Condvar::new(),
            claim: Claim {
                cfg: cfg.clone(),
                vram,
                channels,
            },
            boost: boost::Boost::new(cfg.nice, cfg.rt).with_slice_us(cfg.slice_us),
            pin: pin::Pin::new(cfg.cpus),
            reader_tid: std::sync::atomic::AtomicI32::new(0),
            wake,
        });
        let i = inner.clone();
        let reader = std::thread::Builder::new()
            .name("vgpu-host".into())
            .spawn(move || reader::read_loop(&i))
            .map_err(|e| proto_err(&e))?;
        log::info!(
            "vgpu: registered with vgpud as vm {} on its gpu {} (device {}; {} MiB of VRAM at {:#x})",
            welcome.vm,
            welcome.gpu.index,
            welcome.gpu.device,
            welcome.vram_size >> 20,
            welcome.vram_offset
        );
        Ok((
            HostLink {
                inner,
                reader: Some(reader),
            },
            welcome,
        ))
    }
}
