//! Filling (`fill=on`, FIKIT with preemption): gap and kernel-time prediction, the choice of
//! fillers, preemption of a filler that overruns, hostile timing and identities, and the
//! simulated experiment's targets.

mod common;

use std::time::Duration;

use common::{ms, run, sched, us};
use scheduler::sim::priority::{Mode, compare};
use scheduler::sim::{SimSpec, simulate};
use scheduler::{Action, Config, KernelKey, Pick, Scheduler, VmId, scenarios};

const H: VmId = VmId(10); // high priority (class 2 or 1)
const H2: VmId = VmId(11);
const M: VmId = VmId(5); // middle class
const L1: VmId = VmId(1);
const L2: VmId = VmId(2);
const L3: VmId = VmId(3);

fn k(n: u64) -> Option<KernelKey> {
    Some(KernelKey(n))
}

/// `vm` submits `key` at `at`, is granted at once and completes after `gpu`; returns the end.
fn alone(
    s: &mut Scheduler,
    vm: VmId,
    key: Option<KernelKey>,
    at: Duration,
    gpu: Duration,
) -> Duration {
    assert_eq!(s.on_submit_kernel(vm, key, at).unwrap(), Action::None);
    assert_eq!(run(s, at).run, vm);
    s.on_complete(vm, gpu, at + gpu).unwrap();
    at + gpu
}

/// Teaches `vm` (alone on the GPU) that kernel `key` takes `gpu`: two runs from `at`.
fn teach_kernel(s: &mut Scheduler, vm: VmId, key: u64, gpu: Duration, at: Duration) -> Duration {
    let t = alone(s, vm, k(key), at, gpu);
    alone(s, vm, k(key), t, gpu)
}

/// Teaches the high VM that kernel 7 (100 µs) is followed by `gap` of idle time, twice; returns
/// the time the third gap starts (the VM has just completed kernel 7 and is idle).
fn teach_gap(s: &mut Scheduler, vm: VmId, gap: Duration, at: Duration) -> Duration {
    let mut t = alone(s, vm, k(7), at, us(100));
    for _ in 0..2 {
        t = alone(s, vm, k(7), t + gap, us(100));
    }
    t
}

#[test]
fn policy_fikit_is_timeslice_with_filling() {
    let c = Config::parse("policy=fikit,fill_bound=10us").unwrap();
    assert!(c.fill);
    assert_eq!(c.policy, scheduler::PolicyKind::Timeslice);
    assert_eq!(c.fill_bound, us(10));
    assert!(Config::parse("fill=maybe").is_err());
    assert!(Config::parse("fill=on,fill_kernels=0").is_err());
    assert!(!Config::default().fill);
}

#[test]
fn gap_after_each_identity_is_learned_online() {
    let mut s = sched("fill=on", &[(10, 1, 1)]);
    // No gap measured yet: idle after a completion, but no prediction.
    let t = alone(&mut s, H, k(7), ms(0), us(100));
    assert_eq!(s.predicted_gap(H), Some((t, None)));
    let t = alone(&mut s, H, k(7), t + us(300), us(100));
    assert_eq!(
        s.predicted_gap(H),
        Some((t, None)),
        "one sample is not enough"
    );
    let t = alone(&mut s, H, k(7), t + us(300), us(100));
    assert_eq!(s.predicted_gap(H), Some((t, Some(us(300)))));
    // A different identity has its own gap: after kernel 8 nothing is known.
    let t = alone(&mut s, H, k(8), t + us(300), us(100));
    assert_eq!(s.predicted_gap(H), Some((t, None)));
    // While it has work it is not in a gap.
    s.on_submit_kernel(H, k(7), t + us(50)).unwrap();
    assert_eq!(s.predicted_gap(H), None);
}

#[test]
fn without_fill_nothing_is_learned() {
    let mut s = sched("policy=timeslice", &[(10, 1, 1)]);
    teach_gap(&mut s, H, us(300), ms(0));
    assert_eq!(s.predicted_gap(H), None);
    assert_eq!(s.kernels_known(H), 0);
    assert_eq!(s.predicted_head(H), None);
}

