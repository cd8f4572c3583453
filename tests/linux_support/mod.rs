//! The Linux guest for the tests that boot it (tests/linux.rs, disk.rs, linux_apps.rs): built
//! by guest-images/linux/build.sh (cached under target/linux-guest; the first run builds the
//! kernel, minutes) once per test process, since the script is not safe to run twice at once.
//! VGPU_SKIP_LINUX=1 skips such tests on a machine that cannot build the guest (CI never does);
//! anywhere else a guest that cannot be built is a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The guest's directory (vmlinux, rootfs.ext2), or `None` with VGPU_SKIP_LINUX=1.
pub fn guest_dir() -> Option<&'static Path> {
    if std::env::var_os("VGPU_SKIP_LINUX").is_some_and(|v| v == "1") {
        eprintln!("VGPU_SKIP_LINUX=1: Linux guest test skipped");
        return None;
    }
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = Command::new(root.join("guest-images/linux/build.sh"))
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("run guest-images/linux/build.sh: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "guest-images/linux/build.sh failed ({}):\n{text}",
                out.status
            ));
        }
        let vmlinux = text
            .lines()
            .find_map(|l| l.strip_prefix("vmlinux: "))
            .ok_or_else(|| format!("build.sh printed no vmlinux path:\n{text}"))?;
        Ok(Path::new(vmlinux)
            .parent()
            .ok_or("vmlinux path without a directory")?
            .to_path_buf())
    });
    match dir {
        Ok(d) => Some(d.as_path()),
        Err(e) => panic!("the Linux guest cannot be built: {e}"),
    }
}
