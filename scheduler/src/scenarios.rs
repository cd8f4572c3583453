//! Standard simulation scenarios (the ones in README.md's results table and in the tests).

use std::time::Duration;

use crate::sim::{SimSpec, SimVm};

const fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

/// Every scenario by name.
pub fn all() -> Vec<(&'static str, SimSpec)> {
    vec![
        ("8 VMs equal, 4×500µs + 4×5ms kernels", eight_mixed()),
        (
            "8 VMs equal, each 500µs/5ms alternating",
            eight_alternating(),
        ),
        ("weights 1:2:4:8, 5ms kernels", weights_1248()),
        ("2 backlogged VMs, 5ms vs 500µs", two_backlogged()),
        ("2 sync VMs (50µs gap), 5ms vs 500µs", two_synchronous()),
        (
            "8 sync VMs (50µs gap), 4×500µs + 4×5ms",
            eight_synchronous(),
        ),
        ("4 VMs, one idle except 0.5-1.0s", on_off()),
        ("32 VMs equal, 500µs/5ms", thirty_two()),
    ]
}

fn spec(vms: Vec<SimVm>) -> SimSpec {
    SimSpec {
        vms,
        duration: Duration::from_secs(3),
        warmup: Duration::from_millis(200),
    }
}

/// 8 backlogged VMs of equal weight: four with 500 µs kernels, four with 5 ms kernels.
pub fn eight_mixed() -> SimSpec {
    spec(
        (0..8)
            .map(|i| SimVm::backlogged(1, &[if i < 4 { us(500) } else { us(5000) }]))
            .collect(),
    )
}

/// 8 backlogged VMs of equal weight, each alternating 500 µs and 5 ms kernels (out of phase).
pub fn eight_alternating() -> SimSpec {
    const EVEN: [Duration; 2] = [us(500), us(5000)];
    const ODD: [Duration; 2] = [us(5000), us(500)];
    spec(
        (0..8)
            .map(|i| SimVm::backlogged(1, if i % 2 == 0 { &EVEN } else { &ODD }))
            .collect(),
    )
}

/// Backlogged VMs with weights 1, 2, 4, 8 and 5 ms kernels.
pub fn weights_1248() -> SimSpec {
    spec(
        [1, 2, 4, 8]
            .into_iter()
            .map(|w| SimVm::backlogged(w, &[us(5000)]))
            .collect(),
    )
}

/// GPUvm's case: a long-kernel VM against a short-kernel VM, both always backlogged.
pub fn two_backlogged() -> SimSpec {
    spec(vec![
        SimVm::backlogged(1, &[us(5000)]),
        SimVm::backlogged(1, &[us(500)]),
    ])
}

/// GPUvm's case with synchronous applications (one kernel in flight, 50 µs of CPU between).
pub fn two_synchronous() -> SimSpec {
    spec(vec![
        SimVm::synchronous(1, &[us(5000)], us(50)),
        SimVm::synchronous(1, &[us(500)], us(50)),
    ])
}

/// 8 synchronous VMs of equal weight (one kernel in flight, 50 µs of CPU between kernels):
/// four with 500 µs kernels, four with 5 ms kernels.
pub fn eight_synchronous() -> SimSpec {
    spec(
        (0..8)
            .map(|i| SimVm::synchronous(1, &[if i < 4 { us(500) } else { us(5000) }], us(50)))
            .collect(),
    )
}

/// Three backlogged VMs and one that only has work from 0.5 s to 1.0 s.
pub fn on_off() -> SimSpec {
    let mut vms: Vec<SimVm> = (0..3).map(|_| SimVm::backlogged(1, &[us(1000)])).collect();
    let mut late = SimVm::backlogged(1, &[us(1000)]);
    late.start = Duration::from_millis(500);
    late.stop = Some(Duration::from_millis(1000));
    vms.push(late);
    spec(vms)
}

/// 32 backlogged VMs of equal weight, half with 500 µs and half with 5 ms kernels.
pub fn thirty_two() -> SimSpec {
    spec(
        (0..32)
            .map(|i| SimVm::backlogged(1, &[if i % 2 == 0 { us(500) } else { us(5000) }]))
            .collect(),
    )
}

/// A latency-sensitive high-priority VM (class 1; inference: requests of 3 kernels of
/// 300/500/200 µs with 100 and 150 µs of CPU between them and 3 ms of think time between
/// requests) beside `lp` backlogged throughput VMs (class 0; training: 1 ms, 150 µs, 600 µs and
/// 90 µs kernels in turn, each VM starting at a different kernel). With `lp = 0`: the
/// high-priority VM alone.
pub fn inference_and_training(lp: usize) -> SimSpec {
    let mut vms = vec![SimVm::requests(
        1,
        &[us(300), us(500), us(200)],
        &[us(100), us(150), us(3000)],
    )];
    let training = [us(1000), us(150), us(600), us(90)];
    for i in 0..lp {
        let mut k = training.to_vec();
        k.rotate_left(i % training.len());
        vms.push(SimVm::backlogged(1, &k));
    }
    spec(vms)
}
