//! One daemon, several GPUs, driven by scripted VM processes over its real socket: placement by
//! free VRAM then load, pins (`Hello::gpu`) honoured or refused, each GPU its own VRAM object
//! and scheduler (two grants in flight at once, one per GPU), older VMs placed and told
//! nothing new, and the report's per-GPU figures.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use vgpud::proto::{self, Hello, Placement, RunOutcome, ToDaemon, ToVm};
use vgpud::wire::{Conn, Received};
use vgpud::{Background, DaemonConfig, Report};

fn start(name: &str, gpus: &[u32], vram_mib: u64) -> Background {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = std::env::temp_dir().join(format!("vgpud-multi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sched = "policy=timeslice,slice=50ms,wake_preempt=false";
    Background::start(DaemonConfig {
        socket: dir.join("sock"),
        vram: vram_mib << 20,
        channels: 16,
        gpus: gpus.to_vec(),
        sched: scheduler::Config::parse(sched).unwrap(),
        sched_text: sched.into(),
        revoke_after: Duration::from_millis(500),
        max_run: Duration::from_secs(5),
        report: None,
        report_every: None,
        spin: Duration::ZERO,
        backstop: Duration::from_millis(20),
        adopt: Duration::ZERO,
    })
    .unwrap()
}

struct Vm {
    conn: Conn,
}

/// What a welcome said, and the VRAM object it carried.
struct Welcomed {
    vm: Vm,
    id: u32,
    gpu: Option<Placement>,
    fd: OwnedFd,
}

impl Vm {
    fn send(&self, m: &ToDaemon) {
        self.conn.send(&proto::encode(m), None).unwrap();
    }

    /// The next message and its descriptor (fails the test after 2 s); `None`: closed.
    fn recv(&self) -> Option<(ToVm, Option<OwnedFd>)> {
        let mut pfd = libc::pollfd {
            fd: self.conn.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 2000) };
        assert_eq!(n, 1, "no message within 2 s");
        let mut buf = [0u8; 4096];
        match self.conn.recv(&mut buf).unwrap() {
            Received::Message(n, fd) => Some((proto::decode(&buf[..n]).unwrap(), fd)),
            Received::Closed => None,
            Received::Empty => panic!("empty"),
        }
    }

    fn hello(d: &Background, version: u32, name: &str, vram_mib: u64, pin: Option<u32>) -> Vm {
        let vm = Vm {
            conn: Conn::connect(d.socket()).unwrap(),
        };
        vm.send(&ToDaemon::Hello(Hello {
            version,
            name: name.into(),
            weight: 1,
            priority: 0,
            vram: vram_mib << 20,
            channels: 2,
            resume: None,
            gpu: pin,
            word: false,
        }));
        vm
    }

    fn welcome(self) -> Welcomed {
        match self.recv() {
            Some((ToVm::Welcome { vm, gpu, .. }, Some(fd))) => Welcomed {
                vm: self,
                id: vm,
                gpu,
                fd,
            },
            other => panic!("expected a welcome with a descriptor, got {other:?}"),
        }
    }

    fn grant(&self) -> u64 {
        match self.recv() {
            Some((ToVm::Grant { seq, .. }, _)) => seq,
            other => panic!("expected grant, got {other:?}"),
        }
    }

    fn done(&self, seq: u64, gpu_ns: u64) {
        let end = proto::monotonic_ns();
        self.send(&ToDaemon::Done {
            seq,
            outcome: RunOutcome::Completed,
            gpu_ns,
            start_ns: end - gpu_ns,
            end_ns: end,
            more: false,
        });
    }
}

/// The inode of a descriptor (which memory object it is).
fn inode(fd: &OwnedFd) -> u64 {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat on a descriptor we own into a stat buffer we own.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) }, 0);
    // SAFETY: fstat succeeded, so the buffer is initialised.
    unsafe { st.assume_init() }.st_ino
}

fn placement(index: u32, device: u32) -> Option<Placement> {
    Some(Placement { index, device })
}

