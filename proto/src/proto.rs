//! The vgpud protocol, version 4: the messages a VM process (`vgpu-vmm --gpu host=SOCKET`) and
//! the daemon exchange. One message per `SOCK_SEQPACKET` datagram, JSON encoded (small, rare
//! next to a GPU time slice, readable with `strace`). The rules are in docs/architecture.md
//! ("Sharing one GPU: vgpud"); the state machines live in `client` and `daemon`.

use serde::{Deserialize, Serialize};

/// The protocol version this build speaks. Version 2 added `Want::kernel`: a version-1 daemon
/// refuses unknown fields, so a VM that sends them says so in its `Hello` (and such a daemon
/// refuses it at once instead of dropping its wants). Version 3 added two independent,
/// optional sets of fields: the restart of the daemon (`Welcome::boot`, the daemon instance,
/// and `Hello::resume`, a VM re-registering with the daemon restarted on its socket, claiming
/// the partition it holds), and several GPUs per daemon (`Hello::gpu`, a pin to one of the
/// daemon's GPUs, and `Welcome::gpu`, where the VM was placed). A version-1 or -2 VM is placed
/// by the daemon's policy like any other and told nothing new (its `Welcome` has neither).
/// Version 4 added the grant word (`Hello::word`, `ToVm::GrantWord`, `crate::word`): memory
/// shared with the daemon through which it takes back a turn's grant the VM keeps between two
/// jobs without the VM being scheduled. A version-3 daemon refuses a version-4 `Hello` (as
/// malformed: `word` is unknown to it; the VM then registers again as version 3, without a
/// word); a VM of version 3 or older never gets a word.
pub const VERSION: u32 = 4;

/// The first version with `Hello::word` and `ToVm::GrantWord`.
pub const WORD_VERSION: u32 = 4;

/// The first version with `Welcome::boot` and `Hello::resume`.
pub const RESUME_VERSION: u32 = 3;

/// The oldest version a daemon of this build accepts: a version-1 VM (no identities) is served
/// as before, and its `Welcome` carries the version it asked for.
pub const MIN_VERSION: u32 = 1;

/// The largest message either side sends or accepts, in bytes.
pub const MAX_MESSAGE: usize = 4096;

/// The largest `ToVm::StatusPart::data`, in bytes: escaped as a JSON string (each byte at most
/// two) inside its message it stays under [`MAX_MESSAGE`].
pub const STATUS_CHUNK: usize = 1800;

/// The most parts a status answer has (about 1 MiB of JSON): a daemon whose status would be
/// longer leaves the oldest departed VMs out, and says how many (`Report::vms_omitted`).
pub const STATUS_MAX_PARTS: u32 = 580;

/// Messages from a VM process to the daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToDaemon {
    /// The first message: who the VM is and what it needs. Answered by `Welcome` (with the
    /// VRAM memory object attached) or `Error` and a close.
    Hello(Hello),
    /// The VM has a job ready and wants the GPU. At most one is outstanding: a second before
    /// the grant only identifies the job (the one a `Done { more: true }` announced).
    Want {
        /// The job's kernel identity (`vgpu_proto::kernel::KernelKey`: module content hash, entry, grid,
        /// block, dynamic shared memory); `None` for a copy or an unknown job. With filling the
        /// daemon learns GPU times and idle gaps per identity (bounded per VM). Absent in
        /// messages of older VM processes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kernel: Option<u64>,
    },
    /// The VM no longer wants the GPU (withdraws `Want`). Ignored while a grant is in flight:
    /// the VM answers that grant with `Done { more: false }`.
    Idle {},
    /// Inside a time-sliced grant (`slice_ns > 0`): a job finished and the VM goes on with its
    /// next ready job under the same grant, without a round trip (the grant is a turn). Sent
    /// only while no preempt for the grant has arrived.
    Progress {
        seq: u64,
        /// GPU time of the finished job, and its `CLOCK_MONOTONIC` run stamps.
        gpu_ns: u64,
        start_ns: u64,
        end_ns: u64,
    },
    /// The granted run `seq` ended. Every `Grant` is answered by exactly one `Done`.
    Done {
        seq: u64,
        outcome: RunOutcome,
        /// GPU time the engine reports for the last job of the grant (after any `Progress`),
        /// in nanoseconds (the usage report).
        gpu_ns: u64,
        /// `CLOCK_MONOTONIC` nanoseconds when the engine started and stopped running the job
        /// (both 0 when nothing ran).
        start_ns: u64,
        end_ns: u64,
        /// The VM has another job ready now (an implicit `Want`).
        more: bool,
    },
    /// The VM is going away; its partition may be reclaimed once its process has exited.
    Bye {},
    // multigpu (version 3): moving a running VM to another GPU of the daemon.
    /// Reserve a partition of the VM's size (and its channels) on GPU `gpu` for a move there.
    /// Answered by `MoveReady` (with that GPU's VRAM object) or `MoveRefused`.
    Move { gpu: u32 },
    /// The VM's VRAM now lives in the reserved partition and it holds no grant (it paused its
    /// GPU work): the daemon moves it to the target's scheduler, frees its old partition and
    /// answers `Moved`.
    Moved {},
    /// The move failed on the VM's side: the reservation is given back; the VM stays.
    MoveAbort {},
    // status (an addition to version 3 that VMs never send; a daemon built before it refuses
    // it as malformed, with a non-fatal `Error`, which `vgpud status` reports clearly).
    /// Not a VM: `vgpud status` asks for part `part` of the daemon's status (its report as of
    /// now, without the per-window and per-sample series). Part 0 makes the daemon take the
    /// snapshot; later parts are of that snapshot. Answered by `StatusPart`; after the last
    /// part the daemon closes the connection. Only on a connection that has not registered
    /// (and then never registers).
    Status { part: u32 },
}

