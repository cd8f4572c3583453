//! No grant is held through work that needs no GPU (issue 25: 16 VMs on 2 GPUs through one
//! vgpud), against a scripted daemon: within a turn, a launch of a module not loaded yet (a
//! JIT of tens of ms on cuda) first hands the grant kept from the previous job back (`Done`,
//! no GPU time, no `more`) and asks again with a new `Want`; a launch of a loaded module goes
//! on under the kept grant (`Progress`), also in a new shape where the engine has nothing to
//! prepare (sim; on cuda a shape not prepared yet hands the grant back as a load does:
//! `Engine::prepared`, the GPU test `gpu_prepared_first_run_makes_nothing_and_stops_at_its_slice`).

mod common;

use common::daemon::{accept_and_welcome, next};
use common::*;
use vgpu::host::HostConfig;
use vgpu::regs::method::*;
use vgpu::regs::*;
use vgpu_proto::proto::{self, RunOutcome, ToDaemon, ToVm};
use vgpu_proto::wire::{Conn, Listener};

const SYS_VA_OFF: u64 = 2 << 20;
/// Sysmem offsets (inside the 2 MiB sysmem page at VA_BASE + 2 MiB).
const ENTRY: u64 = 0x8000;
const PARAMS: u64 = 0x8100;
const OUT: u64 = 0x4000;
const SEM: u64 = 0x3000;

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

/// A module whose `put` stores `value` to `out` (distinct values: distinct modules).
fn put_ptx(value: u32) -> String {
    format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .entry put(.param .u64 out)\n{{\n\
         \t.reg .b32 %r<2>;\n\t.reg .b64 %rd<2>;\n\
         \tld.param.u64 %rd1, [out];\n\tmov.u32 %r1, {value};\n\
         \tst.global.u32 [%rd1], %r1;\n\tret;\n}}\n"
    )
}

/// A turn of 10 s (nobody else waits: no deadline).
fn grant(c: &Conn, seq: u64) {
    let g = ToVm::Grant {
        seq,
        slice_ns: 10_000_000_000,
        deadline_ns: 0,
    };
    c.send(&proto::encode(&g), None).unwrap();
}

/// Writes GPFIFO entry `slot` of channel 0: a launch of `put` of `text` (text at sysmem
/// `text_off`, `blocks` CTAs), then a semaphore release of `slot + 1`.
fn write_launch(b: &Bench, slot: u32, text_off: u64, text: &str, blocks: u32) {
    let va = |off: u64| b.va_base + SYS_VA_OFF + off;
    b.sys_write(SYS + text_off, text.as_bytes());
    b.sys_write(SYS + ENTRY, b"put");
    b.sys_write(SYS + PARAMS, &va(OUT).to_le_bytes());
    let (code, entry, params, sem) = (va(text_off), va(ENTRY), va(PARAMS), va(SEM));
    let pb = push(&[
        (
            CODE_HI,
            &[
                hi(code),
                code as u32,
                text.len() as u32,
                hi(entry),
                entry as u32,
                3,
                blocks,
                1,
                1,
                1,
                1,
                1,
                0,
                hi(params),
                params as u32,
                8,
                0,
            ],
        ),
        (
            SEM_ADDR_HI,
            &[hi(sem), sem as u32, slot + 1, SEM_OP_RELEASE],
        ),
    ]);
    let pb_off = 0x1000 + 0x200 * u64::from(slot);
    b.sys_write(SYS + pb_off, &pb);
    let gp = (b.va_base + SYS_VA_OFF + pb_off) | ((pb.len() as u64 / 4) << 48);
    b.sys_write(SYS + 8 * u64::from(slot), &gp.to_le_bytes());
}

/// The run report of grant `seq`: (`Progress`: true, `Done`: false), its GPU time and `more`.
fn report(c: &Conn, seq: u64) -> (bool, u64, bool) {
    match next(c) {
        ToDaemon::Progress { seq: s, gpu_ns, .. } => {
            assert_eq!(s, seq);
            (true, gpu_ns, true)
        }
        ToDaemon::Done {
            seq: s,
            outcome,
            gpu_ns,
            more,
            ..
        } => {
            assert_eq!((s, outcome), (seq, RunOutcome::Completed));
            (false, gpu_ns, more)
        }
        other => panic!("expected the report of grant {seq}, got {other:?}"),
    }
}

#[test]
fn a_kept_grant_goes_back_before_a_module_load_not_before_a_loaded_one() {
    let dir = std::env::temp_dir().join(format!("vgpu-host-prepare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("vgpud.sock");
    let listener = Listener::bind(&socket).unwrap();
    let vram_path = dir.join("vram");
    let vp = vram_path.clone();
    let handshake = std::thread::spawn(move || {
        let conn = accept_and_welcome(&listener, &vp);
        (conn, listener)
    });
    let b = Bench::with(|c| {
        c.host = Some(HostConfig::plain(socket.clone(), "t"));
    });
    let (conn, _listener) = handshake.join().unwrap();
    b.map_big(0, 1, 0);
    b.map_big(1, 2, SYS);
    b.bind(0, b.va_base + SYS_VA_OFF, 16);
    b.write(TLB_FLUSH, 1);
    // Four launches queued at once: module A; module A again (loaded, same shape); module B
    // (a load); module B on 2 CTAs (loaded, a new shape).
    let (a, bm) = (put_ptx(11), put_ptx(22));
    write_launch(&b, 0, 0x10_0000, &a, 1);
    write_launch(&b, 1, 0x10_0000, &a, 1);
    write_launch(&b, 2, 0x18_0000, &bm, 1);
    write_launch(&b, 3, 0x18_0000, &bm, 2);
    b.write(DOORBELL_BASE, 4);

    assert!(matches!(next(&conn), ToDaemon::Want { .. }));
    grant(&conn, 1);
    // The first launch, then the second under the same turn (nothing to load or prepare).
    let (progress, gpu, _) = report(&conn, 1);
    assert!(progress && gpu > 0, "launch 1 ran and the turn goes on");
    let (progress, gpu, _) = report(&conn, 1);
    assert!(progress && gpu > 0, "launch 2 ran under the kept grant");
    // Launch 3 loads module B: the kept grant goes back unused first.
    assert_eq!(
        report(&conn, 1),
        (false, 0, false),
        "the grant goes back before the load"
    );
    assert!(matches!(next(&conn), ToDaemon::Want { .. }));
    grant(&conn, 2);
    let (progress, gpu, _) = report(&conn, 2);
    assert!(progress && gpu > 0, "launch 3 ran under a new grant");
    // Launch 4: module B is loaded; 2 CTAs is a new shape, with nothing to prepare on sim.
    let (_, gpu, _) = report(&conn, 2);
    assert!(gpu > 0, "launch 4 ran under the kept grant");
    // The worker guessed more work (the semaphore release behind the launch) and found none:
    // the kept grant goes back.
    assert_eq!(report(&conn, 2), (false, 0, false));
    b.wait("the last launch", |b| {
        b.sys_read(SYS + SEM, 4) == 4u32.to_le_bytes()
    });
    assert_eq!(b.sys_read(SYS + OUT, 4), 22u32.to_le_bytes());
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
