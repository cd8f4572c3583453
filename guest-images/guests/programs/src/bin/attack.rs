//! `attack`: tries, one by one, to make the virtual GPU reach outside the guest's partition or
//! choke on malformed work, and prints
//! `ATTACK name=<n> contained=<0|1> aim=<where> fault=<KINDS> sanity=<0|1>` per attempt:
//! contained when an expected fault kind came back, nothing leaked, and a correct job (vecadd)
//! still ran right afterwards. `aim` is the address it aimed at (`vram:`, `gpa:`, `va:`) so a
//! host test can check sentinels there. Exits 0 only if every attempt was contained.
//! `only=NAME` runs one; driver options as for `workloads`. With `--gpu mode=para` it also
//! makes hostile para-virtual calls (`fault=REFUSED:[statuses]`: refused as a whole).
#![no_std]
#![no_main]

extern crate alloc;

use FaultKind::*;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use gpu_driver::mmu::{self, Target};
use gpu_driver::push::{OP_IMMD, OP_INCR, method};
use gpu_driver::{Channel, Error, FaultKind, Gpu, para, regs};
use guest_programs::attacks::{self, Attempt, Ctx};
use guest_programs::platform::{self, BareMetal};
use guest_programs::runner;
use guest_rt::println;

guest_rt::entry!(main);

struct Run {
    total: usize,
    contained: usize,
    only: Option<&'static str>,
}

