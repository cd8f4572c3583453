//! Minimal legacy devices a stock Linux kernel touches: the CMOS/RTC index and data ports
//! (0x70/0x71; every register reads zero, so no update is ever in progress) and the POST/delay
//! port 0x80 (writes ignored).

use mmio::BusDevice;

/// CMOS: remembers the index; data reads zero, writes are dropped.
#[derive(Default)]
pub struct Cmos {
    index: u8,
}

impl Cmos {
    /// A CMOS whose index register holds `index` (a restored snapshot).
    pub fn with_index(index: u8) -> Self {
        Cmos {
            index: index & 0x7f,
        }
    }

    /// The index register.
    pub fn index(&self) -> u8 {
        self.index
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
