//! The i8042 keyboard controller (vm-superio): a reset command (0xFE to port 0x64) ends the VM.

use std::sync::Arc;

use mmio::BusDevice;
use vm_superio::{I8042Device, Trigger};

use crate::exit::{ExitLatch, ExitReason};

/// Turns the controller's reset line into a VM exit.
pub struct ResetTrigger(Arc<ExitLatch>);

impl Trigger for ResetTrigger {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        self.0.request(ExitReason::Reset);
        Ok(())
    }
}

/// The controller, registered at ports 0x60..0x65 (offsets 0 = data, 4 = command/status).
pub struct I8042(I8042Device<ResetTrigger>);

impl I8042 {
    pub fn new(latch: Arc<ExitLatch>) -> Self {
        I8042(I8042Device::new(ResetTrigger(latch)))
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (Some(b), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *b = self.0.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&b), Ok(off)) = (data.first(), u8::try_from(offset))
            && let Err(e) = self.0.write(off, b)
        {
            log::warn!("i8042: write {b:#x} at offset {off}: {e:?}");
        }
    }
}