/// The fields of `ToDaemon::Hello`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub version: u32,
    /// A label for logs and reports (at most 64 printable characters).
    pub name: String,
    /// Share weight (1 ..= the scheduler's `max_weight`).
    pub weight: u32,
    /// Priority class (higher runs first).
    pub priority: u8,
    /// VRAM partition size in bytes (a multiple of 2 MiB).
    pub vram: u64,
    /// Channels the VM may use (counted against the daemon's channel quota).
    pub channels: u32,
    /// Version 3: this VM was registered with an earlier instance of the daemon on this socket
    /// (which went away) and claims the partition it still holds. The datagram carries the
    /// VRAM memory object the VM received then (`SCM_RIGHTS`). Absent on a first registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
    /// Version 3: pin to the daemon's GPU of this index (`--gpu host=SOCKET,gpu=N`); `None`:
    /// the daemon places the VM by its policy. An index the daemon does not have is refused
    /// (fatal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// Version 4: the VM takes a grant word (`crate::word`): the daemon sends `GrantWord`
    /// right after the `Welcome` (unless it cannot make one: then the messages alone apply).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub word: bool,
}

/// The claim of a re-registering VM (`Hello::resume`): what it kept of its registration with
/// the daemon instance that went away. Everything else (weight, priority, name, VRAM size,
/// channels) is in the `Hello` as on a first registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// The `Welcome::boot` of the instance the VM was registered with.
    pub boot: String,
    /// The VM id that instance gave (kept if free, for reports and logs).
    pub vm: u32,
    /// The daemon's GPU index the partition is on (0 on a one-GPU daemon; after a move, the
    /// GPU the VM was moved to).
    #[serde(default)]
    pub gpu: u32,
    /// The partition's offset in the VRAM memory object (its size is `Hello::vram`).
    pub vram_offset: u64,
}

/// Where a VM was placed (`Welcome::gpu`, version 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// The daemon's GPU index (0-based, as `Hello::gpu` and the report name it).
    pub index: u32,
    /// The CUDA device ordinal of that GPU (`vgpud --gpus 0,1,...`; the index itself when the
    /// daemon was given a count).
    pub device: u32,
}

/// How a granted run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The job finished (or there was nothing to run).
    Completed,
    /// The job stopped at a preemption point; its context is saved in the VM process and it
    /// stays queued.
    Preempted,
    /// The job faulted (charged, gone).
    Faulted,
}

