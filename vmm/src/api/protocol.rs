//! The control API's messages. A request is one line of JSON with an `op` field:
//! `{"op":"pause"}`, `{"op":"resume"}`, `{"op":"stats"}`,
//! `{"op":"snapshot","dir":"/abs/path","resume":true,"drain":false,"live":false}` (`resume`
//! defaults to true, `drain` and `live` to false), `{"op":"migrate","to":"/abs","live":false}`
//! (with a `tls:` address, optionally `"tls":{"cert":"/abs","key":"/abs","ca":"/abs"}`: the
//! certificate files for this migration instead of the VM's own; a VM older than `tls:`
//! refuses the field as unknown), `{"op":"move_gpu","gpu":1}`, and for a `--standby` VM
//! `{"op":"restore","dir":"/abs/path"}` or `{"op":"incoming","url":"unix:/abs/path"}` (older VMs
//! refuse the op as unknown).
//! The answer
//! is one line: `{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Longest request line accepted.
pub const MAX_LINE: usize = 64 << 10;

/// A request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Park every vCPU. (Empty braces: unknown fields are refused, which serde does only for
    /// struct variants.)
    Pause {},
    /// Release them.
    Resume {},
    /// State and exit counters.
    Stats {},
    /// Write a snapshot to `dir` (absolute; new or empty). A running VM is paused for it and
    /// resumed after unless `resume` is false. `drain`: the virtual GPU lets a running job
    /// finish instead of preempting it (a snapshot without engine contexts, restorable on
    /// another backend).
    Snapshot {
        dir: PathBuf,
        #[serde(default = "yes")]
        resume: bool,
        #[serde(default)]
        drain: bool,
        /// Pre-copy RAM and VRAM while the VM and its GPU run; pause for the last round only.
        #[serde(default)]
        live: bool,
    },
    /// Migration to the `--incoming` endpoint `to` (`unix:PATH` or an absolute path,
    /// `tcp:HOST:PORT` on loopback, or `tls:HOST:PORT`): stop-and-copy, or pre-copy rounds
    /// with KVM's dirty log while the guest runs if `live`; this VM ends once the destination
    /// has it. `tls`: certificate files (absolute) for a `tls:` address, instead of those the
    /// VM was started with.
    Migrate {
        to: String,
        #[serde(default)]
        live: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<crate::snapshot::tls::TlsFiles>,
    },
    // multigpu:
    /// Move the VM's virtual GPU to GPU `gpu` of its vgpud (`{"op":"move_gpu","gpu":1}`),
    /// VRAM pre-copied while it runs.
    #[serde(rename = "move_gpu")]
    MoveGpu { gpu: u32 },
    /// Restore the snapshot in `dir` (absolute) and run it: only a VM started with
    /// `--standby` takes it (`{"op":"restore","dir":"/abs"}`); answered once the vCPUs run.
    Restore { dir: PathBuf },
    /// Take a migration at `url` (`unix:PATH` or an absolute path, `tcp:HOST:PORT` on
    /// loopback, or `tls:HOST:PORT` with the VM's `--tls-*` files) and run the migrated VM:
    /// only a VM started with `--standby` takes it (`{"op":"incoming","url":"unix:/abs"}`);
    /// answered once it listens there. A source that has not connected within `wait_s`
    /// seconds (default [`INCOMING_WAIT_S`], at most [`MAX_INCOMING_WAIT_S`]) is given up on:
    /// the standby stops listening and takes requests again.
    Incoming {
        url: String,
        #[serde(default = "incoming_wait_s")]
        wait_s: u64,
    },
}

fn yes() -> bool {
    true
}

/// How long a standby told `incoming` waits for the source by default, in seconds.
pub const INCOMING_WAIT_S: u64 = 60;
/// The longest `wait_s` accepted (a day).
pub const MAX_INCOMING_WAIT_S: u64 = 86_400;

fn incoming_wait_s() -> u64 {
    INCOMING_WAIT_S
}

/// An answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn ok(result: serde_json::Value) -> Self {
        Response {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    pub fn err(e: impl std::fmt::Display) -> Self {
        Response {
            ok: false,
            result: None,
            error: Some(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_strictly() {
        let r: Request = serde_json::from_str(r#"{"op":"snapshot","dir":"/x"}"#).unwrap();
        assert_eq!(
            r,
            Request::Snapshot {
                dir: "/x".into(),
                resume: true,
                drain: false,
                live: false
            }
        );
        let r: Request = serde_json::from_str(r#"{"op":"pause"}"#).unwrap();
        assert_eq!(r, Request::Pause {});
        assert!(serde_json::from_str::<Request>(r#"{"op":"reboot"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"snapshot"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"pause","x":1}"#).is_err());
        // migrate: `tls` is optional, complete when given, and never sent empty.
        let r: Request = serde_json::from_str(r#"{"op":"migrate","to":"tls:h:1"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"op":"migrate","to":"tls:h:1","live":false}"#
        );
        let r: Request = serde_json::from_str(
            r#"{"op":"migrate","to":"tls:h:1","tls":{"cert":"/c","key":"/k","ca":"/a"}}"#,
        )
        .unwrap();
        let Request::Migrate { tls: Some(f), .. } = r else {
            panic!("{r:?}")
        };
        assert_eq!((f.cert.to_str(), f.ca.to_str()), (Some("/c"), Some("/a")));
        let r: Request = serde_json::from_str(r#"{"op":"move_gpu","gpu":1}"#).unwrap();
        assert_eq!(r, Request::MoveGpu { gpu: 1 });
        let r: Request = serde_json::from_str(r#"{"op":"restore","dir":"/s"}"#).unwrap();
        assert_eq!(r, Request::Restore { dir: "/s".into() });
        let r: Request = serde_json::from_str(r#"{"op":"incoming","url":"unix:/i"}"#).unwrap();
        assert_eq!(
            r,
            Request::Incoming {
                url: "unix:/i".into(),
                wait_s: INCOMING_WAIT_S
            }
        );
        let r: Request =
            serde_json::from_str(r#"{"op":"incoming","url":"/i","wait_s":5}"#).unwrap();
        assert!(matches!(r, Request::Incoming { wait_s: 5, .. }), "{r:?}");
        for bad in [
            r#"{"op":"incoming"}"#,
            r#"{"op":"incoming","url":"/i","x":1}"#,
            r#"{"op":"incoming","url":1}"#,
            r#"{"op":"incoming","url":"/i","wait_s":-1}"#,
            r#"{"op":"migrate","to":"tls:h:1","tls":{"cert":"/c","key":"/k"}}"#,
            r#"{"op":"migrate","to":"tls:h:1","tls":{"cert":"/c","key":"/k","ca":"/a","x":1}}"#,
            r#"{"op":"move_gpu"}"#,
            r#"{"op":"move_gpu","gpu":-1}"#,
            r#"{"op":"move_gpu","gpu":1,"x":0}"#,
            r#"{"op":"movegpu","gpu":1}"#,
            r#"{"op":"restore"}"#,
            r#"{"op":"restore","dir":"/s","x":1}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }
}
