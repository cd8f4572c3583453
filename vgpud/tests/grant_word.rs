//! The grant word (protocol version 4, issue 25): a turn's grant a VM keeps between two jobs is
//! taken back by the daemon through the word while the VM process does nothing at all (frozen:
//! not scheduled), the next VM runs, and the VM, back, finds its grant revoked and asks again.
//! A word holding anything else sends the daemon to its messages as before; a hostile word only
//! costs its own VM its turn. Scripted VMs over the daemon's real socket (`common`).

mod common;

use std::time::{Duration, Instant};

use common::{Vm, start};
use vgpud::proto::{self, RunOutcome, ToDaemon, ToVm};
use vgpud::word::{GrantWord, Resumed, State, decode, encode};

/// The revocation deadline of these daemons: a frozen VM the word does not help keeps the GPU
/// this long, then is evicted.
const REVOKE_MS: u64 = 1500;

/// A job of `seq` under the VM's turn (1 ms), reported with `Progress`, then the grant kept
/// the way `vgpu`'s link keeps it: the word says `Kept` after the `Progress` went out.
fn one_job_then_keep(vm: &Vm, word: &GrantWord, seq: u64) {
    assert!(word.store(seq, State::Running));
    let start_ns = proto::monotonic_ns();
    std::thread::sleep(Duration::from_millis(1));
    let end_ns = proto::monotonic_ns();
    vm.send(&ToDaemon::Progress {
        seq,
        gpu_ns: end_ns - start_ns,
        start_ns,
        end_ns,
    });
    assert!(word.store(seq, State::Kept));
}