/// Messages from the daemon to a VM process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToVm {
    /// Registration accepted. The datagram carries the VRAM memory object (a memfd) as
    /// `SCM_RIGHTS`; the VM maps `[vram_offset, vram_offset + vram_size)` of it and nothing else.
    Welcome {
        version: u32,
        /// The daemon's id for this VM (reports and logs).
        vm: u32,
        vram_offset: u64,
        vram_size: u64,
        /// Version 3: the daemon instance (random at each start), so that a VM whose daemon
        /// went away can tell a restarted daemon on its socket from the one it knew. Never sent
        /// to older VMs (they refuse unknown fields).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        boot: Option<String>,
        /// Version 3 (absent for older VMs): the GPU the VM was placed on: the daemon's index,
        /// and the CUDA device ordinal a cuda engine opens. The VRAM memory object attached is
        /// that GPU's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<Placement>,
    },
    /// The VM may run one job; with a slice, a turn: further jobs that are ready, each
    /// reported with `Progress`, until the VM runs out of work or is preempted.
    Grant {
        seq: u64,
        /// Time slice in nanoseconds; 0 = run the job to completion (non-preemptive policy).
        slice_ns: u64,
        /// `CLOCK_MONOTONIC` instant at which the VM stops its job by itself (the slice end of a
        /// turn other VMs wait for); 0 = none: a `Preempt` ends the turn. The daemon sends a
        /// `Preempt` after it anyway, as a backstop.
        #[serde(default)]
        deadline_ns: u64,
    },
    /// A grant is likely within about `spin_us` (the running VM's slice ends soon and this VM
    /// waits longest): a VM waiting for a grant may poll for it instead of sleeping, for at most
    /// `2 × spin_us`, so that waking up does not delay the switch.
    Standby { spin_us: u64 },
    /// Version 4, to a VM whose `Hello` asked for it, right after its `Welcome`: the datagram
    /// carries the grant word's memory object (a sealed memfd of `word::SIZE` bytes,
    /// `SCM_RIGHTS`), valid for this connection only (`crate::word`).
    GrantWord {},
    /// Stop grant `seq`'s job at its next preemption point and answer with `Done`.
    /// A preempt for a grant that already ended is ignored.
    Preempt { seq: u64 },
    /// A message was refused. `fatal`: the daemon closes the connection after this.
    Error { message: String, fatal: bool },
    // multigpu (version 3): the answers of a move.
    /// A partition is reserved on GPU `gpu` for the VM's move; the datagram carries that GPU's
    /// VRAM memory object (`SCM_RIGHTS`) of which the partition is
    /// `[vram_offset, vram_offset + vram_size)`.
    MoveReady {
        gpu: Placement,
        vram_offset: u64,
        vram_size: u64,
    },
    /// The move was refused (nothing changed).
    MoveRefused { message: String },
    /// The move is done: the VM is scheduled on its new GPU from its next `Want` on.
    Moved { gpu: Placement },
    /// Part `part` of `parts` (at most [`STATUS_MAX_PARTS`]) of the status's JSON text (at most
    /// [`STATUS_CHUNK`] bytes, split at character boundaries): the parts concatenated are one
    /// `vgpud::Report` object.
    StatusPart { part: u32, parts: u32, data: String },
}

/// Errors decoding a message.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("message of {0} bytes exceeds the {MAX_MESSAGE}-byte limit")]
    TooLong(usize),
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Encodes a message.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serializing these plain enums cannot fail.
    serde_json::to_vec(msg).unwrap_or_default()
}