#[test]
fn kernel_time_sums_the_preempted_parts_of_a_job() {
    let mut s = sched("fill=on,slice=100us", &[(1, 1, 0)]);
    let mut t = ms(0);
    for _ in 0..2 {
        s.on_submit_kernel(L1, k(3), t).unwrap();
        run(&mut s, t);
        s.on_preempted(L1, us(100), t + us(100)).unwrap();
        run(&mut s, t + us(100));
        s.on_complete(L1, us(150), t + us(250)).unwrap();
        t += us(250);
    }
    s.on_submit_kernel(L1, k(3), t).unwrap();
    assert_eq!(s.predicted_head(L1), Some(us(250)));
    // Partly run: what is left.
    run(&mut s, t);
    s.on_preempted(L1, us(100), t + us(100)).unwrap();
    assert_eq!(s.predicted_head(L1), Some(us(150)));
    assert_eq!(s.kernels_known(L1), 1);
}

/// A scheduler with the high VM `H` (class 2) in a learned 1 ms gap that started at the
/// returned time, and the low VMs taught their kernels: L1 = 200 µs (key 1), L2 = 450 µs
/// (key 2), L3 = 700 µs (key 3), M (class 1) = 100 µs (key 4).
fn in_gap(config: &str) -> (Scheduler, Duration) {
    let mut s = sched(
        config,
        &[(1, 1, 0), (2, 1, 0), (3, 1, 0), (5, 1, 1), (10, 1, 2)],
    );
    let mut t = ms(0);
    for (vm, key, gpu) in [(L1, 1, 200), (L2, 2, 450), (L3, 3, 700), (M, 4, 100)] {
        t = teach_kernel(&mut s, vm, key, us(gpu), t);
    }
    let t = teach_gap(&mut s, H, ms(1), t);
    (s, t)
}

#[test]
fn the_best_fit_of_the_best_class_fills_the_gap() {
    let (mut s, t) = in_gap("fill=on");
    for (vm, key) in [(L1, 1), (L2, 2), (L3, 3)] {
        s.on_submit_kernel(vm, k(key), t).unwrap();
    }
    // 1 ms predicted: all three fit, 700 µs fits best.
    let d = run(&mut s, t);
    assert_eq!(d.run, L3, "700 µs is the longest kernel that fits 1 ms");
    s.on_complete(L3, us(700), t + us(700)).unwrap();
    // 300 µs left: 450 µs does not fit any more, 200 µs does.
    let d = run(&mut s, t + us(700));
    assert_eq!(d.run, L1);
    s.on_complete(L1, us(200), t + us(900)).unwrap();
    // 100 µs left: L2's 450 µs does not fit; it runs sliced to the gap's end instead.
    let d = run(&mut s, t + us(900));
    assert_eq!((d.run, d.slice), (L2, Some(us(100))));
}

#[test]
fn a_higher_class_filler_goes_before_a_better_fit() {
    let (mut s, t) = in_gap("fill=on");
    s.on_submit_kernel(L2, k(2), t).unwrap();
    s.on_submit_kernel(M, k(4), t).unwrap();
    assert_eq!(
        run(&mut s, t).run,
        M,
        "class 1 first, though 450 µs fits better"
    );
}

#[test]
fn weights_decide_between_equal_fits() {
    let mut s = sched("fill=on", &[(1, 1, 0), (2, 3, 0), (10, 1, 1)]);
    let mut t = teach_kernel(&mut s, L1, 1, us(400), ms(0));
    t = teach_kernel(&mut s, L2, 1, us(400), t);
    t = teach_gap(&mut s, H, ms(1), t);
    // L1 has 800 µs of GPU time at weight 1, L2 800 µs at weight 3: L2 is owed more.
    s.on_submit_kernel(L1, k(1), t).unwrap();
    s.on_submit_kernel(L2, k(1), t).unwrap();
    assert_eq!(run(&mut s, t).run, L2);
}