#[test]
fn a_frozen_vms_kept_grant_is_taken_back_through_its_word_and_the_next_vm_runs() {
    let d = start(
        "word-frozen",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        REVOKE_MS,
    );
    let (a, word) = Vm::hello_word(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    a.send(&ToDaemon::Want { kernel: None });
    let (seq, _) = a.grant();
    one_job_then_keep(&a, &word, seq);
    // From here `a` is frozen: it reads nothing and writes nothing until b has run.
    let asked = Instant::now();
    b.send(&ToDaemon::Want { kernel: None });
    let (sb, _) = b.grant();
    let waited = asked.elapsed();
    // The slice (20 ms) and a generous allowance for a loaded machine; without the word the
    // grant stays with the frozen VM until its eviction (REVOKE_MS after the slice end).
    assert!(
        waited < Duration::from_millis(20 + 200),
        "b waited {waited:?} for the GPU"
    );
    assert_eq!(decode(word.load()), (seq, State::Revoked));
    b.done(sb, RunOutcome::Completed, 1000, false);
    // `a` thaws: its next job finds the grant revoked (it must not run under it). It is still
    // queued (the daemon counted `Done { preempted, more }`): the GPU comes back to it with a
    // new grant, and no preempt was ever sent it (the daemon acted on the word alone).
    assert_eq!(word.resume(seq, State::Kept), Resumed::Revoked);
    let (sa, _) = a.grant();
    assert!(sa > sb && sb > seq);
    assert!(word.store(sa, State::Running));
    a.done(sa, RunOutcome::Completed, 1000, false);
    drop((a, b));
    let r = d.stop();
    assert_eq!((r.kept_revoked, r.evictions, r.refused), (1, 0, 0), "{r:?}");
    let w = r
        .worst_preemptions
        .first()
        .expect("the revocation is a sample");
    assert!(w.kept && w.revoked && w.run_ns == 0, "{w:?}");
    // Kept before the stop was due: the daemon's first look at the word won.
    assert_eq!((w.vm, w.jobs_before, w.word_looks), (1, 1, 1), "{w:?}");
    // `a`: one job by Progress, one after; the revoked grant counts as preempted.
    assert_eq!((r.vms[0].completed, r.vms[0].preempted), (2, 1), "{r:?}");
}

#[test]
fn a_kept_grant_told_its_slice_end_goes_back_at_the_slice_end_without_a_preempt() {
    // `b` waits when `a` is granted: `a` is told its slice end (it stops by itself) and the
    // daemon looks at the word from then on, before its backstop preempt (20 ms later here).
    let d = start(
        "word-deadline",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        REVOKE_MS,
    );
    let (a, word) = Vm::hello_word(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    b.send(&ToDaemon::Want { kernel: None });
    let (sb0, _) = b.grant();
    a.send(&ToDaemon::Want { kernel: None });
    // `a` is queued when `b`'s grant ends preempted: `a` runs next (no GPU time yet), then `b`
    // (less than `a` after its job).
    std::thread::sleep(Duration::from_millis(2));
    b.done(sb0, RunOutcome::Preempted, 1000, true);
    let (seq, deadline_ns) = match a.recv() {
        Some((
            ToVm::Grant {
                seq, deadline_ns, ..
            },
            _,
        )) => (seq, deadline_ns),
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_ne!(deadline_ns, 0, "others wait: a slice end to stop at");
    one_job_then_keep(&a, &word, seq);
    let (sb, _) = b.grant();
    assert!(
        proto::monotonic_ns() >= deadline_ns,
        "not before the slice end"
    );
    assert_eq!(decode(word.load()), (seq, State::Revoked));
    b.done(sb, RunOutcome::Completed, 1000, false);
    drop((a, b));
    let r = d.stop();
    assert_eq!((r.kept_revoked, r.evictions), (1, 0), "{r:?}");
    assert!(r.worst_preemptions.first().is_some_and(|w| w.revoked));
}

#[test]
fn a_grant_kept_after_its_preempt_went_out_is_taken_back_without_the_vm_reading_it() {
    // The preempt leaves while `a`'s job runs (the word says Running: the swap fails); `a`
    // then keeps the grant for its next job without having read the preempt, and freezes. The
    // daemon looks at the word again until the grant ends.
    let d = start(
        "word-after-preempt",
        "policy=timeslice,slice=20ms",
        REVOKE_MS,
    );
    let (a, word) = Vm::hello_word(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    a.send(&ToDaemon::Want { kernel: None });
    let (seq, _) = a.grant();
    assert!(word.store(seq, State::Running));
    // Some GPU time first, so that b's want preempts (wake-up preemption).
    std::thread::sleep(Duration::from_millis(5));
    let asked = Instant::now();
    b.send(&ToDaemon::Want { kernel: None });
    // Wait until the preempt is there (`a` does not read it: it is busy elsewhere).
    assert!(a.readable_within(Duration::from_secs(2)), "no preempt");
    one_job_then_keep(&a, &word, seq);
    let (sb, _) = b.grant();
    assert!(
        asked.elapsed() < Duration::from_millis(200),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(decode(word.load()), (seq, State::Revoked));
    b.done(sb, RunOutcome::Completed, 1000, false);
    // The preempt `a` finds now is for a grant that is over.
    assert!(matches!(a.recv(), Some((ToVm::Preempt { seq: s }, _)) if s == seq));
    drop((a, b));
    let r = d.stop();
    assert_eq!(
        (r.kept_revoked, r.preempts, r.evictions),
        (1, 1, 0),
        "{r:?}"
    );
    // Looked at when the preempt went out (Running), won at a later look.
    let w = r
        .worst_preemptions
        .first()
        .expect("the revocation is a sample");
    assert!(w.revoked && w.word_looks >= 2, "{w:?}");
}

#[test]
fn a_hostile_word_only_costs_its_own_vm_its_turn() {
    let d = start(
        "word-hostile",
        "policy=timeslice,slice=20ms,wake_preempt=false",
        REVOKE_MS,
    );
    let (a, word) = Vm::hello_word(&d, "a", 1, 2);
    let (b, _) = Vm::hello(&d, "b", 1, 2);
    // 1. Garbage (and a stale or future grant's `Kept`) is ignored: the preempt message goes
    //    out at the slice end as without a word, and the VM's answer ends the turn.
    a.send(&ToDaemon::Want { kernel: None });
    let (seq, _) = a.grant();
    b.send(&ToDaemon::Want { kernel: None });
    for w in [
        u64::MAX,
        0,
        encode(seq + 1, State::Kept).unwrap(),
        encode(seq - 1, State::Kept).unwrap(),
        encode(seq, State::Kept).unwrap() | 5,
        encode(seq, State::Revoked).unwrap(),
    ] {
        // Written as a hostile VM would.
        word.store_raw(w);
        assert_eq!(word.load(), w);
        std::thread::sleep(Duration::from_millis(2));
    }
    a.preempted(seq);
    a.done(seq, RunOutcome::Preempted, 1000, true);
    let (sb, _) = b.grant();
    b.done(sb, RunOutcome::Completed, 1000, false);
    // 2. `Kept` written while a job runs, before any `Progress`: the daemon takes the turn at
    //    its stop; the VM's late `Done` for it is refused (not fatal), and nothing else moves.
    let (sa, _) = a.grant();
    assert!(word.store(sa, State::Kept));
    b.send(&ToDaemon::Want { kernel: None });
    let (sb2, _) = b.grant();
    assert_eq!(decode(word.load()), (sa, State::Revoked));
    a.done(sa, RunOutcome::Completed, 1000, false);
    match a.recv() {
        Some((ToVm::Error { fatal: false, .. }, _)) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
    b.done(sb2, RunOutcome::Completed, 1000, false);
    // `a` is still registered and served.
    let (sa2, _) = a.grant();
    a.done(sa2, RunOutcome::Completed, 1000, false);
    drop((a, b));
    let r = d.stop();
    assert_eq!((r.kept_revoked, r.evictions, r.refused), (1, 0, 1), "{r:?}");
    assert!(r.vms.iter().all(|v| !v.evicted));
}

#[test]
fn only_a_version_4_vm_that_asks_gets_a_word() {
    let d = start("word-versions", "policy=timeslice,slice=20ms", REVOKE_MS);
    for (version, word) in [(3, true), (proto::VERSION, false)] {
        let vm = common::Vm::connect(&d);
        vm.send(&ToDaemon::Hello(proto::Hello {
            version,
            name: format!("v{version}"),
            weight: 1,
            priority: 0,
            vram: 2 << 20,
            channels: 1,
            resume: None,
            gpu: None,
            word,
        }));
        assert!(matches!(
            vm.recv(),
            Some((ToVm::Welcome { version: v, .. }, true)) if v == version
        ));
        // No `GrantWord` follows: the next message is the grant.
        vm.send(&ToDaemon::Want { kernel: None });
        let (seq, _) = vm.grant();
        vm.done(seq, RunOutcome::Completed, 1000, false);
    }
    let r = d.stop();
    assert_eq!((r.refused, r.kept_revoked), (0, 0), "{r:?}");
}