/// Decodes one datagram.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ProtoError> {
    if bytes.len() > MAX_MESSAGE {
        return Err(ProtoError::TooLong(bytes.len()));
    }
    Ok(serde_json::from_slice(bytes)?)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock both sides stamp runs with (one clock for every
/// process on the host, so the daemon can compare a VM's stamps with its own).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_wire_format() {
        let m = ToDaemon::Done {
            seq: 7,
            outcome: RunOutcome::Preempted,
            gpu_ns: 1500,
            start_ns: 10,
            end_ns: 20,
            more: true,
        };
        let b = encode(&m);
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"type":"done","seq":7,"outcome":"preempted","gpu_ns":1500,"start_ns":10,"end_ns":20,"more":true}"#
        );
        assert_eq!(decode::<ToDaemon>(&b).unwrap(), m);
        let g = ToVm::Grant {
            seq: 1,
            slice_ns: 2_000_000,
            deadline_ns: 5,
        };
        assert_eq!(decode::<ToVm>(&encode(&g)).unwrap(), g);
    }

    #[test]
    fn want_carries_an_optional_identity_and_old_messages_still_decode() {
        let w = ToDaemon::Want {
            kernel: Some(u64::MAX),
        };
        let b = encode(&w);
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"type":"want","kernel":18446744073709551615}"#
        );
        assert_eq!(decode::<ToDaemon>(&b).unwrap(), w);
        // Without an identity the message is the old form, and the old form decodes.
        let none = ToDaemon::Want { kernel: None };
        assert_eq!(encode(&none), br#"{"type":"want"}"#);
        assert_eq!(decode::<ToDaemon>(br#"{"type":"want"}"#).unwrap(), none);
        assert_eq!(
            decode::<ToDaemon>(br#"{"type":"want","kernel":null}"#).unwrap(),
            none
        );
        for bad in [
            &br#"{"type":"want","kernel":-1}"#[..],
            br#"{"type":"want","kernel":18446744073709551616}"#,
            br#"{"type":"want","kernel":"7"}"#,
            br#"{"type":"want","kernel":1.5}"#,
        ] {
            assert!(decode::<ToDaemon>(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn version_3_fields_are_optional_and_absent_in_older_forms() {
        // A first registration is the version-2 form with a higher version.
        let h = Hello {
            version: 3,
            name: "a".into(),
            weight: 1,
            priority: 0,
            vram: 2 << 20,
            channels: 1,
            resume: None,
            gpu: None,
            word: false,
        };
        let b = encode(&ToDaemon::Hello(h.clone()));
        assert!(!std::str::from_utf8(&b).unwrap().contains("resume"));
        let v2 = br#"{"type":"hello","version":2,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1}"#;
        let ToDaemon::Hello(old) = decode::<ToDaemon>(v2).unwrap() else {
            panic!("not a hello")
        };
        assert_eq!((old.version, old.resume), (2, None));
        // A claim: the gpu index defaults to 0; unknown claim fields are refused.
        let claim = br#"{"type":"hello","version":3,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1,"resume":{"boot":"ab","vm":4,"vram_offset":4194304}}"#;
        let ToDaemon::Hello(c) = decode::<ToDaemon>(claim).unwrap() else {
            panic!("not a hello")
        };
        let r = c.resume.clone().unwrap();
        assert_eq!(
            (r.boot.as_str(), r.vm, r.gpu, r.vram_offset),
            ("ab", 4, 0, 4 << 20)
        );
        assert_eq!(
            decode::<ToDaemon>(&encode(&ToDaemon::Hello(c.clone()))).unwrap(),
            ToDaemon::Hello(c)
        );
        let bad = br#"{"type":"hello","version":3,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1,"resume":{"boot":"ab","vm":4,"vram_offset":0,"x":1}}"#;
        assert!(decode::<ToDaemon>(bad).is_err());
        // The welcome of an older VM carries no boot id (it would refuse the field).
        let w = ToVm::Welcome {
            version: 2,
            vm: 1,
            vram_offset: 0,
            vram_size: 2 << 20,
            boot: None,
            gpu: None,
        };
        assert_eq!(
            encode(&w),
            br#"{"type":"welcome","version":2,"vm":1,"vram_offset":0,"vram_size":2097152}"#
        );
        let w3 = ToVm::Welcome {
            version: 3,
            vm: 1,
            vram_offset: 0,
            vram_size: 2 << 20,
            boot: Some("0f".into()),
            gpu: None,
        };
        assert_eq!(decode::<ToVm>(&encode(&w3)).unwrap(), w3);
    }

    #[test]
    fn a_pin_and_a_placement_are_optional_and_absent_in_the_old_form() {
        let mut h = Hello {
            version: 2,
            name: "a".into(),
            weight: 1,
            priority: 0,
            vram: 2 << 20,
            channels: 1,
            resume: None,
            gpu: None,
            word: false,
        };
        let old = br#"{"type":"hello","version":2,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1}"#;
        assert_eq!(encode(&ToDaemon::Hello(h.clone())), old);
        assert_eq!(decode::<ToDaemon>(old).unwrap(), ToDaemon::Hello(h.clone()));
        h.gpu = Some(3);
        let b = encode(&ToDaemon::Hello(h.clone()));
        assert!(std::str::from_utf8(&b).unwrap().ends_with(r#","gpu":3}"#));
        assert_eq!(decode::<ToDaemon>(&b).unwrap(), ToDaemon::Hello(h));
        let w = ToVm::Welcome {
            version: 3,
            vm: 1,
            vram_offset: 0,
            vram_size: 2 << 20,
            boot: None,
            gpu: None,
        };
        assert_eq!(
            encode(&w),
            br#"{"type":"welcome","version":3,"vm":1,"vram_offset":0,"vram_size":2097152}"#
        );
        let placed = br#"{"type":"welcome","version":3,"vm":1,"vram_offset":0,"vram_size":2097152,"gpu":{"index":1,"device":4}}"#;
        assert!(matches!(
            decode::<ToVm>(placed).unwrap(),
            ToVm::Welcome {
                gpu: Some(Placement {
                    index: 1,
                    device: 4
                }),
                ..
            }
        ));
        for bad in [
            &br#"{"type":"hello","version":3,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1,"gpu":-1}"#[..],
            br#"{"type":"hello","version":3,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1,"gpu":4294967296}"#,
            br#"{"type":"welcome","version":3,"vm":1,"vram_offset":0,"vram_size":2097152,"gpu":{"index":1}}"#,
            br#"{"type":"welcome","version":3,"vm":1,"vram_offset":0,"vram_size":2097152,"gpu":{"index":1,"device":0,"x":0}}"#,
        ] {
            assert!(
                decode::<ToDaemon>(bad).is_err() && decode::<ToVm>(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_version_4_word_is_optional_and_absent_in_older_forms() {
        let mut h = Hello {
            version: 3,
            name: "a".into(),
            weight: 1,
            priority: 0,
            vram: 2 << 20,
            channels: 1,
            resume: None,
            gpu: None,
            word: false,
        };
        // Not asked: the version-3 form, which a version-3 daemon decodes.
        let old = br#"{"type":"hello","version":3,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1}"#;
        assert_eq!(encode(&ToDaemon::Hello(h.clone())), old);
        assert_eq!(decode::<ToDaemon>(old).unwrap(), ToDaemon::Hello(h.clone()));
        (h.version, h.word) = (4, true);
        let b = encode(&ToDaemon::Hello(h.clone()));
        assert!(
            std::str::from_utf8(&b)
                .unwrap()
                .ends_with(r#","word":true}"#)
        );
        assert_eq!(decode::<ToDaemon>(&b).unwrap(), ToDaemon::Hello(h));
        assert_eq!(encode(&ToVm::GrantWord {}), br#"{"type":"grant_word"}"#);
        for bad in [
            &br#"{"type":"grant_word","x":1}"#[..],
            br#"{"type":"hello","version":4,"name":"a","weight":1,"priority":0,"vram":2097152,"channels":1,"word":1}"#,
        ] {
            assert!(
                decode::<ToDaemon>(bad).is_err() && decode::<ToVm>(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_full_status_part_fits_a_message_and_status_is_not_a_hello() {
        // The worst case: every byte of the chunk escaped.
        let m = ToVm::StatusPart {
            part: STATUS_MAX_PARTS - 1,
            parts: STATUS_MAX_PARTS,
            data: "\"".repeat(STATUS_CHUNK),
        };
        let b = encode(&m);
        assert!(b.len() <= MAX_MESSAGE, "{}", b.len());
        assert_eq!(decode::<ToVm>(&b).unwrap(), m);
        let q = ToDaemon::Status { part: 3 };
        assert_eq!(encode(&q), br#"{"type":"status","part":3}"#);
        assert_eq!(decode::<ToDaemon>(&encode(&q)).unwrap(), q);
        for bad in [
            &br#"{"type":"status"}"#[..],
            br#"{"type":"status","part":-1}"#,
            br#"{"type":"status","part":0,"x":1}"#,
        ] {
            assert!(decode::<ToDaemon>(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hostile_bytes_are_errors() {
        for bad in [
            &b""[..],
            b"{",
            b"{\"type\":\"want\",\"x\":1}",
            b"{\"type\":\"launch\"}",
            b"{\"type\":\"done\",\"seq\":-1}",
            b"\xff\xfe",
        ] {
            assert!(decode::<ToDaemon>(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            decode::<ToDaemon>(&vec![b' '; MAX_MESSAGE + 1]),
            Err(ProtoError::TooLong(_))
        ));
    }
}