fn report(
    gpu: &mut Gpu<BareMetal>,
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
        Err(e) => (
            false,
            String::from("-"),
            String::new(),
            format!("driver: {e}"),
        ),
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

/// Whether a correct job (vecadd) still runs right.
fn sanity(gpu: &mut Gpu<BareMetal>, ch: &mut Channel) -> bool {
    let inst = suite::find("vecadd").map(|w| w.instance(suite::Size::Small));
    inst.is_some_and(|i| runner::run_instance(gpu, ch, &i, runner::RunOpts::default()).ok)
}

/// One raw para call: argument area (`None`: the driver's), op, ARG, COUNT.
type RawCall = (Option<u64>, u32, u64, u32);

/// Hostile para-virtual calls (`--gpu mode=para` only): each must come back BAD_CALL (no fault
/// record: the call is refused as a whole, nothing is read or changed) and leave the device
/// usable.
fn para_attacks(gpu: &mut Gpu<BareMetal>, ch: &mut Channel, run: &mut Run, ram_end: u64) {
    const BAD_CALL: u32 = 1;
    let vram = gpu.info().vram_size;
    let attempts: [(&str, String, Vec<RawCall>); 4] = [
        (
            "para_count_beyond_max",
            String::from("count:0xffffffff"),
            alloc::vec![
                (None, para::OP_MAP_BATCH, 0, u32::MAX),
                (None, para::OP_UNMAP_BATCH, 0, 2049),
            ],
        ),
        (
            "para_area_outside_ram",
            format!("gpa:{:#x}", ram_end - 0x1000),
            alloc::vec![
                (Some(ram_end - 0x1000), para::OP_SET_PD, 0, 0),
                (Some(0xfee0_0000), para::OP_MAP_BATCH, 0, 1),
                (Some(0x1234), para::OP_SET_PD, 0, 0),
            ],
        ),
        (
            "para_unknown_ops",
            String::from("op:0,6,7,0xff"),
            [0, 6, 7, 0xff].map(|op| (None, op, 0, 0)).to_vec(),
        ),
        (
            "para_page_directory_flood",
            String::from("pd:8-new"),
            // The driver's directory and 7 more fill the 8 a VM may have; the 8th new one is
            // refused (each call reselects the driver's own afterwards).
            (1..=8u64)
                .map(|k| (None, para::OP_SET_PD, (vram / 16 * k) & !0xfff | 1, 0))
                .collect(),
        ),
    ];
    for (name, aim, calls) in attempts {
        if run.only.is_some_and(|o| o != name) {
            continue;
        }
        let mut statuses = Vec::new();
        let mut note = String::new();
        for (area, op, arg, count) in calls {
            match gpu.para_raw(area, op, arg, count) {
                Ok(Some(st)) => statuses.push(st & 0xff),
                Ok(None) => note = String::from("not in para mode"),
                Err(e) => note = format!("driver: {e}"),
            }
        }
        let refused = match statuses.split_last() {
            Some((last, first)) if name == "para_page_directory_flood" => {
                *last == BAD_CALL && first.iter().all(|s| *s == 0)
            }
            Some(_) => statuses.iter().all(|s| *s == BAD_CALL),
            None => false,
        };
        let fault = gpu.take_fault();
        let ok = sanity(gpu, ch);
        let contained = refused && fault.is_none() && note.is_empty() && ok;
        run.total += 1;
        run.contained += usize::from(contained);
        if !note.is_empty() || fault.is_some() {
            println!("attack: {name}: {note} {fault:?}");
        }
        println!(
            "ATTACK name={name} contained={} aim={aim} fault=REFUSED:{statuses:?} sanity={}",
            u8::from(contained),
            u8::from(ok)
        );
    }
}

fn main() -> u8 {
    let cfg = platform::config_from_args();
    let mut gpu = match platform::open(cfg) {
        Ok(g) => g,
        Err(e) => {
            println!("attack: {e}");
            return guest_rt::abi::exit_codes::NO_DEVICE;
        }
    };
    let info = *gpu.info();
    let mut ch = match gpu.create_channel(0) {
        Ok(c) => c,
        Err(e) => {
            println!("attack: channel: {e}");
            return guest_rt::abi::exit_codes::GPU_FAULT;
        }
    };
    let ram_end = guest_rt::boot_info().mem_below_4g;
    let ctx = match Ctx::new(&mut gpu, ram_end) {
        Ok(c) => c,
        Err(e) => {
            println!("attack: setup: {e}");
            return guest_rt::abi::exit_codes::GPU_FAULT;
        }
    };
    println!(
        "attack: vram={:#x} channels={} va={:#x}+{:#x} ram_end={ram_end:#x}",
        info.vram_size, info.channels, info.va_base, info.va_size
    );
    let mut run = Run {
        total: 0,
        contained: 0,
        only: guest_rt::arg("only"),
    };
    let vram_end = info.vram_size;
    let big_vram = vram_end.next_multiple_of(mmu::PAGE_2M);
    let big_ram = ram_end.next_multiple_of(mmu::PAGE_2M);
    let n = info.channels;
    let code = (ctx.code.va, attacks::PTX.len() as u32);
    let g = &mut gpu;
    let c = &mut ch;
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
        "pte_vram_far",
        &[PteVramRange],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            false,
            attacks::pte_vram(vram_end * 4 + 0x1000),
            format!("vram:{:#x}", vram_end * 4 + 0x1000)
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
            String::from("gpa:0xfee00000")
        )
    );
    attack!(
        "pde_sysmem_outside",
        &[PteSysmemRange],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            true,
            mmu::pde_big(Target::Sysmem, big_ram, false),
            format!("gpa:{big_ram:#x}")
        )
    );
    attack!(
        "pte_reserved_target",
        &[BadEntry],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            false,
            0x3 | 0x1000,
            String::from("entry:0x1003")
        )
    );
    attack!(
        "pde_big_misaligned",
        &[BadEntry],
        attacks::bad_mapping(
            g,
            c,
            &ctx,
            true,
            mmu::pde_big(Target::Vram, 0x10_1000, false),
            String::from("vram:0x101000")
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
        "chan_inst_outside_vram",
        &[BadRegister, BadChannel],
        Ok(attacks::bad_register(
            g,
            regs::chan_inst(n.saturating_sub(1).min(1)),
            regs::CHAN_INST_VALID | (vram_end >> 12) as u32,
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
    if g.exitless() {
        // The doorbell page: only a page of the guest's own RAM, page aligned, is taken.
        attack!(
            "bell_page_outside_ram",
            &[BadRegister],
            Ok(attacks::bad_register(
                g,
                regs::BELL_PAGE_LO,
                (ram_end as u32 & !0xfff) | regs::BELL_ENABLE,
                format!("gpa:{ram_end:#x}")
            ))
        );
        attack!(
            "bell_page_in_the_device_hole",
            &[BadRegister],
            Ok(attacks::bad_register(
                g,
                regs::BELL_PAGE_LO,
                0xfee0_0000 | regs::BELL_ENABLE,
                String::from("gpa:0xfee00000")
            ))
        );
        attack!(
            "bell_page_misaligned",
            &[BadRegister],
            Ok(attacks::bad_register(
                g,
                regs::BELL_PAGE_LO,
                0x10_0010 | regs::BELL_ENABLE,
                String::from("gpa:0x100010")
            ))
        );
        attack!(
            "bell_put_unbound_channel",
            &[BadChannel],
            attacks::bell_put_unbound(g, c, n - 1)
        );
    }
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
        "gpfifo_bad_size",
        &[BadGpfifo, BadInstance],
        attacks::bad_gpfifo(g, c, c.ring_va(), 3)
    );
    attack!(
        "pushbuffer_unmapped",
        &[Unmapped, BadGpfifo],
        attacks::raw_entry(g, c, ctx.pte_va + 0x20000, 4)
    );
    attack!(
        "bad_opcode",
        &[BadMethod],
        attacks::raw_words(
            g,
            c,
            &[attacks::header(2, 1, method::SEM_PAYLOAD), 0],
            String::from("opcode:2")
        )
    );
    attack!(
        "unknown_method",
        &[BadMethod],
        attacks::raw_words(
            g,
            c,
            &[attacks::header(OP_IMMD, 0, 0x0ffc)],
            String::from("method:0xffc")
        )
    );
    attack!(
        "method_cut_short",
        &[BadMethod],
        attacks::raw_words(
            g,
            c,
            &[attacks::header(OP_INCR, 4, method::SEM_ADDR_HI), 0],
            String::from("method:0x10")
        )
    );
    attack!(
        "reserved_subchannel",
        &[BadMethod],
        attacks::raw_words(
            g,
            c,
            &[
                attacks::header(OP_INCR, 1, method::SEM_PAYLOAD) | 1 << 13,
                0
            ],
            String::from("method:0x18")
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
        "copy_into_readonly",
        &[ReadOnly],
        copy_into_readonly(g, c, &ctx)
    );
    attack!(
        "kernel_never_ends",
        &[Timeout],
        attacks::launch(
            g,
            c,
            code,
            "forever",
            None,
            300_000_000_000,
            String::from("job")
        )
    );
    if gpu.is_para() {
        para_attacks(&mut gpu, &mut ch, &mut run, ram_end);
    }
    println!("attack: {}/{} contained", run.contained, run.total);
    if run.total > 0 && run.contained == run.total {
        0
    } else {
        guest_rt::abi::exit_codes::CHECK_FAILED
    }
}

fn copy_into_readonly(
    gpu: &mut Gpu<BareMetal>,
    ch: &mut Channel,
    ctx: &Ctx,
) -> Result<Attempt, Error> {
    let va = ctx.pte_va + 0x40000;
    gpu.map(va, 4096, Target::Sysmem, ctx.scratch.gpa, true)?;
    let mut a = attacks::copy_attempt(gpu, ch, ctx, va)?;
    gpu.set_pte_raw(va, 0)?;
    gpu.flush_tlb();
    a.aim = format!("va:{va:#x}");
    Ok(a)
}
