//! Saved contexts of the cuda engine: a sliced launch is (space, module, entry, launch shape,
//! parameters, next block); a copy job is (space, src, dst, len, bytes done). Nothing of the GPU
//! is saved: blocks before `next_block` have finished and their effects are in memory.
//!
//! Byte layout, little endian: the project's one container ([`snapfmt`], magic `PGPUCUDA`,
//! version 3; version 2 had no container, its payload right after the magic) with one `JOB\0`
//! section: kind (u8), space (u64), then for a launch:
//! module (u64), grid (3 × u32), block (3 × u32), dynamic shared (u32), next block (u64),
//! entry length (u32) + entry bytes, params length (u32) + param bytes; for a copy: src, dst,
//! len, done (u64 each); for a checkpointed launch (kind 3) the launch's fields (next block 0)
//! then the save area: length (u64) + bytes (the GPU state is in it); kind 4 is the same for a
//! launch of a restarting entry in the entry's checkpoint form (escalated, `pgpu::ckpt::stalled`,
//! or not provably idempotent, `pgpu::ckpt::choose`; readers before it refuse the kind by
//! number). Decoding treats the bytes as hostile (lengths bounded, no trailing bytes,
//! progress within the job).

use std::any::Any;

use crate::engine::{EngineLimits, Job, LiveContext, ModuleId, SpaceId};

const FORMAT: snapfmt::Format = snapfmt::Format {
    magic: *b"PGPUCUDA",
    version: 3,
    name: "cuda engine context",
};
const JOB: snapfmt::Id = *b"JOB\0";
const JOB_VERSION: u32 = 1;
const KIND_COPY: u8 = 1;
const KIND_LAUNCH: u8 = 2;
const KIND_CKPT: u8 = 3;
const KIND_CKPT_SAVE: u8 = 4;

/// A launch's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchState {
    pub space: SpaceId,
    pub module: ModuleId,
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared: u32,
    pub params: Vec<u8>,
    /// Linear index of the first block not yet run.
    pub next_block: u64,
}

impl LaunchState {
    /// Blocks in the grid.
    pub fn total_blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }
}

/// A copy's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyState {
    pub space: SpaceId,
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    pub done: u64,
}

/// What was preempted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Copy(CopyState),
    Launch(LaunchState),
}

impl JobState {
    /// The state of a job not started yet.
    pub fn from_job(job: &Job) -> JobState {
        match job {
            Job::Copy(c) => JobState::Copy(CopyState {
                space: c.space,
                src: c.src,
                dst: c.dst,
                len: c.len,
                done: 0,
            }),
            Job::Launch(l) => JobState::Launch(LaunchState {
                space: l.space,
                module: l.module,
                entry: l.entry.clone(),
                grid: l.grid,
                block: l.block,
                dynamic_shared: l.dynamic_shared,
                params: l.params.clone(),
                next_block: 0,
            }),
        }
    }
}

/// A checkpointed launch between runs: its device buffer (flag and save area) and the
/// records' status words after the last run.
#[derive(Debug)]
pub struct CkLive {
    pub buf: super::ckmem::DevBuf,
    /// Bytes of the save area the launch uses.
    pub area_len: u64,
    pub statuses: Vec<u32>,
    /// The last run restarted its threads and finished none (`ckpt::stalled`): the next run
    /// escalates to the entry's checkpoint form.
    pub stalled: bool,
    /// The launch runs in the checkpoint form of a restarting entry (escalated, or not
    /// provably idempotent from its first run).
    pub escalated: bool,
}

/// How `run_ck` starts a checkpointed launch.
pub(crate) enum CkStart {
    /// A fresh launch with a save area of `need` bytes; `save_form`: in the checkpoint form of
    /// a restarting entry (its context is then kind 4, as an escalated one).
    Fresh { need: u64, save_form: bool },
    /// A resume from the launch's state after its last run.
    Resume(CkLive),
}

/// The in-memory context of one cuda engine.
#[derive(Debug)]
pub struct Live {
    /// Identity of the engine that made it.
    pub engine: u64,
    pub job: JobState,
    /// Set for a checkpointed launch (`job` is its launch).
    pub ck: Option<CkLive>,
}