#[test]
fn a_gap_too_short_to_fill_keeps_the_gpu_for_the_high_vm() {
    let mut s = sched("fill=on,fill_min=20us", &[(1, 1, 0), (10, 1, 1)]);
    let t = teach_kernel(&mut s, L1, 1, us(200), ms(0));
    let t = teach_gap(&mut s, H, us(15), t);
    s.on_submit_kernel(L1, k(1), t).unwrap();
    assert_eq!(
        s.pick(t).unwrap(),
        Pick::Wait {
            vm: H,
            until: t + us(15)
        }
    );
    // It is due: the GPU is held for it until its return window ends (its gaps were all
    // 15 µs: at least fill_min more).
    assert_eq!(
        s.pick(t + us(15)).unwrap(),
        Pick::Wait {
            vm: H,
            until: t + us(35)
        }
    );
    // Late: it constrains nothing any more (a preempt covers its return), the class slice.
    let d = run(&mut s, t + us(35));
    assert_eq!((d.run, d.slice), (L1, Some(ms(2))));
    assert_eq!(
        s.on_submit_kernel(H, k(7), t + us(40)).unwrap(),
        Action::Preempt(L1)
    );
}

#[test]
fn a_due_high_vm_holds_the_gpu_until_its_third_quartile_then_late_it_constrains_nothing() {
    // Gaps of 1.0-1.6 ms after kernel 7: the fill is cut at the low quantile (1.0 ms here),
    // the GPU is held until the third quartile, then the low class runs uncut.
    let mut s = sched("fill=on", &[(1, 1, 0), (10, 1, 1)]);
    let t = teach_kernel(&mut s, L1, 1, us(1500), ms(0));
    let mut t = alone(&mut s, H, k(7), t, us(100));
    for gap in [1000, 1100, 1200, 1300, 1400, 1500, 1600, 1250, 1150] {
        t = alone(&mut s, H, k(7), t + us(gap), us(100));
    }
    assert_eq!(s.predicted_gap(H), Some((t, Some(us(1000)))));
    s.on_submit_kernel(L1, k(1), t).unwrap();
    let d = run(&mut s, t);
    assert_eq!((d.run, d.slice), (L1, Some(us(1000))));
    s.on_preempted(L1, us(1000), t + us(1000)).unwrap();
    // 9 samples: the third quartile is the 7th smallest, 1.4 ms; fill_hold (300 µs) caps it.
    assert_eq!(
        s.pick(t + us(1000)).unwrap(),
        Pick::Wait {
            vm: H,
            until: t + us(1300)
        }
    );
    // The high VM comes within the window: granted at once.
    assert_eq!(
        s.on_submit_kernel(H, k(7), t + us(1200)).unwrap(),
        Action::None
    );
    assert_eq!(run(&mut s, t + us(1200)).run, H);
    s.on_complete(H, us(100), t + us(1300)).unwrap();
    // Next gap (a 1.2 ms sample more: the third quartile is 1.3 ms); past the window the high
    // VM no longer holds the GPU.
    let t = t + us(1300);
    // L1's job has 500 µs left: it fits; the grant is cut at the gap's low end all the same.
    let d = run(&mut s, t);
    assert_eq!((d.run, d.slice), (L1, Some(us(1000))));
    s.on_complete(L1, us(500), t + us(500)).unwrap();
    // Its next job (1.5 ms) does not fit the 500 µs left: cut there too.
    s.on_submit_kernel(L1, k(1), t + us(500)).unwrap();
    let d = run(&mut s, t + us(500));
    assert_eq!(d.slice, Some(us(500)));
    s.on_preempted(L1, us(500), t + us(1000)).unwrap();
    assert_eq!(
        s.pick(t + us(1000)).unwrap(),
        Pick::Wait {
            vm: H,
            until: t + us(1300)
        }
    );
    assert_eq!(run(&mut s, t + us(1300)).slice, Some(ms(2)));
}

#[test]
fn without_a_prediction_low_vms_run_short_slices_until_the_high_vm_has_been_idle_long() {
    let mut s = sched(
        "fill=on,fill_slice=150us,fill_idle=5ms,slice=2ms",
        &[(1, 1, 0), (10, 1, 1)],
    );
    let t = alone(&mut s, H, k(7), ms(0), us(100));
    s.on_submit_kernel(L1, k(1), t).unwrap();
    let d = run(&mut s, t);
    assert_eq!(d.slice, Some(us(150)));
    s.on_preempted(L1, us(150), t + us(150)).unwrap();
    // 5 ms after its last completion the high VM no longer constrains: the class slice.
    let late = t + ms(5);
    assert_eq!(run(&mut s, late).slice, Some(ms(2)));
    // A VM that never ran is not in a gap: it constrains nothing (preemption covers it).
    let mut s = sched("fill=on", &[(1, 1, 0), (10, 1, 1)]);
    s.on_submit_kernel(L1, k(1), ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).slice, Some(ms(2)));
}

