//! The boot-info block from the VMM and the command line it points to.

use core::sync::atomic::{AtomicU64, Ordering};
use guest_abi::{BOOT_INFO_MAGIC, BOOT_INFO_VERSION, BootInfo};

static INFO: AtomicU64 = AtomicU64::new(0);

/// Records and checks the boot info at `addr`.
pub(crate) fn init(addr: u64) -> Result<(), ()> {
    if addr == 0 || !addr.is_multiple_of(8) || addr >= 0x10_0000 {
        return Err(());
    }
    // SAFETY: the VMM identity-maps low memory; the address is aligned and below 1 MiB.
    let info = unsafe { core::ptr::read_volatile(addr as *const BootInfo) };
    let cmdline_ok = info.cmdline_len <= 4096
        && info
            .cmdline_addr
            .checked_add(info.cmdline_len)
            .is_some_and(|e| e <= info.mem_below_4g);
    if info.magic != BOOT_INFO_MAGIC || info.version != BOOT_INFO_VERSION || !cmdline_ok {
        return Err(());
    }
    INFO.store(addr, Ordering::Relaxed);
    Ok(())
}

/// The boot info the VMM handed over.
pub fn boot_info() -> BootInfo {
    let addr = INFO.load(Ordering::Relaxed);
    if addr == 0 {
        return BootInfo::default();
    }
    // SAFETY: `init` validated this address before storing it.
    unsafe { core::ptr::read_volatile(addr as *const BootInfo) }
}

/// The command line (empty if absent or not UTF-8).
pub fn args() -> &'static str {
    let info = boot_info();
    if info.cmdline_len == 0 {
        return "";
    }
    // SAFETY: `init` checked the range lies in RAM below 4 GiB, which is identity-mapped and
    // which the VMM does not change while the guest runs.
    let bytes = unsafe {
        core::slice::from_raw_parts(info.cmdline_addr as *const u8, info.cmdline_len as usize)
    };
    core::str::from_utf8(bytes).unwrap_or("")
}

/// The value of `key=value` on the command line.
pub fn arg(key: &str) -> Option<&'static str> {
    args()
        .split_ascii_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}
