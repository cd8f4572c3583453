//! A restart of the daemon driven by scripted VM processes over its real socket: the VMs of an
//! instance that went away re-register with the next one on the same socket (protocol version
//! 3, `Hello::resume`) and get their partitions back in the same memory object with its data;
//! first registrations wait for the adoption window; conflicting and malformed claims are
//! refused; an adopted partition is zeroed when its VM leaves and the object dropped.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpud::proto::{self, Hello, Resume, RunOutcome, ToDaemon, ToVm};
use vgpud::wire::{Conn, Received};
use vgpud::{Background, DaemonConfig};

const MIB: u64 = 1 << 20;

fn daemon(socket: &Path, adopt: Duration) -> Background {
    daemon_of(socket, adopt, Vec::new())
}

/// A daemon with the GPUs `gpus` (`--gpus`; empty: one).
fn daemon_of(socket: &Path, adopt: Duration, gpus: Vec<u32>) -> Background {
    let _ = env_logger::builder().is_test(true).try_init();
    Background::start(DaemonConfig {
        socket: socket.into(),
        vram: 64 * MIB,
        channels: 16,
        gpus,
        sched: scheduler::Config::parse("policy=fifo").unwrap(),
        sched_text: "policy=fifo".into(),
        revoke_after: Duration::from_millis(500),
        max_run: Duration::from_secs(5),
        report: None,
        report_every: None,
        spin: Duration::ZERO,
        backstop: Duration::from_millis(20),
        adopt,
    })
    .unwrap()
}

fn hello(name: &str, vram: u64, resume: Option<Resume>) -> ToDaemon {
    ToDaemon::Hello(Hello {
        version: proto::VERSION,
        name: name.into(),
        weight: 1,
        priority: 0,
        vram,
        channels: 1,
        resume,
        gpu: None,
        word: false,
    })
}

/// The next message within `limit` (and its descriptor), `None` if none came.
fn recv_within(c: &Conn, limit: Duration) -> Option<(ToVm, Option<OwnedFd>)> {
    let mut buf = [0u8; proto::MAX_MESSAGE];
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() || !c.wait_readable_for(Some(left)).unwrap() {
            return None;
        }
        match c.recv(&mut buf).unwrap() {
            Received::Message(n, fd) => return Some((proto::decode(&buf[..n]).unwrap(), fd)),
            Received::Empty => {}
            Received::Closed => return None,
        }
    }
}

/// A registration as the VM keeps it.
struct Registered {
    conn: Conn,
    vm: u32,
    offset: u64,
    boot: String,
    fd: OwnedFd,
}

fn register(
    socket: &Path,
    msg: &ToDaemon,
    fd: Option<BorrowedFd<'_>>,
) -> Result<Registered, String> {
    let conn = Conn::connect(socket).unwrap();
    conn.send(&proto::encode(msg), fd).unwrap();
    match recv_within(&conn, Duration::from_secs(5)) {
        Some((
            ToVm::Welcome {
                vm,
                vram_offset,
                boot: Some(boot),
                ..
            },
            Some(fd),
        )) => Ok(Registered {
            conn,
            vm,
            offset: vram_offset,
            boot,
            fd,
        }),
        Some((ToVm::Error { message, fatal }, _)) => {
            assert!(fatal, "{message}");
            Err(message)
        }
        other => panic!("unexpected answer {other:?}"),
    }
}

fn inode(fd: BorrowedFd<'_>) -> u64 {
    use std::os::unix::fs::MetadataExt;
    File::from(fd.try_clone_to_owned().unwrap())
        .metadata()
        .unwrap()
        .ino()
}

fn pwrite(fd: BorrowedFd<'_>, off: u64, data: &[u8]) {
    // SAFETY: pwrite from our buffer into a descriptor we hold.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), off as _) };
    assert_eq!(n, data.len() as isize);
}

fn pread(fd: BorrowedFd<'_>, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0xeeu8; len];
    // SAFETY: pread into our buffer from a descriptor we hold.
    let n = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), len, off as _) };
    assert_eq!(n, len as isize);
    b
}