#[test]
fn the_high_vm_preempts_a_filler_unless_it_ends_within_the_bound() {
    let (mut s, t) = in_gap("fill=on,fill_bound=50us");
    s.on_submit_kernel(L3, k(3), t).unwrap();
    assert_eq!(run(&mut s, t).run, L3);
    // Early arrival (hostile or mispredicted): 400 µs into a 700 µs filler: preempt now.
    assert_eq!(
        s.on_submit_kernel(H, k(7), t + us(400)).unwrap(),
        Action::Preempt(L3)
    );
    s.on_preempted(L3, us(420), t + us(420)).unwrap();
    assert_eq!(run(&mut s, t + us(420)).run, H);
    // The filler's context is kept: 280 µs of it are left.
    assert_eq!(s.predicted_head(L3), Some(us(280)));

    let (mut s, t) = in_gap("fill=on,fill_bound=50us");
    s.on_submit_kernel(L3, k(3), t).unwrap();
    run(&mut s, t);
    // 30 µs before the filler's predicted end: let it end, stop it at now + bound if not.
    assert_eq!(
        s.on_submit_kernel(H, k(7), t + us(670)).unwrap(),
        Action::PreemptAt {
            vm: L3,
            at: t + us(720)
        }
    );

    let (mut s, t) = in_gap("fill=on,fill_bound=50us");
    s.on_submit_kernel(L3, k(3), t).unwrap();
    run(&mut s, t);
    // The filler overran its prediction: no more credit, preempt now.
    assert_eq!(
        s.on_submit_kernel(H, k(7), t + us(710)).unwrap(),
        Action::Preempt(L3)
    );
}

#[test]
fn a_sliced_filler_stops_early_by_the_learned_stop_latency() {
    let mut s = sched("fill=on", &[(1, 1, 0), (10, 1, 1)]);
    let t = teach_kernel(&mut s, L1, 1, ms(1), ms(0));
    let t = teach_gap(&mut s, H, us(300), t);
    s.on_submit_kernel(L1, k(1), t).unwrap();
    // 1 ms does not fit 300 µs: sliced to the gap's end (no stop latency known yet).
    assert_eq!(run(&mut s, t).slice, Some(us(300)));
    // The high VM arrives on time; the low VM reports its stop 40 µs later.
    assert_eq!(
        s.on_submit_kernel(H, k(7), t + us(300)).unwrap(),
        Action::Preempt(L1)
    );
    s.on_preempted(L1, us(340), t + us(340)).unwrap();
    assert_eq!(run(&mut s, t + us(340)).run, H);
    s.on_complete(H, us(100), t + us(440)).unwrap();
    // Next gap: the filler is told to stop 40 µs before its end.
    assert_eq!(run(&mut s, t + us(440)).slice, Some(us(260)));
}

#[test]
fn the_earliest_predicted_arrival_of_several_high_vms_bounds_the_fill() {
    let mut s = sched("fill=on", &[(1, 1, 0), (10, 1, 1), (11, 1, 1)]);
    let t = teach_kernel(&mut s, L1, 1, us(500), ms(0));
    let t = teach_gap(&mut s, H, ms(2), t);
    // H2: kernel 7 followed by 400 µs.
    let mut t2 = alone(&mut s, H2, k(7), t, us(100));
    for _ in 0..2 {
        t2 = alone(&mut s, H2, k(7), t2 + us(400), us(100));
    }
    s.on_submit_kernel(L1, k(1), t2).unwrap();
    // H's gap ends far later, H2's in 400 µs: L1 (500 µs) does not fit; sliced to 400 µs.
    let d = run(&mut s, t2);
    assert_eq!((d.run, d.slice), (L1, Some(us(400))));
}

