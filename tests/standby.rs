//! Restoring into a standby (`vgpu-vmm --standby --api-socket S`, then `vgpu-vmm ctl S restore
//! DIR`; docs/snapshot.md, "Restoring into a standby"): a snapshot restored into a standby
//! finishes exactly like the same snapshot restored cold (`--restore`): the same console output,
//! exit code and, for GPU guests, the same checked results; the answer and `--stats` give the
//! restore's parts. A snapshot that does not fit what the standby prepared (RAM, vCPUs, GPU) or
//! that `--restore` refuses is refused with the standby left waiting, and still takes a good
//! one after; a GPU image found corrupted while it is being put in uses the standby up, which
//! is prepared again. A standby started with `--template DIR` has that snapshot's GPU modules
//! loaded: restoring it loads none (all served by the engine's cache, counted), restoring
//! another loads its own cold (counted), both with the cold restore's results; a template that
//! is refused (corrupted, not fitting) refuses the standby's start. On an NVIDIA GPU (ignored `cuda_*`; `cargo test --release -p vmm --test
//! standby -- --ignored cuda`, or the test binary with `VGPU_VMM=path/to/vgpu-vmm`): the same
//! on a cuda standby.

mod snapshot_support;

use snapshot_support::standby::Standby;
use snapshot_support::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// The restore's figures, as answered and in `--stats`: a standby's, with a total that holds
/// its parts.
fn check_report(r: &serde_json::Value, standby: bool) {
    assert_eq!(r["standby"], standby, "{r}");
    let total = r["restore_to_running_ms"].as_f64().unwrap();
    assert!(total > 0.0, "{r}");
    let parts: f64 = [
        "check_ms",
        "vm_ms",
        "engine_ms",
        "ram_ms",
        "vcpus_ms",
        "devices_ms",
        "state_ms",
        "gpu_restore_ms",
        "start_ms",
    ]
    .iter()
    .map(|k| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}")))
    .sum();
    assert!(
        parts <= total * 1.01 + 0.05,
        "parts {parts} > total {total}: {r}"
    );
    if standby {
        // Made before the request.
        assert_eq!(
            (r["vm_ms"].as_f64(), r["vcpus_ms"].as_f64()),
            (Some(0.0), Some(0.0))
        );
        assert!(r["prepared_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn a_snapshot_restored_into_a_standby_finishes_like_a_cold_restore() {
    let want = reference();
    let s = Scratch::new("standby-count");
    let vm = Vm::start(&s, "c", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=6 "));
    let dir = s.path("snap");
    assert_eq!(
        vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]).0,
        0
    );
    let (_, before) = vm.terminate();
    let stats = s.path("cold.stats.json");
    let (code, cold, err) = restore(&dir, &[&format!("--stats={}", stats.display())]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(format!("{before}{cold}"), want);
    check_report(
        &json(&std::fs::read_to_string(&stats).unwrap())["restore"],
        false,
    );

    let sb = Standby::start(&s, "sb", &["--memory", "64", "--cpus", "2"]);
    let answer = sb.restore(&dir);
    check_report(&answer, true);
    let (code, out, err, stats) = sb.finish();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out, cold,
        "the standby's run differs from the cold restore's"
    );
    assert_eq!(stats["exit_code"], 0);
    assert_eq!(stats["restore"], answer);
}

#[test]
fn a_standby_refuses_snapshots_that_do_not_fit_and_waits_on() {
    let want = reference();
    let s = Scratch::new("standby-refuse");
    let good = snapshot_for_tampering(&s);
    let before = "COUNT step=4 ";
    let sb = Standby::start(&s, "sb", &["--memory", "64", "--cpus", "2"]);
    // Another RAM size and vCPU count (real snapshots of other VMs).
    for (tag, args, why) in [
        (
            "mem",
            ["--memory", "32", "--cpus", "2"],
            "guest RAM is 32 MiB",
        ),
        ("cpus", ["--memory", "64", "--cpus", "1"], "it has 1 vCPUs"),
    ] {
        let mut a = GUEST[..4].to_vec();
        a.extend(args);
        let vm = Vm::start(&s, tag, &a);
        vm.wait_for(|o| o.contains("COUNT step=2 "));
        let dir = s.path(&format!("{tag}.snap"));
        assert_eq!(
            vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]).0,
            0
        );
        vm.terminate();
        sb.refuses(&dir, why);
    }
    // What --restore refuses: a corrupted state file, a missing directory, a relative path.
    let bad = s.path("bad");
    copy_snapshot(&good, &bad);
    let p = bad.join("state.bin");
    let mut b = std::fs::read(&p).unwrap();
    b[100] ^= 1;
    std::fs::write(&p, b).unwrap();
    sb.refuses(&bad, "state.bin is corrupted");
    sb.refuses(&s.path("nothing"), "not a directory");
    let (code, _, err) = sb.ctl(&["restore", "relative/dir"]);
    // ctl makes the path absolute: it does not exist.
    assert_eq!(code, 1, "{err}");
    // A running VM's operations are refused on standby.
    for op in ["pause", "resume"] {
        let (code, _, err) = sb.ctl(&[op]);
        assert!(code == 1 && err.contains("on standby"), "{op}: {err}");
    }
    // The standby still takes the good one, and runs it to the uninterrupted run's end.
    sb.restore(&good);
    let (code, out, err, _) = sb.finish();
    assert_eq!(code, 0, "{err}");
    let at = want.find(before).unwrap();
    assert!(want.ends_with(&out), "{out}");
    assert!(
        out.len() < want.len() - at,
        "resumed after step 4, not rebooted: {out}"
    );
}

