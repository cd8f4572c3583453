//! How the worker waits for work: parking for a snapshot (and taking a restored state back),
//! eager TLB flushes, the round-robin choice of a runnable channel, and exitless submission's
//! polling of the doorbell page (spin for `spin` after activity, then sleep with WAKE set).

use std::time::Instant;

use super::{ACQUIRE_POLL, CONTENDED, ChanRt, FLUSH, Worker};
use crate::regs;
impl Worker {
    /// Waits for work: a runnable channel (returned marked running, with the flush epoch), or
    /// `(FLUSH, epoch)` when a TLB flush must be handled eagerly.
    pub(super) fn pick(&mut self) -> Option<(usize, u64)> {
        let shared = self.shared.clone();
        let mut r = shared.lock();
        loop {
            if r.shutdown {
                return None;
            }
            if r.pause.requested {
                // Paused for a snapshot: park between turns, state exported.
                if !r.pause.parked {
                    r.pause.image = Some(Box::new(self.export(&r)));
                    r.pause.parked = true;
                    if let Some(h) = &self.jobs.host {
                        // Shared GPU: no Want stays queued at the daemon while paused (a
                        // grant that crosses this is handed back at once), so the VM's
                        // neighbours run on.
                        h.idle();
                    }
                    shared.parked.notify_all();
                }
                r = shared
                    .wake
                    .wait(r)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            if r.pause.parked {
                r.pause.parked = false;
                let image = r.pause.image.take();
                if std::mem::take(&mut r.pause.restored)
                    && let Some(image) = image
                {
                    self.import(*image, &r);
                }
            }
            if !self.cfg.lazy_shadowing && r.flush_epoch != self.seen_epoch {
                // One flush at a time: the flushing vCPU waits for each (see the device). Not
                // while paused: the VMM pauses vCPUs (letting a flush write finish) first, and a
                // restore puts the flush epochs in place before the worker runs again.
                self.seen_epoch += 1;
                return Some((FLUSH, self.seen_epoch));
            }
            let now = Instant::now();
            if shared.poll_bell(&mut r) {
                self.active = now;
                self.contended = false;
            }
            let n = r.chans.len();
            let mut waiting = false;
            for k in 0..n {
                let ch = (self.next + k) % n;
                let c = &r.chans[ch];
                let runnable = r.runlist.contains(&(ch as u32))
                    && c.state == regs::CHAN_PENDING
                    && (c.gp_get != c.gp_put || self.chans[ch].in_segment);
                if !runnable {
                    continue;
                }
                if let Some(since) = self.chans[ch].waiting_since
                    && since.elapsed() < ACQUIRE_POLL
                {
                    waiting = true;
                    continue;
                }
                self.next = (ch + 1) % n;
                self.spent_polling(&mut r, now);
                self.active = now;
                self.contended = false;
                if let Some(t) = r.chans[ch].rung_at {
                    r.counters
                        .path
                        .wakeup
                        .add(now.saturating_duration_since(t).as_nanos() as u64);
                }
                let epoch = r.flush_epoch;
                let c = &mut r.chans[ch];
                c.state = regs::CHAN_RUNNING;
                if c.binding != self.chans[ch].binding {
                    // A new binding: nothing of the old one's pushbuffer state carries over.
                    self.chans[ch] = ChanRt {
                        binding: c.binding,
                        ..ChanRt::default()
                    };
                }
                if std::mem::take(&mut c.inst_dirty) {
                    self.chans[ch].instance = None;
                }
                crate::state::Shared::mirror(&r, ch as u32);
                return Some((ch, epoch));
            }
            if let Some(h) = &self.jobs.host {
                // Nothing runnable: withdraw a Want (`more` may have announced work that is
                // not there, e.g. an unsatisfied acquire).
                h.idle();
            }
            if r.bell.is_some() && !waiting {
                // Exitless submission: look at the doorbell page again; keep looking for
                // `spin` after the last activity, then sleep with WAKE set.
                let now = Instant::now();
                if shared.poll_bell(&mut r) {
                    self.spent_polling(&mut r, now);
                    self.active = now;
                    self.contended = false;
                    continue;
                }
                if now.duration_since(self.active) < self.cfg.spin && !self.contended {
                    if let Some(b) = r.bell.as_mut() {
                        b.set_wake(false);
                    }
                    self.spin_since.get_or_insert(now);
                    drop(r);
                    // Polling must not starve the vCPUs where cores are scarce: give the
                    // core away if anything else wants it (returns at once otherwise). If it
                    // was taken, polling competes for a core: sleep instead until the next
                    // activity (a sleeper is woken at once; a poller waits for its turn).
                    let t = Instant::now();
                    std::thread::yield_now();
                    self.contended = self.cfg.spin_backoff && t.elapsed() > CONTENDED;
                    r = shared.lock();
                    continue;
                }
                if let Some(b) = r.bell.as_mut() {
                    b.set_wake(true);
                }
                // The guest may have written PUT[n] before it saw WAKE: look once more.
                if shared.poll_bell(&mut r) {
                    self.spent_polling(&mut r, now);
                    self.active = now;
                    self.contended = false;
                    continue;
                }
                r.counters.bell.sleeps += 1;
                self.spent_polling(&mut r, now);
            }
            r = if waiting {
                shared
                    .wake
                    .wait_timeout(r, ACQUIRE_POLL)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0)
            } else {
                let g = shared
                    .wake
                    .wait(r)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // Woken (a trapped doorbell, a register, shutdown): activity.
                self.active = Instant::now();
                self.contended = false;
                g
            };
        }
    }

    /// Charges the time polled without finding work since `spin_since` (up to `now`).
    fn spent_polling(&mut self, r: &mut crate::state::Regs, now: Instant) {
        if let Some(since) = self.spin_since.take() {
            r.counters.bell.spin_ns += now.duration_since(since).as_nanos() as u64;
        }
    }
}