impl LiveContext for Live {
    fn to_bytes(&self) -> Vec<u8> {
        match &self.ck {
            None => encode(&self.job),
            Some(c) => {
                let area = c.buf.read_area(c.area_len).unwrap_or_else(|e| {
                    log::error!("cuda: reading a save area failed: {e}");
                    Vec::new()
                });
                encode_ck(&self.job, &area, c.escalated)
            }
        }
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// The job section's payload.
fn payload(job: &JobState) -> Vec<u8> {
    let mut o = Vec::new();
    match job {
        JobState::Copy(c) => {
            o.push(KIND_COPY);
            for v in [c.space.0, c.src, c.dst, c.len, c.done] {
                o.extend_from_slice(&v.to_le_bytes());
            }
        }
        JobState::Launch(l) => {
            o.push(KIND_LAUNCH);
            o.extend_from_slice(&l.space.0.to_le_bytes());
            o.extend_from_slice(&l.module.0.to_le_bytes());
            for v in l.grid.iter().chain(&l.block).chain([&l.dynamic_shared]) {
                o.extend_from_slice(&v.to_le_bytes());
            }
            o.extend_from_slice(&l.next_block.to_le_bytes());
            for b in [l.entry.as_bytes(), &l.params] {
                o.extend_from_slice(&(b.len() as u32).to_le_bytes());
                o.extend_from_slice(b);
            }
        }
    }
    o
}

fn wrap(payload: &[u8]) -> Vec<u8> {
    let mut w = snapfmt::Writer::with_capacity(&FORMAT, payload.len());
    w.section(JOB, JOB_VERSION, payload);
    w.finish()
}

/// Bytes of a context.
pub fn encode(job: &JobState) -> Vec<u8> {
    wrap(&payload(job))
}

/// Bytes of a checkpointed launch's context with its save area (`escalated`: in the checkpoint
/// form of a restarting entry).
pub fn encode_ck(job: &JobState, area: &[u8], escalated: bool) -> Vec<u8> {
    let mut o = payload(job);
    o[0] = if escalated { KIND_CKPT_SAVE } else { KIND_CKPT };
    o.extend_from_slice(&(area.len() as u64).to_le_bytes());
    o.extend_from_slice(area);
    wrap(&o)
}

/// The job section's reader: [`snapfmt::Dec`] with this module's string errors.
struct Reader<'a>(snapfmt::Dec<'a>);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        self.0.take(n).map_err(|_| "context truncated".to_string())
    }
    fn u32(&mut self) -> Result<u32, String> {
        self.0.u32().map_err(|_| "context truncated".to_string())
    }
    fn u64(&mut self) -> Result<u64, String> {
        self.0.u64().map_err(|_| "context truncated".to_string())
    }
    fn blob(&mut self, max: usize, what: &str) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(format!("{what} too long ({n} bytes)"));
        }
        self.take(n)
    }
}

/// Decodes hostile bytes of a context without a save area.
#[cfg(test)]
pub fn decode(bytes: &[u8], limits: &EngineLimits) -> Result<JobState, String> {
    match decode_full(bytes, limits, 0)? {
        (job, None) => Ok(job),
        (_, Some(_)) => Err("a checkpointed context".into()),
    }
}

/// A checkpointed launch's save area as its context bytes carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CkArea {
    pub bytes: Vec<u8>,
    /// In the checkpoint form of a restarting entry (escalated).
    pub escalated: bool,
}

/// Decodes hostile bytes; the area without its form (tests).
#[cfg(test)]
pub fn decode_full(
    bytes: &[u8],
    limits: &EngineLimits,
    max_area: u64,
) -> Result<(JobState, Option<Vec<u8>>), String> {
    decode_ck(bytes, limits, max_area).map(|(j, a)| (j, a.map(|a| a.bytes)))
}

