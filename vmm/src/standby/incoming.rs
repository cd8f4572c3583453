//! A migration received into a standby (`vgpu-vmm ctl SOCKET incoming URL`, issue 24): the
//! destination's KVM VM, guest RAM and GPU engine (cuda context, transfer slots, template
//! modules) exist before the source starts, so that its pre-copy rounds only receive state
//! and no context is made on a GPU beside a running guest. The request binds URL as
//! `--incoming URL` would (`unix:PATH` or an absolute path, loopback `tcp:`, or `tls:` with the
//! standby's `--tls-*` files), is answered at once (`listening`), and the standby waits there
//! for one source (its API socket is not served meanwhile), at most the request's `wait_s`:
//! then it stops listening and takes requests again, as it was. The stream is read by the
//! `--incoming` path ([`crate::snapshot::stream::receive_into`]), this module being its
//! [`Destination`]: the manifest must fit the standby ([`super::fit_config`], as for `restore`)
//! or the source is answered `error: ...` before any of its state is read, and the standby
//! waits on as it was; a live GPU migration's rounds are written into the standby's engine
//! (and, on cuda, guest RAM), which says `ready/1 prepared` at once. At the end the VM is put
//! together by [`super::build::build_on_standby`] and runs; the source is told `ok`. A stream
//! that fails after the standby's engine took rounds uses the standby up (it is prepared
//! again); one that fails before leaves it waiting.

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::Standby;
use super::serve::{Next, Outcome, RunSettings};
use crate::api::protocol::Response;
use crate::api::server::write_line;
use crate::snapshot::incoming::EngineSource;
use crate::snapshot::manifest::Manifest;
use crate::snapshot::stream::{self, Destination, StreamError};
use crate::snapshot::transport::{Endpoint, EndpointError, Link};

/// The standby as a stream's destination.
struct Dest<'a> {
    standby: &'a mut Standby,
    /// The GPU's configuration the VM is built with (its fit).
    gpu: Option<vgpu::GpuConfig>,
    /// The engine was handed to the rounds: the standby is changed from here on.
    gave: bool,
}

impl Destination for Dest<'_> {
    fn admit(&mut self, m: &Manifest) -> Result<(), String> {
        let gpu = super::fit_config(&self.standby.cfg, m).map_err(|e| e.to_string())?;
        // Its disks too, here rather than when the VM is built after every round.
        crate::disk::Disk::check_reopen(&m.disks).map_err(|e| e.to_string())?;
        self.gpu = gpu;
        Ok(())
    }

    fn engine(&mut self, _spec: &str) -> Option<EngineSource> {
        let cfg = self.gpu.clone()?;
        let engine = self.standby.engine.take()?;
        self.gave = true;
        Some(EngineSource::Given(
            cfg,
            engine,
            self.standby.ram.engine_regions(),
        ))
    }
}

/// `incoming URL` on `out` (the request's connection): binds URL, answers, waits for the
/// source (at most `wait`, then stops listening) and receives its VM into `standby`.
pub(super) fn take(
    mut out: UnixStream,
    url: &str,
    wait: Duration,
    standby: Standby,
    run: &RunSettings,
) -> Next {
    let ep = match Endpoint::parse(url) {
        Ok(Endpoint::Unix(p)) if !p.is_absolute() => {
            Err(EndpointError::Relative(p.display().to_string()))
        }
        other => other,
    };
    let tls = run.tls.as_ref();
    let bound = ep.and_then(|ep| {
        let l = ep.bind(tls.filter(|_| matches!(ep, Endpoint::Tls(_))))?;
        Ok((ep, l))
    });
    let (ep, listener) = match bound {
        Ok(b) => b,
        Err(e) => {
            let _ = write_line(&mut out, &Response::err(format!("incoming: {e}")));
            return Next::Wait(Box::new(standby));
        }
    };
    let answer = serde_json::json!({
        "state": "incoming",
        "listening": ep.to_string(),
        "wait_s": wait.as_secs(),
        "prepared_ms": standby.prepared_ms,
    });
    if let Err(e) = write_line(&mut out, &Response::ok(answer)) {
        log::warn!("standby: answer incoming: {e}; not listening");
        listener.close();
        return Next::Wait(Box::new(standby));
    }
    drop(out);
    log::info!("standby: waiting for a migration on {ep} (at most {wait:?})");
    // Within `wait` in all: a `tls:` peer that fails its handshake is refused and the wait
    // goes on to the same deadline (never a blocking accept past it).
    let deadline = Instant::now() + wait;
    let conn = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = match listener.pending_within(left) {
            Ok(true) => listener.accept_pending(),
            Ok(false) => {
                log::warn!("standby: no source on {ep} within {wait:?}; waiting on as a standby");
                listener.close();
                return Next::Wait(Box::new(standby));
            }
            Err(e) => Err(e),
        };
        match got {
            Ok(Some(conn)) => break conn,
            Ok(None) => {}
            Err(e) => {
                log::warn!("standby: incoming {ep}: {e}; waiting on as a standby");
                listener.close();
                return Next::Wait(Box::new(standby));
            }
        }
    };
    listener.close();
    receive(conn, standby, run)
}

/// Receives the VM on `conn` into `standby` and builds it.
fn receive(mut conn: Link, mut standby: Standby, run: &RunSettings) -> Next {
    let mut dest = Dest {
        standby: &mut standby,
        gpu: None,
        gave: false,
    };
    let got = stream::receive_into(&conn, &mut dest);
    let gave = dest.gave;
    let spent_or_waiting = |standby| match gave {
        true => Next::Done(Outcome::Spent),
        false => Next::Wait(Box::new(standby)),
    };
    let mut loaded = match got {
        Ok(l) => l,
        Err(StreamError::NotAdmitted(why)) => {
            log::warn!("standby: a migration that does not fit was refused: {why}");
            return Next::Wait(Box::new(standby));
        }
        Err(e) => {
            log::error!("standby: migration: {e}");
            stream::answer(&mut conn, Err(e.to_string()));
            return spent_or_waiting(standby);
        }
    };
    let since = Instant::now();
    let cfg = match super::serve::vm_config(&standby, &loaded, run) {
        Ok(c) => c,
        Err(e) => {
            log::error!("standby: migration: {e}");
            stream::answer(&mut conn, Err(e));
            return spent_or_waiting(standby);
        }
    };
    let check_ms = since.elapsed().as_secs_f64() * 1e3;
    match super::build::build_on_standby(&cfg, &mut loaded, standby, check_ms) {
        Ok(vm) => Next::Done(Outcome::Restored {
            vm: Box::new(vm),
            cfg: Box::new(cfg),
            reply: None,
            ack: Some(conn),
            since,
            loaded: Box::new(loaded),
        }),
        Err(e) => {
            log::error!("standby: migration: {e} (the standby is prepared again)");
            stream::answer(&mut conn, Err(e.to_string()));
            Next::Done(Outcome::Spent)
        }
    }
}
