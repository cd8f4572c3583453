//! `vgpu-run FILE.ptx --entry NAME [--grid X[,Y[,Z]]] [--block X[,Y[,Z]]] [--arg SPEC]...
//! [--print N] [--shared BYTES] [mode=full] [timeout_s=N] [sys_mib=N]`: runs a user's own PTX
//! kernel on the virtual GPU. Argument SPECs, in the kernel's parameter order:
//! `u32:V`, `i32:V`, `u64:V`, `i64:V`, `f32:V`, `f64:V` (scalars); buffers, passed as their
//! GPU address (`.u64`): `in:T:V,V,...` (initialised), `out:T:N` (N zeroed elements),
//! `ramp:T:N` (0, 1, ..., N-1) with T one of `u32 i32 f32 u64`. Every buffer is copied into
//! VRAM before the launch and back after it, and printed (`BUF i T n=N: first --print values`).
//! Exit code: 0 ran, 1 the GPU refused or faulted (the message says why), 2 bad argument,
//! 3 no GPU.

use gpu_driver::{Gpu, LaunchDesc, PushBuf, SysAlloc, VramAlloc};
use suite::Param;

use crate::ToolError;
use crate::args::Args;
use crate::platform::LinuxGpu;
use crate::run_suite;

const KNOWN: &[&str] = &[
    "entry",
    "grid",
    "block",
    "arg",
    "print",
    "shared",
    "mode",
    "tables",
    "timeout_s",
    "sys_mib",
];

/// Element type of a buffer argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    U32,
    I32,
    F32,
    U64,
}

impl Elem {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "u32" => Elem::U32,
            "i32" => Elem::I32,
            "f32" => Elem::F32,
            "u64" => Elem::U64,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        if self == Elem::U64 { 8 } else { 4 }
    }

    fn name(self) -> &'static str {
        match self {
            Elem::U32 => "u32",
            Elem::I32 => "i32",
            Elem::F32 => "f32",
            Elem::U64 => "u64",
        }
    }

    fn encode(self, v: &str) -> Option<Vec<u8>> {
        Some(match self {
            Elem::U32 => v.parse::<u32>().ok()?.to_le_bytes().to_vec(),
            Elem::I32 => v.parse::<i32>().ok()?.to_le_bytes().to_vec(),
            Elem::F32 => v.parse::<f32>().ok()?.to_le_bytes().to_vec(),
            Elem::U64 => v.parse::<u64>().ok()?.to_le_bytes().to_vec(),
        })
    }

    fn encode_index(self, i: usize) -> Vec<u8> {
        match self {
            Elem::U32 => (i as u32).to_le_bytes().to_vec(),
            Elem::I32 => (i as i32).to_le_bytes().to_vec(),
            Elem::F32 => (i as f32).to_le_bytes().to_vec(),
            Elem::U64 => (i as u64).to_le_bytes().to_vec(),
        }
    }

    fn show(self, b: &[u8]) -> String {
        match self {
            Elem::U32 => u32::from_le_bytes(b.try_into().unwrap_or_default()).to_string(),
            Elem::I32 => i32::from_le_bytes(b.try_into().unwrap_or_default()).to_string(),
            Elem::F32 => f32::from_le_bytes(b.try_into().unwrap_or_default()).to_string(),
            Elem::U64 => u64::from_le_bytes(b.try_into().unwrap_or_default()).to_string(),
        }
    }
}

/// A kernel argument: a scalar, or buffer `index` of `buffers`.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Scalar(Param),
    Buffer { elem: Elem, init: Vec<u8> },
}

/// Most elements a buffer argument may have (16 M).
const MAX_ELEMS: usize = 1 << 24;

