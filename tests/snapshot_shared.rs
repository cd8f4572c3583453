//! Snapshot, restore and migration of VMs whose GPU is shared through vgpud (`--gpu host=`; two
//! daemons run in this test process): one VM of a pair on daemon A is snapshotted (its
//! neighbour keeps getting the GPU while it is paused), restored onto A and onto a second
//! daemon B; one VM of a pair on A migrates live to B mid-run and finishes there while its
//! neighbour on A finishes too; every fairness run ends `ok=1` (each kernel result checked in
//! the guest) and the daemons' reports show where each VM ran.

mod snapshot_support;

use snapshot_support::*;
use std::path::Path;
use std::time::Duration;

use vgpud::{Background, DaemonConfig, Report};

/// A daemon with its socket in `s`: 256 MiB of VRAM, 1 ms time slices.
fn daemon(s: &Scratch, name: &str) -> Background {
    let sched = "policy=timeslice,slice=1ms";
    Background::start(DaemonConfig {
        socket: s.path(&format!("{name}.sock")),
        vram: 256 << 20,
        channels: 64,
        gpus: Vec::new(),
        sched: scheduler::Config::parse(sched).unwrap(),
        sched_text: sched.into(),
        revoke_after: Duration::from_millis(500),
        max_run: Duration::from_secs(5),
        report: None,
        report_every: None,
        spin: Duration::ZERO,
        backstop: Duration::from_millis(1),
        adopt: Duration::ZERO,
    })
    .unwrap()
}

/// The fairness guest for `ms` ms of guest time on daemon `host` as `name`.
fn fairness(host: &Path, name: &str, ms: u32) -> Vec<String> {
    [
        "--guest",
        "fairness",
        "--memory",
        "64",
        "--cmdline",
        &format!("iters=20000 threads=64 blocks=2 depth=3 ms={ms} report_ms=100"),
        "--gpu",
        &format!("vram=32M,host={},name={name}", host.display()),
    ]
    .map(String::from)
    .to_vec()
}

fn start(s: &Scratch, tag: &str, args: &[String]) -> Vm {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Vm::start(s, tag, &args)
}

fn progress(vm: &Vm) -> usize {
    vm.output().matches("FAIRNESS t_ms=").count()
}

/// The `FAIRNESS end` line of `out`, which must end `ok=1`.
fn ended_ok(out: &str, what: &str) {
    let end = out
        .lines()
        .find(|l| l.starts_with("FAIRNESS end "))
        .unwrap_or_else(|| panic!("{what}: no end line:\n{out}"));
    assert!(end.ends_with(" ok=1"), "{what}: {end}");
}

fn vm_report<'a>(r: &'a Report, name: &str) -> &'a vgpud::report::VmReport {
    r.vms
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no vm {name} in {:?}", r.vms))
}

#[test]
fn a_vm_of_a_vgpud_pair_snapshots_while_its_neighbour_runs_and_restores_on_either_daemon() {
    let s = Scratch::new("shared-snap");
    let (a, b) = (daemon(&s, "a"), daemon(&s, "b"));
    // The guests' clocks are wall-clock time: the neighbour is running before the VM starts,
    // and the VM is snapshotted right after its first report.
    let nb = start(&s, "nb", &fairness(a.socket(), "nb", 6000));
    nb.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let vm = start(&s, "vm", &fairness(a.socket(), "vm", 4000));
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let dir = s.path("vm.snap");
    let (code, out, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    let done = json(&out);
    assert!(done["gpu_bytes"].as_u64().unwrap() > 0, "{done}");
    // While the VM is paused (its GPU too), its neighbour on the same daemon still runs kernels.
    let seen = progress(&nb);
    nb.wait_for(|o| o.matches("FAIRNESS t_ms=").count() > seen + 2);
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "paused");
    let (code, before) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);
    assert!(!before.contains("FAIRNESS end"), "{before}");
    let m = json(&std::fs::read_to_string(dir.join("manifest.json")).unwrap());
    assert!(m["gpu"].as_str().unwrap().contains("host="), "{m}");
    // Restored onto daemon A (the snapshot's), then onto B (`--gpu host=`).
    let (code, after, err) = restore(&dir, &[]);
    assert_eq!(code, 0, "{err}\n{after}");
    ended_ok(&after, "restored on A");
    assert!(!after.contains("FAIRNESS start"), "{after}");
    let on_b = format!("host={},name=vm-b", b.socket().display());
    let (code, after, err) = restore(&dir, &["--gpu", &on_b]);
    assert_eq!(code, 0, "{err}\n{after}");
    ended_ok(&after, "restored on B");
    // Only the backend and the daemon may be chosen.
    let (code, _, err) = restore(&dir, &["--gpu", &format!("{on_b},vram=64M")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("may only choose the backend"), "{err}");
    let (code, out, err) = nb.finish();
    assert_eq!(code, 0, "{err}");
    ended_ok(&out, "neighbour");
    let (ra, rb) = (a.stop().unwrap(), b.stop().unwrap());
    // A: the snapshotted VM, its restore (same name) and the neighbour; B: the second restore.
    assert_eq!(
        ra.vms.iter().filter(|v| v.name == "vm").count(),
        2,
        "{ra:?}"
    );
    assert!(vm_report(&rb, "vm-b").gpu_ns > 0, "{rb:?}");
    for r in [&ra, &rb] {
        assert_eq!((r.evictions, r.refused), (0, 0), "{r:?}");
    }
}

#[test]
fn a_vm_of_a_vgpud_pair_migrates_to_a_second_daemon_while_its_neighbour_runs() {
    let s = Scratch::new("shared-mig");
    let (a, b) = (daemon(&s, "a"), daemon(&s, "b"));
    let nb = start(&s, "nb", &fairness(a.socket(), "nb", 6000));
    nb.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let on_b = format!("host={},name=mig-b", b.socket().display());
    let (dest, incoming) = incoming_with(&s, &["--gpu", &on_b]);
    let vm = start(&s, "src", &fairness(a.socket(), "mig", 4000));
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let done = migrate(&vm, &incoming, true);
    assert!(!done["rounds"].as_array().unwrap().is_empty(), "{done}");
    // A live copy: the GPU (the VM process's own sim engine, arbitrated by A) ran through the
    // pre-copy, its VRAM logged by the engine's exact log, and the guest launched kernels.
    let report = &done["precopy"];
    assert_eq!(report["gpu_running"], true, "{done}");
    assert_eq!(report["gpu_dirty_log"], "engine", "{done}");
    assert!(report["rounds"].as_array().unwrap().len() > 1, "{done}");
    migrated_fairness_finishes(vm, dest);
    let (code, out, err) = nb.finish();
    assert_eq!(code, 0, "{err}");
    ended_ok(&out, "neighbour on A");
    let (ra, rb) = (a.stop().unwrap(), b.stop().unwrap());
    // The VM ran on A before the migration and on B after it; it left A.
    let (src, dst) = (vm_report(&ra, "mig"), vm_report(&rb, "mig-b"));
    assert!(src.gpu_ns > 0 && src.gone_ns.is_some(), "{src:?}");
    assert!(dst.gpu_ns > 0 && dst.completed > 0, "{dst:?}");
    assert!(vm_report(&ra, "nb").gpu_ns > src.gpu_ns, "{ra:?}");
    for r in [&ra, &rb] {
        assert_eq!((r.evictions, r.refused), (0, 0), "{r:?}");
    }
}
