//! Several real VM processes sharing one GPU through `vgpud` (run in this test process): results
//! stay right under aggressive preemption (context save/restore), an `attack` VM changes
//! nobody's checksums, a VM killed with SIGKILL mid-kernel or one that stops (SIGSTOP) does not
//! stall the others, and its partition comes back once its process is gone; one daemon with two
//! (sim) GPUs places VMs by its policy or by their pin, refuses a pin it cannot honour, and
//! keeps every VM's results right.

use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vgpud::{Background, DaemonConfig, Report};

struct Host(Background);

fn host(name: &str, sched: &str, vram_mib: u64) -> Host {
    host_gpus(name, sched, vram_mib, 1)
}

/// A daemon with `gpus` sim GPUs of `vram_mib` each.
fn host_gpus(name: &str, sched: &str, vram_mib: u64, gpus: u32) -> Host {
    let dir = std::env::temp_dir().join(format!("vgpu-shared-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("vgpud.sock");
    let cfg = DaemonConfig {
        socket: socket.clone(),
        vram: vram_mib << 20,
        channels: 64,
        gpus: (0..gpus).collect(),
        sched: scheduler::Config::parse(sched).unwrap(),
        sched_text: sched.into(),
        revoke_after: Duration::from_millis(300),
        max_run: Duration::from_secs(5),
        report: None,
        report_every: None,
        spin: Duration::ZERO,
        backstop: Duration::from_millis(1),
        adopt: Duration::ZERO,
    };
    Host(Background::start(cfg).unwrap())
}

impl Host {
    fn vm(&self, guest: &str, gpu: &str, cmdline: &str) -> Child {
        Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
            .args(["--guest", guest, "--timeout", "120", "--cmdline", cmdline])
            .arg("--gpu")
            .arg(format!("host={},{gpu}", self.0.socket().display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start vgpu-vmm")
    }

    fn stop(self) -> Report {
        self.0.stop().unwrap()
    }
}

fn finish(c: Child) -> (i32, String) {
    let out = c.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// The `RESULT name=.. ok=..` pairs of a workloads run.
fn results(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("RESULT "))
        .map(|l| l.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .collect()
}

#[test]
fn workloads_stay_correct_when_preempted_every_200us() {
    let h = host(
        "preempt",
        "policy=timeslice,slice=200us,wake_preempt=false",
        1024,
    );
    // A VM that always wants the GPU, so that every workloads job longer than a slice is
    // preempted (a turn nobody waits for is not), whatever the two workloads VMs overlap.
    let mut spin = h.vm("fairness", "name=spin,vram=16M", &spin_cmdline(120_000));
    wait_for_progress(&mut spin);
    let a = h.vm("workloads", "name=full,mode=full", "");
    let b = h.vm("workloads", "name=para,mode=para", "");
    let (ca, oa) = finish(a);
    let (cb, ob) = finish(b);
    spin.kill().unwrap();
    let _ = spin.wait();
    let r = h.stop();
    assert_eq!(ca, 0, "{oa}");
    assert_eq!(cb, 0, "{ob}");
    assert_eq!(results(&oa).len(), 13, "{oa}");
    assert!(
        results(&oa)
            .iter()
            .chain(&results(&ob))
            .all(|l| l.ends_with("ok=1"))
    );
    assert_eq!(r.vms.len(), 3);
    // Both workloads VMs were really stopped mid-job and resumed from their saved contexts.
    for v in r.vms.iter().filter(|v| v.name != "spin") {
        assert!(v.preempted > 0 && v.completed > 0, "{v:?}");
        assert!(v.gone_ns.is_some() && !v.evicted);
    }
    assert_eq!(r.evictions, 0);
}

#[test]
fn an_attack_vm_beside_workloads_vms_changes_nothing() {
    let h = host("attack", "policy=timeslice,slice=1ms", 1024);
    let w1 = h.vm("workloads", "name=w1,mode=full", "");
    let atk = h.vm("attack", "name=attacker", "");
    let w2 = h.vm("workloads", "name=w2,mode=para", "");
    let (c1, o1) = finish(w1);
    let (c2, o2) = finish(w2);
    let (ca, oa) = finish(atk);
    let r = h.stop();
    assert_eq!(c1, 0, "{o1}");
    assert_eq!(c2, 0, "{o2}");
    assert_eq!(
        ca, 0,
        "the attack guest reports every attempt contained:\n{oa}"
    );
    assert!(
        results(&o1)
            .iter()
            .chain(&results(&o2))
            .all(|l| l.ends_with("ok=1"))
    );
    assert_eq!(r.vms.len(), 3);
    assert!(
        r.vms.iter().all(|v| v.gpu_ns > 0 && !v.evicted),
        "{:?}",
        r.vms
    );
}

/// Reads the fairness guest's output until its first progress line (it has run kernels); the
/// rest of its output is drained by a thread.
fn wait_for_progress(c: &mut Child) -> JoinHandle<String> {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(c.stdout.take().unwrap()).lines();
    for l in lines.by_ref() {
        if l.unwrap_or_default().starts_with("FAIRNESS t_ms=") {
            break;
        }
    }
    std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"))
}

/// The fairness guest, backlogged with short spin kernels for `ms` milliseconds.
fn spin_cmdline(ms: u64) -> String {
    format!("iters=20000 depth=2 ms={ms} report_ms=100")
}

#[test]
fn a_killed_vm_and_a_stopped_vm_do_not_stall_the_others() {
    let h = host("kill", "policy=timeslice,slice=2ms", 560);
    let survivor = h.vm("fairness", "name=survivor,vram=16M", &spin_cmdline(2500));
    let killed = h.vm("fairness", "name=killed,vram=16M", &spin_cmdline(5000));
    // One very long kernel (~0.2 s of GPU time alone, several times that shared): while it
    // runs or waits preempted, this VM is queued, so once it is frozen the daemon grants it at
    // some point and then must revoke the grant.
    let stopped = h.vm(
        "fairness",
        "name=stopped,vram=16M,timeout_ms=20000",
        "iters=3000000 depth=1 ms=5000 report_ms=100",
    );
    // Once all three run kernels, kill one mid-kernel and freeze another.
    let (mut killed, mut stopped) = (killed, stopped);
    wait_for_progress(&mut killed);
    let stopped_out = wait_for_progress(&mut stopped);
    killed.kill().unwrap();
    let _ = killed.wait();
    // SAFETY: sending SIGSTOP to our own child process.
    unsafe { libc::kill(stopped.id() as i32, libc::SIGSTOP) };
    let t0 = Instant::now();
    let (cs, os) = finish(survivor);
    let survivor_time = t0.elapsed();
    // SAFETY: SIGCONT to our own (stopped) child.
    unsafe { libc::kill(stopped.id() as i32, libc::SIGCONT) };
    let (c_stopped, _) = finish(stopped);
    let stopped_out = stopped_out.join().unwrap();
    // Frozen while its job ran, the VM did not answer the preempt and was evicted: thawed, it
    // finds its GPU gone (its guest sees fault kind 16 and stops). Frozen while it waited for
    // the GPU (or between two jobs), the daemon took its grant back through the grant word
    // before it was taken and set it aside (issue 25: nothing to evict, the GPU never waited
    // for it): thawed, it asks again and finishes its work.
    let evicted = c_stopped == i32::from(guest_abi::exit_codes::GPU_FAULT);
    if evicted {
        assert!(
            stopped_out.contains("FAIRNESS fault") && stopped_out.contains("GPU_LOST"),
            "{stopped_out}"
        );
    } else {
        assert_eq!(c_stopped, 0, "{stopped_out}");
        assert!(
            stopped_out.contains("FAIRNESS end") && stopped_out.contains("ok=1"),
            "{stopped_out}"
        );
    }
    // Once both processes are gone, the daemon took their partitions back: a VM needing more
    // than what was never used (560 - 3 × 20 MiB) registers.
    std::thread::sleep(Duration::from_millis(300));
    let big = h.vm("fairness", "name=big,vram=512M", &spin_cmdline(200));
    let (cb, ob) = finish(big);
    let r = h.stop();
    assert_eq!(cs, 0, "{os}");
    assert!(os.contains("FAIRNESS end") && os.contains("ok=1"), "{os}");
    assert!(survivor_time < Duration::from_secs(30), "{survivor_time:?}");
    assert_eq!(cb, 0, "{ob}");
    let by = |n: &str| r.vms.iter().find(|v| v.name == n).unwrap().clone();
    assert_eq!(
        by("stopped").evicted,
        evicted,
        "{:?} refused {} evictions {}",
        r.vms,
        r.refused,
        r.evictions
    );
    if !evicted {
        assert!(r.unstarted_revoked > 0, "set aside: {r:?}");
    }
    assert!(by("killed").gone_ns.is_some() && by("killed").gpu_ns > 0);
    assert!(by("survivor").completed > 0 && !by("survivor").evicted);
}

#[test]
fn vms_are_placed_on_two_gpus_by_policy_or_pin_and_stay_correct() {
    let h = host_gpus("multi", "policy=timeslice,slice=1ms", 600, 2);
    // A workloads VM asks for 256 MiB + two 2 MiB guards. Two VMs pinned to GPU 1 share it;
    // the unpinned one goes to GPU 0 (more free VRAM) whatever the order they register in.
    let spin = h.vm("fairness", "name=spin,vram=16M,gpu=1", &spin_cmdline(1500));
    let pinned = h.vm("workloads", "name=pinned,gpu=1,mode=full", "");
    let placed = h.vm("workloads", "name=placed,mode=para", "");
    // GPU 2 does not exist: refused at registration, the VM does not start.
    let bad = h.vm("fairness", "name=bad,vram=16M,gpu=2", &spin_cmdline(100));
    let (cbad, obad) = finish(bad);
    let (cp, op) = finish(pinned);
    let (cq, oq) = finish(placed);
    let (cs, os) = finish(spin);
    let r = h.stop();
    assert_ne!(cbad, 0, "{obad}");
    assert!(
        obad.contains("gpu=2: this daemon has 2 GPUs (0..=1)"),
        "{obad}"
    );
    assert_eq!(cp, 0, "{op}");
    assert_eq!(cq, 0, "{oq}");
    assert_eq!(cs, 0, "{os}");
    assert!(os.contains("FAIRNESS end") && os.contains("ok=1"), "{os}");
    assert_eq!(results(&op).len(), 13, "{op}");
    assert!(
        results(&op)
            .iter()
            .chain(&results(&oq))
            .all(|l| l.ends_with("ok=1"))
    );
    let by = |n: &str| r.vms.iter().find(|v| v.name == n).unwrap().clone();
    assert_eq!(r.vms.len(), 3, "{:?}", r.vms);
    assert_eq!(
        (by("spin").gpu, by("pinned").gpu, by("placed").gpu),
        (1, 1, 0)
    );
    // The report's GPUs list their VMs and their own busy time; both GPUs were used, and the
    // sums are the daemon's totals.
    assert_eq!(r.gpus.len(), 2);
    for g in &r.gpus {
        let mine: Vec<u32> = r
            .vms
            .iter()
            .filter(|v| v.gpu == g.index)
            .map(|v| v.id)
            .collect();
        assert_eq!(g.vms, mine);
        assert!(g.busy_ns > 0 && g.grants > 0, "{g:?}");
        assert_eq!(g.vram_free, 600 << 20, "every partition back");
    }
    assert_eq!(r.gpus.iter().map(|g| g.busy_ns).sum::<u64>(), r.busy_ns);
    assert_eq!(r.gpus.iter().map(|g| g.grants).sum::<u64>(), r.grants);
    assert!(r.vms.iter().all(|v| v.gpu_ns > 0 && !v.evicted));
}

#[test]
fn a_running_vm_moves_to_the_other_gpu_and_its_results_stay_right() {
    let h = host_gpus("move", "policy=timeslice,slice=1ms", 256, 2);
    let api =
        std::env::temp_dir().join(format!("vgpu-shared-{}-move-api.sock", std::process::id()));
    let _ = std::fs::remove_file(&api);
    let stats = api.with_extension("stats.json");
    let _ = std::fs::remove_file(&stats);
    let mut mover = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
        .args(["--guest", "fairness", "--timeout", "120", "--cmdline"])
        .arg(spin_cmdline(6000))
        .arg("--api-socket")
        .arg(&api)
        .arg("--stats")
        .arg(&stats)
        .arg("--gpu")
        .arg(format!(
            "host={},name=mover,vram=16M,gpu=0",
            h.0.socket().display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vgpu-vmm");
    // A neighbour on the target GPU, running kernels when the mover arrives.
    let mut stay = h.vm("fairness", "name=stay,vram=16M,gpu=1", &spin_cmdline(6000));
    let stay_out = wait_for_progress(&mut stay);
    let mover_out = wait_for_progress(&mut mover);
    let ctl = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_vgpu-vmm"))
            .arg("ctl")
            .arg(&api)
            .args(args)
            .output()
            .unwrap();
        let text =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        (o.status.code().unwrap_or(-1), text)
    };
    // Refused, and the VM runs on where it is: a GPU the daemon lacks, its own GPU.
    let (c, o) = ctl(&["move-gpu", "2"]);
    assert!(c == 1 && o.contains("2 GPUs"), "{o}");
    let (c, o) = ctl(&["move-gpu", "0"]);
    assert!(c == 1 && o.contains("on gpu 0 already"), "{o}");
    let (c, o) = ctl(&["move-gpu", "1"]);
    assert_eq!(c, 0, "{o}");
    let done: serde_json::Value = serde_json::from_str(o.trim()).unwrap();
    eprintln!("move-gpu: {done}");
    assert_eq!(
        (done["from"].as_u64(), done["to"].as_u64()),
        (Some(0), Some(1))
    );
    assert!(done["downtime_ms"].as_f64().unwrap() > 0.0, "{done}");
    // The first round copied the VM's page tables and buffers (never nothing).
    assert!(done["precopy_bytes"][0].as_u64().unwrap() > 0, "{done}");
    let (c, o) = ctl(&["move-gpu", "1"]);
    assert!(c == 1 && o.contains("on gpu 1 already"), "{o}");
    let cm = mover.wait().unwrap().code();
    let cs = stay.wait().unwrap().code();
    let (om, os) = (mover_out.join().unwrap(), stay_out.join().unwrap());
    let r = h.stop();
    // Every kernel's result was checked by the guest, before and after the move.
    assert_eq!(cm, Some(0), "{om}");
    assert!(om.contains("FAIRNESS end") && om.contains("ok=1"), "{om}");
    // The VM's VRAM is the target partition now: the guard areas around it, copied there, are
    // intact at exit (had the VM kept its old mapping, the daemon's zeroing of the source
    // partition would show here).
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    std::fs::remove_file(&stats).ok();
    assert_eq!(st["gpu"]["guard_intact"], true, "{}", st["gpu"]);
    assert_eq!(cs, Some(0), "{os}");
    assert!(os.contains("ok=1"), "{os}");
    let by = |n: &str| r.vms.iter().find(|v| v.name == n).unwrap().clone();
    assert_eq!((by("mover").gpu, by("mover").moves), (1, 1));
    assert!(by("mover").gpu_ns > 0 && !by("mover").evicted);
    let mut both = [by("mover").id, by("stay").id];
    both.sort();
    assert_eq!(r.gpus[1].vms, both);
    // Both partitions came back (the source one at the move, zeroed).
    assert!(
        r.gpus.iter().all(|g| g.vram_free == 256 << 20),
        "{:?}",
        r.gpus
    );
    assert_eq!(r.refused, 3);
}
