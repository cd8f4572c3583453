//! The live status (`vgpud status`): a connection that sends `ToDaemon::Status` instead of a
//! `Hello` is answered, part by part, with the daemon's report as of now (per GPU: VRAM,
//! channels, VMs placed, busy time, shares, grants and preemptions; per VM: name, GPU, weight,
//! share...) without its unbounded series (windows, latency samples), then closed. The answer
//! is built from what the daemon's loop holds (no I/O, nothing waited for), bounded to
//! `STATUS_MAX_PARTS` parts of `STATUS_CHUNK` bytes, and one snapshot serves every status
//! connection for a while (`reuse_ns`: at least 1 ms, ten times what it took to make), so
//! that a flood of status connections costs the loop at most about a tenth of its time. The
//! client side (`query`) is here too.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::daemon::Daemon;
use crate::proto::{self, STATUS_CHUNK, STATUS_MAX_PARTS, ToDaemon, ToVm, monotonic_ns};
use crate::report::Report;
use crate::wire::{Conn, Received, WireError};

/// A status snapshot is reused for at least this long.
pub const REUSE_MIN_NS: u64 = 1_000_000;

/// How long a snapshot that took `cost_ns` to make is reused: at least [`REUSE_MIN_NS`], and
/// ten times its cost (a big daemon's status is a little older, never a burden).
pub fn reuse_ns(cost_ns: u64) -> u64 {
    cost_ns.saturating_mul(10).max(REUSE_MIN_NS)
}

/// The most bytes of JSON a status carries.
const MAX_BYTES: usize = STATUS_CHUNK * STATUS_MAX_PARTS as usize;

impl Daemon {
    /// Answers `Status { part }` on connection `c` (not registered).
    pub(crate) fn status(&mut self, c: u64, part: u32) {
        // A VM whose hello waits for the adoption window's end (`adopt`) is no status client.
        if self.adoption.deferred.iter().any(|(d, _)| *d == c) {
            return self.refuse_status(c, "status asked by a VM waiting to register".into());
        }
        let now = monotonic_ns();
        let held = self.sessions.get(&c).and_then(|s| s.status.clone());
        let parts = match (part, held) {
            (0, _) => {
                let parts = match &self.status_cache {
                    Some((until, p)) if now < *until => p.clone(),
                    _ => {
                        let p = Arc::new(chunks(&self.status_report(now)));
                        let cost = monotonic_ns().saturating_sub(now);
                        self.status_cache = Some((now + reuse_ns(cost), p.clone()));
                        log::debug!("vgpud: status of {} parts made in {cost} ns", p.len());
                        p
                    }
                };
                if let Some(s) = self.sessions.get_mut(&c) {
                    s.status = Some(parts.clone());
                }
                parts
            }
            (_, Some(p)) => p,
            (_, None) => {
                return self.refuse_status(c, format!("status part {part} asked before part 0"));
            }
        };
        let Some(data) = parts.get(part as usize) else {
            return self.refuse_status(
                c,
                format!("status part {part} asked; the status has {}", parts.len()),
            );
        };
        let Some(s) = self.sessions.get_mut(&c) else {
            return;
        };
        s.send(&ToVm::StatusPart {
            part,
            parts: parts.len() as u32,
            data: data.clone(),
        });
        if part as usize + 1 == parts.len() {
            // Answered: the queued parts stay readable for the client after the close.
            s.closing = true;
        }
    }

    /// Refuses a status connection's request, and closes it.
    pub(crate) fn refuse_status(&mut self, c: u64, why: String) {
        self.report.refused += 1;
        if let Some(s) = self.sessions.get_mut(&c) {
            s.refuse(why, true);
        }
    }

    /// The status as of `now`: the report without its series, bounded (`bound`).
    fn status_report(&self, now: u64) -> Report {
        let mut r = self.build_report(now, false);
        bound(&mut r, MAX_BYTES);
        r
    }
}

/// Leaves VMs out of `r` until its JSON fits `max` bytes: the departed ones first, oldest
/// first, then the connected ones, oldest first; the GPUs' lists follow, and
/// `vms_omitted` says how many.
fn bound(r: &mut Report, max: usize) {
    loop {
        let len = serde_json::to_vec(&*r).map_or(0, |b| b.len());
        if len <= max || r.vms.is_empty() {
            return;
        }
        // Each VM's bytes: its object, its id in its GPU's list, its share pair.
        let cost = |v: &crate::report::VmReport| {
            serde_json::to_vec(v).map_or(0, |b| b.len()) + 2 * 12 + 30
        };
        let mut order: Vec<usize> = (0..r.vms.len()).collect();
        order.sort_by_key(|&i| (r.vms[i].gone_ns.is_none(), r.vms[i].registered_ns));
        let (mut excess, mut drop) = (len - max, Vec::new());
        for i in order {
            drop.push(r.vms[i].id);
            let c = cost(&r.vms[i]);
            if c >= excess {
                break;
            }
            excess -= c;
        }
        r.vms.retain(|v| !drop.contains(&v.id));
        for g in &mut r.gpus {
            g.vms.retain(|v| !drop.contains(v));
            g.shares.retain(|(v, _)| !drop.contains(v));
        }
        r.vms_omitted += drop.len() as u64;
    }
}

