//! VM snapshots (docs/snapshot.md): the directory format ([`manifest`], [`format`] and
//! [`state`] for the state file, [`ram`] for guest RAM), reading KVM's state ([`cpu`],
//! [`vmstate`]), the virtual GPU's image and configuration ([`gpu`]), writing a snapshot ([`save`]) and reading one back for `--restore` ([`load`]),
//! and the same as a stream for migration ([`stream`]; its destination's GPU made ready during
//! the rounds, [`incoming`]) over a unix socket, loopback TCP or
//! mutual TLS ([`transport`], [`tls`]); the pre-copy rounds of live migration and live snapshots
//! ([`precopy`]) and what their source measures ([`source_report`]).
//! Pausing the vCPUs is [`crate::pause`]; the operations themselves are [`crate::control`].

pub mod cpu;
pub mod format;
pub mod gpu;
pub mod incoming;
pub mod load;
pub mod manifest;
pub mod paced;
pub mod precopy;
pub mod ram;
pub mod ready;
pub mod restore_report;
pub mod save;
pub mod source_report;
pub mod state;
pub mod stream;
pub mod tls;
pub mod transport;
pub mod vmstate;

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