/// Parses one `--arg` SPEC.
pub fn parse_arg(spec: &str) -> Result<Arg, ToolError> {
    let bad = || ToolError::Bad(format!("--arg {spec}: see vgpu-run --help"));
    let (kind, rest) = spec.split_once(':').ok_or_else(bad)?;
    let scalar = |p: Option<Param>| p.map(Arg::Scalar).ok_or_else(bad);
    match kind {
        "u32" => scalar(rest.parse().ok().map(Param::U32)),
        "i32" => scalar(rest.parse().ok().map(Param::I32)),
        "u64" => scalar(rest.parse().ok().map(Param::U64)),
        "i64" => scalar(rest.parse().ok().map(Param::I64)),
        "f32" => scalar(rest.parse().ok().map(Param::F32)),
        "f64" => scalar(rest.parse().ok().map(Param::F64)),
        "in" | "out" | "ramp" => {
            let (t, v) = rest.split_once(':').ok_or_else(bad)?;
            let elem = Elem::parse(t).ok_or_else(bad)?;
            let init = match kind {
                "in" => {
                    let mut b = Vec::new();
                    for x in v.split(',') {
                        b.extend(elem.encode(x.trim()).ok_or_else(bad)?);
                    }
                    b
                }
                _ => {
                    let n: usize = v.parse().map_err(|_| bad())?;
                    if n == 0 || n > MAX_ELEMS {
                        return Err(ToolError::Bad(format!(
                            "--arg {spec}: 1 to {MAX_ELEMS} elements"
                        )));
                    }
                    if kind == "out" {
                        vec![0; n * elem.size()]
                    } else {
                        (0..n).flat_map(|i| elem.encode_index(i)).collect()
                    }
                }
            };
            Ok(Arg::Buffer { elem, init })
        }
        _ => Err(bad()),
    }
}

/// `X`, `X,Y` or `X,Y,Z` (missing dimensions are 1).
pub fn parse_dim(s: &str) -> Option<[u32; 3]> {
    let mut d = [1u32; 3];
    let parts: Vec<&str> = s.split(',').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    for (i, p) in parts.iter().enumerate() {
        d[i] = p.trim().parse().ok().filter(|&v| v > 0)?;
    }
    Some(d)
}

/// The `vgpu-run FILE.ptx ...` command.
pub fn main(file: &str, a: &Args) -> Result<u8, ToolError> {
    let parsed = (|| {
        a.only(KNOWN)?;
        let entry = a
            .get("entry")
            .ok_or_else(|| ToolError::Bad("--entry NAME is required".into()))?;
        let grid = parse_dim(a.get("grid").unwrap_or("1"))
            .ok_or_else(|| ToolError::Bad("--grid X[,Y[,Z]] (positive)".into()))?;
        let block = parse_dim(a.get("block").unwrap_or("1"))
            .ok_or_else(|| ToolError::Bad("--block X[,Y[,Z]] (positive)".into()))?;
        let args = a.all("arg").map(parse_arg).collect::<Result<Vec<_>, _>>()?;
        let print = a.num("print", 16)? as usize;
        let shared = u32::try_from(a.num("shared", 0)?)
            .map_err(|_| ToolError::Bad("--shared too large".into()))?;
        let cfg = run_suite::config(a)?;
        Ok::<_, ToolError>((entry.to_string(), grid, block, args, print, shared, cfg))
    })();
    let (entry, grid, block, args, print, shared, cfg) = match parsed {
        Ok(p) => p,
        Err(e) => {
            println!("vgpu-run: {e}");
            return Ok(2);
        }
    };
    let ptx = match std::fs::read(file) {
        Ok(p) => p,
        Err(e) => {
            println!("vgpu-run: read {file}: {e}");
            return Ok(2);
        }
    };
    let (mut gpu, mut ch) = match run_suite::open(cfg) {
        Ok(g) => g,
        Err(e) => {
            println!("vgpu-run: driver init: {e}");
            return Ok(3);
        }
    };
    match launch(&mut gpu, &mut ch, &ptx, &entry, grid, block, shared, &args) {
        Ok((gpu_ns, outputs)) => {
            println!("PTX entry={entry} ok=1 gpu_us={}", gpu_ns / 1000);
            for (i, (arg, out)) in args.iter().zip(outputs).enumerate() {
                if let (Arg::Buffer { elem, .. }, Some(bytes)) = (arg, out) {
                    let n = bytes.len() / elem.size();
                    let shown: Vec<String> = bytes
                        .chunks_exact(elem.size())
                        .take(print)
                        .map(|c| elem.show(c))
                        .collect();
                    println!("BUF {i} {} n={n}: {}", elem.name(), shown.join(" "));
                }
            }
            Ok(0)
        }
        Err(e) => {
            println!("PTX entry={entry} ok=0 error: {e}");
            let _ = ch.recover(&mut gpu);
            Ok(1)
        }
    }
}