#[test]
fn hostile_identities_only_bound_the_vms_own_table() {
    let mut s = sched("fill=on,fill_kernels=16", &[(1, 1, 0), (2, 1, 0)]);
    let mut t = teach_kernel(&mut s, L2, 1, us(100), ms(0));
    for n in 0..1000 {
        t = alone(&mut s, L1, k(n), t, us(1));
    }
    assert_eq!(s.kernels_known(L1), 16);
    assert_eq!(s.kernels_known(L2), 1, "another VM's table is untouched");
    // Many queued jobs: identities beyond the kept ones are unknown, nothing breaks.
    for n in 0..200 {
        s.on_submit_kernel(L1, k(n), t).unwrap();
    }
    for _ in 0..200 {
        run(&mut s, t);
        t += us(1);
        s.on_complete(L1, us(1), t).unwrap();
    }
    assert_eq!(s.vm_info(L1).unwrap().1.pending, 0);
}

#[test]
fn hostile_gaps_give_conservative_predictions() {
    // A high VM with wildly varying gaps after the same kernel: the predicted gap is below
    // the mean (mean less twice the deviation), so fillers are chosen for a short gap.
    let mut s = sched("fill=on", &[(10, 1, 1)]);
    let mut t = alone(&mut s, H, k(7), ms(0), us(100));
    for gap in [100, 2000, 100, 2000, 100, 2000] {
        t = alone(&mut s, H, k(7), t + us(gap), us(100));
    }
    let (_, predicted) = s.predicted_gap(H).unwrap();
    assert!(predicted.unwrap() < us(600), "{predicted:?}");
    // Times going backwards and unknown VMs are refused without changing the prediction.
    assert!(s.on_submit_kernel(H, k(7), t - us(1)).is_err());
    assert!(s.on_submit_kernel(VmId(99), k(7), t).is_err());
    assert_eq!(s.predicted_gap(H).unwrap().1, predicted);
}

#[test]
fn removing_a_filler_or_a_high_vm_leaves_a_consistent_state() {
    let (mut s, t) = in_gap("fill=on");
    s.on_submit_kernel(L3, k(3), t).unwrap();
    run(&mut s, t);
    assert!(s.remove(L3, t + us(10)).unwrap().was_running);
    s.on_submit_kernel(L1, k(1), t + us(10)).unwrap();
    assert_eq!(run(&mut s, t + us(10)).run, L1);
    s.on_complete(L1, us(200), t + us(210)).unwrap();
    s.remove(H, t + us(210)).unwrap();
    // The gap that bounded the fill is gone; M (class 1) is idle after its kernel with no
    // gap predicted: short slices.
    s.on_submit_kernel(L2, k(2), t + us(210)).unwrap();
    assert_eq!(run(&mut s, t + us(210)).slice, Some(us(200)));
}

#[test]
fn simulated_experiment_meets_the_targets_with_filling() {
    let results = compare(&Config::default(), &scenarios::inference_and_training(4)).unwrap();
    let get = |m: Mode| results.iter().find(|r| r.mode == m).unwrap();
    let (alone, prio, fill) = (get(Mode::Exclusive), get(Mode::Priority), get(Mode::Fill));
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    assert!(fill.requests > 500 && alone.requests > 500);
    assert!(
        ratio(fill.p50, alone.p50) <= 1.10,
        "{:?} vs {:?}",
        fill.p50,
        alone.p50
    );
    assert!(
        ratio(fill.p99, alone.p99) <= 1.10,
        "{:?} vs {:?}",
        fill.p99,
        alone.p99
    );
    let idle = alone.measured - alone.hp_progress;
    assert!(ratio(fill.lp_progress, idle) >= 0.90);
    assert!(fill.utilization >= 0.95, "{}", fill.utilization);
    assert!(fill.overhead < 0.02, "{}", fill.overhead);
    // Filling avoids most of the preemptions plain priority pays for every high submission.
    assert!(fill.preemptions * 3 < prio.preemptions * 2);
    assert!(fill.p50 < prio.p50);
    // Equal shares (one class) hurt the high VM's tail.
    assert!(ratio(get(Mode::Timeslice).p99, alone.p99) > 1.5);
}

