//! `count`: a deterministic, long-running guest for snapshot and pause tests. For steps= steps
//! (default 40) it checks that its buffer of mib= MiB (default 4) still holds the previous
//! step's pattern, fills it with the next, prints `COUNT step=.. sum=.. f=..` (a wrapping sum
//! and a floating-point accumulator that lives in SSE registers), checks that the TSC never
//! went backwards, and sleeps ms= ms (default 25) on the local APIC timer. Prints `COUNT done
//! steps=..` and exits 0; exit 10 if memory, the TSC or the arithmetic came back wrong, 11 on a
//! bad argument. The output does not depend on timing, so a run that was paused, or
//! snapshotted and restored, prints exactly what an uninterrupted run prints.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec;
use guest_rt::println;

guest_rt::entry!(main);

fn arg(key: &str, default: u64, max: u64) -> Option<u64> {
    match guest_rt::arg(key) {
        None => Some(default),
        Some(v) => v.parse::<u64>().ok().filter(|n| (1..=max).contains(n)),
    }
}

/// Fills `buf` with step `step`'s pattern; returns its wrapping sum.
fn fill(buf: &mut [u64], step: u64) -> u64 {
    let mut x = step.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut sum = 0u64;
    for w in buf.iter_mut() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *w = x;
        sum = sum.wrapping_add(x);
    }
    sum
}

fn main() -> u8 {
    let (Some(steps), Some(mib), Some(ms)) = (
        arg("steps", 40, 1_000_000),
        arg("mib", 4, 1024),
        arg("ms", 25, 4_000),
    ) else {
        println!("count: bad argument (steps=1.., mib=1..1024, ms=1..4000)");
        return 11;
    };
    guest_rt::apic::enable();
    let words = (mib << 20) as usize / 8;
    let mut buf = vec![0u64; words];
    let mut f = 1.0f64;
    let mut last_tsc = guest_rt::time::rdtsc();
    let mut prev_sum = 0u64;
    println!("COUNT start steps={steps} mib={mib}");
    for step in 1..=steps {
        let held = buf.iter().fold(0u64, |a, w| a.wrapping_add(*w));
        if held != prev_sum {
            println!("COUNT memory lost at step={step}: {held:016x} != {prev_sum:016x}");
            return 10;
        }
        let sum = fill(&mut buf, step);
        f = f * 1.000_1 + (sum % 1000) as f64 / 7.0;
        println!("COUNT step={step} sum={sum:016x} f={f:.6}");
        prev_sum = sum;
        let tsc = guest_rt::time::rdtsc();
        if tsc < last_tsc {
            println!("COUNT TSC went back at step={step}");
            return 10;
        }
        last_tsc = tsc;
        guest_rt::apic::wait(ms * 1_000_000);
    }
    println!("COUNT done steps={steps} f={f:.6}");
    0
}
