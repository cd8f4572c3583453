//! The shared library from C: a program compiled with the system's C compiler (`cc`) against
//! `libcuda.so.1` (the soname, found through `LD_LIBRARY_PATH` like an nvcc program's), loading
//! a PTX file and launching, with the timing report (`VGPU_CUDA_STATS`) written at exit; under a
//! preemption method its module load prepares the launch (`VGPU_CUDA_PREPARE_MODULES`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `target/<profile>`, where cargo leaves the cdylib and build.rs its `libcuda.so.1` link.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn have_cc() -> bool {
    Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Compiles tests/c/driver.c against the library into a fresh directory named after `tag`
/// (`None` without a C compiler): the directory and the program.
fn build(tag: &str) -> Option<(PathBuf, PathBuf)> {
    let dir = lib_dir();
    assert!(
        dir.join("libcuda.so.1").exists(),
        "no libcuda.so.1 in {}",
        dir.display()
    );
    if !have_cc() {
        eprintln!("SKIP: no C compiler (cc)");
        return None;
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let tmp = std::env::temp_dir().join(format!("vgpu-cuda-c-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let prog = tmp.join("driver");
    let out = Command::new("cc")
        .arg(here.join("c/driver.c"))
        .arg("-o")
        .arg(&prog)
        .arg(format!("-L{}", dir.display()))
        .arg("-l:libcuda.so.1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((tmp, prog))
}

#[test]
fn a_c_program_links_by_soname_runs_a_kernel_and_writes_stats() {
    let Some((tmp, prog)) = build("abi") else {
        return;
    };
    // The program needs the library by its soname.
    let needed = Command::new("readelf").arg("-d").arg(&prog).output();
    if let Ok(o) = needed {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("[libcuda.so.1]"), "{text}");
    }
    let stats = tmp.join("stats.json");
    let (stdout, stderr) = run(&prog, &stats, &[]);
    assert!(stdout.starts_with("ok version=13000 device="), "{stdout}");
    assert!(stdout.contains("unsupported=801"), "{stdout}");
    assert_eq!(
        stderr.matches("cuGraphCreate is not supported").count(),
        1,
        "{stderr}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(json["backend"], "sim");
    let calls = &json["calls"];
    assert_eq!(calls["cuMemcpyHtoD_v2"]["count"], 2);
    assert_eq!(calls["cuMemcpyHtoD_v2"]["bytes"], 4000);
    assert_eq!(calls["cuMemcpyDtoH_v2"]["bytes"], 2000);
    assert_eq!(calls["cuLaunchKernel"]["count"], 1);
    assert_eq!(json["launch_overhead_ns"]["launches"], 1);
    // In-process: the preemption method (the default, slice: nothing transformed, so no engine
    // counters) and no forced preemptions.
    assert_eq!(json["preempt"]["method"], "slice", "{json}");
    assert!(json["preempt"].get("engine").is_none() && json["preempt"].get("forced").is_none());
    assert!(
        json["preempt"].get("modules_prepared").is_none(),
        "no method: loads do not prepare: {json}"
    );
    let phases = &json["phases_ns"];
    for p in ["init", "copies_in", "kernels", "copies_out", "close"] {
        assert!(phases[p].as_u64().unwrap() > 0, "phase {p} is zero: {json}");
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Under a method that transforms, a module load prepares its runs (`Engine::prepare_module`:
/// on cuda the functions of every form loaded onto the device, the streams and the signal
/// stream) before the program's first launch, which would otherwise pay it inside its timed
/// section; not under `slice` (above), nor with `VGPU_CUDA_PREPARE_MODULES=0`. The program
/// checks the kernel's results.
#[test]
fn module_loads_under_a_method_prepare_their_runs() {
    let Some((tmp, prog)) = build("prepare") else {
        return;
    };
    let stats = tmp.join("stats.json");
    for method in ["checkpoint", "restart", "auto"] {
        let (stdout, _) = run(&prog, &stats, &[("VGPU_CUDA_PREEMPT", method)]);
        assert!(stdout.starts_with("ok "), "{method}: {stdout}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        let p = &json["preempt"];
        assert_eq!(p["method"], method, "{json}");
        assert_eq!(p["engine"]["modules_transformed"], 1, "{method}: {json}");
        assert_eq!(p["modules_prepared"], 1, "{method}: {json}");
    }
    // And not when told not to (`VGPU_CUDA_PREPARE_MODULES=0`, an A/B on a GPU).
    let (stdout, _) = run(
        &prog,
        &stats,
        &[
            ("VGPU_CUDA_PREEMPT", "checkpoint"),
            ("VGPU_CUDA_PREPARE_MODULES", "0"),
        ],
    );
    assert!(stdout.starts_with("ok "), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(json["preempt"].get("modules_prepared").is_none(), "{json}");
    assert_eq!(
        json["preempt"]["engine"]["modules_transformed"], 1,
        "{json}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Runs the C program on sim (one worker) with the stats report at `stats` and `env`; it must
/// exit 0. Its stdout and stderr.
fn run(prog: &Path, stats: &Path, env: &[(&str, &str)]) -> (String, String) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let _ = std::fs::remove_file(stats);
    let run = Command::new(prog)
        .arg(here.join("kernels.ptx"))
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("VGPU_CUDA_BACKEND", "sim")
        .env("VGPU_CUDA_SIM_WORKERS", "1")
        .env("VGPU_CUDA_STATS", stats)
        .env_remove("VGPU_CUDA_PREEMPT")
        .env_remove("VGPU_CUDA_PREPARE_MODULES")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(
        run.status.success(),
        "{env:?}: stdout: {stdout}\nstderr: {stderr}"
    );
    (stdout, stderr)
}