#[test]
fn weights_within_the_low_class_hold_while_filling() {
    let mut spec: SimSpec = scenarios::inference_and_training(2);
    for (vm, w) in spec.vms.iter_mut().skip(1).zip([1, 3]) {
        vm.weight = w;
        vm.kernels = vec![us(300)];
    }
    let r = simulate(&Config::parse("policy=fikit").unwrap(), &spec).unwrap();
    let (a, b) = (
        r.vms[1].progress.as_secs_f64(),
        r.vms[2].progress.as_secs_f64(),
    );
    let share = b / (a + b);
    assert!((share - 0.75).abs() < 0.05, "weight-3 VM share {share}");
}

#[test]
fn an_identity_given_after_the_submission_is_learned_under_it() {
    let mut s = sched("fill=on", &[(1, 1, 0)]);
    let mut t = ms(0);
    // Submitted unidentified (vgpud: the `more` of a run report), identified later (the VM's
    // next want): learned under kernel 3, not under "unidentified".
    for _ in 0..2 {
        s.on_submit_kernel(L1, None, t).unwrap();
        s.identify(L1, k(3));
        run(&mut s, t);
        s.on_complete(L1, us(250), t + us(250)).unwrap();
        t += us(250);
    }
    s.on_submit_kernel(L1, k(3), t).unwrap();
    assert_eq!(s.predicted_head(L1), Some(us(250)));
    // Made unidentified (a turn that ran several kernels): no prediction for its head.
    s.identify(L1, None);
    assert_eq!(s.predicted_head(L1), None);
    s.identify(L1, k(3));
    assert_eq!(s.predicted_head(L1), Some(us(250)));
    // Without a queued job, or for an unknown VM, nothing changes.
    run(&mut s, t);
    s.on_complete(L1, us(250), t + us(250)).unwrap();
    s.identify(L1, k(9));
    s.identify(VmId(99), k(9));
    assert_eq!(s.kernels_known(L1), 1);
}

