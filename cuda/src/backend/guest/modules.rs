//! Modules in the guest: the PTX text is checked here (parsed once in the process, so a bad
//! module fails `module_load`, not a later launch), then kept in DMA memory mapped in the
//! GPU's space, with its entry names; a launch hands the device the text's address, as the
//! driver does for user PTX (`vgpu-run FILE.ptx`), and the device loads and caches the module
//! by its text. A module with `.global`/`.const` variables gets a comment naming this process
//! and module appended to its text: the device keeps variables per text, so that makes them
//! this module's own (never another process's).

use std::collections::HashMap;

use gpu_driver::{Gpu, LaunchDesc, SysAlloc};
use vgpu_linux_tools::platform::LinuxGpu;

use super::setup_error;
use crate::device::{DevPtr, DeviceError, Launch};

/// Longest PTX text the virtual GPU takes for a launch (docs/hardware.md, "Host limits").
const MAX_TEXT: usize = 1 << 20;
/// Longest entry name (ENTRY_LEN).
const MAX_ENTRY: usize = 255;

/// One loaded module.
pub(super) struct Module {
    code: SysAlloc,
    code_len: u32,
    names: Option<SysAlloc>,
    /// Entry name → (GPU VA of the name, its length, parameter bytes).
    entries: HashMap<String, (u64, u32, u32)>,
    /// Module variables (name → size).
    vars: HashMap<String, u64>,
}

impl Module {
    /// Checks `ptx` and places it (and its entry names) in DMA memory.
    pub(super) fn load(gpu: &mut Gpu<LinuxGpu>, ptx: &str, id: u64) -> Result<Self, DeviceError> {
        let parsed = ptx::parse(ptx).map_err(|e| DeviceError::InvalidPtx(e.to_string()))?;
        let mut text = ptx.to_string();
        let mut vars = HashMap::new();
        if parsed.has_variables() {
            text.push_str(&format!(
                "\n// vgpu-cuda: process {} module {id}\n",
                std::process::id()
            ));
            for name in parsed.variable_names() {
                if let Some((_, size)) = parsed.variable(name) {
                    vars.insert(name.to_string(), size);
                }
            }
        }
        if text.len() > MAX_TEXT {
            return Err(DeviceError::InvalidPtx(format!(
                "{} bytes of PTX: the virtual GPU takes at most {MAX_TEXT} per module",
                text.len()
            )));
        }
        let mut names = Vec::new();
        let mut spots = Vec::new();
        for e in parsed.entries() {
            if e.name.is_empty() || e.name.len() > MAX_ENTRY {
                continue;
            }
            spots.push((e.name.clone(), names.len() as u64, e.param_size));
            names.extend_from_slice(e.name.as_bytes());
            names.resize(names.len().next_multiple_of(8), 0);
        }
        let code = gpu.sys_alloc(text.len() as u64).map_err(setup_error)?;
        let placed = gpu.sys_write(&code, 0, text.as_bytes()).and_then(|()| {
            if names.is_empty() {
                return Ok(None);
            }
            let n = gpu.sys_alloc(names.len() as u64)?;
            match gpu.sys_write(&n, 0, &names) {
                Ok(()) => Ok(Some(n)),
                Err(e) => {
                    gpu.sys_free(n);
                    Err(e)
                }
            }
        });
        let names_buf = match placed {
            Ok(n) => n,
            Err(e) => {
                gpu.sys_free(code);
                return Err(setup_error(e));
            }
        };
        let base = names_buf.map_or(0, |n| n.va);
        let entries = spots
            .into_iter()
            .map(|(name, off, params)| {
                let len = name.len() as u32;
                (name, (base + off, len, params))
            })
            .collect();
        Ok(Self {
            code,
            code_len: text.len() as u32,
            names: names_buf,
            entries,
            vars,
        })
    }

    /// The launch's methods' values (the parameters' address is the caller's).
    pub(super) fn launch_desc(&self, l: &Launch<'_>) -> Result<LaunchDesc, DeviceError> {
        let &(entry_va, entry_len, param_size) = self
            .entries
            .get(l.entry)
            .ok_or_else(|| DeviceError::NotFound(l.entry.to_string()))?;
        if l.grid.contains(&0) || l.block.contains(&0) {
            return Err(DeviceError::InvalidValue(format!(
                "grid {:?} / block {:?} with a zero dimension",
                l.grid, l.block
            )));
        }
        if (l.params.len() as u64) < u64::from(param_size) || l.params.len() > 4096 {
            return Err(DeviceError::LaunchFailed(format!(
                "{}: {} bytes of parameters, the entry takes {param_size} (at most 4096)",
                l.entry,
                l.params.len()
            )));
        }
        Ok(LaunchDesc {
            code_va: self.code.va,
            code_len: self.code_len,
            entry_va,
            entry_len,
            grid: l.grid,
            block: l.block,
            shared_bytes: l.shared_bytes,
            param_va: 0,
            param_len: l.params.len() as u32,
        })
    }

    /// A module variable's address: the device keeps the variables, and the virtual GPU gives
    /// no way to reach them but the module's own kernels.
    pub(super) fn global(&self, name: &str) -> Result<(DevPtr, u64), DeviceError> {
        match self.vars.get(name) {
            Some(_) => Err(DeviceError::NotSupported(format!(
                "{name}: module variables cannot be read or written from the guest (only the \
                 module's kernels reach them); their PTX initial values are used"
            ))),
            None => Err(DeviceError::NotFound(name.to_string())),
        }
    }

    /// Gives the module's DMA memory back (no launch of it may be in flight).
    pub(super) fn free(self, gpu: &mut Gpu<LinuxGpu>) {
        gpu.sys_free(self.code);
        if let Some(n) = self.names {
            gpu.sys_free(n);
        }
    }
}
