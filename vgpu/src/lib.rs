//! The virtual GPU: a PCI device whose registers (BAR0), VRAM aperture (BAR1) and PRAMIN
//! window trap into [`device::VgpuDevice`] on vCPU threads, and a GPU worker thread
//! ([`worker::Worker`]) that runs the guest's channels on a physical GPU engine (`pgpu`) under
//! shadow page tables (`shadow`). The programming interface is docs/hardware.md, "The virtual
//! GPU"; the structure is explained in docs/architecture.md.
//!
//! Files: `config` (`--gpu` options), `regs` (offsets, methods, fault kinds), `device` (PCI
//! front end), `state` (shared registers, faults, interrupts), `pushbuf` (pushbuffer decoding),
//! `methods` (method state → commands), `shadowing` (instance blocks and shadow spaces over
//! the `shadow` crate), `worker` (the GPU thread), `watchdog` (per-job time limit).

pub mod config;
pub mod device;
pub mod methods;
pub mod pushbuf;
pub mod regs;
pub mod shadowing;
pub mod state;
mod watchdog;
pub mod worker;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pgpu::Engine;
use pgpu::sim::{SimConfig, SimEngine};
use serde::Serialize;

pub use config::{ConfigError, GpuConfig};
pub use state::{FaultRecord, GpuCounters, IrqSink};

/// Errors creating a virtual GPU.
#[derive(Debug, thiserror::Error)]
pub enum VgpuError {
    #[error("create the GPU engine: {0}")]
    Engine(#[from] pgpu::EngineError),
    #[error("PCI: {0}")]
    Pci(#[from] mmio::pci::PciError),
    #[error("start the GPU worker: {0}")]
    Thread(#[from] std::io::Error),
    #[error("shadowing: {0}")]
    Shadow(String),
}

/// `--stats` of the virtual GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuStats {
    pub counters: GpuCounters,
    pub fault: Option<FaultRecord>,
}

/// One virtual GPU: the device (to put on the PCI bus) and its worker.
pub struct Vgpu {
    device: Arc<Mutex<device::VgpuDevice>>,
    shared: Arc<state::Shared>,
    worker: Option<JoinHandle<()>>,
}

impl Vgpu {
    /// Creates the engine, the device and the worker. `ram` is the VM's RAM (system-memory
    /// targets of GPU page tables must lie in it).
    pub fn new(
        cfg: GpuConfig,
        ram: vm_memory::GuestMemoryMmap,
        irq: Arc<dyn IrqSink>,
    ) -> Result<Self, VgpuError> {
        let sim = SimConfig {
            vram_size: cfg.vram,
            workers: cfg.workers,
            ..SimConfig::default()
        };
        let engine: Arc<dyn Engine> = Arc::new(SimEngine::new(sim)?);
        let vram_base = 0;
        let shadows = shadowing::Shadows::new(engine.clone(), &cfg, vram_base, ram)?;
        let shared = Arc::new(state::Shared::new(cfg.channels, irq));
        let device = Arc::new(Mutex::new(device::VgpuDevice::new(
            cfg.clone(),
            engine.clone(),
            vram_base,
            shared.clone(),
        )?));
        let w = worker::Worker::new(shared.clone(), engine, cfg, shadows)?;
        let worker = std::thread::Builder::new()
            .name("vgpu".into())
            .spawn(move || w.run())?;
        Ok(Vgpu {
            device,
            shared,
            worker: Some(worker),
        })
    }

    /// The PCI device.
    pub fn device(&self) -> Arc<Mutex<device::VgpuDevice>> {
        self.device.clone()
    }

    /// Counters and the pending fault.
    pub fn stats(&self) -> GpuStats {
        let r = self.shared.lock();
        GpuStats {
            counters: r.counters.clone(),
            fault: r.fault,
        }
    }
}

impl Drop for Vgpu {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.worker.take() {
            let _ = t.join();
        }
    }
}
