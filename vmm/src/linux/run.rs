//! `--run PROG [-- ARGS]`: packs a program into a read-only ext2 image for the Linux guest —
//! the program, the shared libraries `ldd` resolves for it (the dynamic loader included), and
//! the guest CUDA libraries found next to the vgpu-vmm executable (`libcudart.so.13`,
//! `libcuda.so.1`) with theirs, symbolic links dereferenced — plus `run.sh`, which `/init`
//! sources after mounting the image at [`MOUNT`]: it sets `LD_LIBRARY_PATH` to the image's
//! `lib/`, changes to the writable [`WORKDIR`] and execs the program with its arguments
//! (quoted for the shell), whose exit status becomes the VM's. Images are made by e2fsprogs'
//! `mke2fs -d` and cached in a private directory, named by a hash of everything in them.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `/init` mounts the image (it makes the directory, and the root image's `/lib64`
/// links to its `lib/`, where the x86-64 loader is).
pub const MOUNT: &str = "/run/prog";
/// The program's working directory: a directory of the ramfs `/init` mounts on `/run`.
pub const WORKDIR: &str = "/run/work";
/// The guest CUDA libraries packed when found next to the vgpu-vmm executable.
pub const CUDA_LIBS: [&str; 2] = ["libcudart.so.13", "libcuda.so.1"];
/// The kernel command line parameter that tells `/init` to run the image's program (its
/// value names the program in messages).
pub const PARAM: &str = "vgpu_prog";
/// Most files an image holds (a program with its libraries needs tens).
const MAX_FILES: usize = 4096;
/// Bumped when the image's layout changes (part of the cache key).
const LAYOUT: &str = "vgpu-run-image-1";

/// Errors preparing the image.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("--run {0}: not an executable file")]
    NotExecutable(PathBuf),
    #[error("--run {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("--run: cannot run {tool}: {err} (install {package})")]
    Tool {
        tool: &'static str,
        package: &'static str,
        err: std::io::Error,
    },
    #[error("--run {prog}: needs {lib}, which ldd does not find{hint}")]
    MissingLib {
        prog: PathBuf,
        lib: String,
        hint: &'static str,
    },
    #[error("--run: mke2fs failed: {0}")]
    Mkfs(String),
    #[error("--run: the cache directory {0} is not a private directory of this user")]
    Cache(PathBuf),
    #[error("--run: more than {MAX_FILES} files to pack")]
    TooMany,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |err| RunError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// What goes into an image: file name in the image -> host file (followed when copied).
#[derive(Debug, Default)]
pub struct Contents {
    pub files: BTreeMap<String, PathBuf>,
    pub script: String,
}

/// The image for `prog` with `args` (built, or found in the cache) and the command-line
/// parameter that runs it.
pub fn prepare(prog: &Path, args: &[String]) -> Result<(PathBuf, String), RunError> {
    let t = std::time::Instant::now();
    let contents = collect(prog, args, &exe_dir())?;
    let path = build_cached(&contents, &cache_dir()?)?;
    log::debug!(
        "--run: image {} ({} files) ready in {:.0} ms",
        path.display(),
        contents.files.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok((path, format!("{PARAM}={}", param_name(prog))))
}

/// The directory of the running vgpu-vmm (where `cargo build --release` leaves the guest
/// CUDA libraries).
fn exe_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default()
}

/// The program's name as a kernel parameter value (no spaces, quotes or `=`).
fn param_name(prog: &Path) -> String {
    let n: String = prog
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-+".contains(*c))
        .take(64)
        .collect();
    if n.is_empty() { "prog".into() } else { n }
}

