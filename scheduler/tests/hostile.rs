//! Bad and hostile inputs are refused with errors (state unchanged), never panics; random event
//! sequences keep the invariants (proptest).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{ms, run, sched};
use proptest::prelude::*;
use scheduler::{KernelKey, Pick, SchedError, Scheduler, VmId, VmParams};

const A: VmId = VmId(1);
const B: VmId = VmId(2);

#[test]
fn zero_or_huge_weight_is_rejected() {
    let mut s = sched("max_weight=100", &[]);
    let zero = VmParams {
        weight: 0,
        priority: 0,
    };
    assert_eq!(
        s.register(A, zero, ms(0)),
        Err(SchedError::BadWeight {
            weight: 0,
            max: 100
        })
    );
    let huge = VmParams {
        weight: 101,
        priority: 0,
    };
    assert!(matches!(
        s.register(A, huge, ms(0)),
        Err(SchedError::BadWeight { .. })
    ));
    assert_eq!(s.vms().count(), 0);
    s.register(
        A,
        VmParams {
            weight: 100,
            priority: 0,
        },
        ms(0),
    )
    .unwrap();
    assert_eq!(
        s.register(A, VmParams::default(), ms(0)),
        Err(SchedError::AlreadyRegistered(A))
    );
}

#[test]
fn too_many_vms_is_rejected() {
    let mut s = sched("max_vms=2", &[(1, 1, 0), (2, 1, 0)]);
    assert_eq!(
        s.register(VmId(3), VmParams::default(), ms(0)),
        Err(SchedError::TooManyVms(2))
    );
    s.remove(A, ms(0)).unwrap();
    s.register(VmId(3), VmParams::default(), ms(0)).unwrap();
}

#[test]
fn queued_jobs_per_vm_are_bounded() {
    let mut s = sched("max_pending=3", &[(1, 1, 0)]);
    for _ in 0..3 {
        s.on_submit(A, ms(0)).unwrap();
    }
    assert_eq!(
        s.on_submit(A, ms(0)),
        Err(SchedError::TooManyJobs { vm: A, limit: 3 })
    );
    assert_eq!(s.vm_info(A).unwrap().1.pending, 3);
    run(&mut s, ms(0));
    s.on_complete(A, ms(1), ms(1)).unwrap();
    s.on_submit(A, ms(1)).unwrap();
}

#[test]
fn unknown_vm_ids_are_rejected() {
    let mut s = sched("", &[(1, 1, 0)]);
    let x = VmId(99);
    assert_eq!(s.on_submit(x, ms(0)), Err(SchedError::UnknownVm(x)));
    assert_eq!(s.on_idle(x, ms(0)), Err(SchedError::UnknownVm(x)));
    assert_eq!(
        s.on_complete(x, ms(1), ms(0)),
        Err(SchedError::UnknownVm(x))
    );
    assert_eq!(
        s.on_preempted(x, ms(1), ms(0)),
        Err(SchedError::UnknownVm(x))
    );
    assert_eq!(s.on_fault(x, ms(1), ms(0)), Err(SchedError::UnknownVm(x)));
    assert_eq!(s.remove(x, ms(0)), Err(SchedError::UnknownVm(x)));
    assert!(s.vm_info(x).is_err());
    assert_eq!(s.pick(ms(0)), Ok(Pick::Idle));
}

#[test]
fn time_going_backwards_is_rejected_without_effect() {
    let mut s = sched("", &[(1, 1, 0), (2, 1, 0)]);
    s.on_submit(A, ms(10)).unwrap();
    let back = Err(SchedError::TimeWentBackwards {
        last: ms(10),
        now: ms(9),
    });
    assert_eq!(s.on_submit(B, ms(9)).map(|_| ()), back);
    assert_eq!(s.pick(ms(9)).map(|_| ()), back);
    assert_eq!(s.register(VmId(3), VmParams::default(), ms(9)), back);
    assert_eq!(
        s.vm_info(B).unwrap().1.pending,
        0,
        "refused submit changed nothing"
    );
    let d = run(&mut s, ms(10));
    assert_eq!(d.run, A);
    assert_eq!(s.on_complete(A, ms(1), ms(9)), back);
    assert_eq!(
        s.running().map(|r| r.vm),
        Some(A),
        "still running after the refused report"
    );
    s.on_complete(A, ms(1), ms(11)).unwrap();
}