/// Decodes hostile bytes; `limits` bound the entry name and parameter sizes, `max_area` the
/// save area of a checkpointed launch (returned with it).
pub fn decode_ck(
    bytes: &[u8],
    limits: &EngineLimits,
    max_area: u64,
) -> Result<(JobState, Option<CkArea>), String> {
    let mut area = None;
    let secs = snapfmt::read(&FORMAT, bytes, 1).map_err(|e| match e {
        snapfmt::FrameError::Magic { .. } => "not a pgpu cuda context".to_string(),
        e => e.to_string(),
    })?;
    let payload = match secs.as_slice() {
        [s] if s.id == JOB => s.payload_v(JOB_VERSION).map_err(|e| e.to_string())?,
        _ => return Err("not one job section".into()),
    };
    let mut r = Reader(snapfmt::Dec::new(payload, "cuda context"));
    let kind = r.take(1)?[0];
    let space = SpaceId(r.u64()?);
    let job = match kind {
        KIND_COPY => {
            let (src, dst, len, done) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
            if done > len {
                return Err(format!("copy progress {done:#x} beyond length {len:#x}"));
            }
            JobState::Copy(CopyState {
                space,
                src,
                dst,
                len,
                done,
            })
        }
        KIND_LAUNCH | KIND_CKPT | KIND_CKPT_SAVE => {
            let module = ModuleId(r.u64()?);
            let mut dims = [0u32; 7];
            for d in &mut dims {
                *d = r.u32()?;
            }
            let next_block = r.u64()?;
            let entry = r.blob(limits.max_entry_name, "entry name")?;
            let entry = std::str::from_utf8(entry)
                .map_err(|_| "entry name is not UTF-8")?
                .to_string();
            let params = r.blob(limits.max_param_bytes, "parameter buffer")?.to_vec();
            let l = LaunchState {
                space,
                module,
                entry,
                grid: [dims[0], dims[1], dims[2]],
                block: [dims[3], dims[4], dims[5]],
                dynamic_shared: dims[6],
                params,
                next_block,
            };
            if l.next_block > l.total_blocks() {
                return Err(format!("next block {next_block} beyond the grid"));
            }
            if kind != KIND_LAUNCH {
                let n = r.u64()?;
                if n > max_area || l.next_block != 0 {
                    return Err(format!("save area of {n} bytes over the limit {max_area}"));
                }
                area = Some(CkArea {
                    bytes: r.take(n as usize)?.to_vec(),
                    escalated: kind == KIND_CKPT_SAVE,
                });
            }
            JobState::Launch(l)
        }
        k => return Err(format!("unknown job kind {k}")),
    };
    if r.0.left() != 0 {
        return Err("trailing bytes".into());
    }
    Ok((job, area))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_truncation_fails() {
        let lim = EngineLimits::default();
        let jobs = [
            JobState::Copy(CopyState {
                space: SpaceId(2),
                src: 1,
                dst: 2,
                len: 9,
                done: 3,
            }),
            JobState::Launch(LaunchState {
                space: SpaceId(1),
                module: ModuleId(4),
                entry: "k".into(),
                grid: [4, 2, 1],
                block: [32, 1, 1],
                dynamic_shared: 0,
                params: vec![1, 2, 3],
                next_block: 5,
            }),
        ];
        for j in jobs {
            let b = encode(&j);
            assert_eq!(decode(&b, &lim), Ok(j));
            for cut in 0..b.len() {
                assert!(decode(&b[..cut], &lim).is_err());
            }
            let mut long = b.clone();
            long.push(0);
            assert!(decode(&long, &lim).is_err());
        }
        let bad = JobState::Launch(LaunchState {
            space: SpaceId(1),
            module: ModuleId(4),
            entry: "k".into(),
            grid: [4, 2, 1],
            block: [32, 1, 1],
            dynamic_shared: 0,
            params: vec![],
            next_block: 9,
        });
        assert!(decode(&encode(&bad), &lim).is_err());
    }

    #[test]
    fn checkpoint_contexts_carry_their_area_and_are_bounded() {
        let lim = EngineLimits::default();
        let job = JobState::Launch(LaunchState {
            space: SpaceId(1),
            module: ModuleId(4),
            entry: "k".into(),
            grid: [4, 1, 1],
            block: [32, 1, 1],
            dynamic_shared: 0,
            params: vec![9; 12],
            next_block: 0,
        });
        let area: Vec<u8> = (0..=255).collect();
        let e = encode_ck(&job, &area, true);
        assert_eq!(
            decode_ck(&e, &lim, 256),
            Ok((
                job.clone(),
                Some(CkArea {
                    bytes: area.clone(),
                    escalated: true
                })
            ))
        );
        let b = encode_ck(&job, &area, false);
        assert_eq!(
            decode_full(&b, &lim, 256),
            Ok((job.clone(), Some(area.clone())))
        );
        // Over the area limit, truncated, trailing bytes, or a plain decode: refused.
        assert!(decode_full(&b, &lim, 255).is_err());
        for cut in 0..b.len() {
            assert!(decode_full(&b[..cut], &lim, 256).is_err(), "cut {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(decode_full(&long, &lim, 256).is_err());
        assert!(decode(&b, &lim).is_err());
        // A huge claimed length is refused before any allocation.
        let mut p = payload(&job);
        p[0] = KIND_CKPT;
        p.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_full(&wrap(&p), &lim, u64::MAX).is_err());
        // Version 2 (no container: the payload right after the magic) is refused by its
        // container version (what its first payload bytes read as), never decoded.
        let mut old = b"PGPUCUDA".to_vec();
        old.extend_from_slice(&payload(&job));
        assert!(
            decode_full(&old, &lim, 0)
                .unwrap_err()
                .contains("format version")
        );
    }
}
