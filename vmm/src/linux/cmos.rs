//! Minimal legacy devices a stock Linux kernel touches: the CMOS/RTC index and data ports
//! (0x70/0x71; every register reads zero, so no update is ever in progress) and the POST/delay
//! port 0x80 (writes ignored).

use mmio::BusDevice;
use snapfmt::{Dec, Enc, Id};

use crate::persist::{Persist, PersistError};
use crate::snapshot::format::{DecodeError, tag};

/// CMOS: remembers the index; data reads zero, writes are dropped.
#[derive(Default)]
pub struct Cmos {
    index: u8,
}

impl Cmos {
    /// The index register.
    pub fn index(&self) -> u8 {
        self.index
    }
}

/// The index register: one byte below 0x80.
impl Persist for Cmos {
    type State = u8;
    const SECTION: Id = tag::CMOS;
    const VERSION: u32 = 1;

    fn save(&self) -> u8 {
        self.index
    }

    fn restore(&mut self, index: &u8) -> Result<(), PersistError> {
        self.index = index & 0x7f;
        Ok(())
    }

    fn encode(index: &u8, e: &mut Enc) {
        e.u8(*index);
    }

    fn decode(d: &mut Dec<'_>) -> Result<u8, DecodeError> {
        match d.at("CMOS section").u8()? {
            i if i < 0x80 => Ok(i),
            i => Err(DecodeError::Invalid {
                what: "CMOS section",
                detail: format!("index {i:#x}, not below 0x80"),
            }),
        }
    }
}

impl BusDevice for Cmos {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == 0
            && let Some(b) = data.first_mut()
        {
            *b = self.index;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == 0
            && let Some(&b) = data.first()
        {
            // Bit 7 is the NMI mask, not part of the index.
            self.index = b & 0x7f;
        }
    }
}

/// Port 0x80: Linux writes it as an I/O delay.
pub struct PostPort;

impl BusDevice for PostPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}
