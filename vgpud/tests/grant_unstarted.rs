//! The grant word's `Granted` state (protocol version 4, issue 25): a grant the VM has not taken
//! by its stop's due time (its worker woken late: here, a VM that does not act on the grant at
//! all) is taken back by the daemon through the word, the next VM runs, and nobody is evicted;
//! the VM, back, finds the grant revoked, sends nothing for it, is not granted again until it
//! asks (it shows it is awake), and its grant after `SPARE_AFTER` such take-backs in a row is
//! not taken back unstarted (progress).
//! Hostile words only cost their own VM. Scripted VMs over the daemon's real socket
//! (`common`).

mod common;

use std::time::{Duration, Instant};

use common::{Vm, start};
use vgpud::proto::{self, RunOutcome, ToDaemon, ToVm};
use vgpud::word::{GrantWord, Resumed, State, decode, encode};

/// The revocation deadline of these daemons: a frozen VM the word does not help keeps the GPU
/// this long, then is evicted.
const REVOKE_MS: u64 = 1500;

/// `b` holds the GPU and `a` (with a word) queues; `b` ends preempted, so `a` is granted while
/// `b` waits: `a`'s grant carries a slice end (others wait). Returns `a`'s grant and its
/// deadline.
fn a_granted_while_b_waits(a: &Vm, b: &Vm) -> (u64, u64) {
    b.send(&ToDaemon::Want { kernel: None });
    let (sb0, _) = b.grant();
    a.send(&ToDaemon::Want { kernel: None });
    std::thread::sleep(Duration::from_millis(2));
    b.done(sb0, RunOutcome::Preempted, 1000, true);
    match a.recv() {
        Some((
            ToVm::Grant {
                seq, deadline_ns, ..
            },
            _,
        )) => {
            assert_ne!(deadline_ns, 0, "others wait: a slice end to stop at");
            (seq, deadline_ns)
        }
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn a_grant_not_taken_by_its_slice_end_goes_back_and_the_late_vm_still_progresses() {
    let d = start(
        "unstarted",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        REVOKE_MS,
    );
    let (a, word) = Vm::hello_word(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    let asked = Instant::now();
    let (seq, deadline_ns) = a_granted_while_b_waits(&a, &b);
    // The daemon wrote `Granted` before it sent the grant.
    assert_eq!(decode(word.load()), (seq, State::Granted));
    // `a` is frozen from here: it never takes the grant (its worker waits for a core).
    let (sb, _) = b.grant();
    let waited = asked.elapsed();
    // The slice (20 ms) and a generous allowance for a loaded machine; without the take-back
    // the GPU stays with the frozen VM until its eviction (REVOKE_MS after the backstop).
    assert!(
        waited < Duration::from_millis(20 + 200),
        "b waited {waited:?} for the GPU"
    );
    assert!(
        proto::monotonic_ns() >= deadline_ns,
        "not before the slice end"
    );
    assert_eq!(decode(word.load()), (seq, State::Revoked));
    b.done(sb, RunOutcome::Completed, 1000, false);
    // `a` thaws: taking the grant, it finds it revoked and sends nothing for it. The daemon set
    // it aside: no grant comes until it asks again, though the GPU is free.
    assert_eq!(word.resume(seq, State::Granted), Resumed::Revoked);
    assert!(
        !a.readable_within(Duration::from_millis(100)),
        "a VM set aside was sent {:?}",
        a.recv()
    );
    // Late again, `SPARE_AFTER` grants in a row in all: each goes back at its stop (`b` asks
    // meanwhile), and `a` is set aside each time.
    let mut last = sb;
    for _ in 1..vgpud::SPARE_AFTER {
        a.send(&ToDaemon::Want { kernel: None });
        let (s, _) = a.grant();
        assert!(s > last);
        b.send(&ToDaemon::Want { kernel: None });
        let (sb, _) = b.grant();
        assert_eq!(decode(word.load()), (s, State::Revoked));
        b.done(sb, RunOutcome::Completed, 1000, false);
        assert_eq!(word.resume(s, State::Granted), Resumed::Revoked);
        assert!(!a.readable_within(Duration::from_millis(30)), "set aside");
        last = sb;
    }
    a.send(&ToDaemon::Want { kernel: None });
    let (sa, _) = a.grant();
    assert!(sa > last);
    assert_eq!(decode(word.load()), (sa, State::Granted));
    // This grant is spared: `a`, late again (frozen past the stop, `b` waiting), is sent a
    // preempt instead and its word is left alone; it then runs and answers.
    b.send(&ToDaemon::Want { kernel: None });
    a.preempted(sa);
    assert_eq!(decode(word.load()), (sa, State::Granted));
    assert_eq!(word.resume(sa, State::Granted), Resumed::Go);
    a.done(sa, RunOutcome::Completed, 1000, false);
    let (sb2, _) = b.grant();
    b.done(sb2, RunOutcome::Completed, 1000, false);
    drop((a, b));
    let r = d.stop();
    let n = u64::from(vgpud::SPARE_AFTER);
    assert_eq!(
        (r.unstarted_revoked, r.kept_revoked, r.evictions, r.refused),
        (n, 0, 0, 0),
        "{r:?}"
    );
    let w = r
        .worst_preemptions
        .iter()
        .find(|w| w.unstarted)
        .expect("the take-back is a sample");
    assert!(w.revoked && !w.kept && w.run_ns == 0 && w.vm == 1, "{w:?}");
    assert_eq!((w.jobs_before, w.grant_to_start_ns), (0, 0), "{w:?}");
    // `a`: the revoked grants ended preempted, the spared one ran.
    assert_eq!((r.vms[0].preempted, r.vms[0].completed), (n, 1), "{r:?}");
}

#[test]
fn a_grant_taken_first_is_stopped_by_message_and_a_late_hand_back_is_not_revoked() {
    let d = start(
        "unstarted-race",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        REVOKE_MS,
    );
    let (a, word) = Vm::hello_word(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    // 1. The VM wins the swap: the daemon's fails and the backstop preempt goes out.
    let (seq, _) = a_granted_while_b_waits(&a, &b);
    assert_eq!(word.resume(seq, State::Granted), Resumed::Go);
    a.preempted(seq);
    // More GPU time than `b`: `b` runs next (then leaves the GPU to `a` alone).
    a.done(seq, RunOutcome::Preempted, 30_000_000, true);
    let (sb, _) = b.grant();
    b.done(sb, RunOutcome::Completed, 1000, false);
    // 2. A late hand-back (`Granted → Free`, its `Done` by message after the stop was due)
    //    wins too: the daemon leaves the word alone, preempts by message, and takes the
    //    `Done`.
    let (sa, _) = a.grant();
    word.swap(sa, State::Granted, State::Free).unwrap();
    b.send(&ToDaemon::Want { kernel: None });
    a.preempted(sa);
    assert_eq!(decode(word.load()), (sa, State::Free));
    a.done(sa, RunOutcome::Completed, 0, true);
    // Both queued: served in the scheduler's order, each taking its grant at once.
    let a_next = a.readable_within(Duration::from_millis(50));
    for (vm, w) in [(&a, Some(&word)), (&b, None)]
        .into_iter()
        .cycle()
        .skip(usize::from(!a_next))
        .take(2)
    {
        let (s, _) = vm.grant();
        if let Some(w) = w {
            assert_eq!(w.resume(s, State::Granted), Resumed::Go);
        }
        vm.done(s, RunOutcome::Completed, 1000, false);
    }
    drop((a, b));
    let r = d.stop();
    assert_eq!(
        (r.unstarted_revoked, r.evictions, r.refused),
        (0, 0, 0),
        "{r:?}"
    );
}

#[test]
fn a_hostile_word_cannot_revoke_another_grant_and_only_costs_its_own_vm() {
    let d = start(
        "unstarted-hostile",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        REVOKE_MS,
    );
    let (a, word) = Vm::hello_word(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    // 1. Scribbles and other grants' `Granted`: the daemon acts on none of them; its preempt
    //    goes out as without a word.
    let (seq, _) = a_granted_while_b_waits(&a, &b);
    for w in [
        u64::MAX,
        0,
        encode(seq, State::Granted).unwrap() | 7,
        encode(seq + 1, State::Granted).unwrap(),
        encode(seq - 1, State::Granted).unwrap(),
        (seq << 2) | 1,
    ] {
        word.store_raw(w);
        std::thread::sleep(Duration::from_millis(4));
    }
    a.preempted(seq);
    // More GPU time than `b`: `b` runs next (then leaves the GPU to `a` alone).
    a.done(seq, RunOutcome::Preempted, 30_000_000, true);
    let (sb, _) = b.grant();
    b.done(sb, RunOutcome::Completed, 1000, false);
    // 2. `Granted` written back while its job runs: the daemon takes the grant at its stop
    //    (the VM lets go of its own turn); the VM's late `Done` is refused (not fatal), it is
    //    set aside until it asks, and `b` is served throughout.
    let (sa, _) = a.grant();
    assert_eq!(word.resume(sa, State::Granted), Resumed::Go);
    assert!(word.store(sa, State::Granted));
    b.send(&ToDaemon::Want { kernel: None });
    let (sb2, _) = b.grant();
    assert_eq!(decode(word.load()), (sa, State::Revoked));
    a.done(sa, RunOutcome::Completed, 1000, true);
    match a.recv() {
        Some((ToVm::Error { fatal: false, .. }, _)) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    b.done(sb2, RunOutcome::Completed, 1000, false);
    assert!(!a.readable_within(Duration::from_millis(50)), "set aside");
    a.send(&ToDaemon::Want { kernel: None });
    let (sa2, _) = a.grant();
    a.done(sa2, RunOutcome::Completed, 1000, false);
    drop((a, b));
    let r = d.stop();
    assert_eq!(
        (r.unstarted_revoked, r.evictions, r.refused),
        (1, 0, 1),
        "{r:?}"
    );
    assert!(r.vms.iter().all(|v| !v.evicted));
}

/// A word of another VM is never written by the daemon for this one's grants.
#[test]
fn each_vm_has_its_own_word() {
    let d = start("unstarted-own", "policy=timeslice,slice=20ms", REVOKE_MS);
    let (a, wa) = Vm::hello_word(&d, "a", 1, 2);
    let (b, wb): (Vm, GrantWord) = Vm::hello_word(&d, "b", 1, 2);
    a.send(&ToDaemon::Want { kernel: None });
    let (sa, _) = a.grant();
    assert_eq!(decode(wa.load()), (sa, State::Granted));
    assert_eq!(wb.load(), 0, "b's word untouched");
    assert_eq!(wa.resume(sa, State::Granted), Resumed::Go);
    a.done(sa, RunOutcome::Completed, 1000, false);
    drop((a, b));
    d.stop();
}