/// `RESULT name=X ok=Y` of every workload, in order (timings left out).
fn workload_results(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("RESULT "))
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

const WORKLOADS: [&str; 6] = [
    "--guest",
    "workloads",
    "--cmdline",
    "size=medium",
    "--gpu",
    "vram=64M",
];

/// The workloads guest snapshotted after its matmul result: (directory, output before).
fn workloads_snapshot(s: &Scratch, gpu: &str) -> (std::path::PathBuf, String) {
    let mut args = WORKLOADS;
    args[5] = gpu;
    let vm = Vm::start(s, "w", &args);
    vm.wait_for(|o| o.contains("name=matmul "));
    let dir = s.path("w.snap");
    let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    let (_, before) = vm.terminate();
    assert!(!before.contains("13/13"), "{before}");
    (dir, before)
}

/// A GPU VM restored cold and into a standby (`gpu`: its `--gpu`) gives the same results.
fn gpu_standby_like_cold(s: &Scratch, gpu: &str) {
    let (dir, before) = workloads_snapshot(s, gpu);
    let (code, cold, err) = restore(&dir, &[]);
    assert_eq!(code, 0, "{err}\n{cold}");
    assert!(cold.contains("workloads: 13/13 ok"), "{cold}");
    let want = workload_results(&format!("{before}{cold}"));
    assert_eq!(want.len(), 13, "{want:?}");
    let sb = Standby::start(s, "sb", &["--memory", "256", "--gpu", gpu]);
    let answer = sb.restore(&dir);
    check_report(&answer, true);
    assert!(answer["gpu_restore_ms"].as_f64().unwrap() > 0.0, "{answer}");
    let (code, out, err, stats) = sb.finish();
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(out.contains("workloads: 13/13 ok"), "{out}");
    assert_eq!(workload_results(&format!("{before}{out}")), want);
    assert!(stats["gpu"].is_object(), "{stats}");
}

#[test]
fn a_gpu_snapshot_restored_into_a_sim_standby_verifies_like_a_cold_restore() {
    let s = Scratch::new("standby-gpu");
    gpu_standby_like_cold(&s, "vram=64M");
}

