//! A standby's API socket until a VM runs in it: one connection at a time, one JSON request
//! per line (the protocol of [`crate::api::protocol`]). `restore` reads and checks the
//! snapshot as `--restore` does and checks that it fits the standby ([`Standby::fit`]); a
//! snapshot refused there is answered with the error and the standby keeps waiting, as it was.
//! One that passes is put into the standby ([`crate::standby::build::build_on_standby`]): the
//! answer (the restore's figures) comes once the vCPUs run ([`Reply`]). If that fails — a GPU
//! image or device state that the checks could not see is refused — the standby is used up:
//! the error is answered and the caller prepares a new one. `incoming URL` takes a migration
//! instead ([`super::incoming`]). `stats` says `standby` and what was prepared; every other
//! request is refused until a VM runs.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Standby;
use crate::api::protocol::{Request, Response};
use crate::api::server::{ApiSocket, read_request, write_line};
use crate::builder::PausedVm;
use crate::snapshot::load::Loaded;
use crate::snapshot::transport::Link;
use crate::vm::VmConfig;

/// How long a connection may sit idle between requests.
const IDLE: Duration = Duration::from_secs(30);

/// The connection of a `restore` request, answered once the restored VM runs.
#[derive(Debug)]
pub struct Reply(UnixStream);

impl Reply {
    /// Answers the request (a client that went away is only logged).
    pub fn send(mut self, r: Result<serde_json::Value, String>) {
        let resp = match r {
            Ok(v) => Response::ok(v),
            Err(e) => Response::err(e),
        };
        if let Err(e) = write_line(&mut self.0, &resp) {
            log::debug!("standby: answer the restore: {e}");
        }
    }
}

/// The settings of the restored VM that come from the standby's command line, not from the
/// snapshot.
#[derive(Debug, Clone, Default)]
pub struct RunSettings {
    pub timeout: Option<Duration>,
    pub console_prefix: Option<String>,
    pub tls: Option<crate::snapshot::tls::TlsFiles>,
}

/// How the wait ended.
pub enum Outcome {
    /// A snapshot or a migration was put into the standby: the VM to run with `cfg`, the
    /// `restore` request to answer once it runs, or the migration source to tell `ok`, when
    /// the request (or the stream's end) arrived, and the snapshot (its files).
    Restored {
        vm: Box<PausedVm>,
        cfg: Box<VmConfig>,
        reply: Option<Reply>,
        ack: Option<Link>,
        since: Instant,
        loaded: Box<Loaded>,
    },
    /// A restore or migration failed after it began changing the standby (answered): prepare
    /// another.
    Spent,
}

/// What a request asks of the standby.
enum Job {
    /// `restore DIR`.
    Restore(PathBuf),
    /// `incoming URL`: take a migration there ([`super::incoming`]), waiting at most this
    /// long for the source.
    Incoming(String, Duration),
}

/// After a request: the standby waits on (as it was), or the wait ended.
pub(super) enum Next {
    Wait(Box<Standby>),
    Done(Outcome),
}