fn claim(r: &Registered, gpu: u32) -> Option<Resume> {
    Some(Resume {
        boot: r.boot.clone(),
        vm: r.vm,
        gpu,
        vram_offset: r.offset,
    })
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vgpud-restart-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_restarted_daemon_adopts_the_partitions_of_the_previous_instance() {
    let d = dir("adopt");
    let socket = d.join("sock");
    // The first instance: no stale socket, so no adoption window (a long one is configured).
    let a = daemon(&socket, Duration::from_secs(30));
    let t = Instant::now();
    let x = register(&socket, &hello("x", 4 * MIB, None), None).unwrap();
    let y = register(&socket, &hello("y", 2 * MIB, None), None).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!((x.offset, y.offset), (0, 4 * MIB));
    pwrite(x.fd.as_fd(), x.offset + 4096, b"x's VRAM");
    pwrite(y.fd.as_fd(), y.offset, b"y's VRAM");
    // It goes away. A clean stop removes the socket; a killed daemon leaves it behind: made
    // here by a listener that does not remove its socket.
    let ra = a.stop().unwrap();
    assert!(!ra.restart.stale_socket);
    assert!(
        recv_within(&x.conn, Duration::from_secs(1)).is_none(),
        "x saw the end"
    );
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let window = Duration::from_millis(600);
    let b = daemon(&socket, window);
    let started = Instant::now();
    // A first registration waits for the window's end.
    let z_conn = Conn::connect(&socket).unwrap();
    z_conn
        .send(&proto::encode(&hello("z", 2 * MIB, None)), None)
        .unwrap();
    // Claims are served at once: the same partition of the same object, with its data.
    let x2 = register(
        &socket,
        &hello("x", 4 * MIB, claim(&x, 0)),
        Some(x.fd.as_fd()),
    )
    .unwrap();
    assert_eq!(x2.offset, x.offset);
    assert_ne!(x2.boot, x.boot, "a new instance");
    assert_eq!(inode(x2.fd.as_fd()), inode(x.fd.as_fd()));
    assert_eq!(pread(x2.fd.as_fd(), x.offset + 4096, 8), b"x's VRAM");
    assert!(started.elapsed() < window, "the claim did not wait");
    // Refused claims (each fatal for its connection only).
    let devnull = File::open("/dev/null").unwrap();
    let refusals: Vec<(ToDaemon, Option<BorrowedFd<'_>>, &str)> = vec![
        // x's range again: a conflicting claim.
        (
            hello("w", 2 * MIB, claim(&x, 0)),
            Some(x.fd.as_fd()),
            "conflicting",
        ),
        // Overlapping x's range from inside.
        (
            hello(
                "w",
                2 * MIB,
                Some(Resume {
                    vram_offset: 2 * MIB,
                    ..claim(&x, 0).unwrap()
                }),
            ),
            Some(x.fd.as_fd()),
            "conflicting",
        ),
        // This instance's own boot id: it did not restart.
        (
            hello("w", 2 * MIB, claim(&x2, 0)),
            Some(x.fd.as_fd()),
            "did not restart",
        ),
        (
            hello("w", 2 * MIB, claim(&y, 1)),
            Some(y.fd.as_fd()),
            "GPU 1",
        ),
        (
            hello("w", 2 * MIB, claim(&y, 0)),
            None,
            "no VRAM memory object",
        ),
        (
            hello("w", 2 * MIB, claim(&y, 0)),
            Some(devnull.as_fd()),
            "not a vgpud VRAM memory object",
        ),
        (
            hello(
                "w",
                2 * MIB,
                Some(Resume {
                    vram_offset: 64 * MIB,
                    ..claim(&y, 0).unwrap()
                }),
            ),
            Some(y.fd.as_fd()),
            "inside",
        ),
        (
            hello(
                "w",
                2 * MIB,
                Some(Resume {
                    boot: "not hex".into(),
                    ..claim(&y, 0).unwrap()
                }),
            ),
            Some(y.fd.as_fd()),
            "hexadecimal",
        ),
    ];
    let refused = refusals.len() as u64;
    for (msg, fd, why) in refusals {
        let e = register(&socket, &msg, fd)
            .err()
            .unwrap_or_else(|| panic!("{msg:?}"));
        assert!(e.contains(why), "{why}: {e}");
    }
    // A version-2 VM cannot claim (it does not know the form).
    let mut v2 = hello("w", 2 * MIB, claim(&y, 0));
    if let ToDaemon::Hello(h) = &mut v2 {
        h.version = 2;
    }
    let e = register(&socket, &v2, Some(y.fd.as_fd())).err().unwrap();
    assert!(e.contains("version 3"), "{e}");
    // A descriptor without a claim is refused (not fatal), as before.
    let w = Conn::connect(&socket).unwrap();
    w.send(
        &proto::encode(&hello("w", 2 * MIB, None)),
        Some(y.fd.as_fd()),
    )
    .unwrap();
    assert!(matches!(
        recv_within(&w, Duration::from_secs(5)),
        Some((ToVm::Error { fatal: false, .. }, None))
    ));
    drop(w);
    let y2 = register(
        &socket,
        &hello("y", 2 * MIB, claim(&y, 0)),
        Some(y.fd.as_fd()),
    )
    .unwrap();
    assert_eq!(pread(y2.fd.as_fd(), y.offset, 8), b"y's VRAM");
    // The first registration is answered once the window is over, on this instance's own
    // object, around the adopted ranges.
    let (welcome, zfd) = recv_within(&z_conn, Duration::from_secs(5)).expect("z welcomed");
    assert!(started.elapsed() >= window, "{:?}", started.elapsed());
    let ToVm::Welcome { vram_offset, .. } = welcome else {
        panic!("{welcome:?}")
    };
    assert_eq!(vram_offset, 6 * MIB);
    let zfd = zfd.unwrap();
    assert_ne!(inode(zfd.as_fd()), inode(x.fd.as_fd()));
    // This instance's own object is not a restart's claim either.
    let own = Resume {
        vram_offset: 8 * MIB,
        ..claim(&y, 0).unwrap()
    };
    let e = register(&socket, &hello("w", 2 * MIB, Some(own)), Some(zfd.as_fd()))
        .err()
        .unwrap();
    assert!(e.contains("own"), "{e}");
    let b_boot = x2.boot.clone();
    // The adopted VM is scheduled like any other.
    x2.conn
        .send(&proto::encode(&ToDaemon::Want { kernel: None }), None)
        .unwrap();
    let Some((ToVm::Grant { seq, .. }, _)) = recv_within(&x2.conn, Duration::from_secs(5)) else {
        panic!("no grant")
    };
    let done = ToDaemon::Done {
        seq,
        outcome: RunOutcome::Completed,
        gpu_ns: 1000,
        start_ns: 0,
        end_ns: 0,
        more: false,
    };
    x2.conn.send(&proto::encode(&done), None).unwrap();
    // x leaves: its range of the adopted object is zeroed (this process is the VM: it has
    // not exited, but an in-process client is reclaimed at once) and free again.
    x2.conn
        .send(&proto::encode(&ToDaemon::Bye {}), None)
        .unwrap();
    drop(x2);
    let t = Instant::now();
    while pread(x.fd.as_fd(), x.offset + 4096, 8) != [0u8; 8] {
        assert!(t.elapsed() < Duration::from_secs(5), "x's range not zeroed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        pread(y.fd.as_fd(), y.offset, 8),
        b"y's VRAM",
        "y's range kept"
    );
    // x's offset is free again, for a new VM (on this instance's own object).
    let n = register(&socket, &hello("n", 4 * MIB, None), None).unwrap();
    assert_eq!(n.offset, 0);
    assert_ne!(inode(n.fd.as_fd()), inode(x.fd.as_fd()));
    drop((y2, n, z_conn));
    let r = b.stop().unwrap();
    assert!(r.restart.stale_socket);
    assert_eq!(r.restart.adopted, 2);
    assert_eq!(r.restart.claims_refused, refused + 2);
    assert_eq!(r.restart.deferred, 1);
    assert!(r.restart.listen_to_first_grant_ns.is_some());
    assert_eq!(r.boot, b_boot);
    let by = |n: &str| r.vms.iter().find(|v| v.name == n).unwrap().clone();
    assert_eq!(by("x").resumed_from, Some(x.vm));
    assert_eq!(by("z").resumed_from, None);
    let _ = std::fs::remove_dir_all(&d);
}

/// Several GPUs and a restart together: a VM moved to GPU 1 claims its partition there after
/// the daemon restarted (`Resume::gpu` = 1, the target's memory object) and is adopted on GPU 1
/// with its data; the same object claimed on another GPU, and a GPU index the new instance
/// does not have, are refused.
#[test]
fn a_vm_moved_to_another_gpu_is_adopted_there_after_a_restart() {
    let d = dir("moved");
    let socket = d.join("sock");
    let a = daemon_of(&socket, Duration::ZERO, vec![0, 1]);
    // m fills GPU 0 first (most free VRAM, lowest index), p too, then m moves to GPU 1.
    let m = register(&socket, &hello("m", 4 * MIB, None), None).unwrap();
    let _p = register(&socket, &hello("p", 2 * MIB, None), None).unwrap();
    m.conn
        .send(&proto::encode(&ToDaemon::Move { gpu: 1 }), None)
        .unwrap();
    let (ready, target) = recv_within(&m.conn, Duration::from_secs(5)).expect("move answer");
    let ToVm::MoveReady {
        gpu, vram_offset, ..
    } = ready
    else {
        panic!("{ready:?}")
    };
    assert_eq!(gpu.index, 1);
    let target = target.expect("the target's memory object");
    assert_ne!(inode(target.as_fd()), inode(m.fd.as_fd()));
    pwrite(target.as_fd(), vram_offset + 8192, b"moved VRAM");
    m.conn
        .send(&proto::encode(&ToDaemon::Moved {}), None)
        .unwrap();
    assert!(matches!(
        recv_within(&m.conn, Duration::from_secs(5)),
        Some((ToVm::Moved { gpu }, None)) if gpu.index == 1
    ));
    let ra = a.stop().unwrap();
    let on1 = ra.vms.iter().find(|v| v.name == "m").unwrap();
    assert_eq!((on1.gpu, on1.moves), (1, 1));
    // Killed, leaving its socket; the next instance has two GPUs again.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let b = daemon_of(&socket, Duration::ZERO, vec![0, 1]);
    let moved = Resume {
        vram_offset,
        ..claim(&m, 1).unwrap()
    };
    // The moved partition's object claimed on GPU 0: refused once it is adopted on GPU 1
    // (before that it is a claim like any other, so m goes first).
    let conn = Conn::connect(&socket).unwrap();
    conn.send(
        &proto::encode(&hello("m", 4 * MIB, Some(moved.clone()))),
        Some(target.as_fd()),
    )
    .unwrap();
    let (welcome, fd) = recv_within(&conn, Duration::from_secs(5)).expect("m welcomed");
    let ToVm::Welcome {
        vram_offset: off,
        gpu: Some(placed),
        boot: Some(_),
        ..
    } = welcome
    else {
        panic!("{welcome:?}")
    };
    assert_eq!((off, placed.index, placed.device), (vram_offset, 1, 1));
    let fd = fd.unwrap();
    assert_eq!(inode(fd.as_fd()), inode(target.as_fd()));
    assert_eq!(pread(fd.as_fd(), vram_offset + 8192, 10), b"moved VRAM");
    let elsewhere = Resume {
        gpu: 0,
        vram_offset: 16 * MIB,
        ..moved.clone()
    };
    let e = register(
        &socket,
        &hello("w", 2 * MIB, Some(elsewhere)),
        Some(target.as_fd()),
    )
    .err()
    .unwrap();
    assert!(e.contains("adopted on GPU 1"), "{e}");
    // A first registration gets this instance's own memory object, not an adopted one.
    let n = register(&socket, &hello("n", 4 * MIB, None), None).unwrap();
    assert_ne!(inode(n.fd.as_fd()), inode(m.fd.as_fd()));
    drop((conn, n));
    let rb = b.stop().unwrap();
    assert_eq!((rb.restart.adopted, rb.restart.claims_refused), (1, 1));
    let m2 = rb.vms.iter().find(|v| v.name == "m").unwrap();
    assert_eq!((m2.gpu, m2.resumed_from), (1, Some(m.vm)));
    assert_eq!(rb.gpus[1].vms, vec![m2.id]);
    // An instance with one GPU has no GPU 1: the claim is refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let c = daemon_of(&socket, Duration::ZERO, Vec::new());
    let again = Resume {
        boot: rb.boot.clone(),
        ..moved
    };
    let e = register(
        &socket,
        &hello("m", 4 * MIB, Some(again)),
        Some(target.as_fd()),
    )
    .err()
    .unwrap();
    assert!(e.contains("GPU 1: this daemon has 1 GPU"), "{e}");
    let rc = c.stop().unwrap();
    assert_eq!((rc.restart.adopted, rc.restart.claims_refused), (0, 1));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_re_registration_gets_a_grant_word_of_the_new_instance() {
    // Protocol version 4: the grant word is the connection's; a VM re-registering after a
    // restart gets a fresh one from the new instance (the old instance's mapping means
    // nothing to it).
    let with_word = |m: ToDaemon| match m {
        ToDaemon::Hello(h) => ToDaemon::Hello(Hello { word: true, ..h }),
        other => other,
    };
    let word_of = |r: &Registered| match recv_within(&r.conn, Duration::from_secs(5)) {
        Some((ToVm::GrantWord {}, Some(fd))) => {
            vgpud::word::GrantWord::map(&fd).expect("a sealed word");
            fd
        }
        other => panic!("expected the grant word, got {other:?}"),
    };
    let d = dir("word");
    let socket = d.join("sock");
    let a = daemon(&socket, Duration::ZERO);
    let x = register(&socket, &with_word(hello("x", 2 * MIB, None)), None).unwrap();
    let w1 = word_of(&x);
    a.stop().unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let b = daemon(&socket, Duration::ZERO);
    let x2 = register(
        &socket,
        &with_word(hello("x", 2 * MIB, claim(&x, 0))),
        Some(x.fd.as_fd()),
    )
    .unwrap();
    let w2 = word_of(&x2);
    assert_ne!(inode(w1.as_fd()), inode(w2.as_fd()), "a new word");
    drop((x, x2));
    let r = b.stop().unwrap();
    assert_eq!((r.restart.adopted, r.refused), (1, 0));
    let _ = std::fs::remove_dir_all(&d);
}
