//! Tests of where, at which priority and when the link's threads run (`boost`, `pin`,
//! `placement`, `wake`): raised or pinned while the worker waits for or holds a grant, back
//! after it, and woken for a pause or the device's end.

use super::tests::{accept_and_welcome, daemon_socket, done, grant, recv};
use super::*;
/// The nice value of thread `tid` of this process.
fn nice_of(tid: libc::pid_t) -> i32 {
    // SAFETY: plain system call on a thread id of this process.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) }
}

/// Whether this process may raise a thread's priority (CAP_SYS_NICE or RLIMIT_NICE); tried on
/// a thread of its own, which then ends.
fn may_raise() -> bool {
    std::thread::spawn(|| {
        // SAFETY: as in `nice_of`, on the calling thread.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -1) == 0 }
    })
    .join()
    .unwrap()
}

/// One grant to a link at `nice=-3,rt=RT` from a scripted daemon: `level` of the worker thread
/// before it registers, while it waits for the grant (seen by the daemon), while it holds it
/// and after it released it.
fn one_grant<T: Send + 'static>(tag: &str, rt: u8, level: fn(libc::pid_t) -> T) -> (T, T, T, T) {
    one_grant_with(
        tag,
        HostConfig {
            nice: -3,
            rt,
            ..HostConfig::plain(PathBuf::new(), "t")
        },
        level,
    )
}

/// [`one_grant`] with the link configured as `base` (its socket replaced).
fn one_grant_with<T: Send + 'static>(
    tag: &str,
    base: HostConfig,
    level: fn(libc::pid_t) -> T,
) -> (T, T, T, T) {
    let (dir, socket, listener) = daemon_socket(tag);
    let (tid_tx, tid_rx) = std::sync::mpsc::channel::<libc::pid_t>();
    // The scripted daemon looks at the worker's level while it waits for the grant.
    let daemon = std::thread::spawn(move || {
        let conn = accept_and_welcome(&listener);
        let tid = tid_rx.recv().unwrap();
        assert_eq!(recv(&conn), ToDaemon::Want { kernel: Some(5) });
        let waiting = level(tid);
        grant(&conn, 1);
        assert_eq!(recv(&conn), done(1, false));
        waiting
    });
    let cfg = HostConfig { socket, ..base };
    let worker = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::gettid() };
        let own = level(tid);
        let (link, _welcome) = HostLink::connect(&cfg, 2 << 20, 1).unwrap();
        tid_tx.send(tid).unwrap();
        let handle = PreemptHandle::new();
        let t = link.acquire(&handle, Some(5)).unwrap();
        let holding = level(tid);
        let gpu = Duration::from_micros(1);
        link.release(t, RunOutcome::Completed, gpu, (0, 0), false);
        let after = level(tid);
        drop(link);
        (own, holding, after)
    });
    let (own, holding, after) = worker.join().unwrap();
    let waiting = daemon.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (own, waiting, holding, after)
}

/// `nice=`: the worker thread runs at the configured nice value from the moment it waits for a
/// grant until the grant ends (issue 25: a worker that waits in a run queue stops late), and at
/// its own level before and after. Where the host refuses raising, nothing changes.
#[test]
fn the_worker_runs_raised_while_it_waits_for_and_holds_a_grant() {
    let (own, waiting, holding, after) = one_grant("nice", 0, nice_of);
    let raised = if may_raise() && own > -3 { -3 } else { own };
    assert_eq!(
        (waiting, holding, after),
        (raised, raised, own),
        "nice while waiting, holding, after (own level {own})"
    );
}

