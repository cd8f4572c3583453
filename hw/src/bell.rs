//! The doorbell page (docs/hardware.md, "Exitless submission"): a 4 KiB page of guest RAM the
//! guest names in `BELL_PAGE_LO/_HI` (CAPS bit 5). The guest writes GP_PUT values into it
//! instead of the trapped `GP_PUT[n]` register; the device polls it while it is active and
//! mirrors GP_GET and CHAN_STATUS into it, so that neither submitting nor watching a channel
//! traps. Byte offsets of its u32 fields (little-endian).

/// Size and alignment of the page.
pub const PAGE_BYTES: u64 = 4096;
/// `PUT[n]` (guest → device): GP_PUT of channel n, at `PUT + 4n`.
pub const PUT: u64 = 0x000;
/// `GET[n]` (device → guest): GP_GET of channel n, at `GET + 4n`.
pub const GET: u64 = 0x080;
/// `STATUS[n]` (device → guest): CHAN_STATUS of channel n, at `STATUS + 4n`.
pub const STATUS: u64 = 0x100;
/// `WAKE` (device → guest): non-zero while the device is not polling the page; a guest that
/// changed a `PUT[n]` must then also write that value to the trapped `GP_PUT[n]`.
pub const WAKE: u64 = 0x180;

/// `PUT[n]`'s offset.
pub const fn put(n: u32) -> u64 {
    PUT + 4 * n as u64
}
/// `GET[n]`'s offset.
pub const fn get(n: u32) -> u64 {
    GET + 4 * n as u64
}
/// `STATUS[n]`'s offset.
pub const fn status(n: u32) -> u64 {
    STATUS + 4 * n as u64
}
