//! `vgpu-bench fairness --daemon-cpus LIST`: the daemon on CPUs of its own and the VMs on the
//! rest of the bench's CPUs, as hosts reserve housekeeping cores for their control plane.
//! Issue 25, 64 VMs on 16 cores (session 13): with every process on every core, the daemon's
//! looks at a stop that was due came 1-3.5 ms late while the VMs booted (the daemon, at nice
//! −10, waiting for a core); with the daemon alone on one core, ~25 µs.
//!
//! A child is pinned between `fork` and `exec` (`sched_setaffinity` of the child itself), so
//! every thread it makes inherits the set.

use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::error::BenchError;

/// Highest CPU number a list may name (`cpu_set_t` holds 1024).
const MAX_CPU: usize = 1023;

/// A parsed CPU list (`--daemon-cpus`), one value on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl std::str::FromStr for CpuList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_list(s).map(CpuList)
    }
}

/// The CPUs of `s`: comma-separated numbers and inclusive ranges (`15`, `0-3,8`), sorted, no
/// duplicates.
pub fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n <= MAX_CPU)
                .ok_or_else(|| format!("{t:?}: not a CPU number (0 to {MAX_CPU})"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("{part:?}: a range runs upwards"));
                }
                v.extend(a..=b);
            }
            None => v.push(num(part)?),
        }
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// The CPUs this process may run on.
pub fn allowed() -> Result<Vec<usize>, BenchError> {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set; the call writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live, writable `cpu_set_t` of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(BenchError::Invalid(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `set` is initialised (above); `CPU_ISSET` only reads it.
    Ok((0..=MAX_CPU)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// The daemon's CPUs (`daemon`, all of them allowed) and the VMs' (the other allowed ones);
/// refused when either would be empty.
pub fn split(allowed: &[usize], daemon: &[usize]) -> Result<(Vec<usize>, Vec<usize>), String> {
    if daemon.is_empty() {
        return Err("no CPU for the daemon".into());
    }
    if let Some(c) = daemon.iter().find(|c| !allowed.contains(c)) {
        return Err(format!(
            "CPU {c} is not one this process may run on ({allowed:?})"
        ));
    }
    let vms: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|c| !daemon.contains(c))
        .collect();
    if vms.is_empty() {
        return Err(format!("no CPU left for the VMs (allowed {allowed:?})"));
    }
    Ok((daemon.to_vec(), vms))
}

/// `--gpu-cpus`: the CPUs reserved for the thread that holds the GPU (`--gpu cpus=N-M` of
/// every VM, `vgpu/src/host/pin.rs`), taken from the VMs' CPUs (`vms`, from [`split`] or
/// every allowed CPU); returns the key's value and the VMs' CPUs without them. Refused
/// unless the list is one range of allowed CPUs (the key's form) leaving the VMs a CPU.
pub fn reserve_gpu(
    allowed: &[usize],
    vms: &[usize],
    gpu: &[usize],
) -> Result<(String, Vec<usize>), String> {
    let (Some(&first), Some(&last)) = (gpu.first(), gpu.last()) else {
        return Err("no CPU for the GPU".into());
    };
    if last - first + 1 != gpu.len() {
        return Err(format!(
            "{gpu:?}: one range N-M (the --gpu cpus= key's form)"
        ));
    }
    if let Some(c) = gpu.iter().find(|c| !allowed.contains(c)) {
        return Err(format!(
            "CPU {c} is not one this process may run on ({allowed:?})"
        ));
    }
    if let Some(c) = gpu.iter().find(|c| !vms.contains(c)) {
        return Err(format!("CPU {c} is the daemon's (--daemon-cpus)"));
    }
    let rest: Vec<usize> = vms.iter().copied().filter(|c| !gpu.contains(c)).collect();
    if rest.is_empty() {
        return Err(format!("no CPU left for the VMs (allowed {allowed:?})"));
    }
    let key = if first == last {
        first.to_string()
    } else {
        format!("{first}-{last}")
    };
    Ok((key, rest))
}

/// Makes `cmd`'s process run on `cpus` only, from before it executes.
pub fn pin(cmd: &mut Command, cpus: &[usize]) {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c <= MAX_CPU) {
        // SAFETY: `c` is within the set's 1024 bits.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // `sched_setaffinity`, an async-signal-safe system call, on a set copied into it; no
    // allocation, no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_list("15"), Ok(vec![15]));
        assert_eq!(parse_list("0-3, 8,2"), Ok(vec![0, 1, 2, 3, 8]));
        for bad in ["", "a", "3-1", "1024", "1-", "-2"] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_daemon_takes_its_cpus_and_the_vms_the_rest() {
        let all: Vec<usize> = (0..16).collect();
        let (d, v) = split(&all, &[15]).unwrap();
        assert_eq!((d, v.len(), v[14]), (vec![15], 15, 14));
        assert!(split(&all, &[16]).is_err());
        assert!(split(&[3], &[3]).is_err());
        assert!(split(&all, &[]).is_err());
    }

    #[test]
    fn the_gpu_takes_a_range_from_the_vms() {
        let all: Vec<usize> = (0..16).collect();
        let (_, vms) = split(&all, &[15]).unwrap();
        let (key, rest) = reserve_gpu(&all, &vms, &[14]).unwrap();
        assert_eq!((key.as_str(), rest.len(), rest[13]), ("14", 14, 13));
        let (key, rest) = reserve_gpu(&all, &all, &[12, 13]).unwrap();
        assert_eq!((key.as_str(), rest.len()), ("12-13", 14));
        assert!(reserve_gpu(&all, &all, &[12, 14]).is_err());
        assert!(reserve_gpu(&all, &all, &[16]).is_err());
        assert!(reserve_gpu(&all, &all, &[]).is_err());
        assert!(reserve_gpu(&[3, 4], &[3], &[3]).is_err());
        // Not one of the daemon's.
        assert!(reserve_gpu(&all, &vms, &[15]).is_err());
    }

    /// A pinned child runs where it was put: its own `/proc/self/status` says so.
    #[test]
    fn a_pinned_child_runs_on_its_cpus() {
        let cpus = allowed().unwrap();
        let one = *cpus.last().unwrap();
        let mut cmd = Command::new("grep");
        cmd.args(["Cpus_allowed_list", "/proc/self/status"]);
        pin(&mut cmd, &[one]);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.split_whitespace().last(),
            Some(one.to_string().as_str()),
            "{text}"
        );
    }
}