#[test]
fn vms_are_spread_by_free_vram_and_each_gpu_schedules_alone() {
    // Two GPUs, CUDA devices 3 and 5: the welcome names both the index and the ordinal.
    let d = start("spread", &[3, 5], 64);
    let a = Vm::hello(&d, proto::VERSION, "a", 8, None).welcome();
    let b = Vm::hello(&d, proto::VERSION, "b", 8, None).welcome();
    let c = Vm::hello(&d, proto::VERSION, "c", 8, None).welcome();
    // Equal free VRAM and load after a and b: the lower index.
    assert_eq!(a.gpu, placement(0, 3));
    assert_eq!(b.gpu, placement(1, 5));
    assert_eq!(c.gpu, placement(0, 3));
    // A big VM goes where most VRAM is free (GPU 1), whatever the order.
    let big = Vm::hello(&d, proto::VERSION, "big", 40, None).welcome();
    assert_eq!(big.gpu, placement(1, 5));
    // Each GPU is its own memory object: a VM of GPU 0 cannot name GPU 1's memory.
    assert_eq!(inode(&a.fd), inode(&c.fd));
    assert_ne!(inode(&a.fd), inode(&b.fd));
    assert_eq!(inode(&b.fd), inode(&big.fd));
    // Both GPUs run at once: a's grant on GPU 0 does not hold b's on GPU 1.
    a.vm.send(&ToDaemon::Want { kernel: None });
    let sa = a.vm.grant();
    b.vm.send(&ToDaemon::Want { kernel: None });
    let sb = b.vm.grant();
    // c waits for a (same GPU) until a is done.
    c.vm.send(&ToDaemon::Want { kernel: None });
    std::thread::sleep(Duration::from_millis(20));
    b.vm.done(sb, 2_000_000);
    a.vm.done(sa, 3_000_000);
    let sc = c.vm.grant();
    // The run's stamps must lie inside the grant to count as busy time.
    std::thread::sleep(Duration::from_millis(5));
    c.vm.done(sc, 1_000_000);
    let ids = (a.id, b.id, c.id, big.id);
    drop((a, b, c, big));
    let r: Report = d.stop().unwrap();
    assert_eq!(r.gpus.len(), 2);
    let (g0, g1) = (&r.gpus[0], &r.gpus[1]);
    assert_eq!((g0.index, g0.device, g1.index, g1.device), (0, 3, 1, 5));
    assert_eq!(g0.vms, [ids.0, ids.2]);
    assert_eq!(g1.vms, [ids.1, ids.3]);
    assert_eq!((g0.grants, g1.grants), (2, 1));
    assert_eq!(r.grants, 3);
    // GPU time per GPU: a 3 ms + c 1 ms on GPU 0, b 2 ms on GPU 1 (stamps give busy time).
    assert_eq!((g0.busy_ns, g1.busy_ns), (4_000_000, 2_000_000));
    assert_eq!(r.busy_ns, 6_000_000);
    // Every VM is gone and every partition back.
    assert_eq!((g0.vram_free, g1.vram_free), (64 << 20, 64 << 20));
    assert_eq!((g0.channels_used, g1.channels_used), (0, 0));
    let gpu_of = |id: u32| r.vms.iter().find(|v| v.id == id).unwrap().gpu;
    assert_eq!(
        (gpu_of(ids.0), gpu_of(ids.1), gpu_of(ids.2), gpu_of(ids.3)),
        (0, 1, 0, 1)
    );
    assert!(r.gpus.iter().all(|g| g.switches <= g.grants));
}

