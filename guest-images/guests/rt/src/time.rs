//! Time from the TSC, scaled with the frequency the VMM reports in the boot info.

/// Reads the time-stamp counter.
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Converts TSC ticks to nanoseconds (0 if the frequency is unknown).
pub fn ticks_to_ns(ticks: u64) -> u64 {
    let khz = crate::boot_info().tsc_khz;
    if khz == 0 {
        0
    } else {
        (u128::from(ticks) * 1_000_000 / u128::from(khz)) as u64
    }
}