#[test]
fn a_gpu_standby_refuses_other_gpus_and_is_prepared_again_after_a_late_failure() {
    let s = Scratch::new("standby-gpu-bad");
    let (dir, _) = workloads_snapshot(&s, "vram=64M");
    // Another VRAM size, no GPU at all.
    let sb = Standby::start(&s, "big", &["--memory", "256", "--gpu", "vram=128M"]);
    sb.refuses(&dir, "vram (prepared 128M, the snapshot's 64M)");
    drop(sb);
    let sb = Standby::start(&s, "none", &["--memory", "256"]);
    sb.refuses(&dir, "this standby prepared none");
    drop(sb);
    // A GPU image whose CRC-32 is forged to match a flipped byte passes the checks made
    // before the standby is changed; the device's own checksum refuses it while it is being
    // put in: the standby is used up, answered, and prepared again.
    let sb = Standby::start(&s, "sb", &["--memory", "256", "--gpu", "vram=64M"]);
    let forged = s.path("forged");
    copy_snapshot(&dir, &forged);
    let p = forged.join("gpu.bin");
    let mut b = std::fs::read(&p).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x40;
    std::fs::write(&p, &b).unwrap();
    edit_manifest(&forged, |m| m["gpu_crc32"] = crc32(&b).into());
    let (code, _, err) = sb.ctl(&["restore", forged.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("prepared again"), "{err}");
    let start = Instant::now();
    while sb.ctl(&["stats"]).0 != 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not prepared again"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let answer = sb.restore(&dir);
    check_report(&answer, true);
    let (code, out, err, _) = sb.finish();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("workloads: 13/13 ok"), "{out}");
}

/// The fairness guest (other kernels than the workloads guest's) on `gpu`, snapshotted while
/// its kernels run: a template whose modules no workloads snapshot uses.
fn fairness_snapshot(s: &Scratch, gpu: &str) -> std::path::PathBuf {
    let args = [
        "--guest",
        "fairness",
        "--cmdline",
        "iters=2000 threads=64 blocks=2 depth=3 ms=60000 report_ms=20",
        "--memory",
        "256",
        "--gpu",
        gpu,
    ];
    let vm = Vm::start(s, "f", &args);
    vm.wait_for(|o| o.matches(" done=").count() >= 2);
    let dir = s.path("f.snap");
    let (code, _, err) = vm.ctl(&["snapshot", dir.to_str().unwrap(), "--paused"]);
    assert_eq!(code, 0, "{err}");
    vm.terminate();
    dir
}

/// A standby started with `--template tmpl` on `gpu` (its modules loaded: `stats` says how
/// many, at least one).
fn templated(s: &Scratch, tag: &str, gpu: &str, tmpl: &Path) -> (Standby, u64) {
    let sb = Standby::start(
        s,
        tag,
        &[
            "--memory",
            "256",
            "--gpu",
            gpu,
            "--template",
            tmpl.to_str().unwrap(),
        ],
    );
    let (code, out, _) = sb.ctl(&["stats"]);
    assert_eq!(code, 0);
    let st = json(&out);
    let n = st["template"]["modules"].as_u64().unwrap_or(0);
    assert!(n >= 1, "no modules loaded from the template: {out}");
    (sb, n)
}

/// A GPU snapshot restored into a standby templated with itself has every module served by the
/// engine's cache (none loaded cold) and gives the cold restore's results; restored into a
/// standby templated with another guest's snapshot, every module loads cold (the template's
/// are released) with the same results.
fn templated_standby_like_cold(s: &Scratch, gpu: &str) {
    let (dir, before) = workloads_snapshot(s, gpu);
    let (code, cold, err) = restore(&dir, &[]);
    assert_eq!(code, 0, "{err}\n{cold}");
    let want = workload_results(&format!("{before}{cold}"));
    assert_eq!(want.len(), 13, "{want:?}");
    let total = {
        let (sb, n) = templated(s, "same", gpu, &dir);
        let answer = sb.restore(&dir);
        check_report(&answer, true);
        assert_eq!(answer["template_modules"], n, "{answer}");
        assert_eq!(answer["modules_cached"], n, "{answer}");
        assert_eq!(answer["modules_cold"], 0, "{answer}");
        let (code, out, err, _) = sb.finish();
        assert_eq!(code, 0, "{err}\n{out}");
        assert_eq!(workload_results(&format!("{before}{out}")), want);
        n
    };
    let other = fairness_snapshot(s, gpu);
    let (sb, _) = templated(s, "other", gpu, &other);
    let answer = sb.restore(&dir);
    check_report(&answer, true);
    assert_eq!(answer["modules_cached"], 0, "{answer}");
    assert_eq!(answer["modules_cold"], total, "{answer}");
    let (code, out, err, _) = sb.finish();
    assert_eq!(code, 0, "{err}\n{out}");
    assert_eq!(workload_results(&format!("{before}{out}")), want);
}

