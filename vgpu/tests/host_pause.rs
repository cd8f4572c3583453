//! Pausing a virtual GPU shared through vgpud (`--gpu host=`) for a snapshot, against a
//! scripted daemon: a pause while the worker waits for a grant that does not come returns at
//! once (it does not wait for the grant), the Want is withdrawn (`idle`) so the daemon can give
//! the GPU to others, the image holds no context (the job never ran), and after `resume` the
//! job asks again, runs under the grant and completes.

mod common;

use std::time::Duration;

use common::daemon::{accept_and_welcome, next};
use common::para::*;
use common::*;
use vgpu::config::Mode;
use vgpu::host::HostConfig;
use vgpu::para::{ARGS_HI, ARGS_LO};
use vgpu_proto::proto::{self, RunOutcome, ToDaemon, ToVm};
use vgpu_proto::wire::{Conn, Listener};

/// Whether a message arrives within `d`.
fn quiet_for(c: &Conn, d: Duration) -> bool {
    !c.wait_readable_for(Some(d)).unwrap()
}

#[test]
fn a_pause_does_not_wait_for_a_grant_and_the_job_runs_after_resume() {
    let dir = std::env::temp_dir().join(format!("vgpu-host-pause-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("vgpud.sock");
    let listener = Listener::bind(&socket).unwrap();
    // The daemon's side of the handshake: VRAM is a file of the size asked for.
    let vram_path = dir.join("vram");
    let vp = vram_path.clone();
    let handshake = std::thread::spawn(move || {
        let conn = accept_and_welcome(&listener, &vp);
        (conn, listener)
    });
    let b = Bench::with(|c| {
        c.mode = Mode::Para;
        c.host = Some(HostConfig::plain(socket.clone(), "t"));
    });
    let (conn, _listener) = handshake.join().unwrap();
    b.para_write(ARGS_LO, ARGS as u32);
    b.para_write(ARGS_HI, 0);
    setup(&b);
    let (sys_va, vram_va) = (b.va_base + (2 << 20), b.va_base);
    b.sys_write(SYS + 0x4000, &[5u8; 64]);
    submit_copy(&b, 0, sys_va + 0x4000, vram_va + 0x100, 1);
    assert!(matches!(next(&conn), ToDaemon::Want { .. }));
    // No grant comes: the pause returns anyway, and the Want is withdrawn.
    b.gpu.pause().unwrap();
    assert!(b.gpu.is_paused());
    assert_eq!(next(&conn), ToDaemon::Idle {});
    let mut snap = Vec::new();
    let report = b.gpu.save_report(&mut snap).unwrap();
    assert_eq!(report.suspended, 0, "the job never ran");
    assert!(
        quiet_for(&conn, Duration::from_millis(100)),
        "paused: no Want"
    );
    // Resumed: the job asks again and runs under the grant.
    b.gpu.resume();
    assert!(matches!(next(&conn), ToDaemon::Want { .. }));
    let grant = ToVm::Grant {
        seq: 1,
        slice_ns: 0,
        deadline_ns: 0,
    };
    conn.send(&proto::encode(&grant), None).unwrap();
    assert!(copied(&b, 1), "the copy ran after the resume");
    match next(&conn) {
        ToDaemon::Done { seq, outcome, .. } => {
            assert_eq!((seq, outcome), (1, RunOutcome::Completed))
        }
        other => panic!("expected done, got {other:?}"),
    }
    // The copy wrote the daemon's VRAM object (the VM maps its partition of it).
    drop(b);
    let vram = std::fs::read(&vram_path).unwrap();
    assert!(
        vram.windows(64).any(|w| w == [5u8; 64]),
        "the copy is in VRAM"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
