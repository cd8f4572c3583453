//! The daemon link's slice end between two jobs (issue 25: 64 VMs, preemption up to 6.3 ms),
//! against a scripted daemon: a VM that finished a job inside its slice with more work behind
//! it keeps the grant (`Progress`); if the slice has ended by the time its worker asks for the
//! next run, the grant goes back at once (`Done` preempted, no run, with `more`; a preempt —
//! the daemon's backstop — makes the reader thread send it earlier, `host::tests`) and the next
//! job waits for a new grant, instead of starting late under the old one (the GPU held idle
//! from the slice end). Likewise a fresh grant the worker takes only
//! after its slice has ended (woken late) goes back unused — once: the next one runs whatever
//! its deadline, so a VM that is always late still progresses.

mod common;

use std::time::{Duration, Instant};

use pgpu::PreemptHandle;
use vgpu::host::{HostConfig, HostLink};
use vgpu_proto::proto::{self, RunOutcome, ToDaemon, ToVm};
use vgpu_proto::wire::{Conn, Listener, Received};

/// The next message from the VM, within 2 s.
fn next(c: &Conn) -> Option<ToDaemon> {
    let mut buf = [0u8; proto::MAX_MESSAGE];
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        if !c
            .wait_readable_for(Some(Duration::from_millis(50)))
            .unwrap()
        {
            continue;
        }
        match c.recv(&mut buf).unwrap() {
            Received::Message(n, _) => return Some(proto::decode(&buf[..n]).unwrap()),
            Received::Empty => {}
            Received::Closed => panic!("the VM closed the link"),
        }
    }
    None
}

fn grant(c: &Conn, seq: u64, slice: Duration) {
    grant_until(
        c,
        seq,
        slice,
        proto::monotonic_ns() + slice.as_nanos() as u64,
    );
}

/// A grant whose slice ends at `deadline_ns` (in the past: the VM is late).
fn grant_until(c: &Conn, seq: u64, slice: Duration, deadline_ns: u64) {
    let g = ToVm::Grant {
        seq,
        slice_ns: slice.as_nanos() as u64,
        deadline_ns,
    };
    c.send(&proto::encode(&g), None).unwrap();
}

/// A link to a scripted daemon: (link, the daemon's end).
fn connect(dir: &std::path::Path) -> (HostLink, Conn) {
    let socket = dir.join("vgpud.sock");
    let listener = Listener::bind(&socket).unwrap();
    let vram_path = dir.join("vram");
    let daemon = std::thread::spawn(move || {
        let conn = common::daemon::accept_and_welcome(&listener, &vram_path);
        (conn, listener)
    });
    let cfg = HostConfig::plain(socket, "t");
    let (link, _welcome) = HostLink::connect(&cfg, 4 << 20, 1).unwrap();
    let (conn, listener) = daemon.join().unwrap();
    std::mem::forget(listener);
    (link, conn)
}