/// The report's JSON in parts of at most `STATUS_CHUNK` bytes, cut at character boundaries.
fn chunks(r: &Report) -> Vec<String> {
    let text = serde_json::to_string(r).unwrap_or_default();
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let mut cut = rest.len().min(STATUS_CHUNK);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head.to_owned());
        rest = tail;
    }
    out
}

/// Errors of `vgpud status`.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("cannot connect to {0}: {1} (is vgpud running there?)")]
    Connect(String, WireError),
    #[error("socket: {0}")]
    Wire(#[from] WireError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the daemon closed the connection before the status was complete")]
    Closed,
    #[error(
        "this vgpud does not answer status (it was built before the status request, an \
         addition to protocol version {version}; upgrade it): {0}",
        version = proto::VERSION
    )]
    Unsupported(String),
    #[error("the daemon refused: {0}")]
    Refused(String),
    #[error("bad answer: {0}")]
    Bad(String),
}

/// Asks the daemon at `socket` for its status (each answer waited for at most `wait`):
/// the JSON text, and the report it holds.
pub fn query(socket: &Path, wait: Duration) -> Result<(String, Report), StatusError> {
    let conn =
        Conn::connect(socket).map_err(|e| StatusError::Connect(socket.display().to_string(), e))?;
    let mut text = String::new();
    let mut parts = None;
    let mut part = 0u32;
    let mut buf = [0u8; proto::MAX_MESSAGE];
    while parts.is_none_or(|n| part < n) {
        conn.send(&proto::encode(&ToDaemon::Status { part }), None)?;
        if !conn.wait_readable_for(Some(wait))? {
            return Err(StatusError::Timeout(wait));
        }
        let n = match conn.recv(&mut buf)? {
            Received::Message(n, _) => n,
            Received::Closed | Received::Empty => return Err(StatusError::Closed),
        };
        match proto::decode::<ToVm>(&buf[..n]) {
            Ok(ToVm::StatusPart {
                part: p,
                parts: total,
                data,
            }) if p == part
                && total > 0
                && total <= STATUS_MAX_PARTS
                && parts.is_none_or(|n| n == total) =>
            {
                parts = Some(total);
                text.push_str(&data);
                part += 1;
            }
            // A daemon without the request cannot decode it: a malformed message to it.
            Ok(ToVm::Error { message, .. }) if message.contains("unknown variant `status`") => {
                return Err(StatusError::Unsupported(message));
            }
            Ok(ToVm::Error { message, .. }) => return Err(StatusError::Refused(message)),
            Ok(other) => return Err(StatusError::Bad(format!("{other:?}"))),
            Err(e) => return Err(StatusError::Bad(e.to_string())),
        }
    }
    let report = serde_json::from_str(&text).map_err(|e| StatusError::Bad(e.to_string()))?;
    Ok((text, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{GpuReport, VmReport};

    #[test]
    fn a_status_too_long_leaves_the_oldest_departed_vms_out_first() {
        let vm = |id: u32, gone: bool| VmReport {
            id,
            name: format!("vm-with-a-long-name-{id:040}"),
            registered_ns: u64::from(id),
            gone_ns: gone.then_some(1),
            ..VmReport::default()
        };
        let mut r = Report {
            vms: (1..=400).map(|i| vm(i, i <= 300)).collect(),
            gpus: vec![GpuReport {
                vms: (1..=400).collect(),
                ..GpuReport::default()
            }],
            ..Report::default()
        };
        r.fill_shares();
        let full = serde_json::to_vec(&r).unwrap().len();
        bound(&mut r, full / 2);
        let len = serde_json::to_vec(&r).unwrap().len();
        assert!(len <= full / 2, "{len} > {}", full / 2);
        assert!(
            r.vms_omitted > 0 && r.vms_omitted < 300,
            "{}",
            r.vms_omitted
        );
        // The oldest departed ones went; every connected one stayed; the GPU's lists follow.
        assert_eq!(r.vms.len() as u64 + r.vms_omitted, 400);
        assert_eq!(r.vms[0].id as u64, r.vms_omitted + 1);
        assert!((301..=400).all(|i| r.vms.iter().any(|v| v.id == i)));
        assert_eq!(r.gpus[0].vms.len(), r.vms.len());
        assert_eq!(r.gpus[0].shares.len(), r.vms.len());
        // A bound below one VM leaves them all out, and stops.
        bound(&mut r, 10);
        assert!(r.vms.is_empty() && r.gpus[0].vms.is_empty());
        assert_eq!(r.vms_omitted, 400);
    }

    #[test]
    fn parts_are_bounded_and_cut_at_character_boundaries() {
        let r = Report {
            sched: "é".repeat(STATUS_CHUNK),
            ..Report::default()
        };
        let parts = chunks(&r);
        assert!(parts.len() >= 2);
        assert!(
            parts
                .iter()
                .all(|p| !p.is_empty() && p.len() <= STATUS_CHUNK)
        );
        let back: Report = serde_json::from_str(&parts.concat()).unwrap();
        assert_eq!(back.sched, r.sched);
    }
}
