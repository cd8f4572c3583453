//! Writing a snapshot directory: the output-directory rules (checked before the VM is paused:
//! the directory must not exist, in an existing parent, or be an empty directory; never a
//! symbolic link, never a user's file overwritten), then the RAM file, the GPU image (VMs
//! with a virtual GPU), the state file and,
//! last, the manifest, so that a directory with a manifest is complete. A failed save removes
//! the files it created (and the directory, if it created that too).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use vm_memory::GuestMemoryMmap;

use super::gpu::CrcWriter;
use super::manifest::{self, Manifest};
use super::ram::{self, Backing, RamError};
use super::state::MachineState;

/// Errors choosing or writing the snapshot directory.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("{0}: is not a directory")]
    NotADir(PathBuf),
    #[error("{0}: is a symbolic link; give the directory itself")]
    Symlink(PathBuf),
    #[error("{0}: is not empty; a snapshot goes to a new or empty directory")]
    NotEmpty(PathBuf),
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{0}")]
    Ram(#[from] RamError),
    #[error("the virtual GPU: {0}")]
    Gpu(#[from] vgpu::snapshot::SnapshotError),
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> SaveError + '_ {
    move |err| SaveError::Io {
        path: path.to_owned(),
        err,
    }
}

/// Writes the GPU's image (the device paused) and says what it holds.
pub type GpuSave<'a> = dyn FnMut(&mut dyn Write) -> Result<vgpu::snapshot::SaveReport, vgpu::snapshot::SnapshotError>
    + 'a;

/// A checked output directory; dropping it without [`OutputDir::keep`] removes what the save
/// created.
#[derive(Debug)]
pub struct OutputDir {
    dir: PathBuf,
    created_dir: bool,
    files: Vec<PathBuf>,
    keep: bool,
    /// What the GPU image holds, once written.
    pub gpu_report: Option<vgpu::snapshot::SaveReport>,
}

impl OutputDir {
    /// Checks `dir` and creates it if it does not exist (its parent must).
    pub fn prepare(dir: &Path) -> Result<Self, SaveError> {
        let created_dir = match std::fs::symlink_metadata(dir) {
            Ok(m) if m.file_type().is_symlink() => return Err(SaveError::Symlink(dir.into())),
            Ok(m) if !m.is_dir() => return Err(SaveError::NotADir(dir.into())),
            Ok(_) => {
                let mut entries = std::fs::read_dir(dir).map_err(at(dir))?;
                if entries.next().is_some() {
                    return Err(SaveError::NotEmpty(dir.into()));
                }
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(dir).map_err(at(dir))?;
                true
            }
            Err(e) => return Err(at(dir)(e)),
        };
        Ok(OutputDir {
            dir: dir.into(),
            created_dir,
            files: Vec::new(),
            keep: false,
            gpu_report: None,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Creates `name` in the directory (it must not exist), opened for reading too (the GPU
    /// image's lanes map a tmpfs file shared and writable, which needs a descriptor open both
    /// ways: `vgpu/src/snapshot/mapped.rs`).
    fn create(&mut self, name: &str) -> Result<File, SaveError> {
        let path = self.dir.join(name);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(at(&path))?;
        self.files.push(path);
        Ok(f)
    }

    /// Writes the snapshot: RAM, the GPU image (`gpu`, paused, if the VM has one), state, then
    /// the manifest (`manifest`'s file fields filled in).
    pub fn write(
        &mut self,
        mut manifest: Manifest,
        state: &MachineState,
        mem: &GuestMemoryMmap,
        backing: Backing,
        gpu: Option<&vgpu::Vgpu>,
    ) -> Result<Manifest, SaveError> {
        let ram_file = self.create(manifest::RAM_FILE)?;
        let t = std::time::Instant::now();
        let saved = ram::save(mem, backing, &ram_file)?;
        log::debug!(
            "snapshot: {} pages of RAM written and synced in {:.1} ms",
            saved.pages,
            t.elapsed().as_secs_f64() * 1e3
        );
        manifest.ram_bytes = saved.bytes;
        manifest.ram_pages = saved.pages;
        if let Some(gpu) = gpu {
            self.gpu_file(&mut manifest, gpu)?;
        }
        self.finish(manifest, state, None)
    }

    /// Writes the GPU image of a paused device with `Vgpu::save_file` (its VRAM at offsets
    /// on several threads, the file's CRC-32 combined from its sections': no second pass),
    /// syncs it and records it in `manifest`.
    fn gpu_file(&mut self, manifest: &mut Manifest, gpu: &vgpu::Vgpu) -> Result<(), SaveError> {
        let path = self.dir.join(manifest::GPU_FILE);
        let f = self.create(manifest::GPU_FILE)?;
        let t = std::time::Instant::now();
        let report = gpu.save_file(&f)?;
        f.sync_all().map_err(at(&path))?;
        log::debug!(
            "snapshot: GPU image of {} bytes ({} of VRAM, {} modules, {} preempted jobs) \
             written and synced in {:.1} ms",
            report.bytes,
            report.vram_bytes,
            report.modules,
            report.suspended,
            t.elapsed().as_secs_f64() * 1e3
        );
        manifest.gpu_bytes = report.bytes;
        manifest.gpu_crc32 = report.crc32;
        self.gpu_report = Some(report);
        Ok(())
    }

    /// Creates a file of `len` bytes (holes) for a live snapshot's rounds: `ram.bin`, or
    /// `vram.bin` (the pre-copied VRAM).
    pub fn create_sized(&mut self, name: &'static str, len: u64) -> Result<File, SaveError> {
        let path = self.dir.join(name);
        let f = self.create(name)?;
        f.set_len(len).map_err(at(&path))?;
        Ok(f)
    }

    /// Syncs a file made by [`OutputDir::create_sized`].
    pub fn sync(&self, name: &'static str, f: &File) -> Result<(), SaveError> {
        f.sync_all().map_err(at(&self.dir.join(name)))
    }

    /// Writes the rest once RAM is written (`manifest`'s RAM fields filled in): the GPU image
    /// (by `gpu`, the device paused), the state and the manifest.
    pub fn finish(
        &mut self,
        mut manifest: Manifest,
        state: &MachineState,
        gpu: Option<&mut GpuSave<'_>>,
    ) -> Result<Manifest, SaveError> {
        if let Some(gpu) = gpu {
            let f = self.gpu_image(&mut manifest, gpu)?;
            self.sync(manifest::GPU_FILE, &f)?;
        }
        self.finish_state(manifest, state)
    }

    /// Writes the GPU image (by `gpu`, the device paused) into `gpu.bin` and records it in
    /// `manifest`, without syncing it: the caller syncs the file it gets before
    /// [`OutputDir::finish_state`] (a live snapshot does that after the VM runs again).
    pub fn gpu_image(
        &mut self,
        manifest: &mut Manifest,
        gpu: &mut GpuSave<'_>,
    ) -> Result<File, SaveError> {
        let path = self.dir.join(manifest::GPU_FILE);
        let f = self.create(manifest::GPU_FILE)?;
        let t = std::time::Instant::now();
        let mut w = CrcWriter::new(std::io::BufWriter::with_capacity(1 << 20, f));
        let report = gpu(&mut w)?;
        let (buf, bytes, crc) = w.finish();
        let f = buf.into_inner().map_err(|e| at(&path)(e.into_error()))?;
        log::debug!(
            "snapshot: GPU image of {bytes} bytes ({} of VRAM, {} modules, {} preempted jobs) \
             written in {:.1} ms",
            report.vram_bytes,
            report.modules,
            report.suspended,
            t.elapsed().as_secs_f64() * 1e3
        );
        manifest.gpu_bytes = bytes;
        manifest.gpu_crc32 = crc;
        self.gpu_report = Some(report);
        Ok(f)
    }

    /// Writes the state and then the manifest (both synced), once every other file of the
    /// snapshot is written and synced: a directory with a manifest is complete.
    pub fn finish_state(
        &mut self,
        mut manifest: Manifest,
        state: &MachineState,
    ) -> Result<Manifest, SaveError> {
        let bytes = state.encode();
        manifest.state_bytes = bytes.len() as u64;
        manifest.state_crc32 = crc32fast::hash(&bytes);
        let state_path = self.dir.join(manifest::STATE_FILE);
        let mut f = self.create(manifest::STATE_FILE)?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(at(&state_path))?;

        let text = serde_json::to_string_pretty(&manifest).map_err(|e| SaveError::Io {
            path: self.dir.join(manifest::FILE),
            err: e.into(),
        })?;
        let manifest_path = self.dir.join(manifest::FILE);
        let mut f = self.create(manifest::FILE)?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .and_then(|()| f.sync_all())
            .map_err(at(&manifest_path))?;
        Ok(manifest)
    }

    /// Keeps what was written.
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        if self.created_dir {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn its_files_are_open_both_ways_and_go_with_an_unfinished_save() {
        let dir = std::env::temp_dir().join(format!("vmm-save-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let mut out = OutputDir::prepare(&dir).unwrap();
            let f = out.create(manifest::GPU_FILE).unwrap();
            f.write_all_at(b"abc", 0).unwrap();
            // Readable too: the GPU image's lanes map a tmpfs file shared and writable
            // (vgpu/src/snapshot/mapped.rs), which a write-only descriptor cannot be.
            let mut back = [0u8; 3];
            f.read_exact_at(&mut back, 0).unwrap();
            assert_eq!(&back, b"abc");
        }
        // Not finished: the file and the directory it made are gone.
        assert!(!dir.exists());
    }
}