/// The CPUs thread `tid` of this process may run on.
fn cpus_of(tid: libc::pid_t) -> Vec<usize> {
    // SAFETY: an all-zero `cpu_set_t` is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live, writable `cpu_set_t` of the size passed.
    let r =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(r, 0);
    // SAFETY: `set` is initialised; CPU_ISSET only reads it.
    (0..1024)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// `cpus=`: the worker thread runs on the configured CPU from the moment it waits for a grant
/// until the grant ends (issue 25: the thread holding a sim GPU kept off the vCPUs' cores), at
/// its own level while it waits (the holder there runs first) and raised while it holds the
/// grant; on its own CPUs before and after.
#[test]
fn the_worker_runs_on_its_cpus_while_it_waits_for_and_holds_a_grant() {
    let own = cpus_of(0);
    let last = *own.last().unwrap();
    let cfg = HostConfig {
        cpus: Some((last as u16, last as u16)),
        ..HostConfig::plain(PathBuf::new(), "t")
    };
    let (before, waiting, holding, after) = one_grant_with("cpus", cfg.clone(), cpus_of);
    assert_eq!(before, own);
    assert_eq!((waiting, holding), (vec![last], vec![last]));
    assert_eq!(after, own);
    // The link's reader thread with it while the grant is held, back after.
    let (dir, socket, listener) = daemon_socket("cpus-reader");
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let daemon = std::thread::spawn(move || {
        let conn = accept_and_welcome(&listener);
        assert_eq!(recv(&conn), ToDaemon::Want { kernel: Some(5) });
        grant(&conn, 1);
        assert_eq!(recv(&conn), done(1, false));
        // The connection (and so the reader thread) lives until the test has looked.
        let _ = end_rx.recv();
    });
    let (link, _welcome) = HostLink::connect(
        &HostConfig {
            socket,
            ..cfg.clone()
        },
        2 << 20,
        1,
    )
    .unwrap();
    // The reader thread names itself once it runs (before that a grant leaves it in place).
    let reader_tid = || {
        link.inner
            .reader_tid
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let t0 = Instant::now();
    while reader_tid() == 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let reader = reader_tid();
    assert_ne!(reader, 0);
    let handle = PreemptHandle::new();
    let t = link.acquire(&handle, Some(5)).unwrap();
    let holding = cpus_of(reader);
    link.release(
        t,
        RunOutcome::Completed,
        Duration::from_micros(1),
        (0, 0),
        false,
    );
    assert_eq!((holding, cpus_of(reader)), (vec![last], own.clone()));
    end_tx.send(()).unwrap();
    daemon.join().unwrap();
    drop(link);
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = HostConfig { nice: -3, ..cfg };
    let (own, waiting, holding, after) = one_grant_with("cpus-nice", cfg, nice_of);
    let raised = if may_raise() && own > -3 { -3 } else { own };
    assert_eq!(
        (waiting, holding, after),
        (own, raised, own),
        "nice while waiting, holding, after (own level {own})"
    );
}

/// The scheduling policy (without the `SCHED_RESET_ON_FORK` flag a raise sets) and nice value
/// of thread `tid`.
fn sched_of(tid: libc::pid_t) -> (libc::c_int, i32) {
    // SAFETY: plain system call on a thread id of this process.
    let p = unsafe { libc::sched_getscheduler(tid) };
    (p & !libc::SCHED_RESET_ON_FORK, nice_of(tid))
}

/// Whether this process may make a thread real-time; tried on a thread of its own, which then
/// ends.
fn may_realtime() -> bool {
    std::thread::spawn(|| {
        let p = libc::sched_param { sched_priority: 1 };
        // SAFETY: plain system call on the calling thread, with a live sched_param.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 }
    })
    .join()
    .unwrap()
}

/// `rt=`: the worker thread is `SCHED_FIFO` from the moment it waits for a grant until the
/// grant ends, and back in the fair class at its own nice value after; where the host refuses
/// real-time, it falls back to `nice` for the same span.
#[test]
fn the_worker_runs_real_time_while_it_waits_for_and_holds_a_grant() {
    let (own, waiting, holding, after) = one_grant("rt", 1, sched_of);
    assert_eq!(own.0, libc::SCHED_OTHER);
    let raised = if may_realtime() {
        (libc::SCHED_FIFO, own.1)
    } else if may_raise() && own.1 > -3 {
        (libc::SCHED_OTHER, -3)
    } else {
        own
    };
    assert_eq!(
        (waiting, holding, after),
        (raised, raised, own),
        "(policy, nice) while waiting, holding, after"
    );
}

/// Between two jobs of a turn the grant is kept (`Progress`), but not the priority: the
/// guest's CPU work up to the next job runs at the thread's own level, and the next `acquire`
/// (which returns the kept grant at once) raises it again.
#[test]
fn between_two_jobs_of_a_turn_the_worker_runs_at_its_own_level() {
    let (dir, socket, listener) = daemon_socket("turn");
    let daemon = std::thread::spawn(move || {
        let conn = accept_and_welcome(&listener);
        assert_eq!(recv(&conn), ToDaemon::Want { kernel: Some(5) });
        // A turn (a slice, no deadline): jobs may follow each other under it.
        let g = ToVm::Grant {
            seq: 1,
            slice_ns: 1_000_000_000,
            deadline_ns: 0,
        };
        conn.send(&proto::encode(&g), None).unwrap();
        assert!(matches!(recv(&conn), ToDaemon::Progress { seq: 1, .. }));
        assert_eq!(recv(&conn), done(1, false));
    });
    let cfg = HostConfig {
        nice: -3,
        ..HostConfig::plain(socket, "t")
    };
    let worker = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments.
        let tid = unsafe { libc::gettid() };
        let own = nice_of(tid);
        let (link, _welcome) = HostLink::connect(&cfg, 2 << 20, 1).unwrap();
        let handle = PreemptHandle::new();
        let gpu = Duration::from_micros(1);
        let t = link.acquire(&handle, Some(5)).unwrap();
        let first = nice_of(tid);
        link.release(t, RunOutcome::Completed, gpu, (0, 0), true);
        let between = nice_of(tid);
        let t2 = link.acquire(&handle, Some(5)).unwrap();
        let second = nice_of(tid);
        assert_eq!(t2.seq, 1, "the kept grant");
        link.release(t2, RunOutcome::Completed, gpu, (0, 0), false);
        let after = nice_of(tid);
        drop(link);
        (own, [first, between, second, after])
    });
    let (own, got) = worker.join().unwrap();
    daemon.join().unwrap();
    let raised = if may_raise() && own > -3 { -3 } else { own };
    assert_eq!(
        got,
        [raised, own, raised, own],
        "nice holding, between the jobs, holding again, after (own level {own})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker waiting in `acquire_unless` (stop: `stop`) on a scripted daemon that never grants;
/// `poke` is called on the link 30 ms in; returns how the wait ended (`is`) and how long after
/// the poke.
fn waiting_worker_poked(
    tag: &str,
    stop: Arc<std::sync::atomic::AtomicBool>,
    poke: fn(&HostLink),
    is: fn(&HostError) -> bool,
) -> (bool, Duration) {
    let (dir, socket, listener) = daemon_socket(tag);
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let daemon = std::thread::spawn(move || {
        let conn = accept_and_welcome(&listener);
        assert_eq!(recv(&conn), ToDaemon::Want { kernel: Some(5) });
        // No grant: the worker waits until the test lets it go.
        let _ = end_rx.recv();
    });
    let (link, _welcome) = HostLink::connect(&HostConfig::plain(socket, "t"), 2 << 20, 1).unwrap();
    let link = Arc::new(link);
    let l2 = link.clone();
    let worker = std::thread::spawn(move || {
        let handle = PreemptHandle::new();
        let r = l2.acquire_unless(&handle, Some(5), &|| {
            stop.load(std::sync::atomic::Ordering::SeqCst)
        });
        (r.is_err_and(|e| is(&e)), Instant::now())
    });
    // Let it reach its wait (the Want is sent first).
    std::thread::sleep(Duration::from_millis(30));
    let t = Instant::now();
    poke(&link);
    let (ended_so, at) = worker.join().unwrap();
    end_tx.send(()).unwrap();
    daemon.join().unwrap();
    drop(link);
    let _ = std::fs::remove_dir_all(&dir);
    (ended_so, at.saturating_duration_since(t))
}

/// A worker waiting for a grant in `acquire_unless` looks at its `stop` when `interrupt` wakes
/// it (a pause), not at a periodic look: interrupted well before the 250 ms safety wake-up.
#[test]
fn interrupt_wakes_a_waiting_worker_to_its_stop() {
    static STOP: std::sync::OnceLock<Arc<std::sync::atomic::AtomicBool>> =
        std::sync::OnceLock::new();
    let stop = STOP.get_or_init(Arc::default).clone();
    let (interrupted, took) = waiting_worker_poked(
        "interrupt",
        stop,
        |link| {
            STOP.get()
                .unwrap()
                .store(true, std::sync::atomic::Ordering::SeqCst);
            link.interrupt();
        },
        |e| matches!(e, HostError::Interrupted),
    );
    assert!(interrupted);
    assert!(took < Duration::from_millis(200), "{took:?}");
}

/// `close` (device teardown) wakes a worker waiting for a grant at once: it returns `Lost`
/// well before the 250 ms safety wake-up.
#[test]
fn close_wakes_a_waiting_worker() {
    let (lost, took) = waiting_worker_poked("close-wakes", Arc::default(), HostLink::close, |e| {
        matches!(e, HostError::Lost(_))
    });
    assert!(lost);
    assert!(took < Duration::from_millis(200), "{took:?}");
}