#[test]
fn a_templated_sim_standby_serves_the_snapshots_modules_from_its_cache_and_others_cold() {
    let s = Scratch::new("standby-template");
    templated_standby_like_cold(&s, "vram=64M");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_templated_standby_serves_the_snapshots_modules_from_its_cache_and_others_cold() {
    let s = Scratch::new("standby-template-cuda");
    templated_standby_like_cold(&s, "vram=64M,backend=cuda");
}

/// A template that is refused refuses the standby's start (exit 2, the reason named): a GPU
/// image with a changed byte, one whose module section is corrupted under a forged file
/// checksum, a snapshot that does not fit, a directory that is none.
#[test]
fn a_bad_template_refuses_the_standbys_start() {
    let s = Scratch::new("standby-template-bad");
    let (dir, _) = workloads_snapshot(&s, "vram=64M");
    let start = |tmpl: &Path, args: &[&str]| {
        let sock = s.path("bad.sock");
        let mut a = vec!["--standby", "--api-socket", sock.to_str().unwrap()];
        a.extend(args);
        a.extend(["--template", tmpl.to_str().unwrap()]);
        let (code, _, err) = run(&a);
        (code, err)
    };
    let gpu = ["--memory", "256", "--gpu", "vram=64M"];
    let flipped = s.path("flipped");
    copy_snapshot(&dir, &flipped);
    let p = flipped.join("gpu.bin");
    let mut b = std::fs::read(&p).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x40;
    std::fs::write(&p, &b).unwrap();
    let (code, err) = start(&flipped, &gpu);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--template") && err.contains("corrupted"),
        "{err}"
    );
    // The module section's bytes changed and the file's CRC-32 forged to match: the section's
    // own checksum refuses it.
    let forged = s.path("forged");
    copy_snapshot(&dir, &forged);
    let p = forged.join("gpu.bin");
    let mut b = std::fs::read(&p).unwrap();
    let at = find(&b, b".version").expect("a module's text in the image");
    b[at + 1] ^= 0x20;
    std::fs::write(&p, &b).unwrap();
    edit_manifest(&forged, |m| m["gpu_crc32"] = crc32(&b).into());
    let (code, err) = start(&forged, &gpu);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--template") && err.contains("a section is corrupted"),
        "{err}"
    );
    let (code, err) = start(&dir, &["--memory", "128", "--gpu", "vram=64M"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("guest RAM is 256 MiB"), "{err}");
    let (code, err) = start(&s.path("nothing"), &gpu);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a directory"), "{err}");
    // The good one starts.
    let (sb, _) = templated(&s, "good", "vram=64M", &dir);
    drop(sb);
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_gpu_snapshot_restored_into_a_cuda_standby_verifies_like_a_cold_restore() {
    let s = Scratch::new("standby-cuda");
    gpu_standby_like_cold(&s, "vram=64M,backend=cuda");
}

#[test]
fn standby_usage_errors_and_a_running_vm_refuses_restore() {
    let s = Scratch::new("standby-usage");
    let sock = s.path("u.sock");
    let sock = sock.to_str().unwrap();
    for (args, want) in [
        (vec!["--standby"], "--api-socket"),
        (
            vec!["--standby", "--api-socket", sock, "--guest", "count"],
            "cannot be used with",
        ),
        // A sim GPU shared through vgpud takes the daemon's VRAM: nothing to make before.
        (
            vec![
                "--standby",
                "--api-socket",
                sock,
                "--gpu",
                "vram=64M,host=/nonexistent.sock",
            ],
            "cannot be made before its device",
        ),
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let vm = Vm::start(&s, "r", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=1 "));
    let (code, _, err) = vm.ctl(&["restore", s.path("x").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("runs already"), "{err}");
    let (code, _, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
}
