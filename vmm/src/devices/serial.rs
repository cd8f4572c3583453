//! The 8250 UART at COM1 (vm-superio): output to the VMM's stdout, input from its stdin, its
//! interrupt through an irqfd on IRQ 4. Console input reaches the event loop through
//! [`ConsoleInput`], fed by a reader thread so that any stdin works (terminal, pipe, file,
//! /dev/null); on a terminal, Ctrl-A x quits.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::sync::{Arc, Mutex, PoisonError};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use mmio::BusDevice;
use snapfmt::{Dec, Enc, Id};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::exit::{ExitLatch, ExitReason};
use crate::persist::{Persist, PersistError};
use crate::snapshot::format::{DecodeError, tag};

/// Raises the UART's interrupt through an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// The UART as a bus device.
pub struct SerialDevice(Serial<IrqTrigger, vm_superio::serial::NoEvents, Box<dyn Write + Send>>);

impl SerialDevice {
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        SerialDevice(Serial::new(IrqTrigger(irq), out))
    }

    /// Writes out console output held in a buffer (a partial line), so that a paused VM's
    /// output is complete up to the pause.
    pub fn flush_output(&mut self) {
        if let Err(e) = self.0.writer_mut().flush() {
            log::warn!("serial: flush console output: {e}");
        }
    }

    /// Queues console input; returns how many bytes fit in the receive FIFO.
    fn enqueue(&mut self, bytes: &[u8]) -> usize {
        self.0.enqueue_raw_bytes(bytes).unwrap_or(0)
    }
}

/// The receive FIFO (vm-superio's).
pub const SERIAL_FIFO: usize = 64;

/// The UART's registers and receive FIFO: 9 register bytes (divisor low/high, IER, IIR, LCR,
/// LSR, MCR, MSR, scratch), then the FIFO (u32 length, at most 64, and bytes).
impl Persist for SerialDevice {
    type State = SerialState;
    const SECTION: Id = tag::SERIAL;
    const VERSION: u32 = 1;

    fn save(&self) -> SerialState {
        self.0.state()
    }

    /// Rebuilds the UART in `state` with the same interrupt and output; raises the interrupt if
    /// the state has one pending.
    fn restore(&mut self, state: &SerialState) -> Result<(), PersistError> {
        let irq = self.0.interrupt_evt().0.try_clone();
        let irq = irq.map_err(|e| PersistError::Serial(format!("clone its irqfd: {e}")))?;
        let spare = irq
            .try_clone()
            .map_err(|e| PersistError::Serial(format!("clone its irqfd: {e}")))?;
        let old = std::mem::replace(
            &mut self.0,
            Serial::new(IrqTrigger(spare), Box::new(std::io::sink())),
        );
        let out = old.into_writer();
        self.0 = Serial::from_state(state, IrqTrigger(irq), NoEvents, out)
            .map_err(|e| PersistError::Serial(format!("{e:?}")))?;
        Ok(())
    }

    fn encode(s: &SerialState, e: &mut Enc) {
        e.raw(&[
            s.baud_divisor_low,
            s.baud_divisor_high,
            s.interrupt_enable,
            s.interrupt_identification,
            s.line_control,
            s.line_status,
            s.modem_control,
            s.modem_status,
            s.scratch,
        ])
        .bytes(&s.in_buffer);
    }

    fn decode(d: &mut Dec<'_>) -> Result<SerialState, DecodeError> {
        let regs = d.at("UART registers").array::<9>()?;
        let in_buffer = d.at("UART receive FIFO").bytes(SERIAL_FIFO)?.to_vec();
        Ok(SerialState {
            baud_divisor_low: regs[0],
            baud_divisor_high: regs[1],
            interrupt_enable: regs[2],
            interrupt_identification: regs[3],
            line_control: regs[4],
            line_status: regs[5],
            modem_control: regs[6],
            modem_status: regs[7],
            scratch: regs[8],
            in_buffer,
        })
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = u8::try_from(offset + i as u64)
                .map(|o| self.0.read(o))
                .unwrap_or(0xff);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, b) in data.iter().enumerate() {
            if let Ok(o) = u8::try_from(offset + i as u64)
                && let Err(e) = self.0.write(o, *b)
            {
                log::warn!("serial: write at offset {o}: {e:?}");
            }
        }
    }
}

/// Starts the stdin reader thread; returns the channel and the eventfd it signals.
pub fn spawn_stdin_reader() -> std::io::Result<(Receiver<Vec<u8>>, EventFd)> {
    let (tx, rx) = channel();
    let evt = EventFd::new(libc::EFD_NONBLOCK)?;
    let notify = evt.try_clone()?;
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 512];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() || notify.write(1).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        log::debug!("stdin: {e}");
                        break;
                    }
                }
            }
        })?;
    Ok((rx, evt))
}

/// Event-loop subscriber moving console input into the UART, holding back what does not fit
/// in its FIFO until the guest drains it (retried on every wake-up and on a timer tick).
pub struct ConsoleInput {
    serial: Arc<Mutex<SerialDevice>>,
    rx: Receiver<Vec<u8>>,
    evt: EventFd,
    pending: VecDeque<u8>,
    latch: Arc<ExitLatch>,
    interactive: bool,
    saw_ctrl_a: bool,
}

impl ConsoleInput {
    pub fn new(
        serial: Arc<Mutex<SerialDevice>>,
        rx: Receiver<Vec<u8>>,
        evt: EventFd,
        latch: Arc<ExitLatch>,
        interactive: bool,
    ) -> Self {
        ConsoleInput {
            serial,
            rx,
            evt,
            pending: VecDeque::new(),
            latch,
            interactive,
            saw_ctrl_a: false,
        }
    }

    /// Feeds pending input into the UART FIFO.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut serial = self.serial.lock().unwrap_or_else(PoisonError::into_inner);
        let (a, _) = self.pending.as_slices();
        let n = serial.enqueue(a);
        self.pending.drain(..n);
    }

    fn take(&mut self, bytes: Vec<u8>) {
        for b in bytes {
            if self.interactive {
                if self.saw_ctrl_a {
                    self.saw_ctrl_a = false;
                    if b == b'x' {
                        self.latch.request(ExitReason::ConsoleQuit);
                        return;
                    }
                } else if b == 0x01 {
                    self.saw_ctrl_a = true;
                    continue;
                }
            }
            self.pending.push_back(b);
        }
    }
}

impl MutEventSubscriber for ConsoleInput {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        if events.fd() != self.evt.as_raw_fd() {
            return;
        }
        let _ = self.evt.read();
        loop {
            match self.rx.try_recv() {
                Ok(bytes) => self.take(bytes),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    let _ = ops.remove(Events::new(&self.evt, EventSet::IN));
                    break;
                }
            }
        }
        self.flush();
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.evt, EventSet::IN)) {
            log::error!("console input: {e:?}");
        }
    }
}
