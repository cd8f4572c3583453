//! The harness of the daemon tests that drive it with scripted VM processes over its real
//! socket (`protocol.rs`, `late_stops.rs`): a daemon in a background thread, one at a time, and
//! a VM's end of the protocol.

#![allow(dead_code)] // each test file uses its own part of it

use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use vgpud::proto::{self, Hello, RunOutcome, ToDaemon, ToVm};
use vgpud::wire::{Conn, Received};
use vgpud::word::GrantWord;
use vgpud::{Background, DaemonConfig, Report};

/// A daemon of one test, and the lock of each test file: the tests measure slice ends, standbys and
/// revocations in real time, so they run one daemon at a time (in parallel, on a 2-CPU machine,
/// a daemon thread starved for a few milliseconds missed a standby: ~5% of runs).
pub struct Running {
    bg: Background,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

static ONE_DAEMON: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn start(name: &str, sched: &str, revoke_ms: u64) -> Running {
    start_with(name, sched, revoke_ms, Duration::ZERO)
}

pub fn start_with(name: &str, sched: &str, revoke_ms: u64, spin: Duration) -> Running {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = std::env::temp_dir().join(format!("vgpud-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("sock");
    let cfg = DaemonConfig {
        socket: socket.clone(),
        vram: 64 << 20,
        channels: 16,
        gpus: Vec::new(),
        sched: scheduler::Config::parse(sched).unwrap(),
        sched_text: sched.into(),
        revoke_after: Duration::from_millis(revoke_ms),
        max_run: Duration::from_secs(5),
        report: None,
        report_every: None,
        spin,
        // Long enough that a loaded machine's late `done` is not mistaken for a VM that did
        // not stop (the standby test counts preempts).
        backstop: Duration::from_millis(20),
        adopt: Duration::ZERO,
    };
    let lock = ONE_DAEMON
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Running {
        bg: Background::start(cfg).unwrap(),
        _one_at_a_time: lock,
    }
}

impl Running {
    pub fn stop(self) -> Report {
        self.bg.stop().unwrap()
    }
}

pub struct Vm {
    pub conn: Conn,
}

impl Vm {
    pub fn connect(r: &Running) -> Vm {
        Vm {
            conn: Conn::connect(r.bg.socket()).unwrap(),
        }
    }

    pub fn send(&self, m: &ToDaemon) {
        self.conn.send(&proto::encode(m), None).unwrap();
    }

    pub fn send_raw(&self, b: &[u8]) {
        self.conn.send(b, None).unwrap();
    }

    /// The next message (fails the test after 2 s).
    pub fn recv(&self) -> Option<(ToVm, bool)> {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 4096];
        let mut pfd = libc::pollfd {
            fd: self.conn.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 2000) };
        assert!(n == 1 && Instant::now() < deadline, "no message within 2 s");
        match self.conn.recv(&mut buf).unwrap() {
            Received::Message(n, fd) => Some((proto::decode(&buf[..n]).unwrap(), fd.is_some())),
            Received::Closed => None,
            Received::Empty => panic!("empty"),
        }
    }

    pub fn hello(r: &Running, name: &str, weight: u32, vram_mib: u64) -> (Vm, u64) {
        Vm::hello_at(r, name, weight, 0, vram_mib)
    }

    pub fn hello_at(
        r: &Running,
        name: &str,
        weight: u32,
        priority: u8,
        vram_mib: u64,
    ) -> (Vm, u64) {
        let vm = Vm::connect(r);
        vm.send(&ToDaemon::Hello(Hello {
            version: proto::VERSION,
            name: name.into(),
            weight,
            priority,
            vram: vram_mib << 20,
            channels: 4,
            resume: None,
            gpu: None,
            word: false,
        }));
        match vm.recv() {
            Some((
                ToVm::Welcome {
                    vram_offset,
                    vram_size,
                    ..
                },
                true,
            )) => {
                assert_eq!(vram_size, vram_mib << 20);
                (vm, vram_offset)
            }
            other => panic!("expected welcome with a descriptor, got {other:?}"),
        }
    }

    /// A version-4 VM that takes a grant word: its welcome, then the word (mapped).
    pub fn hello_word(r: &Running, name: &str, weight: u32, vram_mib: u64) -> (Vm, GrantWord) {
        let vm = Vm::connect(r);
        vm.send(&ToDaemon::Hello(Hello {
            version: proto::VERSION,
            name: name.into(),
            weight,
            priority: 0,
            vram: vram_mib << 20,
            channels: 4,
            resume: None,
            gpu: None,
            word: true,
        }));
        assert!(matches!(vm.recv(), Some((ToVm::Welcome { .. }, true))));
        let (msg, fd) = vm.recv_fd();
        assert_eq!(msg, ToVm::GrantWord {});
        let word = GrantWord::map(&fd.expect("the word's memory object")).unwrap();
        (vm, word)
    }

    /// The next message and the descriptor it carried (fails the test after 2 s).
    pub fn recv_fd(&self) -> (ToVm, Option<std::os::fd::OwnedFd>) {
        assert!(
            self.readable_within(Duration::from_secs(2)),
            "no message within 2 s"
        );
        let mut buf = [0u8; 4096];
        match self.conn.recv(&mut buf).unwrap() {
            Received::Message(n, fd) => (proto::decode(&buf[..n]).unwrap(), fd),
            _ => panic!("expected a message"),
        }
    }

    /// Whether a message (or the end) is waiting within `limit`.
    pub fn readable_within(&self, limit: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.conn.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut pfd, 1, limit.as_millis() as i32) == 1 }
    }

    /// The next message is a preempt of grant `seq`.
    pub fn preempted(&self, seq: u64) {
        match self.recv() {
            Some((ToVm::Preempt { seq: s }, _)) => assert_eq!(s, seq),
            other => panic!("expected a preempt of {seq}, got {other:?}"),
        }
    }

    pub fn grant(&self) -> (u64, u64) {
        match self.recv() {
            Some((ToVm::Grant { seq, slice_ns, .. }, _)) => (seq, slice_ns),
            other => panic!("expected grant, got {other:?}"),
        }
    }

    pub fn done(&self, seq: u64, outcome: RunOutcome, gpu_ns: u64, more: bool) {
        let end = proto::monotonic_ns();
        self.send(&ToDaemon::Done {
            seq,
            outcome,
            gpu_ns,
            start_ns: end - gpu_ns.min(end),
            end_ns: end,
            more,
        });
    }
}
