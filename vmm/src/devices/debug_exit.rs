//! The debug-exit port: a guest write ends the VM with the written value as exit code.

use std::sync::Arc;

use mmio::BusDevice;

use crate::exit::{ExitLatch, ExitReason};

/// See the module documentation.
pub struct DebugExit {
    latch: Arc<ExitLatch>,
}

impl DebugExit {
    pub fn new(latch: Arc<ExitLatch>) -> Self {
        DebugExit { latch }
    }
}

impl BusDevice for DebugExit {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset != 0 || data.is_empty() {
            log::warn!(
                "debug-exit: ignored {}-byte write at offset {offset}",
                data.len()
            );
            return;
        }
        let mut raw = [0u8; 8];
        let n = data.len().min(8);
        raw[..n].copy_from_slice(&data[..n]);
        let value = u64::from_le_bytes(raw);
        let code = u8::try_from(value).unwrap_or_else(|_| {
            log::warn!("debug-exit: code {value} is out of range 0..=255; exiting with 255");
            255
        });
        self.latch.request(ExitReason::Guest(code));
    }
}
