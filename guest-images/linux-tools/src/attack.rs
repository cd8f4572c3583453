//! `vgpu-run attack [only=NAME] [mode=full]`: the `attack` guest's escape attempts that make
//! sense from Linux user space, run through the same code (guest-programs' `attacks` module,
//! compiled in here): page-table entries aimed outside the partition (VRAM past its end, guest
//! RAM past its end, the local APIC), register writes naming channels beyond the quota or VRAM
//! past its end, a malformed GPFIFO and pushbuffer, garbage PTX, a kernel writing through an
//! unmapped pointer and a kernel that never ends. Prints `ATTACK name=.. contained=<0|1>
//! aim=.. fault=.. sanity=<0|1>` per attempt (contained: an expected fault came back, nothing
//! leaked, and a correct vecadd still ran right afterwards) and exits 0 only if all were.

use gpu_driver::mmu::{self, Target};
use gpu_driver::push::method;
use gpu_driver::suite_run::{self, Options};
use gpu_driver::{Channel, Error, FaultKind, FaultKind::*, Gpu, regs};

use crate::ToolError;
use crate::args::Args;
use crate::platform::LinuxGpu;
use crate::run_suite;

#[path = "../../guests/programs/src/attacks.rs"]
#[allow(dead_code)]
mod attacks;

use attacks::{Attempt, Ctx};

/// End of guest RAM below 4 GiB: the last `System RAM` line of /proc/iomem (the `memmap=`
/// reservation inside it stays RAM for the GPU's purposes).
pub fn ram_end(iomem: &str) -> Option<u64> {
    iomem
        .lines()
        .filter(|l| !l.starts_with(' ') && l.ends_with(": System RAM"))
        .filter_map(|l| {
            let range = l.split(':').next()?.trim();
            let (_, end) = range.split_once('-')?;
            u64::from_str_radix(end, 16).ok()?.checked_add(1)
        })
        .filter(|&e| e <= 1 << 32)
        .max()
}

struct Run<'a> {
    total: usize,
    contained: usize,
    only: Option<&'a str>,
}

fn sanity(gpu: &mut Gpu<LinuxGpu>, ch: &mut Channel) -> bool {
    let inst = suite::find("vecadd").map(|w| w.instance(suite::Size::Small));
    inst.is_some_and(|i| suite_run::run_instance(gpu, ch, &i, Options::default()).ok)
}

fn report(
    gpu: &mut Gpu<LinuxGpu>,
    ch: &mut Channel,
    run: &mut Run,
    name: &str,
    expected: &[FaultKind],
    r: Result<Attempt, Error>,
) {
    let sanity = sanity(gpu, ch);
    let (ok, aim, faults, note) = match r {
        Ok(a) => {
            let hit = a.faults.iter().any(|k| expected.contains(k));
            let names: Vec<&str> = a.faults.iter().map(|k| k.name()).collect();
            (
                hit && a.breach.is_none(),
                a.aim,
                names.join(","),
                a.breach.unwrap_or_default(),
            )
        }
        Err(e) => (false, "-".into(), String::new(), format!("driver: {e}")),
    };
    let contained = ok && sanity;
    run.total += 1;
    run.contained += usize::from(contained);
    if !note.is_empty() {
        println!("attack: {name}: {note}");
    }
    println!(
        "ATTACK name={name} contained={} aim={aim} fault={} sanity={}",
        u8::from(contained),
        if faults.is_empty() { "none" } else { &faults },
        u8::from(sanity)
    );
}