#[test]
fn a_grant_kept_past_its_slice_end_goes_back_before_the_next_job() {
    let dir = std::env::temp_dir().join(format!("vgpu-host-slice-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (link, conn) = connect(&dir);
    let link = std::sync::Arc::new(link);
    let handle = PreemptHandle::new();
    // The first job: Want, a 50 ms slice, completed inside it with more work behind it.
    let (l, h) = (link.clone(), handle.clone());
    let first = std::thread::spawn(move || l.acquire(&h, Some(7)).unwrap());
    assert!(matches!(next(&conn), Some(ToDaemon::Want { .. })));
    grant(&conn, 1, Duration::from_millis(50));
    let t1 = first.join().unwrap();
    link.release(
        t1,
        RunOutcome::Completed,
        Duration::from_millis(1),
        (1, 2),
        true,
    );
    assert!(
        matches!(next(&conn), Some(ToDaemon::Progress { seq: 1, .. })),
        "inside the slice the grant is kept"
    );
    // The worker gets to the next job only after the slice end.
    std::thread::sleep(Duration::from_millis(80));
    let (l, h) = (link.clone(), handle.clone());
    let second = std::thread::spawn(move || l.acquire(&h, Some(7)).unwrap());
    match next(&conn) {
        Some(ToDaemon::Done {
            seq: 1,
            outcome: RunOutcome::Preempted,
            gpu_ns: 0,
            more: true,
            ..
        }) => {}
        other => panic!("the kept grant must go back at the slice end, got {other:?}"),
    }
    assert!(matches!(next(&conn), Some(ToDaemon::Want { .. })));
    assert!(!second.is_finished(), "the next job waits for a new grant");
    grant(&conn, 2, Duration::from_millis(50));
    let t2 = second.join().unwrap();
    assert!(!handle.is_requested(), "the new grant's slice is running");
    link.release(
        t2,
        RunOutcome::Completed,
        Duration::from_millis(1),
        (3, 4),
        false,
    );
    assert!(
        matches!(next(&conn), Some(ToDaemon::Done { seq: 2, .. })),
        "the next job ran under the new grant"
    );
    // Within the slice, a kept grant is used at once (no message).
    let (l, h) = (link.clone(), handle.clone());
    let third = std::thread::spawn(move || l.acquire(&h, None).unwrap());
    assert!(matches!(next(&conn), Some(ToDaemon::Want { .. })));
    grant(&conn, 3, Duration::from_millis(500));
    let t3 = third.join().unwrap();
    link.release(t3, RunOutcome::Completed, Duration::ZERO, (5, 6), true);
    assert!(matches!(
        next(&conn),
        Some(ToDaemon::Progress { seq: 3, .. })
    ));
    let t4 = link.acquire(&handle, None).unwrap();
    link.release(t4, RunOutcome::Completed, Duration::ZERO, (7, 8), false);
    assert!(matches!(next(&conn), Some(ToDaemon::Done { seq: 3, .. })));
    link.close();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_grant_taken_after_its_slice_end_goes_back_once() {
    let dir = std::env::temp_dir().join(format!("vgpu-host-late-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (link, conn) = connect(&dir);
    let link = std::sync::Arc::new(link);
    let handle = PreemptHandle::new();
    let (l, h) = (link.clone(), handle.clone());
    let worker = std::thread::spawn(move || l.acquire(&h, Some(9)).unwrap());
    assert!(matches!(next(&conn), Some(ToDaemon::Want { .. })));
    // A grant whose 1 ms slice ended 5 ms ago: back unused, and a new Want with the identity.
    let slice = Duration::from_millis(1);
    grant_until(&conn, 1, slice, proto::monotonic_ns() - 5_000_000);
    match next(&conn) {
        Some(ToDaemon::Done {
            seq: 1,
            outcome: RunOutcome::Completed,
            gpu_ns: 0,
            start_ns: 0,
            end_ns: 0,
            more: true,
        }) => {}
        other => panic!("a grant past its slice end must go back unused, got {other:?}"),
    }
    assert!(matches!(
        next(&conn),
        Some(ToDaemon::Want { kernel: Some(9) })
    ));
    assert!(!worker.is_finished(), "the job waits for the next grant");
    // The next one is late too: it runs all the same (stopping at once under its deadline).
    grant_until(&conn, 2, slice, proto::monotonic_ns() - 5_000_000);
    let t = worker.join().unwrap();
    assert!(
        handle.is_requested(),
        "its deadline has passed: the job stops at once"
    );
    link.release(t, RunOutcome::Preempted, Duration::ZERO, (1, 2), true);
    assert!(matches!(
        next(&conn),
        Some(ToDaemon::Done {
            seq: 2,
            outcome: RunOutcome::Preempted,
            ..
        })
    ));
    // A grant in time after that runs as usual.
    let (l, h) = (link.clone(), handle.clone());
    let worker = std::thread::spawn(move || l.acquire(&h, None).unwrap());
    grant(&conn, 3, Duration::from_millis(500));
    let t = worker.join().unwrap();
    assert!(!handle.is_requested());
    link.release(t, RunOutcome::Completed, Duration::ZERO, (3, 4), false);
    // (A Want may come first: the preempted job's `more` left one outstanding or not.)
    let done = std::iter::from_fn(|| next(&conn)).find(|m| !matches!(m, ToDaemon::Want { .. }));
    assert!(
        matches!(done, Some(ToDaemon::Done { seq: 3, .. })),
        "{done:?}"
    );
    link.close();
    let _ = std::fs::remove_dir_all(&dir);
}