#[test]
fn kernel_keys_are_stable_fnv1a() {
    // FNV-1a test vectors: the hash is fixed across builds (VM processes and the daemon may be
    // different builds).
    assert_eq!(KernelKey::content_hash(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(KernelKey::content_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    let a = KernelKey::of(1, "k", [1, 1, 1], [32, 1, 1], 0);
    assert_eq!(a, KernelKey::of(1, "k", [1, 1, 1], [32, 1, 1], 0));
    for b in [
        KernelKey::of(2, "k", [1, 1, 1], [32, 1, 1], 0),
        KernelKey::of(1, "kk", [1, 1, 1], [32, 1, 1], 0),
        KernelKey::of(1, "k", [2, 1, 1], [32, 1, 1], 0),
        KernelKey::of(1, "k", [1, 1, 1], [64, 1, 1], 0),
        KernelKey::of(1, "k", [1, 1, 1], [32, 1, 1], 16),
    ] {
        assert_ne!(a, b);
    }
}

#[test]
fn jobs_inside_a_turn_are_learned_one_by_one() {
    let mut s = sched("fill=on", &[(1, 1, 0)]);
    // Turns of two jobs: kernel 3 (400 µs, identified by the want), then an unidentified one
    // (300 µs; vgpud: a `progress` between them); the turn ends with 700 µs of GPU time.
    let mut t = ms(0);
    for _ in 0..2 {
        s.on_submit_kernel(L1, k(3), t).unwrap();
        run(&mut s, t);
        s.on_progress(L1, us(400), t + us(400)).unwrap();
        s.on_complete(L1, us(700), t + us(700)).unwrap();
        t += us(700);
    }
    s.on_submit_kernel(L1, k(3), t).unwrap();
    assert_eq!(
        s.predicted_head(L1),
        Some(us(400)),
        "kernel 3's own time, not the 700 µs turn"
    );
    // Preempted in its second job: the head (unidentified, 300 µs) keeps only its own part.
    run(&mut s, t);
    s.on_progress(L1, us(400), t + us(400)).unwrap();
    s.on_preempted(L1, us(500), t + us(500)).unwrap();
    assert_eq!(s.predicted_head(L1), Some(us(200)));
    assert_eq!(s.kernels_known(L1), 2);
}

#[test]
fn hostile_progress_reports_are_refused_or_bounded() {
    let mut s = sched("fill=on", &[(1, 1, 0), (2, 1, 0)]);
    s.on_submit_kernel(L1, k(3), ms(0)).unwrap();
    s.on_submit_kernel(L2, k(3), ms(0)).unwrap();
    let d = run(&mut s, ms(0));
    let other = if d.run == L1 { L2 } else { L1 };
    assert!(s.on_progress(other, us(10), ms(1)).is_err(), "not running");
    assert!(s.on_progress(VmId(99), us(10), ms(1)).is_err(), "unknown");
    // A job longer than the grant has existed counts as the grant's age; zero is a sample.
    s.on_progress(d.run, Duration::MAX, ms(1)).unwrap();
    assert!(
        s.on_progress(d.run, us(1), us(500)).is_err(),
        "time went backwards"
    );
    s.on_progress(d.run, Duration::ZERO, ms(1)).unwrap();
    s.on_complete(d.run, Duration::MAX, ms(1)).unwrap();
    s.on_submit_kernel(d.run, k(3), ms(1)).unwrap();
    s.on_preempted(other, us(1), ms(1)).unwrap_err();
    run(&mut s, ms(1));
    s.on_progress(d.run, us(1000), ms(2)).unwrap();
    s.on_complete(d.run, us(1000), ms(2)).unwrap();
    // Kernel 3 learned 1 ms twice (capped); its queue and the other VM are intact.
    s.on_submit_kernel(d.run, k(3), ms(2)).unwrap();
    assert_eq!(s.predicted_head(d.run), Some(ms(1)));
    assert_eq!(s.vm_info(other).unwrap().1.pending, 1);
    // Without filling a progress changes nothing but is still checked.
    let mut s = sched("policy=timeslice", &[(1, 1, 0)]);
    assert!(s.on_progress(L1, us(1), ms(0)).is_err());
}

#[test]
fn a_filler_that_fits_ends_its_job_and_is_cut_at_the_gap_end() {
    // A job that fits is not preempted before its end; the grant lasts until the gap's end less
    // the stop latency (a turn, under vgpud, goes on with the VM's next jobs until then).
    let (mut s, t) = in_gap("fill=on");
    s.on_submit_kernel(L3, k(3), t).unwrap();
    let d = run(&mut s, t);
    assert_eq!((d.run, d.slice), (L3, Some(ms(1))));
    // Its turn ran into a next job, stopped at the slice end, reported 400 µs later: the stop
    // latency learned.
    s.on_preempted(L3, ms(1), t + us(1400)).unwrap();
    let t = alone(&mut s, H, k(7), t + us(1400), us(100));
    s.on_submit_kernel(L2, k(2), t).unwrap();
    let d = run(&mut s, t);
    assert_eq!(
        (d.run, d.slice),
        (L2, Some(us(600))),
        "450 µs fits; cut 400 µs early"
    );
}

#[test]
fn simulated_vgpud_dispatch_fikit_beats_priority_for_the_high_vm() {
    use scheduler::sim::turns::{TurnSpec, compare as compare_turns};
    let spec = TurnSpec {
        duration: ms(2500),
        ..TurnSpec::vgpu_bench(4)
    };
    let r = compare_turns(&Config::default(), &spec).unwrap();
    let get = |m: Mode| r.iter().find(|x| x.mode == m).unwrap();
    let (alone, prio, fill) = (get(Mode::Exclusive), get(Mode::Priority), get(Mode::Fill));
    assert!(fill.latencies.len() > 500);
    // The high VM is never preempted by its own stale turn (it was, every other request,
    // before a grant in another class ended a kept turn).
    let hp_preempted: Vec<u64> = r.iter().map(|x| x.hp_preemptions).collect();
    assert!(hp_preempted.iter().all(|n| *n == 0), "{hp_preempted:?}");
    // Its submissions find the GPU free: granted at once, as alone.
    assert_eq!(fill.latency(0.5), alone.latency(0.5));
    assert!(fill.latency(0.5) < prio.latency(0.5));
    // Fewer stops than a preempt per request, and the low VMs get most of the idle GPU time.
    assert!(fill.preemptions < prio.preemptions);
    let idle = alone.measured - alone.hp_work;
    assert!(fill.lp_work.as_secs_f64() / idle.as_secs_f64() > 0.8);
}
