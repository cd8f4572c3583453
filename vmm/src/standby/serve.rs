//! A standby's API socket until a snapshot is restored: one connection at a time, one JSON
//! request per line (the protocol of [`crate::api::protocol`]). `restore` reads and checks the
//! snapshot as `--restore` does and checks that it fits the standby ([`Standby::fit`]); a
//! snapshot refused there is answered with the error and the standby keeps waiting, as it was.
//! One that passes is put into the standby ([`crate::standby::build::build_on_standby`]): the answer
//! (the restore's figures) comes once the vCPUs run ([`Reply`]). If that fails — a GPU image
//! or device state that the checks could not see is refused — the standby is used up: the
//! error is answered and the caller prepares a new one. `stats` says `standby` and what was
//! prepared; every other request is refused until a snapshot runs.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Standby;
use crate::api::protocol::{Request, Response};
use crate::api::server::{ApiSocket, read_request, write_line};
use crate::builder::PausedVm;
use crate::snapshot::load::Loaded;
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
    /// A snapshot was put into the standby: the VM to run with `cfg`, the request to answer
    /// once it runs, when the request arrived, and the snapshot (its files).
    Restored {
        vm: Box<PausedVm>,
        cfg: Box<VmConfig>,
        reply: Reply,
        since: Instant,
        loaded: Box<Loaded>,
    },
    /// A restore failed after it began changing the standby (answered): prepare another.
    Spent,
}

/// Serves `api` until a snapshot is restored into `standby` (or a restore used it up).
pub fn wait_for_restore(api: &ApiSocket, standby: Standby, run: &RunSettings) -> Outcome {
    loop {
        let conn = match api.accept() {
            Ok(c) => c,
            Err(e) => {
                log::warn!("standby: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let (conn, req, since) = match serve_until_restore(conn, &standby) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                log::debug!("standby: connection: {e}");
                continue;
            }
        };
        let mut out = conn;
        let checked = match check(&standby, &req, since, run) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("standby: {}: refused: {e}", req.display());
                let _ = write_line(&mut out, &Response::err(format!("restore: {e}")));
                continue;
            }
        };
        let (cfg, loaded, check_ms) = checked;
        match crate::standby::build::build_on_standby(&cfg, &loaded, standby, check_ms) {
            Ok(vm) => {
                return Outcome::Restored {
                    vm: Box::new(vm),
                    cfg: Box::new(cfg),
                    reply: Reply(out),
                    since,
                    loaded: Box::new(loaded),
                };
            }
            Err(e) => {
                log::error!("standby: restore {}: {e}", req.display());
                let msg = format!(
                    "restore: {e} (found while it was being put into the standby, which is \
                     prepared again)"
                );
                let _ = write_line(&mut out, &Response::err(msg));
                return Outcome::Spent;
            }
        }
    }
}

/// Reads and checks the snapshot in `dir` and its fit; the restored VM's configuration.
fn check(
    standby: &Standby,
    dir: &Path,
    since: Instant,
    run: &RunSettings,
) -> Result<(VmConfig, Loaded, f64), String> {
    let loaded = crate::snapshot::load::load(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let gpu = standby.fit(&loaded).map_err(|e| e.to_string())?;
    let disks = crate::disk::Disk::reopen(&loaded.manifest.disks).map_err(|e| e.to_string())?;
    let m = &loaded.manifest;
    let cfg = VmConfig {
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
    };
    let check_ms = since.elapsed().as_secs_f64() * 1e3;
    Ok((cfg, loaded, check_ms))
}

/// Answers the requests on `conn` until one is `restore` (returned with its directory and
/// arrival), or the client closes it.
fn serve_until_restore(
    conn: UnixStream,
    standby: &Standby,
) -> std::io::Result<Option<(UnixStream, std::path::PathBuf, Instant)>> {
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
            Request::Restore { dir } => return Ok(Some((out, dir, since))),
            Request::Stats {} => Response::ok(stats(standby)),
            other => Response::err(format!(
                "{}: the VM is on standby (--standby): nothing runs until `restore DIR` gives \
                 it a snapshot",
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
    }
}
