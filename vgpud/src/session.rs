//! One connected VM process as the daemon sees it: its connection, registration, partition and
//! counters, and validation of its `Hello`.

use std::time::Duration;

use scheduler::VmId;

use crate::proto::{self, Hello, ToVm};
use crate::report::VmReport;
use crate::wire::Conn;

/// Limits a `Hello` is checked against.
pub struct Limits {
    pub vram_free: u64,
    pub channels_free: u32,
}

/// Checks the fields of a `Hello` (weight limits are the scheduler's to check).
pub fn validate_hello(h: &Hello, limits: &Limits) -> Result<(), String> {
    let Hello {
        version,
        name,
        vram,
        channels,
        ..
    } = h;
    let (version, vram, channels) = (*version, *vram, *channels);
    if !(proto::MIN_VERSION..=proto::VERSION).contains(&version) {
        return Err(format!(
            "protocol version {version} is not supported (this daemon speaks {}..={})",
            proto::MIN_VERSION,
            proto::VERSION
        ));
    }
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_graphic()) {
        return Err("name must be 1..=64 printable ASCII characters".into());
    }
    if vram == 0 || !vram.is_multiple_of(crate::partition::GRANULE) {
        return Err(format!("vram {vram} is not a positive multiple of 2 MiB"));
    }
    if vram > limits.vram_free {
        return Err(format!(
            "vram {} MiB requested, {} MiB free",
            vram >> 20,
            limits.vram_free >> 20
        ));
    }
    if channels == 0 || channels > limits.channels_free {
        return Err(format!(
            "channels {channels} requested, 1..={} available",
            limits.channels_free
        ));
    }
    Ok(())
}

/// A connection, registered or not yet.
pub struct Session {
    pub conn: Conn,
    pub pid: Option<i32>,
    /// Set by a successful `Hello`.
    pub reg: Option<Registered>,
    /// Closing: the connection is dropped at the end of this round.
    pub closing: bool,
    /// A status connection (`ToDaemon::Status`): the parts of the snapshot it is reading.
    /// Such a connection never registers.
    pub status: Option<std::sync::Arc<Vec<String>>>,
}

/// The state of a registered VM.
pub struct Registered {
    pub id: VmId,
    /// Index of the GPU it was placed on (multigpu).
    pub gpu: usize,
    /// A partition reserved on another GPU for a move in progress (multigpu).
    pub moving: Option<crate::moving::Reservation>,
    /// Queued in the scheduler (wants the GPU, or holds a preempted job).
    pub pending: bool,
    /// When it last became queued (the standby hint goes to the VM that waits longest).
    pub want_since_ns: u64,
    /// The VRAM memory object its partition is in: this instance's own, or one adopted from
    /// the VMs of an earlier instance (`adopt`).
    pub object: crate::adopt::ObjectKey,
    /// Version 4: the grant word shared with the VM (`kept`), if it asked for one.
    pub word: Option<vgpu_proto::word::GrantWord>,
    /// Its grants taken back through the word before it took them (`kept`) since it last
    /// answered one by message: from `kept::SPARE_AFTER` on, its next grant is not (it runs
    /// whatever its deadline, so that a VM always late progresses).
    pub unstarted_streak: u32,
    pub report: VmReport,
}

impl Session {
    pub fn new(conn: Conn) -> Self {
        let pid = conn.peer_pid();
        Session {
            conn,
            pid,
            reg: None,
            closing: false,
            status: None,
        }
    }

    /// Sends a message; a VM whose socket is full or gone is closed (it does not read: hung).
    pub fn send(&mut self, msg: &ToVm) {
        if self.closing {
            return;
        }
        if let Err(e) = self.conn.send(&proto::encode(msg), None) {
            log::warn!("vgpud: {}: send failed ({e}); closing", self.label());
            self.closing = true;
        }
    }

    /// Sends an error; `fatal` closes the connection after it.
    pub fn refuse(&mut self, message: String, fatal: bool) {
        log::warn!("vgpud: {}: refused: {message}", self.label());
        self.send(&ToVm::Error { message, fatal });
        if fatal {
            self.conn.shutdown();
            self.closing = true;
        }
    }

    /// `name (vm N, pid P)` for logs.
    pub fn label(&self) -> String {
        match &self.reg {
            Some(r) => format!(
                "{} (vm {}, pid {})",
                r.report.name,
                r.id.0,
                self.pid.unwrap_or(0)
            ),
            None if self.status.is_some() => {
                format!("status connection (pid {})", self.pid.unwrap_or(0))
            }
            None => format!("unregistered connection (pid {})", self.pid.unwrap_or(0)),
        }
    }
}

/// Human form of a duration for messages.
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
