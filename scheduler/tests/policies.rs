//! Behaviour of each policy through the `Scheduler` API: order, budgets, waits, slices, priorities.

mod common;

use common::{ms, run, sched, us};
use scheduler::{Action, Decision, Pick, VmId};
use std::time::Duration;

const A: VmId = VmId(1);
const B: VmId = VmId(2);
const C: VmId = VmId(3);

#[test]
fn fifo_runs_jobs_in_submission_order_without_preemption() {
    let mut s = sched("policy=fifo", &[(1, 1, 0), (2, 1, 0), (3, 1, 0)]);
    for (vm, t) in [(B, 0), (A, 1), (B, 2), (C, 3)] {
        assert_eq!(s.on_submit(vm, us(t)).unwrap(), Action::None);
    }
    let mut order = Vec::new();
    let mut now = us(10);
    for _ in 0..4 {
        let d = run(&mut s, now);
        assert_eq!(d.slice, None, "FIFO never preempts");
        order.push(d.run);
        now += ms(1);
        s.on_complete(d.run, ms(1), now).unwrap();
    }
    assert_eq!(order, [B, A, B, C]);
    assert_eq!(s.pick(now).unwrap(), Pick::Idle);
}

#[test]
fn credit_puts_a_vm_in_debt_behind_vms_in_credit() {
    // Period 10 ms, 2 VMs: 5 ms of credit each. A overdraws with a 20 ms kernel.
    let mut s = sched("policy=credit,credit_period=10ms", &[(1, 1, 0), (2, 1, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    s.on_submit(A, ms(1)).unwrap();
    s.on_submit(B, ms(1)).unwrap();
    s.on_complete(A, ms(20), ms(20)).unwrap();
    // Replenished at 10 and 20 ms but A is still negative (5 - 20 + 5 capped); B goes first...
    assert_eq!(run(&mut s, ms(20)).run, B);
    s.on_submit(B, ms(20)).unwrap();
    s.on_complete(B, ms(1), ms(21)).unwrap();
    // ...and again, while A is in debt and B is not.
    assert_eq!(run(&mut s, ms(21)).run, B);
    s.on_complete(B, ms(1), ms(22)).unwrap();
    // Only A has work: work-conserving, it runs despite its debt.
    assert_eq!(run(&mut s, ms(22)).run, A);
}

#[test]
fn band_waits_for_the_current_vm_then_switches() {
    let mut s = sched(
        "policy=band,band_period=100ms,band_wait=200us",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    s.on_complete(A, ms(1), ms(1)).unwrap();
    // A is idle but has budget: the GPU waits for A's next submission rather than switch to B.
    assert_eq!(
        s.pick(ms(1)).unwrap(),
        Pick::Wait {
            vm: A,
            until: ms(1) + us(200)
        }
    );
    s.on_submit(A, ms(1) + us(50)).unwrap();
    assert_eq!(run(&mut s, ms(1) + us(50)).run, A);
    s.on_complete(A, ms(1), ms(2) + us(50)).unwrap();
    assert!(matches!(
        s.pick(ms(2) + us(100)).unwrap(),
        Pick::Wait { vm: A, .. }
    ));
    // The wait expires: B gets the GPU.
    assert_eq!(run(&mut s, ms(2) + us(250)).run, B);
}

#[test]
fn band_sends_an_over_budget_vm_to_the_tail() {
    // 2 VMs, period 10 ms: 5 ms budget each.
    let mut s = sched(
        "policy=band,band_period=10ms,band_wait=0ns",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    s.on_complete(A, ms(6), ms(6)).unwrap();
    // A still has work but is over budget: B runs.
    assert_eq!(run(&mut s, ms(6)).run, B);
    s.on_complete(B, ms(1), ms(7)).unwrap();
    assert_eq!(run(&mut s, ms(7)).run, A);
}

#[test]
fn band_resets_budgets_each_period() {
    let mut s = sched(
        "policy=band,band_period=10ms,band_wait=0ns",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    s.on_complete(A, ms(30), ms(30)).unwrap();
    // New period: A's debt of 25 ms is forgiven, it keeps the GPU with its fresh budget.
    s.on_submit(A, ms(30)).unwrap();
    s.on_submit(B, ms(30)).unwrap();
    s.on_submit(A, ms(30)).unwrap();
    assert_eq!(run(&mut s, ms(30)).run, A);
    s.on_complete(A, ms(1), ms(31)).unwrap();
    assert_eq!(run(&mut s, ms(31)).run, A);
}

#[test]
fn timeslice_grants_slices_and_continues_a_turn_across_jobs() {
    let mut s = sched("policy=timeslice,slice=2ms", &[(1, 1, 0), (2, 1, 0)]);
    for _ in 0..3 {
        s.on_submit(A, ms(0)).unwrap();
    }
    s.on_submit(B, ms(0)).unwrap();
    let d = run(&mut s, ms(0));
    assert_eq!((d.run, d.slice), (A, Some(ms(2))));
    s.on_complete(A, us(500), us(500)).unwrap();
    // Same turn, the rest of the slice.
    let d = run(&mut s, us(500));
    assert_eq!((d.run, d.slice), (A, Some(us(1500))));
    s.on_preempted(A, us(1500), ms(2)).unwrap();
    let d = run(&mut s, ms(2));
    assert_eq!((d.run, d.slice), (B, Some(ms(2))));
}

#[test]
fn timeslice_a_preempted_turn_is_over_even_if_the_engine_reports_less() {
    let mut s = sched(
        "policy=timeslice,slice=2ms,wake_preempt=false",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    // Preempted at the slice end; the engine counted 1.8 ms of the 2 ms (dispatch overheads).
    s.on_preempted(A, us(1800), ms(2)).unwrap();
    let d = run(&mut s, ms(2));
    assert_eq!((d.run, d.slice), (B, Some(ms(2))));
}

#[test]
fn timeslice_peek_next_names_the_vm_the_next_turn_goes_to() {
    let mut s = sched(
        "policy=timeslice,slice=2ms,wake_preempt=false",
        &[(1, 1, 0), (2, 1, 0), (3, 1, 0)],
    );
    for vm in [A, B, C] {
        s.on_submit(vm, ms(0)).unwrap();
    }
    let mut t = 0;
    for _ in 0..9 {
        let d = run(&mut s, ms(t));
        let guess = s.peek_next();
        assert!(guess.is_some() && guess != Some(d.run));
        t += 2;
        s.on_preempted(d.run, ms(2), ms(t)).unwrap();
        assert_eq!(Some(run(&mut s, ms(t)).run), guess);
        s.on_preempted(guess.unwrap(), Duration::ZERO, ms(t))
            .unwrap();
    }
    let f = sched("policy=fifo", &[(1, 1, 0)]);
    assert_eq!(f.peek_next(), None, "FIFO does not guess");
}

#[test]
fn timeslice_repays_overshoot_with_a_shorter_slice() {
    let mut s = sched(
        "policy=timeslice,slice=2ms,wake_preempt=false",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    // A overshot its 2 ms slice by 500 µs (slow preemption).
    s.on_preempted(A, us(2500), us(2500)).unwrap();
    // B is behind in GPU time: it runs until it is not (two turns).
    for end in [4500, 6500] {
        assert_eq!(run(&mut s, us(end - 2000)).run, B);
        s.on_preempted(B, ms(2), us(end)).unwrap();
    }
    let d = run(&mut s, us(6500));
    assert_eq!(
        (d.run, d.slice),
        (A, Some(us(1500))),
        "overshoot repaid in A's next slice"
    );
    s.on_preempted(A, us(1500), ms(8)).unwrap();
    let (a, b) = (
        s.vm_info(A).unwrap().1.gpu_time,
        s.vm_info(B).unwrap().1.gpu_time,
    );
    assert_eq!((a, b), (ms(4), ms(4)), "equal GPU time after A repaid");
    // Even again: round robin resumes with B (A ran last), full slices.
    let d = run(&mut s, ms(8));
    assert_eq!((d.run, d.slice), (B, Some(ms(2))));
}

/// Round-robin turns of `vms` (all backlogged, each stopping exactly at its slice end) from
/// `now` until `until`: the GPU time each got, and the slice of each one's first grant.
fn backlogged(
    s: &mut scheduler::Scheduler,
    vms: &[VmId],
    mut now: Duration,
    until: Duration,
) -> (Vec<Duration>, Vec<Option<Duration>>) {
    let mut got = vec![Duration::ZERO; vms.len()];
    let mut first = vec![None; vms.len()];
    while now < until {
        let d = run(s, now);
        let i = vms.iter().position(|&v| v == d.run).expect("a known VM");
        let slice = d.slice.expect("a time slice");
        first[i].get_or_insert(slice);
        now += slice;
        got[i] += slice;
        s.on_preempted(d.run, slice, now).unwrap();
    }
    (got, first)
}

#[test]
fn timeslice_a_turn_run_alone_is_not_repaid_when_others_join() {
    // vgpud extends a turn nobody else waits for: A, first to start, runs alone for 40 ms in
    // one turn (charged only at its end). B and C then get work. Issue 25 (16 VMs on 2 GPUs,
    // cuda): the first VM was placed 40 ms ahead of the others and got nothing while they
    // caught up, then repaid the 38 ms "overshoot" in quarter slices (Jain 0.91).
    let mut s = sched(
        "policy=timeslice,slice=2ms",
        &[(1, 1, 0), (2, 1, 0), (3, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    // B is placed one slice below A's virtual time with the turn so far: far enough behind to
    // preempt A (wake-up preemption), no further.
    assert_eq!(s.on_submit(B, ms(40)).unwrap(), Action::Preempt(A));
    assert_eq!(s.on_submit(C, ms(40)).unwrap(), Action::Preempt(A));
    s.on_preempted(A, ms(40), us(40_100)).unwrap();
    let (got, first) = backlogged(&mut s, &[A, B, C], us(40_100), us(100_100));
    assert_eq!(
        first[0],
        Some(ms(2)),
        "A's next turn is a whole slice: running alone was no overshoot"
    );
    // 60 ms shared by three: A gets its third, give or take a turn (B and C were placed one
    // slice behind it).
    for (vm, g) in [A, B, C].iter().zip(&got) {
        assert!(
            *g >= ms(18) && *g <= ms(22),
            "{vm:?} got {g:?} of 60 ms (A, B, C: {got:?})"
        );
    }
}

#[test]
fn timeslice_a_vm_placed_against_a_run_pays_for_it_whatever_its_engine_reports() {
    // B is placed against A's 200 ms run so far (wall time); A's engine then reports 20 ms of
    // GPU time (its clock misses what the wall clock sees). A is charged the 200 ms that
    // placed B, or it would run ahead of B for 180 ms.
    let mut s = sched(
        "policy=timeslice,slice=50ms,wake_preempt=false",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    s.on_submit(B, ms(200)).unwrap();
    s.on_preempted(A, ms(20), ms(201)).unwrap();
    assert_eq!(run(&mut s, ms(201)).run, B, "B is behind A");
}

#[test]
fn timeslice_overshoot_after_others_join_is_still_repaid() {
    let mut s = sched(
        "policy=timeslice,slice=2ms,wake_preempt=false",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    // Alone until 10 ms (extended); B asks then and A takes 1 ms to stop.
    assert_eq!(s.on_submit(B, ms(10)).unwrap(), Action::None);
    s.on_preempted(A, ms(11), ms(11)).unwrap();
    // B was placed one slice behind A's 10 ms, and A ran 1 ms more: B runs two turns.
    for end in [13, 15] {
        assert_eq!(run(&mut s, ms(end - 2)).run, B);
        s.on_preempted(B, ms(2), ms(end)).unwrap();
    }
    let d = run(&mut s, ms(15));
    assert_eq!(
        (d.run, d.slice),
        (A, Some(ms(1))),
        "the 1 ms A ran after B asked is repaid, the 10 ms alone are not"
    );
}

#[test]
fn timeslice_idle_vm_gives_up_its_turn() {
    let mut s = sched("policy=timeslice,slice=2ms", &[(1, 1, 0), (2, 1, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    s.on_complete(A, us(300), us(300)).unwrap();
    // A has nothing queued at the pick: B runs at once (work-conserving), no wait.
    assert_eq!(run(&mut s, us(300)).run, B);
}

#[test]
fn timeslice_weights_set_shares() {
    let mut s = sched("policy=timeslice,slice=1ms", &[(1, 1, 0), (2, 3, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    let mut now = ms(0);
    for _ in 0..400 {
        let d = run(&mut s, now);
        now += d.slice.unwrap();
        s.on_preempted(d.run, d.slice.unwrap(), now).unwrap();
    }
    let (a, b) = (
        s.vm_info(A).unwrap().1.gpu_time,
        s.vm_info(B).unwrap().1.gpu_time,
    );
    assert_eq!((a, b), (ms(100), ms(300)));
}

#[test]
fn timeslice_wakeup_of_a_vm_behind_preempts_the_running_vm() {
    let mut s = sched(
        "policy=timeslice,slice=2ms,wake_granularity=500us",
        &[(1, 1, 0), (2, 1, 0)],
    );
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    s.on_preempted(A, ms(2), ms(2)).unwrap();
    assert_eq!(run(&mut s, ms(2)).run, A);
    // B gets work 1 ms into A's second slice: B is 3 ms behind (capped at one slice): preempt.
    assert_eq!(s.on_submit(B, ms(3)).unwrap(), Action::Preempt(A));
    s.on_preempted(A, us(1030), us(3030)).unwrap();
    assert_eq!(run(&mut s, us(3030)).run, B);
}

#[test]
fn higher_priority_class_runs_first_and_preempts() {
    let mut s = sched(
        "policy=timeslice,policy.5=fifo",
        &[(1, 1, 0), (2, 1, 0), (3, 1, 5)],
    );
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    let low = run(&mut s, ms(0)).run;
    // A class-5 VM gets work: the running class-0 VM must be preempted now.
    assert_eq!(s.on_submit(C, ms(1)).unwrap(), Action::Preempt(low));
    s.on_preempted(low, ms(1), ms(1)).unwrap();
    let d = run(&mut s, ms(1));
    assert_eq!((d.run, d.slice), (C, None), "class 5 uses FIFO: no slice");
    s.on_submit(C, ms(2)).unwrap();
    s.on_complete(C, ms(10), ms(11)).unwrap();
    // C still has a job: it runs again, class 0 waits however long.
    assert_eq!(run(&mut s, ms(11)).run, C);
    s.on_complete(C, ms(10), ms(21)).unwrap();
    assert!([A, B].contains(&run(&mut s, ms(21)).run));
}

#[test]
fn a_higher_class_vm_gets_a_fresh_turn_after_a_lower_class_ran_in_its_gap() {
    // The inference pattern: C (class 1, alone in it) runs 1 ms of its 2 ms turn, goes idle;
    // A (class 0) runs in the gap; C's next request must get a whole slice, not the 1 ms left
    // of its old turn (it was preempted mid-request at that stale end).
    let mut s = sched("policy=timeslice,slice=2ms", &[(1, 1, 0), (3, 1, 1)]);
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(C, ms(0)).unwrap();
    assert_eq!(
        run(&mut s, ms(0)),
        Decision {
            run: C,
            slice: Some(ms(2))
        }
    );
    s.on_complete(C, ms(1), ms(1)).unwrap();
    assert_eq!(run(&mut s, ms(1)).run, A);
    assert_eq!(s.on_submit(C, ms(3)).unwrap(), Action::Preempt(A));
    s.on_preempted(A, ms(2), ms(3)).unwrap();
    assert_eq!(
        run(&mut s, ms(3)),
        Decision {
            run: C,
            slice: Some(ms(2))
        }
    );
    // Within its class, a VM that submits again before any other grant keeps its turn.
    s.on_complete(C, ms(1), ms(4)).unwrap();
    s.on_submit(C, ms(4)).unwrap();
    assert_eq!(
        run(&mut s, ms(4)),
        Decision {
            run: C,
            slice: Some(ms(1))
        }
    );
}

#[test]
fn priority_preemption_can_be_turned_off() {
    let mut s = sched("priority_preempt=false", &[(1, 1, 0), (3, 1, 5)]);
    s.on_submit(A, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    assert_eq!(s.on_submit(C, ms(1)).unwrap(), Action::None);
    s.on_preempted(A, ms(2), ms(2)).unwrap();
    assert_eq!(run(&mut s, ms(2)).run, C);
}

#[test]
fn removing_the_running_vm_frees_the_gpu() {
    for policy in ["fifo", "credit", "band", "timeslice"] {
        let mut s = sched(&format!("policy={policy}"), &[(1, 1, 0), (2, 1, 0)]);
        s.on_submit(A, ms(0)).unwrap();
        s.on_submit(B, ms(0)).unwrap();
        let first = run(&mut s, ms(0)).run;
        let removed = s.remove(first, ms(1)).unwrap();
        assert!(removed.was_running && removed.pending == 1, "{policy}");
        assert!(s.running().is_none());
        let other = if first == A { B } else { A };
        assert_eq!(run(&mut s, ms(1)).run, other, "{policy}");
        // Its late report is refused; the other VM's run is untouched.
        assert!(s.on_complete(first, ms(1), ms(2)).is_err());
        s.on_complete(other, ms(1), ms(2)).unwrap();
        assert_eq!(s.pick(ms(2)).unwrap(), Pick::Idle, "{policy}");
    }
}

#[test]
fn faults_and_dropped_queues_end_the_vms_work() {
    let mut s = sched("policy=timeslice", &[(1, 1, 0), (2, 1, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    let d = run(&mut s, ms(0));
    assert_eq!(d.run, A);
    s.on_fault(A, us(10), us(10)).unwrap();
    assert_eq!(s.vm_info(A).unwrap().1.faults, 1);
    assert_eq!(run(&mut s, us(10)).run, B);
    s.on_preempted(B, ms(2), ms(2)).unwrap();
    s.on_idle(B, ms(2)).unwrap();
    assert_eq!(s.pick(ms(2)).unwrap(), Pick::Idle);
}

#[test]
fn a_vm_that_does_not_yield_is_overdue_and_can_be_removed() {
    let mut s = sched("policy=timeslice,slice=2ms", &[(1, 1, 0), (2, 1, 0)]);
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    assert_eq!(run(&mut s, ms(0)).run, A);
    assert_eq!(s.overdue(ms(11), ms(10)), None);
    assert_eq!(s.overdue(ms(12), ms(10)), Some(A));
    assert!(s.remove(A, ms(12)).unwrap().was_running);
    assert_eq!(s.overdue(ms(12), ms(10)), None);
    assert_eq!(run(&mut s, ms(12)).run, B);
    // Non-preemptive grants: overdue after the grace alone.
    let mut f = sched("policy=fifo", &[(1, 1, 0)]);
    f.on_submit(A, ms(0)).unwrap();
    run(&mut f, ms(0));
    assert_eq!(
        (f.overdue(ms(99), ms(100)), f.overdue(ms(100), ms(100))),
        (None, Some(A))
    );
}

#[test]
fn weights_can_change_at_run_time() {
    let mut s = sched("policy=timeslice,slice=1ms", &[(1, 1, 0), (2, 1, 0)]);
    assert!(s.set_weight(A, 0, ms(0)).is_err());
    assert!(s.set_weight(VmId(9), 1, ms(0)).is_err());
    s.set_weight(B, 3, ms(0)).unwrap();
    assert_eq!(s.vm_info(B).unwrap().0.weight, 3);
    s.on_submit(A, ms(0)).unwrap();
    s.on_submit(B, ms(0)).unwrap();
    let mut now = ms(0);
    for _ in 0..400 {
        let d = run(&mut s, now);
        now += d.slice.unwrap();
        s.on_preempted(d.run, d.slice.unwrap(), now).unwrap();
    }
    let (a, b) = (
        s.vm_info(A).unwrap().1.gpu_time,
        s.vm_info(B).unwrap().1.gpu_time,
    );
    assert_eq!((a, b), (ms(100), ms(300)));
}
