//! Snapshots of VMs with a virtual GPU (`--gpu`, sim backend): guests snapshotted while their
//! kernels run (or drained) and restored after the original was stopped finish with every result
//! checked; a restored GPU VM snapshots again; corrupted or mismatched GPU images are refused
//! before the guest runs; para-mode GPUs (spaces made by hypercalls) snapshot mid-run and
//! restore twice, and forged para state in their image is refused before the guest runs;
//! pass-through (mode=pt) GPUs refuse snapshots and migration. On an NVIDIA GPU (ignored tests
//! named `cuda_*`; `cargo test --release -p vmm --test snapshot_gpu -- --ignored cuda`, or the
//! built test binary with `VGPU_VMM=path/to/vgpu-vmm`): drained snapshots move between the sim
//! and cuda backends.

mod snapshot_support;

use snapshot_support::*;
use std::path::Path;

#[test]
fn gpu_vms_snapshotted_while_kernels_run_finish_after_restore() {
    let s = Scratch::new("gpu-fair");
    let mut preempted = 0;
    for (progress, extra) in [(1, &[][..]), (4, &[][..]), (2, &["--drain"][..])] {
        let drain = !extra.is_empty();
        let (dir, done) = fairness_snapshot(&s, &format!("f{progress}"), progress, extra);
        assert_eq!(done["state"], "paused");
        let gpu_bytes = done["gpu_bytes"].as_u64().unwrap();
        assert!(gpu_bytes > 0, "{done}");
        assert_eq!(
            std::fs::metadata(dir.join("gpu.bin")).unwrap().len(),
            gpu_bytes
        );
        let m = json(&std::fs::read_to_string(dir.join("manifest.json")).unwrap());
        assert_eq!(m["gpu_bytes"], gpu_bytes);
        let spec = m["gpu"].as_str().unwrap();
        assert!(
            spec.contains("mode=full") && spec.contains("vram=65536K"),
            "{spec}"
        );
        if drain {
            // Drained: the running kernels finished first, no engine context is saved.
            assert_eq!(done["gpu_preempted"], 0, "{done}");
        } else {
            preempted += done["gpu_preempted"].as_u64().unwrap();
        }
        let (code, after, err) = restore(&dir, &[]);
        assert_eq!(code, 0, "progress {progress}: {err}\n{after}");
        let end = after
            .lines()
            .find(|l| l.starts_with("FAIRNESS end "))
            .unwrap_or_else(|| panic!("no end line:\n{after}"));
        assert!(end.ends_with(" ok=1"), "{end}");
        assert!(
            !after.contains("FAIRNESS start"),
            "resumed, not rebooted: {after}"
        );
    }
    // With three kernels always queued, the pauses caught kernels mid-run: their contexts
    // went into gpu.bin and resumed after the restore.
    assert!(preempted >= 1, "no snapshot caught a running kernel");
}