/// Decides the image's files: the program, its libraries and the CUDA libraries in
/// `cuda_dir` with theirs, as `ldd` resolves them with `cuda_dir` first in the search path
/// (as the guest's `LD_LIBRARY_PATH` puts the image's `lib/`).
pub fn collect(prog: &Path, args: &[String], cuda_dir: &Path) -> Result<Contents, RunError> {
    let meta = std::fs::metadata(prog).map_err(io(prog))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(RunError::NotExecutable(prog.to_path_buf()));
    }
    let name = param_name(prog);
    let mut c = Contents::default();
    c.files.insert(format!("bin/{name}"), prog.to_path_buf());
    let mut roots = vec![prog.to_path_buf()];
    for lib in CUDA_LIBS {
        let p = cuda_dir.join(lib);
        if p.is_file() {
            c.files.insert(format!("lib/{lib}"), p.clone());
            roots.push(p);
        } else {
            log::info!("--run: no {} (the program runs without it)", p.display());
        }
    }
    let mut interp = None;
    for root in &roots {
        let deps = ldd(root, cuda_dir)?;
        for (lib, path) in deps.libs {
            let Some(path) = path else {
                let hint = if CUDA_LIBS.contains(&lib.as_str()) {
                    " next to vgpu-vmm (cargo build --release builds the guest CUDA libraries)"
                } else {
                    " (set LD_LIBRARY_PATH for it)"
                };
                return Err(RunError::MissingLib {
                    prog: root.clone(),
                    lib,
                    hint,
                });
            };
            c.files.entry(format!("lib/{lib}")).or_insert(path);
        }
        if let Some(i) = deps.interp {
            interp.get_or_insert(i);
        }
        if c.files.len() > MAX_FILES {
            return Err(RunError::TooMany);
        }
    }
    let mut script = format!(
        "# run.sh, written by vgpu-vmm --run: sourced by /init in a subshell\n\
         export LD_LIBRARY_PATH={MOUNT}/lib\n"
    );
    if let Some(i) = &interp {
        let base = i.file_name().map(|n| n.to_string_lossy().into_owned());
        if let Some(base) = base {
            c.files
                .entry(format!("lib/{base}"))
                .or_insert_with(|| i.clone());
            // The root image links /lib64 to the image's lib/ (the x86-64 loader's path);
            // another loader path gets its link here.
            if i != Path::new(&format!("/lib64/{base}")) {
                let dir = i.parent().unwrap_or(Path::new("/")).display().to_string();
                script += &format!(
                    "busybox mkdir -p {} && busybox ln -sf {MOUNT}/lib/{} {}\n",
                    quote(&dir),
                    quote(&base),
                    quote(&i.display().to_string())
                );
            }
        }
    }
    script += &format!("cd {WORKDIR} || exit 125\nexec {MOUNT}/bin/{name}");
    for a in args {
        script.push(' ');
        script += &quote(a);
    }
    script.push('\n');
    c.script = script;
    Ok(c)
}

/// `s` as one shell word: single-quoted, each `'` as `'\''`.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What `ldd` says a file needs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Deps {
    /// Name asked for -> where it resolves (None: not found).
    pub libs: Vec<(String, Option<PathBuf>)>,
    /// The dynamic loader (absolute path).
    pub interp: Option<PathBuf>,
}

/// Parses `ldd`'s output (a static program: no dependencies).
pub fn parse_ldd(out: &str) -> Deps {
    let mut d = Deps::default();
    for line in out.lines().map(str::trim) {
        let line = line.split(" (0x").next().unwrap_or(line).trim();
        match line.split_once(" => ") {
            Some((name, "not found")) => d.libs.push((name.trim().into(), None)),
            Some((name, path)) if path.starts_with('/') => d
                .libs
                .push((name.trim().into(), Some(PathBuf::from(path.trim())))),
            Some(_) => {}
            // The loader appears by its absolute path alone; the vDSO by a bare name.
            None if line.starts_with('/') && !line.contains(' ') => {
                d.interp = Some(PathBuf::from(line))
            }
            None => {}
        }
    }
    d
}

/// Runs `ldd` on `file` with `first` searched first.
fn ldd(file: &Path, first: &Path) -> Result<Deps, RunError> {
    let mut path = first.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let out = Command::new("ldd")
        .arg(file)
        .env("LD_LIBRARY_PATH", path)
        .output()
        .map_err(|err| RunError::Tool {
            tool: "ldd",
            package: "libc-bin",
            err,
        })?;
    // A static program: ldd exits 1 with "not a dynamic executable".
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

/// The private cache directory (`$TMPDIR/vgpu-vmm-run-UID`, mode 0700, owned by this user).
fn cache_dir() -> Result<PathBuf, RunError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = std::env::temp_dir().join(format!("vgpu-vmm-run-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(&dir)(e)),
    }
    let m = std::fs::symlink_metadata(&dir).map_err(io(&dir))?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(RunError::Cache(dir));
    }
    Ok(dir)
}

/// The image for `c` in `cache` (made unless an image with its key is there).
pub fn build_cached(c: &Contents, cache: &Path) -> Result<PathBuf, RunError> {
    let key = key(c)?;
    let image = cache.join(format!("{key}.ext2"));
    if std::fs::symlink_metadata(&image).is_ok_and(|m| m.is_file()) {
        log::debug!("--run: cached image {}", image.display());
        return Ok(image);
    }
    let stage = cache.join(format!("{key}.{}.d", std::process::id()));
    let tmp = cache.join(format!("{key}.{}.img", std::process::id()));
    let result =
        build(c, &stage, &tmp).and_then(|()| std::fs::rename(&tmp, &image).map_err(io(&image)));
    let _ = std::fs::remove_dir_all(&stage);
    let _ = std::fs::remove_file(&tmp);
    result.map(|()| image)
}