/// Buffer outputs per argument (`None` for scalars).
type Outputs = Vec<Option<Vec<u8>>>;

/// Uploads, launches once, downloads; GPU time between two timestamps and the buffers.
#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &mut Gpu<LinuxGpu>,
    ch: &mut gpu_driver::Channel,
    ptx: &[u8],
    entry: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    args: &[Arg],
) -> Result<(u64, Outputs), ToolError> {
    let too_long = |what: &str| ToolError::Bad(format!("{what} longer than 4 GiB"));
    let code = gpu.sys_alloc(ptx.len() as u64)?;
    gpu.sys_write(&code, 0, ptx)?;
    let mut pb = PushBuf::new();
    let mut bufs: Vec<Option<(SysAlloc, VramAlloc)>> = Vec::new();
    let mut addrs = Vec::new();
    let mut params = Vec::new();
    for a in args {
        match a {
            Arg::Scalar(p) => {
                params.push(*p);
                bufs.push(None);
            }
            Arg::Buffer { init, .. } => {
                let len = init.len() as u64;
                let s = gpu.sys_alloc(len)?;
                gpu.sys_write(&s, 0, init)?;
                let v = gpu.vram_alloc(len)?;
                pb.copy(s.va, v.va, len);
                params.push(Param::Buffer(addrs.len()));
                addrs.push(v.va);
                bufs.push(Some((s, v)));
            }
        }
    }
    let layout = suite::layout_params(&params, &addrs)
        .map_err(|e| ToolError::Bad(format!("parameters: {e}")))?;
    let entry_va = ch.stage(gpu, entry.as_bytes(), 8)?;
    let param_va = if layout.is_empty() {
        0
    } else {
        ch.stage(gpu, &layout, 16)?
    };
    pb.release(ch.slot_va(1), 1, false, true);
    pb.launch(&LaunchDesc {
        code_va: code.va,
        code_len: u32::try_from(ptx.len()).map_err(|_| too_long("PTX"))?,
        entry_va,
        entry_len: u32::try_from(entry.len()).map_err(|_| too_long("entry"))?,
        grid,
        block,
        shared_bytes: shared,
        param_va,
        param_len: u32::try_from(layout.len()).map_err(|_| too_long("parameters"))?,
    });
    pb.release(ch.slot_va(2), 1, false, true);
    for (s, v) in bufs.iter().flatten() {
        pb.copy(v.va, s.va, s.len);
    }
    let f = ch.submit(gpu, &mut pb)?;
    ch.wait(gpu, f)?;
    let gpu_ns = ch.slot_time(gpu, 2)?.saturating_sub(ch.slot_time(gpu, 1)?);
    let mut outs = Vec::new();
    for (b, a) in bufs.iter().zip(args) {
        outs.push(match (b, a) {
            (Some((s, _)), Arg::Buffer { init, .. }) => {
                let mut o = vec![0u8; init.len()];
                gpu.sys_read(s, 0, &mut o)?;
                Some(o)
            }
            _ => None,
        });
    }
    Ok((gpu_ns, outs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_specs() {
        assert_eq!(parse_arg("u32:7").unwrap(), Arg::Scalar(Param::U32(7)));
        assert_eq!(parse_arg("f32:1.5").unwrap(), Arg::Scalar(Param::F32(1.5)));
        match parse_arg("in:f32:1,2").unwrap() {
            Arg::Buffer { elem, init } => {
                assert_eq!(elem, Elem::F32);
                assert_eq!(init, [1f32.to_le_bytes(), 2f32.to_le_bytes()].concat());
            }
            a => panic!("{a:?}"),
        }
        match parse_arg("ramp:u32:3").unwrap() {
            Arg::Buffer { init, .. } => assert_eq!(init, [0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]),
            a => panic!("{a:?}"),
        }
        for bad in [
            "u32",
            "u32:x",
            "out:f32:0",
            "out:f16:4",
            "in:u32:1,z",
            "q:1",
            "out:u32:99999999999",
        ] {
            assert!(parse_arg(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_dim("4"), Some([4, 1, 1]));
        assert_eq!(parse_dim("4,2,3"), Some([4, 2, 3]));
        assert_eq!(parse_dim("0"), None);
        assert_eq!(parse_dim("1,1,1,1"), None);
    }
}
