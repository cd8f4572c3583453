//! The para-virtual state in a snapshot (`mode=para`; docs/snapshot.md, "Virtual GPU", section
//! `PARA`): the address spaces the guest built with hypercalls (each page directory's PDB and
//! its validated runs), the selected page directory, the BAR3 front end's ARGS and STATUS, the
//! VRAM_ALLOC blocks and the hypercall counters. Empty for a full-mode GPU.
//!
//! Decoding checks every space as the hypercalls would have (`ParaSpaces::check_space`: valid
//! PDB, runs inside the VA window onto the VM's VRAM partition or RAM) and every block against
//! the VRAM size before anything is applied; a forged selected PDB that names no saved space is
//! refused too.

use shadow::{Aperture, GuestMapping, GuestTarget};

use super::SnapshotError;
use super::format::{Dec, Enc};
use crate::para::{MAX_RUNS, MAX_SPACES, ParaCounters, ParaSpaces, SpaceImage};
use crate::para_vram::{MAX_BLOCKS, VramAllocator};

/// Bytes of one saved run.
const RUN_BYTES: u64 = 8 + 8 + 1 + 8 + 1;

/// The most bytes a `PARA` section can need.
pub const LIMIT: u64 =
    128 + MAX_SPACES as u64 * (12 + MAX_RUNS as u64 * RUN_BYTES) + MAX_BLOCKS as u64 * 16;

/// See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParaImage {
    pub args: u64,
    pub status: u32,
    pub current: Option<u64>,
    pub spaces: Vec<SpaceImage>,
    pub blocks: Vec<(u64, u64)>,
    pub counters: [u64; 5],
}

fn counters_of(c: &ParaCounters) -> [u64; 5] {
    [
        c.hypercalls,
        c.refused,
        c.entries,
        c.pages_mapped,
        c.pages_unmapped,
    ]
}

impl ParaImage {
    /// The state of `spaces` and of the front end (`args`, `status`, `blocks`).
    pub fn capture(spaces: &ParaSpaces, front: (u64, u32, Vec<(u64, u64)>)) -> Self {
        let (list, current, counters) = spaces.export();
        ParaImage {
            args: front.0,
            status: front.1,
            current,
            spaces: list,
            blocks: front.2,
            counters: counters_of(&counters),
        }
    }

    pub fn counters(&self) -> ParaCounters {
        let [hypercalls, refused, entries, pages_mapped, pages_unmapped] = self.counters;
        ParaCounters {
            hypercalls,
            refused,
            entries,
            pages_mapped,
            pages_unmapped,
        }
    }

    /// The section's payload: empty without para state (`None`).
    pub fn encode(image: Option<&ParaImage>) -> Vec<u8> {
        let Some(p) = image else {
            return Vec::new();
        };
        let mut e = Enc::default();
        e.u8(1).u64(p.args).u32(p.status);
        for c in p.counters {
            e.u64(c);
        }
        match p.current {
            Some(c) => e.u8(1).u64(c),
            None => e.u8(0).u64(0),
        };
        e.u32(p.spaces.len() as u32);
        for s in &p.spaces {
            e.u64(s.pdb).u32(s.runs.len() as u32);
            for g in &s.runs {
                let aperture = match g.target.aperture() {
                    Aperture::Vram => 1,
                    Aperture::Sysmem => 2,
                };
                e.u64(g.va)
                    .u64(g.len)
                    .u8(aperture)
                    .u64(g.target.addr())
                    .u8(u8::from(g.read_only));
            }
        }
        e.u32(p.blocks.len() as u32);
        for &(s, l) in &p.blocks {
            e.u64(s).u64(l);
        }
        e.0
    }

    /// Decodes a `PARA` payload and checks it against `spaces` (this device's para state,
    /// `None` in full mode) and a VRAM of `vram` bytes. A para snapshot restores only into a
    /// para GPU and a full one only into a full GPU.
    pub fn decode(
        b: &[u8],
        spaces: Option<&ParaSpaces>,
        vram: u64,
    ) -> Result<Option<ParaImage>, SnapshotError> {
        let mut d = Dec::new(b, "PARA");
        let (saved, here) = (!b.is_empty(), spaces.is_some());
        if saved != here {
            let mode = |p| if p { "para" } else { "full" };
            return Err(d.bad(format!(
                "a mode={} GPU's snapshot does not restore into a mode={} GPU",
                mode(saved),
                mode(here)
            )));
        }
        let Some(spaces) = spaces else {
            return Ok(None);
        };
        if d.u8()? != 1 {
            return Err(d.bad("unknown para state version"));
        }
        let mut p = ParaImage {
            args: d.u64()?,
            status: d.u32()?,
            ..ParaImage::default()
        };
        for c in &mut p.counters {
            *c = d.u64()?;
        }
        let (has, cur) = (d.bool()?, d.u64()?);
        p.current = has.then_some(cur);
        let n = d.count(MAX_SPACES, 12, "spaces")?;
        for _ in 0..n {
            let pdb = d.u64()?;
            let runs = d.count(MAX_RUNS, RUN_BYTES as usize, "runs")?;
            let mut s = SpaceImage {
                pdb,
                runs: Vec::with_capacity(runs),
            };
            for _ in 0..runs {
                let (va, len) = (d.u64()?, d.u64()?);
                let aperture = match d.u8()? {
                    1 => Aperture::Vram,
                    2 => Aperture::Sysmem,
                    a => return Err(d.bad(format!("run at VA {va:#x}: aperture {a}"))),
                };
                let addr = d.u64()?;
                let read_only = d.bool()?;
                s.runs.push(GuestMapping {
                    va,
                    len,
                    target: GuestTarget::new(aperture, addr),
                    read_only,
                });
            }
            spaces
                .check_space(&s)
                .map_err(|e| d.bad(format!("space {pdb:#x}: {e}")))?;
            if p.spaces.iter().any(|o| o.pdb == pdb) {
                return Err(d.bad(format!("space {pdb:#x} saved twice")));
            }
            p.spaces.push(s);
        }
        if let Some(c) = p.current
            && !p.spaces.iter().any(|s| s.pdb == c)
        {
            return Err(d.bad(format!("the selected page directory {c:#x} has no space")));
        }
        let n = d.count(MAX_BLOCKS, 16, "VRAM blocks")?;
        for _ in 0..n {
            p.blocks.push((d.u64()?, d.u64()?));
        }
        VramAllocator::with_blocks(vram, &p.blocks).map_err(|e| d.bad(e))?;
        d.end()?;
        Ok(Some(p))
    }
}
