//! PCI functions as Linux's sysfs shows them (`/sys/bus/pci/devices/*`), the `lspci` command
//! (Debian's busybox-static has no lspci applet), and the BAR mappings of a function's
//! `resourceN` files (made 2 MiB at a time: [`LazyMap`]).

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::ToolError;
use crate::lazymap::LazyMap;

/// Where sysfs lists PCI functions.
pub const SYSFS_PCI: &str = "/sys/bus/pci/devices";

/// One PCI function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// `0000:00:02.0`.
    pub slot: String,
    pub dir: PathBuf,
    pub vendor: u16,
    pub device: u16,
    /// Class, subclass, programming interface (`0x030200`).
    pub class: u32,
    pub revision: u8,
    /// Memory and I/O resources: (start, end inclusive, flags) per BAR, as sysfs gives them.
    pub resources: Vec<(u64, u64, u64)>,
}

fn read_hex(path: &Path) -> Result<u64, ToolError> {
    let s = fs::read_to_string(path).map_err(ToolError::io(format!("read {}", path.display())))?;
    let t = s.trim();
    u64::from_str_radix(t.trim_start_matches("0x"), 16)
        .map_err(|_| ToolError::Bad(format!("{}: not a hex number: {t:?}", path.display())))
}

/// Parses a sysfs `resource` file: one `start end flags` line per resource.
pub fn parse_resources(text: &str) -> Vec<(u64, u64, u64)> {
    text.lines()
        .map(|l| {
            let mut n = l
                .split_whitespace()
                .map(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).unwrap_or(0));
            (
                n.next().unwrap_or(0),
                n.next().unwrap_or(0),
                n.next().unwrap_or(0),
            )
        })
        .collect()
}

impl Function {
    /// Reads the function at `dir`.
    pub fn read(dir: &Path) -> Result<Self, ToolError> {
        let slot = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let res = fs::read_to_string(dir.join("resource")).unwrap_or_default();
        Ok(Self {
            slot,
            dir: dir.to_path_buf(),
            vendor: read_hex(&dir.join("vendor"))? as u16,
            device: read_hex(&dir.join("device"))? as u16,
            class: read_hex(&dir.join("class"))? as u32,
            revision: read_hex(&dir.join("revision")).unwrap_or(0) as u8,
            resources: parse_resources(&res),
        })
    }

    /// Size of BAR `i` (0 when absent).
    pub fn bar_size(&self, i: usize) -> u64 {
        match self.resources.get(i) {
            Some(&(s, e, _)) if e > s => e - s + 1,
            _ => 0,
        }
    }

    /// Address of BAR `i`.
    pub fn bar_addr(&self, i: usize) -> u64 {
        self.resources.get(i).map_or(0, |r| r.0)
    }

    /// Turns on memory decode (through the kernel: `enable`) and bus mastering (the command
    /// register, through `config`), as a driver's probe would.
    pub fn enable(&self) -> Result<(), ToolError> {
        fs::write(self.dir.join("enable"), "1")
            .map_err(ToolError::io(format!("enable {}", self.slot)))?;
        let cfg = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join("config"))
            .map_err(ToolError::io(format!("open {} config", self.slot)))?;
        let mut cmd = [0u8; 2];
        cfg.read_exact_at(&mut cmd, 4)
            .map_err(ToolError::io("read the command register"))?;
        let v = u16::from_le_bytes(cmd) | 0x6;
        cfg.write_all_at(&v.to_le_bytes(), 4)
            .map_err(ToolError::io("write the command register"))
    }

    /// Maps BAR `i` (its `resourceN` file) read-write, uncached, 2 MiB at a time on first
    /// access.
    pub fn map_bar(&self, i: usize) -> Result<Mapping, ToolError> {
        let len = self.bar_size(i);
        if len == 0 {
            return Err(ToolError::Bad(format!(
                "{}: BAR{i} is not assigned",
                self.slot
            )));
        }
        let path = self.dir.join(format!("resource{i}"));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(ToolError::io(format!("open {}", path.display())))?;
        let len = usize::try_from(len).map_err(|_| ToolError::Bad("BAR too large".into()))?;
        let map = LazyMap::new(f, 0, len).map_err(ToolError::io(format!(
            "reserve address space for {}",
            path.display()
        )))?;
        Ok(Mapping { map })
    }
}

/// Every PCI function, sorted by slot.
pub fn scan() -> Result<Vec<Function>, ToolError> {
    let mut v = Vec::new();
    for e in fs::read_dir(SYSFS_PCI).map_err(ToolError::io(format!("list {SYSFS_PCI}")))? {
        let e = e.map_err(ToolError::io(format!("list {SYSFS_PCI}")))?;
        v.push(Function::read(&e.path())?);
    }
    v.sort_by(|a, b| a.slot.cmp(&b.slot));
    Ok(v)
}

