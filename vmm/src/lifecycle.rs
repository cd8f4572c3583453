//! The event-loop subscriber for the VM's life: the exit latch, SIGINT/SIGTERM (delivered
//! through socket pairs by signal-hook), the `--timeout` timer, and a periodic tick that
//! retries console input the UART could not take yet.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::timerfd::TimerFd;

use crate::devices::serial::ConsoleInput;
use crate::exit::{ExitLatch, ExitReason};

const TAG_LATCH: u32 = 0;
const TAG_SIGNAL: u32 = 1;
const TAG_TIMEOUT: u32 = 2;
const TAG_TICK: u32 = 3;

/// Console-input retry period.
const TICK: Duration = Duration::from_millis(20);

/// See the module documentation.
pub struct Lifecycle {
    latch: Arc<ExitLatch>,
    signals: Vec<(i32, UnixStream)>,
    timeout: Option<TimerFd>,
    tick: TimerFd,
    console: Option<Arc<Mutex<ConsoleInput>>>,
}

impl Lifecycle {
    /// Registers SIGINT and SIGTERM, and arms the timeout if there is one.
    pub fn new(
        latch: Arc<ExitLatch>,
        timeout: Option<Duration>,
        console: Option<Arc<Mutex<ConsoleInput>>>,
    ) -> std::io::Result<Self> {
        let mut signals = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM] {
            let (rx, tx) = UnixStream::pair()?;
            rx.set_nonblocking(true)?;
            signal_hook::low_level::pipe::register(sig, tx)?;
            signals.push((sig, rx));
        }
        let timeout = match timeout {
            Some(d) => {
                let mut t = TimerFd::new()?;
                t.reset(d.max(Duration::from_millis(1)), None)?;
                Some(t)
            }
            None => None,
        };
        let mut tick = TimerFd::new()?;
        tick.reset(TICK, Some(TICK))?;
        Ok(Lifecycle {
            latch,
            signals,
            timeout,
            tick,
            console,
        })
    }
}

impl MutEventSubscriber for Lifecycle {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        match events.data() {
            TAG_LATCH => {
                let _ = self.latch.event().read();
            }
            TAG_SIGNAL => {
                let fd = events.fd();
                if let Some((sig, s)) = self.signals.iter_mut().find(|(_, s)| s.as_raw_fd() == fd) {
                    let mut buf = [0u8; 16];
                    let _ = s.read(&mut buf);
                    self.latch.request(ExitReason::Signal(*sig));
                }
            }
            TAG_TIMEOUT => self.latch.request(ExitReason::Timeout),
            TAG_TICK => {
                let _ = self.tick.wait();
                if let Some(c) = &self.console {
                    c.lock().unwrap_or_else(PoisonError::into_inner).flush();
                }
            }
            _ => {}
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let mut add = |fd: &dyn AsRawFd, tag| {
            if let Err(e) = ops.add(Events::with_data_raw(fd.as_raw_fd(), tag, EventSet::IN)) {
                log::error!("event loop: register fd {}: {e:?}", fd.as_raw_fd());
            }
        };
        add(self.latch.event(), TAG_LATCH);
        for (_, s) in &self.signals {
            add(s, TAG_SIGNAL);
        }
        if let Some(t) = &self.timeout {
            add(t, TAG_TIMEOUT);
        }
        add(&self.tick, TAG_TICK);
    }
}