#[test]
fn reports_for_a_vm_that_is_not_running_are_rejected() {
    let mut s = sched("", &[(1, 1, 0), (2, 1, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(
        s.on_complete(A, ms(1), ms(1)),
        Err(SchedError::NotRunning(A))
    );
    assert_eq!(run(&mut s, ms(1)).run, A);
    assert_eq!(
        s.on_preempted(B, ms(1), ms(2)),
        Err(SchedError::NotRunning(B))
    );
    assert_eq!(
        s.pick(ms(2)),
        Err(SchedError::Busy(A)),
        "one grant at a time"
    );
    assert_eq!(s.on_idle(A, ms(2)), Err(SchedError::Busy(A)));
}

#[test]
fn engine_reports_are_capped_at_the_time_held() {
    let mut s = sched("charge=engine", &[(1, 1, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    run(&mut s, ms(0));
    s.on_complete(A, Duration::MAX, ms(3)).unwrap();
    assert_eq!(s.vm_info(A).unwrap().1.gpu_time, ms(3));
    // charge=wall ignores the report (a VM process cannot under-report its use).
    let mut s = sched("charge=wall", &[(1, 1, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    run(&mut s, ms(0));
    s.on_complete(A, Duration::ZERO, ms(3)).unwrap();
    assert_eq!(s.vm_info(A).unwrap().1.gpu_time, ms(3));
}

#[test]
fn extreme_times_do_not_panic() {
    for policy in ["fifo", "credit", "band", "timeslice"] {
        let mut s = sched(&format!("policy={policy}"), &[(1, 1, 0), (2, 10_000, 0)]);
        s.on_submit(A, Duration::ZERO).unwrap();
        s.on_submit(B, Duration::ZERO).unwrap();
        let d = run(&mut s, Duration::ZERO);
        s.on_preempted(d.run, Duration::MAX, Duration::MAX).unwrap();
        let d = run(&mut s, Duration::MAX);
        s.on_complete(d.run, Duration::MAX, Duration::MAX).unwrap();
        assert!(s.pick(Duration::MAX).is_ok());
    }
}

/// One random event.
#[derive(Debug, Clone)]
enum Ev {
    Register(u32, u32, u8),
    Remove(u32),
    Weight(u32, u32),
    /// A job with kernel identity `.1` (learned under `fill=on`).
    Submit(u32, u8),
    Idle(u32),
    Pick,
    /// End the running VM's run: 0 = complete, 1 = preempted, 2 = fault.
    End(u8, u64),
    /// A report for some VM, running or not.
    Bogus(u32, u8),
    Advance(u64),
    Backwards(u64),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        1 => (0u32..6, 0u32..20, 0u8..3).prop_map(|(v, w, p)| Ev::Register(v, w, p)),
        1 => (0u32..6).prop_map(Ev::Remove),
        1 => (0u32..6, 0u32..20).prop_map(|(v, w)| Ev::Weight(v, w)),
        4 => (0u32..6, 0u8..4).prop_map(|(v, k)| Ev::Submit(v, k)),
        1 => (0u32..6).prop_map(Ev::Idle),
        4 => Just(Ev::Pick),
        4 => (0u8..3, 0u64..10_000_000).prop_map(|(k, ns)| Ev::End(k, ns)),
        1 => (0u32..6, 0u8..3).prop_map(|(v, k)| Ev::Bogus(v, k)),
        3 => (0u64..5_000_000).prop_map(Ev::Advance),
        1 => (1u64..1_000_000).prop_map(Ev::Backwards),
    ]
}

/// The model the scheduler must agree with: registered VMs and their queued jobs.
#[derive(Default)]
struct Model {
    /// Time of the last event the scheduler accepted.
    last: Duration,
    pending: BTreeMap<u32, u64>,
    removed: BTreeSet<u32>,
}

fn step(s: &mut Scheduler, m: &mut Model, now: &mut Duration, e: Ev) -> Result<(), TestCaseError> {
    let t = *now;
    match e {
        Ev::Register(v, w, p) => {
            let ok = s
                .register(
                    VmId(v),
                    VmParams {
                        weight: w,
                        priority: p,
                    },
                    t,
                )
                .is_ok();
            prop_assert_eq!(ok, w > 0 && !m.pending.contains_key(&v));
            if ok {
                m.last = t;
                m.pending.insert(v, 0);
                m.removed.remove(&v);
            }
        }
        Ev::Remove(v) => {
            let r = s.remove(VmId(v), t);
            prop_assert_eq!(r.is_ok(), m.pending.remove(&v).is_some());
            if r.is_ok() {
                m.last = t;
                m.removed.insert(v);
            }
        }
        Ev::Weight(v, w) => {
            let ok = s.set_weight(VmId(v), w, t).is_ok();
            prop_assert_eq!(ok, w > 0 && m.pending.contains_key(&v));
            if ok {
                m.last = t;
            }
        }
        Ev::Submit(v, key) => {
            let key = Some(KernelKey(u64::from(key)));
            let ok = s.on_submit_kernel(VmId(v), key, t).is_ok();
            prop_assert_eq!(ok, m.pending.contains_key(&v));
            if let Some(p) = m.pending.get_mut(&v) {
                m.last = t;
                *p += 1;
            }
        }
        Ev::Idle(v) => {
            let running = s.running().is_some_and(|r| r.vm == VmId(v));
            let ok = s.on_idle(VmId(v), t).is_ok();
            prop_assert_eq!(ok, m.pending.contains_key(&v) && !running);
            if ok {
                m.last = t;
                m.pending.insert(v, 0);
            }
        }
        Ev::Pick => {
            let busy = s.running().is_some();
            let r = s.pick(t);
            if r.is_ok() {
                m.last = t;
            }
            match r {
                Err(_) => prop_assert!(busy),
                Ok(Pick::Run(d)) => {
                    prop_assert!(!busy);
                    let p = m.pending.get(&d.run.0).copied();
                    prop_assert!(
                        p.is_some_and(|p| p > 0),
                        "picked {} with {:?} jobs",
                        d.run,
                        p
                    );
                    prop_assert!(!m.removed.contains(&d.run.0));
                }
                Ok(Pick::Wait { vm, until }) => {
                    prop_assert!(until > t && m.pending.contains_key(&vm.0));
                    prop_assert!(m.pending.values().any(|&p| p > 0));
                }
                Ok(Pick::Idle) => prop_assert!(m.pending.values().all(|&p| p == 0)),
            }
        }
        Ev::End(kind, ns) => {
            if let Some(r) = s.running() {
                *now += Duration::from_nanos(ns);
                let (vm, gpu) = (r.vm, Duration::from_nanos(ns));
                match kind {
                    0 => s.on_complete(vm, gpu, *now),
                    1 => s.on_preempted(vm, gpu, *now),
                    _ => s.on_fault(vm, gpu, *now),
                }
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                m.last = *now;
                if kind != 1
                    && let Some(p) = m.pending.get_mut(&vm.0)
                {
                    *p -= 1;
                }
            }
        }
        Ev::Bogus(v, kind) => {
            if s.running().is_none_or(|r| r.vm != VmId(v)) {
                let r = match kind {
                    0 => s.on_complete(VmId(v), ms(1), t),
                    1 => s.on_preempted(VmId(v), ms(1), t),
                    _ => s.on_fault(VmId(v), ms(1), t),
                };
                prop_assert!(r.is_err());
            }
        }
        Ev::Advance(ns) => *now += Duration::from_nanos(ns),
        Ev::Backwards(ns) => {
            if let Some(past) = m.last.checked_sub(Duration::from_nanos(ns)) {
                let back = SchedError::TimeWentBackwards {
                    last: m.last,
                    now: past,
                };
                prop_assert_eq!(s.pick(past).map(|_| ()), Err(back.clone()));
                prop_assert_eq!(s.on_submit(VmId(0), past).map(|_| ()), Err(back));
            }
        }
    }
    for (&v, &p) in &m.pending {
        prop_assert_eq!(s.vm_info(VmId(v)).map(|i| i.1.pending).ok(), Some(p));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// Never panics; never grants an idle or removed VM; errors exactly where the model says.
    #[test]
    fn random_event_sequences_keep_the_invariants(
        policy in 0usize..4,
        fill in any::<bool>(),
        events in proptest::collection::vec(ev(), 1..300),
    ) {
        let name = ["fifo", "credit", "band", "timeslice"][policy];
        let fill = if fill { "on" } else { "off" };
        let mut s = sched(
            &format!("policy={name},credit_period=5ms,band_period=5ms,fill={fill},fill_samples=1"),
            &[],
        );
        let mut m = Model::default();
        let mut now = Duration::ZERO;
        for e in events {
            step(&mut s, &mut m, &mut now, e)?;
        }
    }

    /// Backlogged VMs with random weights converge to their weighted shares under TIMESLICE.
    #[test]
    fn timeslice_shares_converge_to_weights(weights in proptest::collection::vec(1u32..20, 2..6)) {
        let vms: Vec<(u32, u32, u8)> =
            weights.iter().enumerate().map(|(i, &w)| (i as u32, w, 0)).collect();
        let mut s = sched("policy=timeslice,slice=1ms", &vms);
        for &(v, _, _) in &vms {
            s.on_submit(VmId(v), Duration::ZERO).unwrap();
        }
        let mut now = Duration::ZERO;
        for _ in 0..3000 {
            let d = run(&mut s, now);
            // Kernels of 700 µs: some runs complete, some are preempted, with 20 µs overshoot.
            let used = d.slice.map_or(Duration::from_micros(700), |sl| sl.min(Duration::from_micros(700)));
            now += used;
            if used == Duration::from_micros(700) {
                s.on_complete(d.run, used, now).unwrap();
                s.on_submit(d.run, now).unwrap();
            } else {
                now += Duration::from_micros(20);
                s.on_preempted(d.run, used + Duration::from_micros(20), now).unwrap();
            }
        }
        let total: u32 = weights.iter().sum();
        let all: Duration = vms.iter().map(|&(v, _, _)| s.vm_info(VmId(v)).unwrap().1.gpu_time).sum();
        for &(v, w, _) in &vms {
            let share = s.vm_info(VmId(v)).unwrap().1.gpu_time.as_secs_f64() / all.as_secs_f64();
            let expected = f64::from(w) / f64::from(total);
            prop_assert!((share - expected).abs() < 0.01, "vm {} share {} expected {}", v, share, expected);
        }
    }
}
