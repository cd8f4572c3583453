//! Helpers shared by the integration tests: time shorthands and a scheduler with VMs registered.

#![allow(dead_code)]

use std::time::Duration;

use scheduler::{Config, Decision, Pick, Scheduler, VmId, VmParams};

pub fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A scheduler configured by `config` with VMs `(id, weight, priority)` registered at time 0.
pub fn sched(config: &str, vms: &[(u32, u32, u8)]) -> Scheduler {
    let mut s = Scheduler::new(Config::parse(config).expect("config")).expect("scheduler");
    for &(id, weight, priority) in vms {
        s.register(VmId(id), VmParams { weight, priority }, Duration::ZERO)
            .expect("register");
    }
    s
}

/// The decision of a pick that must grant the GPU.
pub fn run(s: &mut Scheduler, now: Duration) -> Decision {
    match s.pick(now).expect("pick") {
        Pick::Run(d) => d,
        other => panic!("expected a grant at {now:?}, got {other:?}"),
    }
}
