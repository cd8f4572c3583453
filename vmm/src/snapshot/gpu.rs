//! The virtual GPU's part of a snapshot (docs/snapshot.md, "Virtual GPU"): its configuration
//! written into the manifest in `--gpu` syntax (and read back, with only the backend open to
//! an override), and `gpu.bin`, the device image `vgpu::Vgpu::save` writes, with its length
//! and CRC-32 counted while it is written and checked while it is read back.

use std::io::{Read, Write};

use vgpu::GpuConfig;

/// The GPU image's file name.
pub const FILE: &str = "gpu.bin";

/// Why a snapshot's GPU configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum GpuSpecError {
    #[error("the manifest's gpu {spec:?}: {err}")]
    Parse {
        spec: String,
        err: vgpu::config::ConfigError,
    },
    #[error(
        "with --restore or --incoming, --gpu may only choose the backend (backend=sim|cuda) and \
         the vgpud to attach to (host=SOCKET[,weight=,priority=,name=,reconnect_ms=,gpu=,nice=,rt=,slice_us=]); the rest of the GPU's \
         configuration comes from the snapshot"
    )]
    Override,
}

/// `cfg` in `--gpu` syntax: every key a snapshot's device must match, written out so that it
/// does not depend on the defaults of the build or host that reads it (the `--gpu` keys'
/// declarations print it, `vgpu::config::keys`).
pub fn spec(cfg: &GpuConfig) -> String {
    cfg.spec()
}

/// The configuration a restore builds its GPU with: the manifest's `spec`, with the backend of
/// `given` (`--gpu` on the command line) if there is one, and its vgpud (`host=`, with its
/// weight, priority and name) if it names one: a VM that shared a GPU through one daemon
/// resumes attached to another (migration between daemons), or one that had its own GPU
/// attaches to a daemon, and its `copy_slots` (the restoring host's memory for its copies,
/// invisible to the guest: with `--gpu` given, its value, 0 unless set). Nothing else the guest
/// sees may change.
pub fn restore_config(spec: &str, given: Option<&GpuConfig>) -> Result<GpuConfig, GpuSpecError> {
    let mut cfg = GpuConfig::parse_written(spec).map_err(|err| GpuSpecError::Parse {
        spec: spec.to_owned(),
        err,
    })?;
    if let Some(g) = given {
        let allowed = GpuConfig {
            backend: g.backend,
            host: g.host.clone(),
            copy_slots: g.copy_slots,
            ..GpuConfig::default()
        };
        if *g != allowed {
            return Err(GpuSpecError::Override);
        }
        cfg.backend = g.backend;
        if g.host.is_some() {
            cfg.host = g.host.clone();
        }
        cfg.copy_slots = g.copy_slots;
        if cfg.backend != vgpu::config::Backend::Cuda {
            // A cuda snapshot restored on sim: no request path or copy slots there (as
            // `GpuConfig::parse`).
            cfg.ck_path = pgpu::cuda::DEFAULT_CK_PATH;
            cfg.copy_slots = 0;
        }
    }
    Ok(cfg)
}

/// A writer that counts and checksums what passes through it.
pub struct CrcWriter<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> CrcWriter<W> {
    pub fn new(inner: W) -> Self {
        CrcWriter {
            inner,
            hasher: crc32fast::Hasher::new(),
            bytes: 0,
        }
    }