#[test]
fn pins_are_honoured_and_a_bad_pin_is_refused() {
    let d = start("pin", &[0, 1], 32);
    let a = Vm::hello(&d, proto::VERSION, "a", 8, Some(1)).welcome();
    let b = Vm::hello(&d, proto::VERSION, "b", 8, Some(1)).welcome();
    assert_eq!((a.gpu, b.gpu), (placement(1, 1), placement(1, 1)));
    // Out of range, and a GPU without room: fatal for that connection only.
    for (pin, vram, why) in [
        (2, 2, "this daemon has 2 GPUs (0..=1)"),
        (u32::MAX, 2, "this daemon has 2 GPUs"),
        (1, 24, "do not fit"),
    ] {
        let x = Vm::hello(&d, proto::VERSION, "x", vram, Some(pin));
        match x.recv() {
            Some((ToVm::Error { message, fatal }, _)) => {
                assert!(fatal && message.contains(why), "{message}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(x.recv().is_none(), "connection closed");
    }
    // Unpinned it fits on GPU 0; the pinned VMs still work.
    let c = Vm::hello(&d, proto::VERSION, "c", 24, None).welcome();
    assert_eq!(c.gpu, placement(0, 0));
    a.vm.send(&ToDaemon::Want { kernel: None });
    let s = a.vm.grant();
    a.vm.done(s, 1000);
    drop((a, b, c));
    let r = d.stop().unwrap();
    assert_eq!(r.refused, 3);
    assert_eq!(r.vms.len(), 3);
}

#[test]
fn an_older_vm_is_placed_and_told_nothing_new() {
    let d = start("old", &[0, 1], 32);
    let a = Vm::hello(&d, proto::VERSION, "a", 8, None).welcome();
    let mut kept = Vec::new();
    for version in [1, 2] {
        let old = Vm::hello(&d, version, "old", 8, None);
        // Its welcome is the old form: no `gpu` field (an old VM refuses unknown fields).
        let mut pfd = libc::pollfd {
            fd: old.conn.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 2000) }, 1);
        let mut buf = [0u8; 4096];
        let Received::Message(n, Some(_)) = old.conn.recv(&mut buf).unwrap() else {
            panic!("expected a welcome with a descriptor");
        };
        let text = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(
            text.starts_with(&format!(r#"{{"type":"welcome","version":{version},"#))
                && !text.contains("gpu"),
            "{text}"
        );
        old.send(&ToDaemon::Want { kernel: None });
        let s = old.grant();
        old.done(s, 1000);
        // Kept connected: its partition counts in the next placement.
        kept.push(old);
    }
    drop((a, kept));
    let r = d.stop().unwrap();
    // a on GPU 0, the version-1 VM on GPU 1 (more free), the version-2 one on GPU 0.
    let gpus: Vec<u32> = r.vms.iter().map(|v| v.gpu).collect();
    assert_eq!(gpus, [0, 1, 0]);
    assert_eq!(r.refused, 0);
}

#[test]
fn a_vm_moves_to_another_gpu_and_a_crossing_grant_is_waited_for() {
    let d = start("move", &[0, 1], 32);
    let a = Vm::hello(&d, proto::VERSION, "a", 8, Some(0)).welcome();
    let b = Vm::hello(&d, proto::VERSION, "b", 8, Some(0)).welcome();
    let c = Vm::hello(&d, proto::VERSION, "c", 8, Some(1)).welcome();
    let ready = |vm: &Vm| match vm.recv() {
        Some((
            ToVm::MoveReady {
                gpu,
                vram_offset,
                vram_size,
            },
            Some(fd),
        )) => (gpu, vram_offset, vram_size, fd),
        other => panic!("expected move_ready with a descriptor, got {other:?}"),
    };
    let refused = |vm: &Vm, why: &str| match vm.recv() {
        Some((ToVm::MoveRefused { message }, None)) => assert!(message.contains(why), "{message}"),
        other => panic!("expected move_refused, got {other:?}"),
    };
    // Refused: a GPU the daemon lacks, the VM's own GPU.
    a.vm.send(&ToDaemon::Move { gpu: 2 });
    refused(&a.vm, "2 GPUs");
    a.vm.send(&ToDaemon::Move { gpu: 0 });
    refused(&a.vm, "on gpu 0 already");
    // a moves to GPU 1: a partition there, in GPU 1's memory object.
    a.vm.send(&ToDaemon::Move { gpu: 1 });
    let (gpu, off, size, fd) = ready(&a.vm);
    assert_eq!(
        (gpu, size),
        (
            Placement {
                index: 1,
                device: 1
            },
            8 << 20
        )
    );
    assert_eq!(inode(&fd), inode(&c.fd));
    assert_ne!(off, 0, "c holds the first range of GPU 1");
    a.vm.send(&ToDaemon::Move { gpu: 1 });
    refused(&a.vm, "already in progress");
    a.vm.send(&ToDaemon::Moved {});
    assert!(matches!(
        a.vm.recv(),
        Some((
            ToVm::Moved {
                gpu: Placement { index: 1, .. }
            },
            None
        ))
    ));
    // From now on a and b run at once: different GPUs.
    b.vm.send(&ToDaemon::Want { kernel: None });
    let sb = b.vm.grant();
    a.vm.send(&ToDaemon::Want { kernel: None });
    let sa = a.vm.grant();
    a.vm.done(sa, 1000);
    // b moves while its grant is in flight: the commit waits for that grant's end.
    b.vm.send(&ToDaemon::Move { gpu: 1 });
    let _ = ready(&b.vm);
    b.vm.send(&ToDaemon::Moved {});
    std::thread::sleep(Duration::from_millis(20));
    b.vm.done(sb, 1000);
    assert!(matches!(
        b.vm.recv(),
        Some((
            ToVm::Moved {
                gpu: Placement { index: 1, .. }
            },
            None
        ))
    ));
    // c reserves on GPU 0 and gives it back.
    c.vm.send(&ToDaemon::Move { gpu: 0 });
    let _ = ready(&c.vm);
    c.vm.send(&ToDaemon::MoveAbort {});
    // b now shares GPU 1 with a and c: a's want waits for b's grant.
    b.vm.send(&ToDaemon::Want { kernel: None });
    let sb = b.vm.grant();
    a.vm.send(&ToDaemon::Want { kernel: None });
    std::thread::sleep(Duration::from_millis(20));
    b.vm.done(sb, 1000);
    let sa = a.vm.grant();
    a.vm.done(sa, 1000);
    // A VM that leaves with a reservation gives it back too.
    let x = Vm::hello(&d, proto::VERSION, "x", 2, Some(0)).welcome();
    x.vm.send(&ToDaemon::Move { gpu: 1 });
    let _ = ready(&x.vm);
    drop((a, b, c, x));
    let r = d.stop().unwrap();
    let by = |n: &str| r.vms.iter().find(|v| v.name == n).unwrap().clone();
    assert_eq!((by("a").gpu, by("a").moves), (1, 1));
    assert_eq!((by("b").gpu, by("b").moves), (1, 1));
    assert_eq!((by("c").gpu, by("c").moves), (1, 0));
    assert_eq!(r.gpus[1].vms, [by("a").id, by("b").id, by("c").id]);
    assert!(
        r.gpus
            .iter()
            .all(|g| g.vram_free == 32 << 20 && g.channels_used == 0)
    );
    assert_eq!(r.refused, 3);
    assert_eq!(r.gpus[1].grants, 3);
}