/// The `vgpu-run attack` command.
pub fn main(a: &Args) -> Result<u8, ToolError> {
    if let Err(e) = a.only(&["only", "mode", "tables"]) {
        println!("vgpu-run: {e}");
        return Ok(2);
    }
    let iomem =
        std::fs::read_to_string("/proc/iomem").map_err(ToolError::io("read /proc/iomem"))?;
    let ram_end =
        ram_end(&iomem).ok_or_else(|| ToolError::Bad("no System RAM in /proc/iomem".into()))?;
    let (mut gpu, mut ch) = match run_suite::open(run_suite::config(a)?) {
        Ok(g) => g,
        Err(e) => {
            println!("attack: driver init: {e}");
            return Ok(3);
        }
    };
    let ctx = Ctx::new(&mut gpu, ram_end)?;
    let info = *gpu.info();
    println!(
        "attack: vram={:#x} channels={} ram_end={ram_end:#x}",
        info.vram_size, info.channels
    );
    let mut run = Run {
        total: 0,
        contained: 0,
        only: a.get("only"),
    };
    let vram_end = info.vram_size;
    let big_vram = vram_end.next_multiple_of(mmu::PAGE_2M);
    let n = info.channels;
    let code = (ctx.code.va, attacks::PTX.len() as u32);
    let (g, c) = (&mut gpu, &mut ch);
    macro_rules! attack {
        ($name:expr, $expected:expr, $body:expr) => {
            if run.only.is_none_or(|o| o == $name) {
                let r = $body;
                report(g, c, &mut run, $name, $expected, r);
            }
        };
    }
    attack!(
        "pte_vram_outside",
        &[PteVramRange],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            false,
            attacks::pte_vram(vram_end),
            format!("vram:{vram_end:#x}")
        )
    );
    attack!(
        "pde_vram_outside",
        &[PteVramRange],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            true,
            mmu::pde_big(Target::Vram, big_vram, false),
            format!("vram:{big_vram:#x}")
        )
    );
    attack!(
        "pte_sysmem_outside",
        &[PteSysmemRange],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            false,
            attacks::pte_sys(ram_end),
            format!("gpa:{ram_end:#x}")
        )
    );
    attack!(
        "pte_sysmem_mmio",
        &[PteSysmemRange],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            false,
            attacks::pte_sys(0xfee0_0000),
            "gpa:0xfee00000".into()
        )
    );
    attack!(
        "pramin_past_vram",
        &[BadRegister],
        Ok(attacks::bad_register(
            g,
            regs::PRAMIN_BASE,
            (vram_end >> 16) as u32,
            format!("vram:{vram_end:#x}")
        ))
    );
    attack!(
        "chan_inst_beyond_quota",
        &[BadChannel],
        Ok(attacks::bad_register(
            g,
            regs::chan_inst(n),
            regs::CHAN_INST_VALID | (c.instance() >> 12) as u32,
            format!("channel:{n}")
        ))
    );
    attack!(
        "doorbell_beyond_quota",
        &[BadChannel],
        Ok(attacks::bad_register(
            g,
            regs::gp_put(n),
            1,
            format!("channel:{n}")
        ))
    );
    attack!(
        "runlist_beyond_quota",
        &[BadRunlist],
        attacks::bad_runlist(g, n)
    );
    attack!(
        "gpfifo_unmapped",
        &[Unmapped, BadGpfifo],
        attacks::bad_gpfifo(g, c, ctx.pte_va + 0x10000, 512)
    );
    attack!(
        "bad_opcode",
        &[BadMethod],
        attacks::raw_words(
            g,
            c,
            &[attacks::header(2, 1, method::SEM_PAYLOAD), 0],
            "opcode:2".into()
        )
    );
    let garbage = b"this is not PTX { at all ;;";
    attack!("garbage_ptx", &[PtxError], {
        match c.stage(g, garbage, 8) {
            Ok(va) => attacks::launch(
                g,
                c,
                (va, garbage.len() as u32),
                "poke",
                Some(0),
                5_000_000_000,
                format!("va:{va:#x}"),
            ),
            Err(e) => Err(e),
        }
    });
    let hole = ctx.pte_va + 0x30000;
    attack!(
        "kernel_unmapped_pointer",
        &[KernelFault],
        attacks::launch(
            g,
            c,
            code,
            "poke",
            Some(hole),
            5_000_000_000,
            format!("va:{hole:#x}")
        )
    );
    attack!(
        "kernel_never_ends",
        &[Timeout],
        attacks::launch(g, c, code, "forever", None, 300_000_000_000, "job".into())
    );
    println!("attack: {}/{} contained", run.contained, run.total);
    Ok(if run.total > 0 && run.contained == run.total {
        0
    } else {
        1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_end_from_iomem() {
        let iomem = "00000000-00000fff : Reserved\n00001000-0009fbff : System RAM\n00100000-07ffffff : System RAM\n  01000000-01ffffff : Kernel code\n08000000-0bffffff : Reserved\n0c000000-0fffffff : System RAM\nc0000000-c001ffff : 0000:00:01.0\n";
        assert_eq!(ram_end(iomem), Some(0x1000_0000));
        assert_eq!(ram_end("c0000000-c001ffff : 0000:00:01.0\n"), None);
    }
}
