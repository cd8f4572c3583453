//! What a restore did and how long each part took (issue 24, "restore to running"): the cold
//! path (`--restore DIR`: everything made after the process starts) and a standby's
//! (`--standby`, then `ctl SOCKET restore DIR`: the KVM VM, its vCPUs, guest RAM's memory slots
//! and the GPU engine made before the request, [`crate::standby`]). The total runs from the
//! start of reading the snapshot (the request's arrival on a standby) to the vCPU threads
//! started; it is logged at `debug` as `restore to running: N ms`, the parts at `info`, written
//! into `--stats` as `restore` and, on a standby, answered to the `restore` request.

use serde::Serialize;

/// A restore's figures, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct RestoreReport {
    /// Restored into a standby process (its VM, vCPUs, RAM slots and engine made before).
    pub standby: bool,
    /// Reading and checking the snapshot directory (manifest, state file, sizes), and on a
    /// standby checking that it fits what was prepared.
    pub check_ms: f64,
    /// Creating the KVM VM (irqchip, PIT); 0 on a standby.
    pub vm_ms: f64,
    /// Making the GPU engine (the cuda context and its VRAM; a sim engine is made with its
    /// device, inside `devices_ms`); 0 on a standby.
    pub engine_ms: f64,
    /// Guest RAM: the file mapped copy-on-write and the wait for its memory slots (cold; see
    /// `ram_slots_ms`), mapped over the registered addresses (standby), or its data copied
    /// into engine memory (cuda, cold: allocation and registration too).
    pub ram_ms: f64,
    /// Of a cold restore without a cuda engine: how long registering guest RAM's memory slots
    /// took on its own thread, overlapping the VM's irqchip, the vCPUs and the devices (only
    /// the wait for it after them is in `ram_ms`); 0 otherwise.
    pub ram_slots_ms: f64,
    /// Creating the vCPUs (CPUID, LAPIC); 0 on a standby.
    pub vcpus_ms: f64,
    /// The devices and buses, the virtual GPU's device on its engine.
    pub devices_ms: f64,
    /// The devices', VM's and vCPUs' state put back (besides the GPU image).
    pub state_ms: f64,
    /// The GPU image restored (registers, channels, VRAM; the guest's modules loaded, JIT on
    /// cuda).
    pub gpu_restore_ms: f64,
    /// Of `gpu_restore_ms` (a whole image): waiting for the new device's worker thread to park
    /// before the image goes in.
    pub gpu_pause_ms: f64,
    /// Of `gpu_restore_ms` (a whole image): the partition zeroed and the image's VRAM pages
    /// written into it.
    pub gpu_vram_ms: f64,
    /// Of `gpu_restore_ms` (a whole image): the image's modules loaded into the engine (PTX
    /// rewrite and JIT on cuda for each cold one).
    pub gpu_modules_ms: f64,
    /// Of `gpu_restore_ms` (a whole image): after the modules, the device's state applied
    /// (preempted jobs' contexts re-targeted, registers, doorbell, the BAR's trapped pages,
    /// which split the aperture's memory slots).
    pub gpu_apply_ms: f64,
    /// The image's modules the engine's content cache served (a standby's template loaded
    /// them before the request).
    pub modules_cached: usize,
    /// The image's modules loaded afresh.
    pub modules_cold: usize,
    /// From everything restored to the vCPU threads running: the event loop, the API's
    /// controller (the MSR list snapshots save; made before on a standby), the threads.
    pub start_ms: f64,
    /// The whole: check to vCPUs running (`restore to running`).
    pub restore_to_running_ms: f64,
    /// A standby: how long preparing took (before the request; not part of the total).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prepared_ms: Option<f64>,
    /// A standby with a template (`--template DIR`): the modules it loaded before the request
    /// and how long reading, checking and loading it took (in `prepared_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_modules: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_ms: Option<f64>,
    /// The engine modules the image's texts got (which of them the template held: cached).
    #[serde(skip)]
    pub(crate) module_ids: Vec<pgpu::ModuleId>,
}

impl RestoreReport {
    /// Takes the GPU device's parts of a whole image's restore (every module counted cold until
    /// a standby finds its template's among them); returns the delta bytes (none).
    pub(crate) fn gpu_parts(&mut self, p: vgpu::snapshot::RestoreParts) -> u64 {
        self.gpu_pause_ms = p.pause_ms;
        self.gpu_vram_ms = p.vram_ms;
        self.gpu_modules_ms = p.modules_ms;
        self.gpu_apply_ms = p.apply_ms;
        self.modules_cold = p.modules.len();
        self.modules_cached = 0;
        self.module_ids = p.modules;
        0
    }

    /// The parts as one log line.
    pub fn parts(&self) -> String {
        format!(
            "check {:.1}, VM {:.1}, engine {:.1}, RAM {:.1} (slots {:.1} overlapped), vCPUs \
             {:.1}, devices {:.1}, state {:.1}, GPU {:.1} (pause {:.1}, VRAM {:.1}, modules {:.1}: \
             {} cached, {} cold, apply {:.1}), start {:.1} ms",
            self.check_ms,
            self.vm_ms,
            self.engine_ms,
            self.ram_ms,
            self.ram_slots_ms,
            self.vcpus_ms,
            self.devices_ms,
            self.state_ms,
            self.gpu_restore_ms,
            self.gpu_pause_ms,
            self.gpu_vram_ms,
            self.gpu_modules_ms,
            self.modules_cached,
            self.modules_cold,
            self.gpu_apply_ms,
            self.start_ms
        )
    }
}

/// Milliseconds since `t`.
pub(crate) fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
