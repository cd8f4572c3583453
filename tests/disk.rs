//! Disks in the Linux guest (real KVM; the guest of guest-images/linux/build.sh, built on
//! first use as in tests/linux.rs): `--run` of a dynamically linked C program
//! (tests/data/disk_prog.c, linked against a stand-in `libcudart.so.13` that sits next to a
//! copy of vgpu-vmm, as the guest CUDA libraries will) with arguments, its output and its exit
//! code as the VM's; a second, read-only `--disk` whose file the guest reads back with the
//! host's checksum and cannot write; a snapshot of such a VM restored after its source ended
//! (the program goes on and reads the disk through the restored device), refused while the
//! disk's size differs from the snapshot's. Each test is one boot (~15-20 s of emulated kernel
//! on a quiet machine, minutes on a loaded one).
//!
//! VGPU_SKIP_LINUX=1 skips them on a machine that cannot build the guest (CI never does).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod linux_support;
use linux_support::guest_dir;

/// A scratch directory: the program, the stand-in library, a copy of vgpu-vmm next to it
/// (where `--run` looks for the guest CUDA libraries), and a read-only data disk.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("run a build tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The data disk's file's contents (deterministic, not compressible to nothing).
fn data() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..300_001)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("vgpu-disk-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("content")).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/disk_prog.c");
    std::fs::write(
        d.join("standin.c"),
        "int vgpu_standin(int x) { return 2 * x + 1; }\n",
    )
    .unwrap();
    sh(Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o"])
        .arg(d.join("libcudart.so.13"))
        .arg(d.join("standin.c")));
    sh(Command::new("cc")
        .arg("-o")
        .arg(d.join("disk_prog"))
        .arg(&src)
        .arg(format!("-L{}", d.display()))
        .arg("-l:libcudart.so.13"));
    std::fs::copy(env!("CARGO_BIN_EXE_vgpu-vmm"), d.join("vgpu-vmm")).unwrap();
    std::fs::write(d.join("content/data.bin"), data()).unwrap();
    sh(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext2", "-b", "4096", "-d"])
        .arg(d.join("content"))
        .arg(d.join("data.ext2"))
        .arg("1024"));
    Scratch(d)
}

fn vmm(s: &Scratch, dir: &Path) -> Command {
    let mut c = Command::new(s.0.join("vgpu-vmm"));
    c.env("VGPU_LINUX_DIR", dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

/// The uptime figure in a line containing `marker` ("... uptime 12.34 s ...").
fn uptime_after(out: &str, marker: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.contains(marker))?;
    line.split("uptime ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

#[test]
fn run_a_dynamic_program_with_a_read_only_data_disk() {
    let Some(dir) = guest_dir() else { return };
    let s = scratch("run");
    let disk = s.0.join("data.ext2");
    let before = std::fs::read(&disk).unwrap();
    let t = Instant::now();
    let out = vmm(&s, dir)
        .args(["--guest", "linux", "--timeout", "1200", "--disk"])
        .arg(format!("{},ro", disk.display()))
        .arg("--run")
        .arg(s.0.join("disk_prog"))
        .args(["--", "7", "0", "a b", "it's", "$(x)"])
        .output()
        .unwrap();
    let wall = t.elapsed().as_secs_f64();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // The program's exit code is the VM's.
    assert_eq!(out.status.code(), Some(7), "{text}");
    assert!(text.contains("standin(20)=41"), "{text}");
    for (i, a) in ["7", "0", "a b", "it's", "$(x)"].iter().enumerate() {
        assert!(text.contains(&format!("argv[{}]=<{a}>", i + 1)), "{text}");
    }
    assert!(text.contains("cwd=/run/work writable=1"), "{text}");
    let d = data();
    let want = format!("data.bin bytes={} fnv={:016x}", d.len(), fnv(&d));
    assert!(text.contains(&want), "want {want}:\n{text}");
    // The guest could not write the read-only disk, and the file is unchanged.
    assert!(text.contains("write to /dev/vdb:"), "{text}");
    assert!(!text.contains("wrote=512"), "{text}");
    assert_eq!(std::fs::read(&disk).unwrap(), before);
    let init = uptime_after(&text, "/init running");
    let first = uptime_after(&text, "disk_prog: first line");
    eprintln!(
        "boot: /init at {init:?} s, the program's first line at {first:?} s (uptime); {wall:.1} s wall"
    );
}

#[test]
fn snapshot_and_restore_with_a_read_only_disk() {
    let Some(dir) = guest_dir() else { return };
    let s = scratch("snap");
    let disk = s.0.join("data.ext2");
    let socket = s.0.join("api.sock");
    let log = s.0.join("source.out");
    // The program sleeps before it reads the disk: the snapshot is taken meanwhile.
    let mut source = vmm(&s, dir)
        .args(["--guest", "linux", "--timeout", "1200", "--disk"])
        .arg(format!("{},ro", disk.display()))
        .arg("--api-socket")
        .arg(&socket)
        .arg("--run")
        .arg(s.0.join("disk_prog"))
        .args(["--", "5", "20"])
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("disk_prog: sleeping")
    {
        assert!(
            start.elapsed() < Duration::from_secs(1200),
            "the program never started:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let snap = s.0.join("snap");
    let ctl = Command::new(s.0.join("vgpu-vmm"))
        .arg("ctl")
        .arg(&socket)
        .args(["snapshot", snap.to_str().unwrap(), "--paused"])
        .output()
        .unwrap();
    assert!(
        ctl.status.success(),
        "{}",
        String::from_utf8_lossy(&ctl.stderr)
    );
    // SAFETY: kill(2) on our own child, not reaped yet.
    assert_eq!(unsafe { libc::kill(source.id() as i32, libc::SIGKILL) }, 0);
    let _ = source.wait();
    let manifest = std::fs::read_to_string(snap.join("manifest.json")).unwrap();
    let m: serde_json::Value = serde_json::from_str(&manifest).unwrap();
    // The program's image, the data disk, then the guest's root image (the file its link
    // names); all read-only, with their sizes.
    let disks = m["disks"].as_array().expect("disks in the manifest");
    assert_eq!(disks.len(), 3, "{manifest}");
    let root = std::fs::canonicalize(dir.join("rootfs.ext2")).unwrap();
    assert_eq!(disks[2]["path"].as_str(), root.to_str(), "{manifest}");
    assert_eq!(disks[1]["path"].as_str(), disk.to_str(), "{manifest}");
    assert_eq!(
        disks[1]["bytes"].as_u64(),
        Some(std::fs::metadata(&disk).unwrap().len())
    );
    assert!(disks.iter().all(|d| d["read_only"] == true), "{manifest}");
    // A disk whose size changed is refused before anything runs.
    let original = std::fs::read(&disk).unwrap();
    let mut grown = original.clone();
    grown.extend_from_slice(&[0; 4096]);
    std::fs::write(&disk, &grown).unwrap();
    let out = vmm(&s, dir).arg("--restore").arg(&snap).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the snapshot recorded"), "{err}");
    std::fs::write(&disk, &original).unwrap();
    // Restored, the program wakes up and reads the disk through the restored device.
    let out = vmm(&s, dir)
        .arg("--restore")
        .arg(&snap)
        .args(["--timeout", "600"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{text}");
    let d = data();
    let want = format!("data.bin bytes={} fnv={:016x}", d.len(), fnv(&d));
    assert!(text.contains(&want), "want {want}:\n{text}");
    assert!(
        !text.contains("disk_prog: first line"),
        "a restore, not a boot:\n{text}"
    );
}
