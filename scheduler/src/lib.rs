//! GPU scheduling policies (FIFO, CREDIT, BAND, TIMESLICE, strict priority classes) as pure logic
//! over an injected clock, with per-VM GPU-time accounting and a deterministic simulator.
//!
//! The caller (a dispatcher owning the GPU thread, or the `vgpud` daemon) reports events with
//! explicit timestamps and asks [`Scheduler::pick`] who runs next; see README.md for the event
//! model and each policy's exact semantics.
//!
//! ```
//! use std::time::Duration;
//! use scheduler::{Config, Pick, Scheduler, VmId, VmParams};
//!
//! let ms = Duration::from_millis;
//! let mut s = Scheduler::new(Config::parse("policy=timeslice,slice=2ms").unwrap()).unwrap();
//! s.register(VmId(1), VmParams { weight: 1, priority: 0 }, ms(0)).unwrap();
//! s.on_submit(VmId(1), ms(0)).unwrap();
//! let Pick::Run(d) = s.pick(ms(0)).unwrap() else { panic!() };
//! assert_eq!((d.run, d.slice), (VmId(1), Some(ms(2))));
//! // The engine preempted the job at the slice end after 2.05 ms of GPU time.
//! s.on_preempted(VmId(1), Duration::from_micros(2050), Duration::from_micros(2050)).unwrap();
//! assert_eq!(s.vm_info(VmId(1)).unwrap().1.gpu_time, Duration::from_micros(2050));
//! ```

mod accounting;
mod clock;
mod config;
mod error;
mod fill;
pub mod policy;
pub mod scenarios;
mod scheduler;
pub mod sim;
mod types;

pub use accounting::{Accounting, WindowUsage};
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use config::{Charge, Config, ConfigError, PolicyKind, parse_duration};
pub use error::SchedError;
pub use policy::{Choice, Policy};
pub use scheduler::Scheduler;
pub use types::{Action, Decision, KernelKey, Pick, Removed, Running, VmId, VmParams, VmStats};
