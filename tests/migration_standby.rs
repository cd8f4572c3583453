//! Migration into a standby (`vgpu-vmm --standby --api-socket S`, `vgpu-vmm ctl S incoming URL`,
//! then the source's `ctl migrate URL [--live]`; docs/snapshot.md, "Migrating into a standby"):
//! the guest finishes on the standby exactly as an uninterrupted run (stop-and-copy), and a
//! `fairness` GPU guest live-migrated with VRAM pre-copy finishes `ok=1` with its working set
//! checked byte for byte, its rounds written into the engine the standby made before the
//! migration (`dest_engine_ms` near 0, the standby's own preparation reported apart). A
//! migration whose VM does not fit the standby (RAM size, vCPUs, GPU) is refused before any of
//! its state is read: the source says why and runs on to its own end, and the standby, left
//! as it was, then takes a VM that fits. On an NVIDIA GPU (ignored `cuda_*`; `cargo test
//! --release -p vmm --test migration_standby -- --ignored cuda`): the live case on a cuda
//! standby.

mod snapshot_support;

use snapshot_support::standby::Standby;
use snapshot_support::*;
use std::path::PathBuf;

/// `incoming` on `sb` at a unix socket `tag.in` in `s`: answered once it listens.
fn listen(sb: &Standby, s: &Scratch, tag: &str) -> PathBuf {
    let sock = s.path(&format!("{tag}.in"));
    let (code, out, err) = sb.ctl(&["incoming", sock.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let a = json(&out);
    assert_eq!(a["state"], "incoming", "{a}");
    assert_eq!(
        a["listening"].as_str(),
        Some(format!("unix:{}", sock.display()).as_str()),
        "{a}"
    );
    assert!(a["prepared_ms"].as_f64().unwrap() > 0.0, "{a}");
    assert!(sock.exists());
    sock
}

#[test]
fn a_guest_migrated_into_a_standby_finishes_like_an_uninterrupted_run() {
    let want = reference();
    let s = Scratch::new("mig-standby-count");
    let sb = Standby::start(&s, "sb", &["--memory", "64", "--cpus", "2"]);
    let sock = listen(&sb, &s, "a");
    let vm = Vm::start(&s, "src", &GUEST);
    vm.wait_for(|o| o.contains("COUNT step=8 "));
    let done = migrate(&vm, &sock, false);
    assert!(done["ram_pages"].as_u64().unwrap() > 0, "{done}");
    let (code, before, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    let (code, after, err, stats) = sb.finish();
    assert_eq!(code, 0, "{err}");
    assert_eq!(format!("{before}{after}"), want);
    assert!(!sock.exists(), "the incoming socket is removed");
    // Built on the standby: its VM and vCPUs were made before.
    let r = &stats["restore"];
    assert_eq!(r["standby"], true, "{stats}");
    assert_eq!(
        (r["vm_ms"].as_f64(), r["vcpus_ms"].as_f64()),
        (Some(0.0), Some(0.0))
    );
    let d = &stats["incoming"];
    assert!(d["dest_standby_prepared_ms"].as_f64().unwrap() > 0.0, "{d}");
    assert!(d["dest_switch_ms"].as_f64().unwrap() > 0.0, "{d}");
}

#[test]
fn fairness_live_migrated_into_a_standby_finishes_ok() {
    live_into_standby(false);
}

/// The same on a GPU: a cuda standby (its context, transfer slots and guest RAM made before),
/// the rounds' RAM copied into its engine memory.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cuda_fairness_live_migrated_into_a_standby_finishes_ok() {
    live_into_standby(true);
}

/// The `fairness` guest with a 16 MiB working set rewritten while it runs (compared byte for
/// byte at its end), live-migrated into a standby.
fn live_into_standby(cuda: bool) {
    let s = Scratch::new(if cuda {
        "mig-standby-cuda"
    } else {
        "mig-standby-live"
    });
    let gpu = if cuda {
        "vram=64M,backend=cuda"
    } else {
        "vram=64M"
    };
    let sb = Standby::start(&s, "sb", &["--memory", "64", "--gpu", gpu]);
    let sock = listen(&sb, &s, "live");
    let mut args = FAIRNESS;
    args[5] = "iters=20000 threads=64 blocks=8 depth=3 ms=3000 report_ms=100 out=vram \
               pool_mib=16 dirty_mib_s=16 vpool_mib=24 sys_mib=32";
    args[7] = gpu;
    let vm = Vm::start(&s, "src", &args);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    let done = migrate(&vm, &sock, true);
    let report = &done["precopy"];
    assert_eq!(report["gpu_running"], true, "{done}");
    let (code, before, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    assert!(!before.contains("FAIRNESS end"), "{before}");
    let stats = sb.stats.clone();
    let (code, after, err, _) = sb.finish();
    assert_eq!(code, 0, "{after} {err}");
    fairness_resumed_ok(&after);
    let pool = after
        .lines()
        .find(|l| l.starts_with("FAIRNESS pool rewritten_mib="))
        .unwrap_or_else(|| panic!("no working-set check:\n{after}"));
    assert!(pool.ends_with(" check=ok"), "{pool}");
    destination_was_ready(report, &stats, true);
}

#[test]
fn a_standby_refuses_a_migration_that_does_not_fit_and_takes_one_that_does() {
    let s = Scratch::new("mig-standby-misfit");
    let sb = Standby::start(&s, "sb", &["--memory", "64", "--gpu", "vram=64M"]);
    // RAM, vCPUs and the GPU's VRAM other than the standby's, each live (the GPU's rounds
    // would go into its engine) and stop-and-copy.
    let mut fairness = FAIRNESS;
    fairness[5] = "iters=20000 threads=64 blocks=2 depth=3 ms=2500 report_ms=100";
    let mut more_ram = fairness;
    more_ram[3] = "128";
    let mut vram = fairness;
    vram[7] = "vram=128M";
    let mut cpus = fairness.to_vec();
    cpus.extend(["--cpus", "2"]);
    for (tag, args, live, why) in [
        ("ram", more_ram.to_vec(), true, "its guest RAM is 128 MiB"),
        (
            "cpus",
            cpus,
            false,
            "it has 2 vCPUs, this standby prepared 1",
        ),
        (
            "vram",
            vram.to_vec(),
            true,
            "vram (prepared 64M, the snapshot's 128M)",
        ),
    ] {
        let sock = listen(&sb, &s, tag);
        let vm = Vm::start(&s, tag, &args);
        vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
        let mut req = vec!["migrate", sock.to_str().unwrap()];
        if live {
            req.push("--live");
        }
        let (code, out, err) = vm.ctl(&req);
        assert_eq!(code, 1, "{tag}: {out}");
        assert!(
            err.contains("the destination refused the VM") && err.contains(why),
            "{tag}: {err}"
        );
        // The standby waits on, as it was.
        let (code, out, _) = sb.ctl(&["stats"]);
        assert_eq!(code, 0, "{tag}");
        assert_eq!(json(&out)["state"], "standby", "{tag}: {out}");
        // The source runs on and finishes its guest itself.
        let (code, own, err) = vm.finish();
        assert_eq!(code, 0, "{tag}: {err}");
        let end = own
            .lines()
            .find(|l| l.starts_with("FAIRNESS end "))
            .unwrap_or_else(|| panic!("{tag}: no end line:\n{own}"));
        assert!(end.ends_with(" ok=1"), "{tag}: {end}");
    }
    // A VM that fits, live.
    let sock = listen(&sb, &s, "fits");
    let vm = Vm::start(&s, "fits", &fairness);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    migrate(&vm, &sock, true);
    let (code, _, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    let (code, after, err, stats) = sb.finish();
    assert_eq!(code, 0, "{after} {err}");
    fairness_resumed_ok(&after);
    assert_eq!(stats["incoming"]["dest_prepared"], true, "{stats}");
}

/// Bad `incoming` requests are answered and the standby waits on; one whose source does not
/// come stops listening after its wait; a running VM refuses the op.
#[test]
fn incoming_is_refused_where_it_cannot_be_taken_and_gives_up_on_a_late_source() {
    let s = Scratch::new("mig-standby-usage");
    let sb = Standby::start(&s, "sb", &["--memory", "64"]);
    // A path that is not a socket is never replaced; the standby waits on.
    let file = s.path("file");
    std::fs::write(&file, b"x").unwrap();
    let (code, _, err) = sb.ctl(&["incoming", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    let (code, _, err) = sb.ctl(&["incoming", "tcp:192.0.2.1:5000"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("loopback"), "{err}");
    let (code, _, err) = sb.ctl(&["incoming", "/x.in", "--wait-s", "0"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, _) = sb.ctl(&["stats"]);
    assert_eq!((code, json(&out)["state"].as_str()), (0, Some("standby")));
    // A source that does not come within --wait-s: the standby stops listening (the socket
    // file removed) and takes requests again, the same one.
    let before = prepared_ms(&sb);
    let sock = s.path("late.in");
    let t = std::time::Instant::now();
    let (code, out, err) = sb.ctl(&["incoming", sock.to_str().unwrap(), "--wait-s", "1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["wait_s"], 1, "{out}");
    assert_eq!(prepared_ms(&sb), before);
    assert!(t.elapsed() >= std::time::Duration::from_secs(1));
    assert!(!sock.exists(), "the socket is left after the wait");
    // A running VM takes no `incoming`.
    let vm = Vm::start(&s, "run", &GUEST);
    let (code, _, err) = vm.ctl(&["incoming", s.path("x.in").to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("only by a VM started with --standby"), "{err}");
    let (code, _) = vm.terminate();
    assert_eq!(code, 128 + libc::SIGTERM);
}

/// Sends `incoming` on `sb`, then a stream that fits it (64 MiB, GPU `vram=64M`) but ends
/// after a RAM page (and, `live`, a pre-copied VRAM page): the destination's answer.
fn cut_stream(sb: &Standby, s: &Scratch, tag: &str, live: bool) -> String {
    use std::io::{Read, Write};
    use vmm::snapshot::manifest::{BootKind, FORMAT, Manifest};
    let sock = listen(sb, s, tag);
    let m = Manifest {
        format: FORMAT.into(),
        version: vmm::snapshot::format::VERSION,
        vmm_version: "0".into(),
        memory_mib: 64,
        cpus: 1,
        boot: BootKind::BareMetal,
        image: "fairness".into(),
        testdev: false,
        gpu: Some("vram=64M".into()),
        tsc_khz: 0,
        msrs: 0,
        state_bytes: 0,
        state_crc32: 0,
        ram_bytes: 64 << 20,
        ram_pages: 0,
        gpu_bytes: 0,
        gpu_crc32: 0,
        gpu_live: live,
        disks: Vec::new(),
    };
    let frame = |out: &mut Vec<u8>, kind: u32, payload: &[u8]| {
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(payload);
    };
    let mut bytes = Vec::new();
    frame(&mut bytes, 1, &serde_json::to_vec(&m).unwrap());
    let mut ram = 0u64.to_le_bytes().to_vec();
    ram.extend([7u8; 4096]);
    frame(&mut bytes, 3, &ram);
    if live {
        let mut vram = 0u32.to_le_bytes().to_vec();
        vram.extend(0u64.to_le_bytes());
        vram.extend([9u8; 4096]);
        frame(&mut bytes, 6, &vram);
    }
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    c.write_all(&bytes).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    answer
}

/// The standby's `prepared_ms`, once it answers `stats` again.
fn prepared_ms(sb: &Standby) -> f64 {
    let (code, out, err) = sb.ctl(&["stats"]);
    assert_eq!(code, 0, "{err}");
    let st = json(&out);
    assert_eq!(st["state"], "standby", "{st}");
    st["prepared_ms"].as_f64().unwrap()
}

#[test]
fn a_stream_cut_short_leaves_the_standby_waiting_or_prepares_it_again() {
    let s = Scratch::new("mig-standby-cut");
    let sb = Standby::start(&s, "sb", &["--memory", "64", "--gpu", "vram=64M"]);
    let first = prepared_ms(&sb);
    // Nothing of the standby was used (RAM went to the stream's own file): it waits on, the
    // same one.
    let answer = cut_stream(&sb, &s, "ram", false);
    assert!(answer.starts_with("error: migration stream: "), "{answer}");
    assert_eq!(prepared_ms(&sb), first);
    // Its engine took a pre-copied VRAM page: it is used up and prepared again.
    let answer = cut_stream(&sb, &s, "vram", true);
    assert!(answer.starts_with("error: migration stream: "), "{answer}");
    assert_ne!(prepared_ms(&sb), first);
    // And the new one takes a VM.
    let sock = listen(&sb, &s, "fits");
    let mut args = FAIRNESS;
    args[5] = "iters=20000 threads=64 blocks=2 depth=3 ms=1500 report_ms=100";
    let vm = Vm::start(&s, "fits", &args);
    vm.wait_for(|o| o.contains("FAIRNESS t_ms="));
    migrate(&vm, &sock, true);
    assert_eq!(vm.finish().0, 0);
    let (code, after, err, _) = sb.finish();
    assert_eq!(code, 0, "{after} {err}");
    fairness_resumed_ok(&after);
}