#[test]
fn a_restored_gpu_vm_snapshots_again() {
    let s = Scratch::new("gpu-again");
    // The fairness guest's clock (the TSC) is seen to run on between a snapshot and its
    // restore on the development host (docs/snapshot.md, "PVM"), so this chain gives the
    // guest 1.5 s to be still running at its second snapshot.
    let mut args = FAIRNESS;
    args[5] = "iters=20000 threads=64 blocks=2 depth=3 ms=1500 report_ms=100";
    let vm = Vm::start(&s, "first", &args);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let first = s.path("first.snap");
    let (code, _, err) = vm.ctl(&["snapshot", first.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    vm.terminate();
    // Restored (RAM a file mapping, the GPU restored), then snapshotted again.
    let vm = Vm::start(&s, "again", &["--restore", first.to_str().unwrap()]);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let second = s.path("again.snap");
    let (code, _, err) = vm.ctl(&["snapshot", second.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    let (_, before) = vm.terminate();
    assert!(!before.contains("FAIRNESS end"), "{before}");
    let (code, after, err) = restore(&second, &[]);
    assert_eq!(code, 0, "{err}\n{after}");
    assert!(after.contains(" ok=1\n"), "{after}");
}

/// `RESULT name=X ok=Y` of every workload, in order (timings left out).
fn workload_results(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("RESULT "))
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn gpu_workloads_snapshotted_at_two_moments_verify_like_an_uninterrupted_run() {
    let guest = [
        "--guest",
        "workloads",
        "--cmdline",
        "size=medium",
        "--gpu",
        "vram=64M",
    ];
    let (code, want, err) = run(&guest);
    assert_eq!(code, 0, "{err}");
    let want = workload_results(&want);
    assert_eq!(want.len(), 13, "{want:?}");
    assert!(want.iter().all(|r| r.ends_with("ok=1")), "{want:?}");
    let s = Scratch::new("gpu-workloads");
    for (i, marker) in ["INIT ", "name=matmul "].into_iter().enumerate() {
        let vm = Vm::start(&s, &format!("w{i}"), &guest);
        vm.wait_for(|o| o.contains(marker));
        let dir = s.path(&format!("w{i}.snap"));
        let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
        assert_eq!(code, 0, "{err}");
        let (_, before) = vm.terminate();
        assert!(
            !before.contains("13/13"),
            "snapshot before the end: {before}"
        );
        let (code, after, err) = restore(&dir, &[]);
        assert_eq!(code, 0, "{marker}: {err}\n{after}");
        assert!(after.contains("workloads: 13/13 ok"), "{after}");
        assert_eq!(
            workload_results(&format!("{before}{after}")),
            want,
            "snapshot at {marker}"
        );
    }
}

#[test]
fn corrupted_or_mismatched_gpu_images_are_refused_before_the_guest_runs() {
    let s = Scratch::new("gpu-bad");
    let (good, _) = fairness_snapshot(&s, "b", 1, &[]);
    let gpu_len = std::fs::metadata(good.join("gpu.bin")).unwrap().len() as usize;
    let refused =
        |name: &str, extra: &[&str], want_code: i32, tamper: &dyn Fn(&Path), want: &str| {
            let dir = s.path(name);
            copy_snapshot(&good, &dir);
            tamper(&dir);
            let (code, out, err) = restore(&dir, extra);
            assert_eq!(code, want_code, "{name}: {err}");
            assert!(err.contains(want), "{name}: {err}");
            assert!(out.is_empty(), "{name}: the guest must not run: {out}");
        };
    let flip = |dir: &Path, at: usize| {
        let p = dir.join("gpu.bin");
        let mut b = std::fs::read(&p).unwrap();
        b[at] ^= 0x40;
        std::fs::write(&p, b).unwrap();
    };
    // A flipped byte: the manifest's CRC-32 catches it.
    refused(
        "flip",
        &[],
        1,
        &|d| flip(d, gpu_len / 2),
        "gpu.bin is corrupted",
    );
    // ... and with the CRC-32 forged to match, the image's own checksum.
    refused(
        "forged",
        &[],
        1,
        &|d| {
            flip(d, gpu_len / 2);
            let crc = crc32(&std::fs::read(d.join("gpu.bin")).unwrap());
            edit_manifest(d, |m| m["gpu_crc32"] = crc.into());
        },
        "checksum mismatch",
    );
    refused(
        "short",
        &[],
        1,
        &|d| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("gpu.bin"))
                .unwrap();
            f.set_len(gpu_len as u64 - 1).unwrap();
        },
        "gpu.bin is",
    );
    refused(
        "missing",
        &[],
        1,
        &|d| std::fs::remove_file(d.join("gpu.bin")).unwrap(),
        "gpu.bin",
    );
    // Another VRAM size in the manifest than in the image.
    refused(
        "vram",
        &[],
        1,
        &|d| {
            edit_manifest(d, |m| {
                let spec = m["gpu"]
                    .as_str()
                    .unwrap()
                    .replace("vram=65536K", "vram=131072K");
                m["gpu"] = spec.into();
            })
        },
        "VRAM",
    );
    // --gpu with --restore chooses the backend only.
    refused(
        "override",
        &["--gpu", "vram=128M"],
        2,
        &|_| {},
        "only choose the backend",
    );
    // The untouched copy restores.
    let (code, out, err) = restore(&good, &["--gpu", "backend=sim"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("FAIRNESS end"), "{out}");
}

#[test]
fn pass_through_gpus_refuse_snapshots_and_migration_and_run_on() {
    let s = Scratch::new("gpu");
    let vm = Vm::start(&s, "t", &["--guest", "idle", "--gpu", "mode=pt"]);
    vm.wait_for(|o| o.contains("idle: halting"));
    let dir = s.path("snap");
    let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("virtual GPU") && err.contains("mode=pt"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing left behind");
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    let incoming = s.path("in.sock");
    let listener = std::os::unix::net::UnixListener::bind(&incoming).unwrap();
    let (code, _, err) = vm.ctl(&["migrate", incoming.to_str().unwrap()]);
    drop(listener);
    assert_eq!(code, 1);
    assert!(err.contains("mode=pt"), "{err}");
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    let (code, _) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);
}

/// The workloads guest on a para-virtual GPU (`mode=para`: mappings made by hypercalls).
const PARA_WORKLOADS: [&str; 6] = [
    "--guest",
    "workloads",
    "--cmdline",
    "size=medium mode=para",
    "--gpu",
    "vram=64M,mode=para",
];

#[test]
fn para_gpu_workloads_snapshotted_mid_run_restore_twice_like_an_uninterrupted_run() {
    let (code, want, err) = run(&PARA_WORKLOADS);
    assert_eq!(code, 0, "{err}");
    let want = workload_results(&want);
    assert_eq!(want.len(), 13, "{want:?}");
    assert!(want.iter().all(|r| r.ends_with("ok=1")), "{want:?}");
    let s = Scratch::new("gpu-para");
    let vm = Vm::start(&s, "p", &PARA_WORKLOADS);
    vm.wait_for(|o| o.contains("name=matmul "));
    let dir = s.path("p.snap");
    let (code, out, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    assert!(json(&out)["gpu_bytes"].as_u64().unwrap() > 0, "{out}");
    let m = json(&std::fs::read_to_string(dir.join("manifest.json")).unwrap());
    assert!(m["gpu"].as_str().unwrap().contains("mode=para"), "{m}");
    let (code, before) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);
    assert!(
        !before.contains("13/13"),
        "snapshot before the end: {before}"
    );
    // Restored twice from the one snapshot: both finish every workload verified, exit 0.
    for i in 0..2 {
        let (code, after, err) = restore(&dir, &[]);
        assert_eq!(code, 0, "restore {i}: {err}\n{after}");
        assert!(after.contains("workloads: 13/13 ok"), "{after}");
        assert!(
            !after.contains("workloads: gpu vram="),
            "resumed, not rebooted"
        );
        assert_eq!(
            workload_results(&format!("{before}{after}")),
            want,
            "restore {i}"
        );
    }
    // Forged para state in gpu.bin (checksums redone): a mapping onto VRAM past the partition,
    // and a selected page directory no space was saved for, are refused before the guest runs.
    use vgpu::snapshot::format;
    let gpu = std::fs::read(dir.join("gpu.bin")).unwrap();
    let secs = format::split_sections(&gpu).unwrap();
    let para = &secs.iter().find(|(t, _)| *t == format::PARA).unwrap().1;
    // The PARA payload (docs/snapshot.md): version, ARGS, STATUS, 5 counters, then the
    // selected PDB (flag + u64), the space count and the first space's PDB and run count.
    let (current, first_run) = (1 + 8 + 4 + 40 + 1, 1 + 8 + 4 + 40 + 1 + 8 + 4 + 8 + 4);
    assert!(para.len() > first_run + 26, "a space with runs was saved");
    for (tag, edit, want) in [
        (
            "past-vram",
            // The first run's target: 1 GiB, past the 64 MiB partition (aperture VRAM).
            (first_run + 17, 1u64 << 30, 1u8),
            "outside the VM's",
        ),
        ("forged-pd", (current, 0x7fff_f000 | 1, 0), "has no space"),
    ] {
        let forged = s.path(tag);
        copy_snapshot(&dir, &forged);
        let mut secs = secs.clone();
        let p = &mut secs.iter_mut().find(|(t, _)| *t == format::PARA).unwrap().1;
        p[edit.0..edit.0 + 8].copy_from_slice(&edit.1.to_le_bytes());
        if edit.2 != 0 {
            p[edit.0 - 1] = edit.2;
        }
        let bytes = format::assemble(format::VERSION, &secs);
        std::fs::write(forged.join("gpu.bin"), &bytes).unwrap();
        edit_manifest(&forged, |m| {
            m["gpu_bytes"] = bytes.len().into();
            m["gpu_crc32"] = crc32(&bytes).into();
        });
        let (code, out, err) = restore(&forged, &[]);
        assert_eq!(code, 1, "{tag}: {err}");
        assert!(err.contains("PARA") && err.contains(want), "{tag}: {err}");
        assert!(out.is_empty(), "{tag}: the guest must not run: {out}");
    }
}

#[test]
fn gpu_pause_resume_and_a_snapshot_left_paused() {
    let s = Scratch::new("gpu");
    let dir = s.path("snap");
    // A full-mode GPU: pause and resume work; a snapshot left paused resumes with its GPU.
    let vm = Vm::start(&s, "g", &["--guest", "idle", "--gpu"]);
    vm.wait_for(|o| o.contains("idle: halting"));
    assert_eq!(vm.ctl(&["pause"]).0, 0);
    assert_eq!(vm.ctl(&["resume"]).0, 0);
    let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "paused");
    assert_eq!(vm.ctl(&["resume"]).0, 0);
    assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");
    let (code, _) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);
}

/// A `workloads` VM on `from` snapshotted with a drained pause (after its INIT line and after
/// matmul), stopped, and restored on `to` (`--restore DIR --gpu backend=to`): the same exit
/// code as an uninterrupted run on `from`, and every `RESULT` line equal to it, 13/13 ok. On
/// sim the GPU offers 2 MiB pages only (`pages=2m`), as cuda does: a guest that was offered
/// 4 KiB pages may have used them, and a restore onto an engine without them is refused.
fn across_backends(from: &str, to: &str) {
    let pages = if from == "sim" { ",pages=2m" } else { "" };
    let gpu = format!("vram=64M,backend={from}{pages}");
    let guest = [
        "--guest",
        "workloads",
        "--cmdline",
        "size=medium",
        "--gpu",
        gpu.as_str(),
    ];
    let (want_code, want, err) = run(&guest);
    assert_eq!(want_code, 0, "{from}: {err}");
    let want = workload_results(&want);
    assert_eq!(want.len(), 13, "{want:?}");
    assert!(want.iter().all(|r| r.ends_with("ok=1")), "{want:?}");
    let s = Scratch::new(&format!("gpu-{from}-to-{to}"));
    let backend = format!("backend={to}");
    for (i, marker) in ["INIT ", "name=matmul "].into_iter().enumerate() {
        let vm = Vm::start(&s, &format!("x{i}"), &guest);
        vm.wait_for(|o| o.contains(marker));
        let dir = s.path(&format!("x{i}.snap"));
        let (code, out, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused", "--drain"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(json(&out)["gpu_preempted"], 0, "drained: {out}");
        let m = json(&std::fs::read_to_string(dir.join("manifest.json")).unwrap());
        assert!(
            m["gpu"]
                .as_str()
                .unwrap()
                .contains(&format!("backend={from}")),
            "{m}"
        );
        let (_, before) = vm.terminate();
        assert!(
            !before.contains("13/13"),
            "snapshot before the end: {before}"
        );
        let (code, after, err) = restore(&dir, &["--gpu", &backend]);
        assert_eq!(
            code, want_code,
            "{from} -> {to} at {marker}: {err}\n{after}"
        );
        assert!(after.contains("workloads: 13/13 ok"), "{after}");
        assert_eq!(
            workload_results(&format!("{before}{after}")),
            want,
            "{from} -> {to}, snapshot at {marker}"
        );
    }
}

/// The same on sim alone (the backend named on the restore's command line); where there is no
/// NVIDIA driver, a restore with `backend=cuda` is a clear error before the guest runs.
#[test]
fn drained_workload_snapshots_restore_with_the_backend_named() {
    across_backends("sim", "sim");
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine: cuda_restores_a_drained_sim_snapshot is the one to run
    }
    let s = Scratch::new("gpu-no-cuda");
    let vm = Vm::start(&s, "n", &FAIRNESS);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let dir = s.path("n.snap");
    let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused", "--drain"]);
    assert_eq!(code, 0, "{err}");
    vm.terminate();
    let (code, out, err) = restore(&dir, &["--gpu", "backend=cuda"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("CUDA"), "{err}");
    assert!(!out.contains("FAIRNESS"), "the guest ran: {out}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_restores_a_drained_sim_snapshot() {
    across_backends("sim", "cuda");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_snapshot_restores_on_sim() {
    across_backends("cuda", "sim");
}
