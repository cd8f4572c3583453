//! `vgpu-exit CODE`: ends the VM with exit code CODE through the VMM's debug-exit port (0xf4).
//! Under PVM a user-mode `out` raises #GP even with IOPL 3, so the byte goes through
//! `/dev/port` (the kernel's `outb`).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use crate::ToolError;

/// The VMM's debug-exit port (guest_abi::ports::DEBUG_EXIT).
pub const DEBUG_EXIT_PORT: u64 = 0xf4;

/// Writes `code` to the debug-exit port; returns only if the VMM did not stop the VM.
pub fn exit_vm(code: u8) -> Result<(), ToolError> {
    let port = OpenOptions::new()
        .write(true)
        .open("/dev/port")
        .map_err(ToolError::io("open /dev/port"))?;
    port.write_all_at(&[code], DEBUG_EXIT_PORT)
        .map_err(ToolError::io("write the debug-exit port"))
}

/// The `vgpu-exit` command.
pub fn main(argv: &[String]) -> Result<u8, ToolError> {
    let code = match argv {
        [c] => c
            .parse::<u8>()
            .map_err(|_| ToolError::Bad(format!("vgpu-exit: {c}: not a code 0-255")))?,
        _ => return Err(ToolError::Bad("usage: vgpu-exit CODE".into())),
    };
    exit_vm(code)?;
    Err(ToolError::Bad(
        "the VM is still running (no debug-exit port?)".into(),
    ))
}
