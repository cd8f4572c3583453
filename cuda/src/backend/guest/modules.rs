//! Modules in the guest: the PTX text is checked here (parsed once in the process, so a bad
//! module fails `module_load`, not a later launch), then kept in DMA memory mapped in the
//! GPU's space, with its entry names; a launch hands the device the text's address, as the
//! driver does for user PTX (`vgpu-run FILE.ptx`), and the device loads and caches the module
//! by its text. A module's `.global`/`.const` variables are moved into a VRAM block of the
//! process (`crate::globals`, the rewrite the host backend uses), so `module_global` gives their address and copies reach them. Where
//! the text cannot be rewritten, the variables stay on the device: the text gets a comment
//! naming this process and module appended (the device keeps variables per text, so they are
//! still this module's own) and `module_global` is refused.

use std::collections::HashMap;

use gpu_driver::{Gpu, LaunchDesc, SysAlloc, VramAlloc};
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
    /// Where the variables were moved (name → GPU VA), and the block holding them.
    placed: HashMap<String, u64>,
    pub(super) block: Option<VramAlloc>,
}

/// Initial values to copy into a module's variable block: (GPU VA, bytes).
pub(super) type Images = Vec<(u64, Vec<u8>)>;

impl Module {
    /// Checks `ptx`, moves its variables into a VRAM block (their initial values are
    /// returned for the caller to copy there), and places the text and its entry names in DMA
    /// memory.
    pub(super) fn load(
        gpu: &mut Gpu<LinuxGpu>,
        ptx: &str,
        id: u64,
    ) -> Result<(Self, Images), DeviceError> {
        let parsed = ptx::parse(ptx).map_err(|e| DeviceError::InvalidPtx(e.to_string()))?;
        let mut text = ptx.to_string();
        let mut vars = HashMap::new();
        let mut placed = HashMap::new();
        let mut images = Vec::new();
        let mut block = None;
        if parsed.has_variables() {
            for name in parsed.variable_names() {
                if let Some((_, size)) = parsed.variable(name) {
                    vars.insert(name.to_string(), size);
                }
            }
            match relocated(gpu, &parsed, ptx) {
                Ok((t, b, p, i)) => {
                    (text, block, placed, images) = (t, Some(b), p, i);
                }
                Err(why) => {
                    log::info!("module {id}: variables stay on the device ({why})");
                    text.push_str(&format!(
                        "\n// vgpu-cuda: process {} module {id}\n",
                        std::process::id()
                    ));
                }
            }
        }
        let free_block = |gpu: &mut Gpu<LinuxGpu>| {
            if let Some(b) = block {
                gpu.vram_free(b);
            }
        };
        if text.len() > MAX_TEXT {
            free_block(gpu);
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
        let code = match gpu.sys_alloc(text.len() as u64) {
            Ok(c) => c,
            Err(e) => {
                free_block(gpu);
                return Err(setup_error(e));
            }
        };
        let written = gpu.sys_write(&code, 0, text.as_bytes()).and_then(|()| {
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
        let names_buf = match written {
            Ok(n) => n,
            Err(e) => {
                gpu.sys_free(code);
                free_block(gpu);
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
        let m = Self {
            code,
            code_len: text.len() as u32,
            names: names_buf,
            entries,
            vars,
            placed,
            block,
        };
        Ok((m, images))
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

    /// A module variable's address and size.
    pub(super) fn global(&self, name: &str) -> Result<(DevPtr, u64), DeviceError> {
        match (self.vars.get(name), self.placed.get(name)) {
            (Some(&size), Some(&va)) => Ok((va, size)),
            (Some(_), None) => Err(DeviceError::NotSupported(format!(
                "{name}: module variables cannot be read or written from the guest (only the \
                 module's kernels reach them); their PTX initial values are used"
            ))),
            (None, _) => Err(DeviceError::NotFound(name.to_string())),
        }
    }

    /// Gives the module's DMA memory back (no launch of it may be in flight).
    pub(super) fn free(self, gpu: &mut Gpu<LinuxGpu>) {
        gpu.sys_free(self.code);
        if let Some(b) = self.block {
            gpu.vram_free(b);
        }
        if let Some(n) = self.names {
            gpu.sys_free(n);
        }
    }
}

/// The text with its variables moved into a new VRAM block (the rewrite the host backend uses
/// too, [`crate::globals`]): (text, block, name → VA, initial values). `Err` says why not (the
/// caller keeps the variables on the device).
fn relocated(
    gpu: &mut Gpu<LinuxGpu>,
    _parsed: &ptx::Module,
    ptx: &str,
) -> Result<(String, VramAlloc, HashMap<String, u64>, Images), String> {
    let layout = crate::globals::layout(ptx).ok_or("no variables the rewrite can place")?;
    let total = layout.image.len() as u64;
    let block = gpu
        .vram_alloc(total.max(1))
        .map_err(|e| format!("no VRAM for {total} bytes of variables: {e}"))?;
    let text = crate::globals::rewrite(ptx, &layout, block.va);
    let checked = match ptx::parse(&text) {
        Ok(m) if !m.has_variables() => Ok(text),
        Ok(_) => Err("variables left after the rewrite".to_string()),
        Err(e) => Err(format!("the rewritten text does not parse: {e}")),
    };
    let text = match checked {
        Ok(t) => t,
        Err(e) => {
            gpu.vram_free(block);
            return Err(e);
        }
    };
    let placed = layout
        .vars
        .iter()
        .map(|(name, off, _)| (name.clone(), block.va + off))
        .collect();
    // The whole block's initial image: initialisers where the PTX has them, zeros elsewhere.
    Ok((text, block, placed, vec![(block.va, layout.image)]))
}
