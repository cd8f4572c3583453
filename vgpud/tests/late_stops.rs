//! Late stops as the daemon reports them (issue 25): the preemption latency samples and
//! `worst_preemptions` of a turn that stopped late after several jobs, and of a turn's grant
//! given back between two jobs without a run (the harness: `common`).

mod common;

use std::time::Duration;

use common::{Vm, start};
use vgpud::proto::{self, RunOutcome, ToDaemon, ToVm};

#[test]
fn a_late_stop_of_an_extended_turn_is_reported_with_the_jobs_before_it() {
    // Issue 25: a `worst_preemptions` entry with a grant → start of 34 ms read as a VM that
    // held its grant idle; it was the 7th job of a turn that ran alone past its slice. The
    // entry says so now.
    let d = start(
        "extended-report",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        500,
    );
    let (a, _) = Vm::hello(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    a.send(&ToDaemon::Want { kernel: None });
    let (seq, _) = a.grant();
    for _ in 0..2 {
        let start_ns = proto::monotonic_ns();
        std::thread::sleep(Duration::from_millis(15));
        let end_ns = proto::monotonic_ns();
        a.send(&ToDaemon::Progress {
            seq,
            gpu_ns: end_ns - start_ns,
            start_ns,
            end_ns,
        });
    }
    let start_ns = proto::monotonic_ns();
    std::thread::sleep(Duration::from_millis(2));
    b.send(&ToDaemon::Want { kernel: None });
    a.preempted(seq);
    std::thread::sleep(Duration::from_millis(1));
    let end_ns = proto::monotonic_ns();
    a.send(&ToDaemon::Done {
        seq,
        outcome: RunOutcome::Preempted,
        gpu_ns: end_ns - start_ns,
        start_ns,
        end_ns,
        more: false,
    });
    let (sb, _) = b.grant();
    b.done(sb, RunOutcome::Completed, 1000, false);
    drop((a, b));
    let r = d.stop();
    let w = r.worst_preemptions.first().expect("the late stop is kept");
    assert_eq!((w.vm, w.jobs_before, w.extended), (1, 2, true), "{w:?}");
    assert!(w.grant_to_start_ns >= 30_000_000, "{w:?}");
    assert!(w.start_to_due_ns >= 2_000_000, "due at B's want: {w:?}");
}

#[test]
fn a_turn_given_back_between_two_jobs_is_a_preemption_timed_to_its_receipt() {
    // Issue 25: a turn's grant kept between two jobs and given back without a run (`Done`
    // preempted without stamps: the VM's reader thread at the preempt or the slice end) held
    // the GPU idle until it came back. It was no latency sample at all; it is one now, up to
    // the daemon receiving it, and `worst_preemptions` marks it `kept`.
    let d = start(
        "kept",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        500,
    );
    let (a, _) = Vm::hello(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    a.send(&ToDaemon::Want { kernel: None });
    let (seq, _) = a.grant();
    let start_ns = proto::monotonic_ns();
    std::thread::sleep(Duration::from_millis(1));
    let end_ns = proto::monotonic_ns();
    a.send(&ToDaemon::Progress {
        seq,
        gpu_ns: end_ns - start_ns,
        start_ns,
        end_ns,
    });
    b.send(&ToDaemon::Want { kernel: None });
    a.preempted(seq);
    // The VM's worker is elsewhere; the grant comes back 30 ms after the preempt at least.
    std::thread::sleep(Duration::from_millis(30));
    a.send(&ToDaemon::Done {
        seq,
        outcome: RunOutcome::Preempted,
        gpu_ns: 0,
        start_ns: 0,
        end_ns: 0,
        more: true,
    });
    let (sb, _) = b.grant();
    b.done(sb, RunOutcome::Completed, 1000, false);
    // `a` is still queued (its next job): the GPU comes back to it without a want.
    let (sa, _) = a.grant();
    a.done(sa, RunOutcome::Completed, 1000, false);
    drop((a, b));
    let r = d.stop();
    assert_eq!(r.preempts, 1);
    assert_eq!(r.preempt_latency_ns.len(), 1, "{:?}", r.preempt_latency_ns);
    assert!(r.preempt_latency_ns[0] >= 30_000_000, "{r:?}");
    let w = r
        .worst_preemptions
        .first()
        .expect("the late give-back is kept");
    assert!(w.kept && w.run_ns == 0, "{w:?}");
    assert_eq!(
        (w.vm, w.jobs_before, w.late_ns),
        (1, 1, r.preempt_latency_ns[0])
    );
    assert!(
        w.grant_to_start_ns >= 1_000_000,
        "grant → last job's end: {w:?}"
    );
    assert_eq!((r.vms[0].preempted, r.vms[0].completed), (1, 2));
}

/// `a` is granted while `b` waits (so told its slice end), `b` withdraws, `a` runs one job and
/// keeps the grant; its worker, back from the guest's work 30 ms past the slice end, gives it
/// back. With `waits`, `b` asks again 5 ms before that.
fn kept_past_the_slice_end(name: &str, waits: bool) -> vgpud::Report {
    let d = start(name, "policy=timeslice,slice=10ms,wake_preempt=false", 500);
    let (a, _) = Vm::hello(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    b.send(&ToDaemon::Want { kernel: None });
    let (sb, _) = b.grant();
    a.send(&ToDaemon::Want { kernel: None });
    std::thread::sleep(Duration::from_millis(2));
    // `a` has used less GPU time: it runs next, with `b` waiting.
    b.done(sb, RunOutcome::Preempted, 2_000_000, true);
    let (seq, deadline_ns) = match a.recv() {
        Some((
            ToVm::Grant {
                seq, deadline_ns, ..
            },
            _,
        )) => (seq, deadline_ns),
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_ne!(deadline_ns, 0, "b waits: a slice end to stop at");
    b.send(&ToDaemon::Idle {});
    let start_ns = proto::monotonic_ns();
    a.send(&ToDaemon::Progress {
        seq,
        gpu_ns: 1000,
        start_ns,
        end_ns: start_ns + 1000,
    });
    while proto::monotonic_ns() < deadline_ns + 30_000_000 {
        std::thread::sleep(Duration::from_millis(5));
    }
    if waits {
        // The turn went on past its slice end (nobody waited): b's want preempts it.
        b.send(&ToDaemon::Want { kernel: None });
        assert!(matches!(a.recv(), Some((ToVm::Preempt { seq: s }, _)) if s == seq));
        std::thread::sleep(Duration::from_millis(5));
    }
    a.send(&ToDaemon::Done {
        seq,
        outcome: RunOutcome::Preempted,
        gpu_ns: 0,
        start_ns: 0,
        end_ns: 0,
        more: true,
    });
    // `a` is still queued (preempted), and `b` with `waits`: each gets the GPU, in the
    // scheduler's order.
    let mut queued = vec![&a];
    if waits {
        queued.push(&b);
    }
    while !queued.is_empty() {
        let until = std::time::Instant::now() + Duration::from_secs(2);
        let i = loop {
            if let Some(i) =
                (0..queued.len()).find(|&i| queued[i].readable_within(Duration::from_millis(1)))
            {
                break i;
            }
            assert!(std::time::Instant::now() < until, "no grant within 2 s");
        };
        let vm = queued.remove(i);
        let (sv, _) = vm.grant();
        vm.done(sv, RunOutcome::Completed, 1000, false);
    }
    drop((a, b));
    let r = d.stop();
    assert_eq!(
        (r.preempts, r.refused, r.evictions),
        (u64::from(waits), 0, 0),
        "{r:?}"
    );
    assert_eq!(r.vms[0].preempted, 1);
    r
}

#[test]
fn a_turn_given_back_with_nobody_waiting_is_no_preemption_sample() {
    // Nobody was kept from the GPU: no latency sample (it read as a stop 30 ms late).
    let r = kept_past_the_slice_end("kept-alone", false);
    assert!(
        r.preempt_latency_ns.is_empty(),
        "{:?}",
        r.preempt_latency_ns
    );
    assert!(r.worst_preemptions.is_empty(), "{:?}", r.worst_preemptions);
}

#[test]
fn a_turn_given_back_is_late_from_when_a_vm_began_to_wait() {
    // `b` waited for the last 5 ms (its want preempted the turn, which had gone on past its slice
    // end): a sample from the want to the receipt, not from the slice end (35 ms); a loaded
    // machine may stretch it, never back to the slice end.
    let r = kept_past_the_slice_end("kept-since", true);
    assert_eq!(r.preempt_latency_ns.len(), 1, "{:?}", r.preempt_latency_ns);
    let w = &r.worst_preemptions[0];
    assert!(
        w.kept && (5_000_000..30_000_000).contains(&w.late_ns),
        "{w:?}"
    );
}
