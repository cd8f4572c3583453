//! `vgpud --gpus all`: the host's CUDA devices, found through NVIDIA's driver (`cuInit`,
//! `cuDeviceGetCount`, names and memory; `pgpu::cuda::devices`). The daemon never creates a
//! CUDA context (each VM process owns its own); this only counts and names the devices, and
//! their names and memory go into the report. Bounded: at most `MAX_GPUS` devices, else an
//! error; no driver or no device is an error that says so.

use crate::gpus::MAX_GPUS;

/// One discovered device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub ordinal: u32,
    pub name: String,
    pub memory: u64,
}

/// The host's CUDA devices, or why there are none.
pub fn cuda_devices() -> Result<Vec<Discovered>, String> {
    pgpu::cuda::devices(MAX_GPUS as usize)
        .map(|v| {
            v.into_iter()
                .map(|d| Discovered {
                    ordinal: d.ordinal,
                    name: d.name,
                    memory: d.memory,
                })
                .collect()
        })
        .map_err(|e| format!("all: no CUDA GPU to manage: {e}"))
}

/// Checks the daemon's per-GPU VRAM against each device's memory: a partition the device
/// cannot hold would fail only later, in a VM's engine.
pub fn check_vram(devices: &[Discovered], vram: u64) -> Result<(), String> {
    match devices.iter().find(|d| d.memory < vram) {
        Some(d) => Err(format!(
            "--vram {} MiB is more than device {} ({}) has: {} MiB",
            vram >> 20,
            d.ordinal,
            d.name,
            d.memory >> 20
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(ordinal: u32, mib: u64) -> Discovered {
        Discovered {
            ordinal,
            name: format!("GPU {ordinal}"),
            memory: mib << 20,
        }
    }

    #[test]
    fn vram_larger_than_a_device_is_refused_with_its_name() {
        let d = [dev(0, 81_000), dev(1, 4_000)];
        assert_eq!(check_vram(&d, 4_000 << 20), Ok(()));
        let e = check_vram(&d, 8 << 30).unwrap_err();
        assert!(
            e.contains("device 1 (GPU 1)") && e.contains("4000 MiB"),
            "{e}"
        );
    }

    /// Without NVIDIA's driver (CI, this machine) discovery is an error that says why; with
    /// one, it lists at least one device with a name and memory.
    #[test]
    fn discovery_lists_devices_or_says_why_not() {
        match cuda_devices() {
            Ok(d) => {
                assert!(!d.is_empty() && d.len() <= MAX_GPUS as usize);
                for (i, x) in d.iter().enumerate() {
                    assert_eq!(x.ordinal, i as u32);
                    assert!(x.memory > 0 && !x.name.is_empty(), "{x:?}");
                }
            }
            Err(e) => assert!(
                e.starts_with("all: no CUDA GPU to manage: ")
                    && (e.contains("driver") || e.contains("device")),
                "{e}"
            ),
        }
    }
}