/// A key over everything in the image: its layout version, each file's name, mode and
/// contents, and the script (two 64-bit SipHashes, 128 bits).
fn key(c: &Contents) -> Result<String, RunError> {
    let mut h = [
        std::hash::DefaultHasher::new(),
        std::hash::DefaultHasher::new(),
    ];
    h[1].write(b"second");
    let mut feed = |b: &[u8]| h.iter_mut().for_each(|h| h.write(b));
    feed(LAYOUT.as_bytes());
    feed(c.script.as_bytes());
    let mut buf = vec![0u8; 1 << 16];
    for (name, path) in &c.files {
        feed(name.as_bytes());
        let mut f = std::fs::File::open(path).map_err(io(path))?;
        let m = f.metadata().map_err(io(path))?;
        feed(&m.len().to_le_bytes());
        feed(&(m.mode() & 0o777).to_le_bytes());
        loop {
            let n = f.read(&mut buf).map_err(io(path))?;
            if n == 0 {
                break;
            }
            feed(&buf[..n]);
        }
    }
    Ok(format!("{:016x}{:016x}", h[0].finish(), h[1].finish()))
}

/// Copies the files into `stage` and makes the ext2 image `out` of it.
fn build(c: &Contents, stage: &Path, out: &Path) -> Result<(), RunError> {
    let _ = std::fs::remove_dir_all(stage);
    let mut bytes = 0u64;
    for (name, src) in &c.files {
        let dst = stage.join(name);
        if let Some(d) = dst.parent() {
            std::fs::create_dir_all(d).map_err(io(d))?;
        }
        // fs::copy follows symbolic links and keeps the permission bits.
        bytes += std::fs::copy(src, &dst).map_err(io(src))?;
    }
    std::fs::create_dir_all(stage).map_err(io(stage))?;
    let script = stage.join("run.sh");
    std::fs::write(&script, &c.script).map_err(io(&script))?;
    // Room for the data (4 KiB blocks, indirect blocks), the inodes and the metadata.
    let files = c.files.len() as u64 + 8;
    let blocks = bytes.div_ceil(4096) * 102 / 100 + files * 4 + 256;
    let mkfs = ["/usr/sbin/mke2fs", "/sbin/mke2fs"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .unwrap_or(Path::new("mke2fs"));
    let out_cmd = Command::new(mkfs)
        .args([
            "-q", "-F", "-t", "ext2", "-b", "4096", "-m", "0", "-I", "128",
        ])
        .arg("-N")
        .arg((files + 16).to_string())
        .args(["-L", "vgpu-run", "-E", "root_owner=0:0", "-d"])
        .arg(stage)
        .arg(out)
        .arg(blocks.to_string())
        .output()
        .map_err(|err| RunError::Tool {
            tool: "mke2fs",
            package: "e2fsprogs",
            err,
        })?;
    if !out_cmd.status.success() {
        return Err(RunError::Mkfs(
            String::from_utf8_lossy(&out_cmd.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_is_parsed() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibcudart.so.13 => /x/target/release/libcudart.so.13 (0x00007f00)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f01)\n\
                   \tlibgone.so => not found\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f02)\n";
        let d = parse_ldd(out);
        assert_eq!(d.interp, Some(PathBuf::from("/lib64/ld-linux-x86-64.so.2")));
        assert_eq!(
            d.libs,
            vec![
                (
                    "libcudart.so.13".into(),
                    Some(PathBuf::from("/x/target/release/libcudart.so.13"))
                ),
                (
                    "libc.so.6".into(),
                    Some(PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"))
                ),
                ("libgone.so".into(), None),
            ]
        );
        assert_eq!(parse_ldd("\tnot a dynamic executable\n"), Deps::default());
        assert_eq!(parse_ldd("\tstatically linked\n"), Deps::default());
    }

    #[test]
    fn arguments_are_quoted_for_the_shell() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$(reboot) `x` \"y\"\n"), "'$(reboot) `x` \"y\"\n'");
        assert_eq!(param_name(Path::new("/a/my prog\"=1")), "myprog1");
        assert_eq!(param_name(Path::new("/")), "prog");
    }
}