/// The function `vendor:device`.
pub fn find(vendor: u16, device: u16) -> Result<Function, ToolError> {
    scan()?
        .into_iter()
        .find(|f| f.vendor == vendor && f.device == device)
        .ok_or(ToolError::NoGpu { vendor, device })
}

/// The name lspci gives a class (base class and subclass).
pub fn class_name(class: u32) -> &'static str {
    match class >> 8 {
        0x0000 => "Non-VGA unclassified device",
        0x0100 => "SCSI storage controller",
        0x0106 => "SATA controller",
        0x0200 => "Ethernet controller",
        0x0300 => "VGA compatible controller",
        0x0302 => "3D controller",
        0x0380 => "Display controller",
        0x0600 => "Host bridge",
        0x0601 => "ISA bridge",
        0x0604 => "PCI bridge",
        0x0700 => "Serial controller",
        0x0c03 => "USB controller",
        0xff00 => "Unassigned class",
        _ => "Device",
    }
}

/// One lspci line: `00:02.0 3D controller [0302]: Device 1234:9a01 (rev 01)`.
pub fn lspci_line(f: &Function) -> String {
    let slot = f.slot.strip_prefix("0000:").unwrap_or(&f.slot);
    let mut s = format!(
        "{slot} {} [{:04x}]: Device {:04x}:{:04x}",
        class_name(f.class),
        f.class >> 8,
        f.vendor,
        f.device
    );
    if f.revision != 0 {
        s.push_str(&format!(" (rev {:02x})", f.revision));
    }
    s
}

/// `lspci [-v]`: every function; `-v` adds the memory and I/O BARs.
pub fn lspci(argv: &[String]) -> Result<u8, ToolError> {
    let verbose = argv.iter().any(|a| a == "-v");
    for f in scan()? {
        println!("{}", lspci_line(&f));
        if verbose {
            for (i, &(s, e, flags)) in f.resources.iter().enumerate().take(6) {
                if e > s {
                    let kind = if flags & 0x100 != 0 {
                        "I/O ports"
                    } else {
                        "Memory"
                    };
                    println!("\t{kind} at {s:x} (BAR{i}, size={})", e - s + 1);
                }
            }
        }
    }
    Ok(0)
}

/// A mapped BAR (made accessible 2 MiB at a time; an access the kernel refuses to map reads
/// as all-ones and writes nothing).
#[derive(Debug)]
pub struct Mapping {
    map: LazyMap,
}

impl Mapping {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The address of `n` aligned bytes at `off`, mapped.
    fn at(&mut self, off: u64, n: usize) -> Option<*mut u8> {
        let o = usize::try_from(off).ok()?;
        if !o.is_multiple_of(n) {
            return None;
        }
        self.map.ensure(o, n)
    }

    /// Volatile 32-bit read at `off` (all-ones outside or misaligned).
    pub fn read32(&mut self, off: u64) -> u32 {
        match self.at(off, 4) {
            // SAFETY: mapped, inside the BAR and aligned (`at`); device memory is only reached
            // through volatile accesses.
            Some(p) => unsafe { std::ptr::read_volatile(p.cast::<u32>()) },
            None => u32::MAX,
        }
    }

    /// Volatile 32-bit write at `off` (ignored outside or misaligned).
    pub fn write32(&mut self, off: u64, v: u32) {
        if let Some(p) = self.at(off, 4) {
            // SAFETY: as for `read32`.
            unsafe { std::ptr::write_volatile(p.cast::<u32>(), v) }
        }
    }

    /// Volatile 64-bit read at `off` (all-ones outside or misaligned).
    pub fn read64(&mut self, off: u64) -> u64 {
        match self.at(off, 8) {
            // SAFETY: as for `read32`, 8 bytes.
            Some(p) => unsafe { std::ptr::read_volatile(p.cast::<u64>()) },
            None => u64::MAX,
        }
    }

    /// Volatile 64-bit write at `off` (ignored outside or misaligned).
    pub fn write64(&mut self, off: u64, v: u64) {
        if let Some(p) = self.at(off, 8) {
            // SAFETY: as for `read32`, 8 bytes.
            unsafe { std::ptr::write_volatile(p.cast::<u64>(), v) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_and_names() {
        let r = parse_resources(
            "0x00000000c0000000 0x00000000c001ffff 0x0000000000040200\n0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
        );
        assert_eq!(r[0], (0xc000_0000, 0xc001_ffff, 0x40200));
        let f = Function {
            slot: "0000:00:02.0".into(),
            dir: PathBuf::new(),
            vendor: 0x1234,
            device: 0x9a01,
            class: 0x030200,
            revision: 0,
            resources: r,
        };
        assert_eq!(f.bar_size(0), 0x2_0000);
        assert_eq!(f.bar_size(1), 0);
        assert_eq!(f.bar_size(7), 0);
        assert_eq!(
            lspci_line(&f),
            "00:02.0 3D controller [0302]: Device 1234:9a01"
        );
    }
}