    /// (the writer, bytes written, their CRC-32).
    pub fn finish(self) -> (W, u64, u32) {
        (self.inner, self.bytes, self.hasher.finalize())
    }
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader of exactly `len` bytes whose CRC-32 must be `crc`: the read that would hand out
/// the last byte fails instead if the checksum differs (so the device, which reads its whole
/// image before it applies any of it, refuses a corrupted file), and nothing is read past
/// `len`.
pub struct CheckedReader<R> {
    inner: R,
    hasher: crc32fast::Hasher,
    left: u64,
    crc: u32,
}

impl<R: Read> CheckedReader<R> {
    pub fn new(inner: R, len: u64, crc: u32) -> Self {
        CheckedReader {
            inner,
            hasher: crc32fast::Hasher::new(),
            left: len,
            crc,
        }
    }
}

impl<R: Read> Read for CheckedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{FILE} ends {} bytes early", self.left),
            ));
        }
        self.hasher.update(&buf[..n]);
        self.left -= n as u64;
        if self.left == 0 {
            let found = self.hasher.clone().finalize();
            if found != self.crc {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{FILE} is corrupted: CRC-32 {found:#010x}, the manifest says {:#010x}",
                        self.crc
                    ),
                ));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu::config::Backend;

    #[test]
    fn spec_round_trips_and_only_the_backend_may_be_overridden() {
        let cfg =
            GpuConfig::parse("vram=64M,channels=4,opt=lazy,preempt=checkpoint,spin_us=7").unwrap();
        assert_eq!(restore_config(&spec(&cfg), None).unwrap(), cfg);
        let cuda = GpuConfig::parse("backend=cuda").unwrap();
        let got = restore_config(&spec(&cfg), Some(&cuda)).unwrap();
        assert_eq!(got.backend, Backend::Cuda);
        assert_eq!(got.vram, 64 << 20);
        // Another daemon (migration between two vgpud).
        let shared = GpuConfig::parse("host=/a.sock,weight=2,name=x").unwrap();
        let snap = restore_config(&spec(&shared), None).unwrap();
        assert_eq!(snap, shared);
        let b = GpuConfig::parse("host=/b.sock,name=y").unwrap();
        let got = restore_config(&spec(&shared), Some(&b)).unwrap();
        assert_eq!(got.host, b.host);
        assert_eq!(got.vram, shared.vram);
        let got = restore_config(&spec(&shared), Some(&cuda)).unwrap();
        assert_eq!(
            got.host, shared.host,
            "the snapshot's daemon unless another is named"
        );
        // The copy slots are the restoring host's: the given `--gpu`'s, none on sim.
        let slots = GpuConfig::parse("backend=cuda,copy_slots=64M").unwrap();
        assert_eq!(
            restore_config(&spec(&slots), None).unwrap().copy_slots,
            64 << 20
        );
        assert_eq!(
            restore_config(&spec(&slots), Some(&cuda))
                .unwrap()
                .copy_slots,
            0
        );
        let few = GpuConfig::parse("backend=cuda,copy_slots=4M").unwrap();
        assert_eq!(
            restore_config(&spec(&cfg), Some(&few)).unwrap().copy_slots,
            4 << 20
        );
        let sim = GpuConfig::parse("backend=sim").unwrap();
        let on_sim = restore_config(&spec(&slots), Some(&sim)).unwrap();
        assert_eq!(on_sim.copy_slots, 0);
        assert_eq!(GpuConfig::parse_written(&spec(&on_sim)).unwrap(), on_sim);
        let more = GpuConfig::parse("backend=cuda,vram=128M").unwrap();
        assert!(matches!(
            restore_config(&spec(&cfg), Some(&more)),
            Err(GpuSpecError::Override)
        ));
        assert!(matches!(
            restore_config("vram=3M", None),
            Err(GpuSpecError::Parse { .. })
        ));
    }

    #[test]
    fn the_checked_reader_refuses_a_changed_byte_before_the_last_one_is_handed_out() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let crc = crc32fast::hash(&data);
        let mut out = Vec::new();
        CheckedReader::new(&data[..], data.len() as u64, crc)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data);
        let mut bad = data.clone();
        bad[5000] ^= 1;
        let mut out = Vec::new();
        let e = CheckedReader::new(&bad[..], bad.len() as u64, crc)
            .read_to_end(&mut out)
            .unwrap_err();
        assert!(e.to_string().contains("corrupted"), "{e}");
        assert!(out.len() < bad.len());
        // Shorter than the manifest says.
        let e = CheckedReader::new(&data[..100], 200, crc)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
