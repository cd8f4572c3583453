//! The worker's sections: CHAN (per-channel method registers and pushbuffer position, the
//! round-robin position, the eager flush epoch), MODS (cached module texts) and CTXT (jobs
//! preempted by pauses, with their backend), and their validated decoding.

use std::sync::Arc;

use pgpu::SavedContext;

use super::SnapshotError;
use super::format::{Dec, Enc};
use super::image::{ChanImage, RegsImage, SuspendedImage, WorkerImage};
use crate::methods::MethodState;
use crate::pushbuf::{DecodeError, MethodCall};
use crate::regs;

/// Decode errors in the snapshot: (tag, index, header, extra).
fn decode_error_fields(e: &DecodeError) -> (u8, u32, u32, u32) {
    match *e {
        DecodeError::Opcode {
            index,
            opcode,
            header,
        } => (1, index as u32, header, opcode),
        DecodeError::Reserved { index, header } => (2, index as u32, header, 0),
        DecodeError::Truncated {
            index,
            header,
            count,
        } => (3, index as u32, header, count),
    }
}

impl WorkerImage {
    /// The CHAN section (channels, round-robin position, flush epoch).
    pub fn encode_chans(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.seen_epoch).u32(self.next);
        e.u32(self.chans.len() as u32);
        for c in &self.chans {
            let Some(c) = c else {
                e.u8(0);
                continue;
            };
            e.u8(1);
            e.u32(MethodState::WORDS as u32);
            for w in c.methods.words() {
                e.u32(*w);
            }
            e.u32(c.calls.len() as u32);
            for call in &c.calls {
                e.u32(call.addr).u32(call.data);
            }
            e.u32(c.pos).u8(u8::from(c.in_segment));
            match &c.decode_error {
                None => {
                    e.u8(0);
                }
                Some(err) => {
                    let (tag, index, header, extra) = decode_error_fields(err);
                    e.u8(tag).u32(index).u32(header).u32(extra);
                }
            }
        }
        e.0
    }

    /// The MODS section.
    pub fn encode_modules(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u32(self.modules.len() as u32);
        for m in &self.modules {
            e.bytes(m.text.as_bytes());
        }
        e.0
    }

    /// The CTXT section.
    pub fn encode_suspended(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u32(self.suspended.len() as u32);
        for s in &self.suspended {
            e.u32(s.channel)
                .bytes(s.backend.as_bytes())
                .u64(s.gpu_ns)
                .u32(s.module.unwrap_or(u32::MAX))
                .bytes(&s.context.to_bytes());
        }
        e.0
    }

    /// Decodes the CHAN section against the registers it goes with.
    pub fn decode_chans(
        b: &[u8],
        regs: &RegsImage,
        lazy_shadowing: bool,
    ) -> Result<(u64, u32, Vec<Option<ChanImage>>), SnapshotError> {
        let mut d = Dec::new(b, "CHAN");
        let channels = regs.chans.len();
        let seen_epoch = d.u64()?;
        if !lazy_shadowing && seen_epoch > regs.flush_epoch {
            return Err(d.bad("flush epoch handled beyond the last flush"));
        }
        let next = d.u32()?;
        if next as usize >= channels.max(1) {
            return Err(d.bad(format!("next channel {next}")));
        }
        let n = d.u32()? as usize;
        if n != channels {
            return Err(d.bad(format!("{n} channels, the device has {channels}")));
        }
        let mut chans = Vec::with_capacity(n);
        for ch in 0..n {
            if !d.bool()? {
                chans.push(None);
                continue;
            }
            let words = d.u32()? as usize;
            if words != MethodState::WORDS {
                return Err(d.bad(format!("channel {ch}: {words} method registers")));
            }
            let w = (0..words).map(|_| d.u32()).collect::<Result<Vec<_>, _>>()?;
            let methods = MethodState::from_words(&w)
                .ok_or_else(|| d.bad(format!("channel {ch}: method registers")))?;
            let ncalls = d.count(regs::MAX_PUSH as usize, 8, "method calls")?;
            let mut calls = Vec::with_capacity(ncalls);
            for _ in 0..ncalls {
                calls.push(MethodCall {
                    addr: d.u32()?,
                    data: d.u32()?,
                });
            }
            let pos = d.u32()?;
            let in_segment = d.bool()?;
            if pos as usize > calls.len() {
                return Err(d.bad(format!("channel {ch}: position {pos} past its calls")));
            }
            if in_segment && regs.chans[ch].state == regs::CHAN_UNBOUND {
                return Err(d.bad(format!("channel {ch}: in a segment but unbound")));
            }
            let decode_error = match d.u8()? {
                0 => None,
                tag => {
                    let (index, header, extra) = (d.u32()? as usize, d.u32()?, d.u32()?);
                    if index >= regs::MAX_PUSH as usize {
                        return Err(d.bad(format!("channel {ch}: decode error at word {index}")));
                    }
                    Some(match tag {
                        1 => DecodeError::Opcode {
                            index,
                            opcode: extra,
                            header,
                        },
                        2 => DecodeError::Reserved { index, header },
                        3 => DecodeError::Truncated {
                            index,
                            header,
                            count: extra,
                        },
                        t => return Err(d.bad(format!("channel {ch}: decode error kind {t}"))),
                    })
                }
            };
            chans.push(Some(ChanImage {
                methods,
                calls,
                pos,
                in_segment,
                decode_error,
            }));
        }
        d.end()?;
        Ok((seen_epoch, next, chans))
    }

    /// Decodes the MODS section: at most `max_modules` texts of at most `MAX_CODE_LEN` bytes,
    /// `max_total` in all, no text twice.
    pub fn decode_modules(
        b: &[u8],
        max_modules: usize,
        max_total: u64,
    ) -> Result<Vec<Arc<str>>, SnapshotError> {
        let mut d = Dec::new(b, "MODS");
        let n = d.count(max_modules, 4, "modules")?;
        let mut texts: Vec<Arc<str>> = Vec::with_capacity(n);
        let mut total = 0u64;
        for i in 0..n {
            let t = d.bytes(regs::MAX_CODE_LEN as usize, "module text")?;
            total += t.len() as u64;
            if total > max_total {
                return Err(d.bad(format!("module texts over {max_total} bytes")));
            }
            let t = std::str::from_utf8(t)
                .map_err(|_| d.bad(format!("module {i}: text is not UTF-8")))?;
            if texts.iter().any(|x| &**x == t) {
                return Err(d.bad(format!("module {i}: the same text twice")));
            }
            texts.push(Arc::from(t));
        }
        d.end()?;
        Ok(texts)
    }

    /// Decodes the CTXT section: each suspended job must sit on its channel's launch or copy
    /// method (one per channel), name a saved module, and all fit `max_context` bytes.
    pub fn decode_suspended(
        b: &[u8],
        chans: &[Option<ChanImage>],
        modules: usize,
        max_context: usize,
    ) -> Result<Vec<SuspendedImage>, SnapshotError> {
        let mut d = Dec::new(b, "CTXT");
        let n = d.count(chans.len(), 24, "suspended jobs")?;
        let mut out: Vec<SuspendedImage> = Vec::with_capacity(n);
        let mut left = max_context;
        for _ in 0..n {
            let s = Self::decode_one_suspended(&mut d, chans, modules, left)?;
            if out.iter().any(|o| o.channel == s.channel) {
                return Err(d.bad(format!("two suspended jobs on channel {}", s.channel)));
            }
            left -= s.context.to_bytes().len();
            out.push(s);
        }
        d.end()?;
        Ok(out)
    }

    fn decode_one_suspended(
        d: &mut Dec<'_>,
        chans: &[Option<ChanImage>],
        modules: usize,
        max_context: usize,
    ) -> Result<SuspendedImage, SnapshotError> {
        let channel = d.u32()?;
        let backend = d.string(64, "backend name")?;
        let gpu_ns = d.u64()?;
        let module = match d.u32()? {
            u32::MAX => None,
            i if (i as usize) < modules => Some(i),
            i => return Err(d.bad(format!("module index {i} of {modules}"))),
        };
        let context = d.clone_bytes(max_context, "job context")?;
        let c = chans
            .get(channel as usize)
            .and_then(|c| c.as_ref())
            .ok_or_else(|| d.bad(format!("suspended job on channel {channel} without state")))?;
        let method = c
            .in_segment
            .then(|| c.calls.get(c.pos as usize))
            .flatten()
            .map(|call| call.addr);
        let want_module = match method {
            Some(regs::method::LAUNCH) => true,
            Some(regs::method::COPY_LAUNCH) => false,
            _ => {
                return Err(d.bad(format!(
                    "suspended job on channel {channel}, which is not at a launch or copy"
                )));
            }
        };
        if want_module != module.is_some() {
            return Err(d.bad("a launch's module missing (or a copy's given)"));
        }
        Ok(SuspendedImage {
            channel,
            backend,
            gpu_ns,
            module,
            context: SavedContext::from_bytes(context),
        })
    }
}