/// Serves `api` until a snapshot is restored, or a migration received, into `standby` (or
/// one used it up).
pub fn wait_for_vm(api: &ApiSocket, standby: Standby, run: &RunSettings) -> Outcome {
    let mut standby = standby;
    loop {
        let conn = match api.accept() {
            Ok(c) => c,
            Err(e) => {
                log::warn!("standby: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let (conn, job, since) = match serve_until_job(conn, &standby) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                log::debug!("standby: connection: {e}");
                continue;
            }
        };
        let next = match job {
            Job::Restore(dir) => restore(conn, &dir, since, standby, run),
            Job::Incoming(url, wait) => super::incoming::take(conn, &url, wait, standby, run),
        };
        match next {
            Next::Wait(s) => standby = *s,
            Next::Done(o) => return o,
        }
    }
}

/// `restore DIR`: the snapshot read, checked and put into the standby.
fn restore(
    mut out: UnixStream,
    dir: &Path,
    since: Instant,
    standby: Standby,
    run: &RunSettings,
) -> Next {
    let checked = crate::snapshot::load::load(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
        .and_then(|l| Ok((vm_config(&standby, &l, run)?, l)));
    let (cfg, mut loaded) = match checked {
        Ok(c) => c,
        Err(e) => {
            log::warn!("standby: {}: refused: {e}", dir.display());
            let _ = write_line(&mut out, &Response::err(format!("restore: {e}")));
            return Next::Wait(Box::new(standby));
        }
    };
    let check_ms = since.elapsed().as_secs_f64() * 1e3;
    match crate::standby::build::build_on_standby(&cfg, &mut loaded, standby, check_ms) {
        Ok(vm) => Next::Done(Outcome::Restored {
            vm: Box::new(vm),
            cfg: Box::new(cfg),
            reply: Some(Reply(out)),
            ack: None,
            since,
            loaded: Box::new(loaded),
        }),
        Err(e) => {
            log::error!("standby: restore {}: {e}", dir.display());
            let msg = format!(
                "restore: {e} (found while it was being put into the standby, which is \
                 prepared again)"
            );
            let _ = write_line(&mut out, &Response::err(msg));
            Next::Done(Outcome::Spent)
        }
    }
}

/// The configuration of the VM of snapshot `loaded` (read and checked) on `standby`: its fit
/// ([`Standby::fit`]), its disks reopened, the run's settings.
pub(super) fn vm_config(
    standby: &Standby,
    loaded: &Loaded,
    run: &RunSettings,
) -> Result<VmConfig, String> {
    let gpu = standby.fit(loaded).map_err(|e| e.to_string())?;
    let disks = crate::disk::Disk::reopen(&loaded.manifest.disks).map_err(|e| e.to_string())?;
    let m = &loaded.manifest;
    Ok(VmConfig {
        image: crate::loader::Image::Bundled(String::new()),
        cmdline: String::new(),
        memory_mib: m.memory_mib,
        cpus: m.cpus,
        testdev: m.testdev,
        timeout: run.timeout,
        linux: false,
        initramfs: None,
        gpu,
        console_prefix: run.console_prefix.clone(),
        disks,
        tls: run.tls.clone(),
    })
}

/// Answers the requests on `conn` until one is `restore` or `incoming` (returned with its
/// argument and arrival), or the client closes it.
fn serve_until_job(
    conn: UnixStream,
    standby: &Standby,
) -> std::io::Result<Option<(UnixStream, Job, Instant)>> {
    conn.set_read_timeout(Some(IDLE))?;
    conn.set_write_timeout(Some(IDLE))?;
    let mut out = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    loop {
        let Some(line) = read_request(&mut reader, &mut out)? else {
            return Ok(None);
        };
        let since = Instant::now();
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => {
                write_line(&mut out, &Response::err(format!("bad request: {e}")))?;
                continue;
            }
        };
        log::debug!("standby api: {req:?}");
        let resp = match req {
            Request::Restore { dir } if !dir.is_absolute() => {
                Response::err("restore: dir must be an absolute path")
            }
            Request::Restore { dir } => return Ok(Some((out, Job::Restore(dir), since))),
            Request::Incoming { wait_s, .. }
                if !(1..=crate::api::protocol::MAX_INCOMING_WAIT_S).contains(&wait_s) =>
            {
                Response::err(format!(
                    "incoming: wait_s must be 1 to {}",
                    crate::api::protocol::MAX_INCOMING_WAIT_S
                ))
            }
            Request::Incoming { url, wait_s } => {
                let job = Job::Incoming(url, Duration::from_secs(wait_s));
                return Ok(Some((out, job, since)));
            }
            Request::Stats {} => Response::ok(stats(standby)),
            other => Response::err(format!(
                "{}: the VM is on standby (--standby): nothing runs until `restore DIR` gives \
                 it a snapshot or `incoming URL` a migration",
                op_name(&other)
            )),
        };
        write_line(&mut out, &resp)?;
    }
}

/// The `stats` answer of a standby.
fn stats(s: &Standby) -> serde_json::Value {
    serde_json::json!({
        "state": "standby",
        "memory_mib": s.cfg.memory_mib,
        "cpus": s.cfg.cpus,
        "gpu": s.cfg.gpu.as_ref().map(|g| g.spec()),
        "prepared_ms": s.prepared_ms,
        "template": s.template.as_ref().map(|t| serde_json::json!({
            "dir": t.dir,
            "modules": t.modules,
            "ms": t.ms,
        })),
    })
}

fn op_name(r: &Request) -> &'static str {
    match r {
        Request::Pause {} => "pause",
        Request::Resume {} => "resume",
        Request::Stats {} => "stats",
        Request::Snapshot { .. } => "snapshot",
        Request::Migrate { .. } => "migrate",
        Request::MoveGpu { .. } => "move_gpu",
        Request::Restore { .. } => "restore",
        Request::Incoming { .. } => "incoming",
    }
}
