//! `cuda-guest-check MODE`: drives the guest backend of libcuda ([`cuda::backend::guest`])
//! through the `Device` interface inside the Linux guest, several processes at once.
//!
//! - `vadd N`: copies, fills, device copies, `host_alloc` memory, launches and markers on N
//!   elements, checked against the CPU; with `--until FILE` it keeps accumulating launches
//!   until FILE exists (another process's signal) and checks the total; `--ready FILE` is
//!   created once its slot is attached. One `CHECK vadd ok=1|0 ...` line; exit 0 / 1.
//! - `fault`: (after `--wait FILE` exists) a kernel stores to an unmapped address: the sticky
//!   error must be an illegal address; `--done FILE` is created afterwards. Exit 0 when it is.
//! - `hold`: attaches, prints its slot, sleeps (a process to kill: its slot is taken back).
//! - `info`: attaches, prints the slot, whether it set the device up, and reclaimed slots.
//! - `copies SECS [K]`: no GPU: large copies into and out of the `memmap=` range in a loop,
//!   each checked (two at once, K 0 and 1, show whether the guest keeps each process's
//!   register state: `CHECK copies ok=1|0 ...`).
//! - `bench N`: per-launch cost of the backend against the bare guest driver, side by side on
//!   the same channel (`BENCH ...` lines).
//!
//! Exit codes: 0 as expected, 1 a check failed, 2 bad arguments, 3 no GPU.

use std::path::Path;
use std::time::{Duration, Instant};

use cuda::backend::guest::GuestDevice;
use cuda::device::{Device, DeviceError, Launch, ModuleId};

const PTX: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.visible .entry vadd(.param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    add.s64 %rd5, %rd1, %rd4;
    add.s64 %rd6, %rd2, %rd4;
    add.s64 %rd7, %rd3, %rd4;
    ld.global.u32 %r6, [%rd5];
    ld.global.u32 %r7, [%rd6];
    add.u32 %r6, %r6, %r7;
    st.global.u32 [%rd7], %r6;
DONE:
    ret;
}

.visible .entry poke(.param .u64 addr)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [addr];
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}

.visible .entry nothing(.param .u64 addr)
{
    ret;
}
"#;

/// A module with variables: a `.const` table read by the kernel and a `.global` counter it
/// increments.
const VARS_PTX: &str = r#"
.version 7.0
.target sm_80
.address_size 64

.const .align 4 .u32 coef[4] = {1, 2, 3, 4};
.visible .global .align 4 .u32 counter;

.visible .entry gk(.param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    and.b32 %r6, %r5, 3;
    mul.wide.u32 %rd2, %r6, 4;
    mov.u64 %rd3, coef;
    add.s64 %rd4, %rd3, %rd2;
    ld.const.u32 %r7, [%rd4];
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd1, %rd5;
    st.global.u32 [%rd6], %r7;
    atom.global.add.u32 %r8, [counter], 1;
DONE:
    ret;
}
"#;

/// Module variables: initial values seen by the kernel, then new ones written through
/// `module_global`, and the kernel's counter read back.
fn globals(d: &mut GuestDevice, n: u32) -> Result<(), String> {
    let e = |e: DeviceError| e.to_string();
    let m = d.module_load(VARS_PTX).map_err(e)?;
    let out = d.mem_alloc(u64::from(n) * 4).map_err(e)?;
    let (coef, coef_len) = d.module_global(m, "coef").map_err(e)?;
    let (counter, _) = d.module_global(m, "counter").map_err(e)?;
    if coef_len != 16 {
        return Err(format!("coef is {coef_len} bytes"));
    }
    let mut p = out.to_le_bytes().to_vec();
    p.extend_from_slice(&n.to_le_bytes());
    p.resize(16, 0);
    for (round, table) in [[1u32, 2, 3, 4], [10, 20, 30, 40]].iter().enumerate() {
        if round == 1 {
            d.copy_htod(coef, &u32s(table)).map_err(e)?;
            d.copy_htod(counter, &u32s(&[0])).map_err(e)?;
        }
        d.launch(&Launch {
            module: m,
            entry: "gk",
            grid: [n.div_ceil(128), 1, 1],
            block: [128, 1, 1],
            shared_bytes: 0,
            params: &p[..12],
        })
        .map_err(e)?;
        let mut got = vec![0u8; n as usize * 4];
        d.copy_dtoh(&mut got, out).map_err(e)?;
        let got = from_u32s(&got);
        if (0..n as usize).any(|i| got[i] != table[i % 4]) {
            return Err(format!(
                "module variables: round {round} read {:?}",
                &got[..4]
            ));
        }
        let mut c = [0u8; 4];
        d.copy_dtoh(&mut c, counter).map_err(e)?;
        if u32::from_le_bytes(c) != n {
            return Err(format!(
                "counter {} after {n} threads",
                u32::from_le_bytes(c)
            ));
        }
    }
    d.mem_free(out).map_err(e)?;
    d.module_unload(m).map_err(e)
}

fn vadd_params(a: u64, b: u64, c: u64, n: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(28);
    for v in [a, b, c] {
        p.extend_from_slice(&v.to_le_bytes());
    }
    p.extend_from_slice(&n.to_le_bytes());
    p
}

fn u32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Where `got` differs from `want`: how many words, the first and last index, the first
/// wrong word's address (`base` is where `got`'s bytes were read into) and up to 16 words
/// from there, as read and as expected.
fn mismatch(got: &[u32], base: *const u8, want: impl Fn(usize) -> u32) -> String {
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want(i)).collect();
    let (Some(&first), Some(&last)) = (bad.first(), bad.last()) else {
        return "ok".into();
    };
    let span = first..(first + 16).min(got.len());
    let words = |f: &dyn Fn(usize) -> u32| {
        span.clone()
            .map(|i| format!("{:x}", f(i)))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "{} of {} wrong, [{first}..={last}] at {:#x} got [{}] want [{}]",
        bad.len(),
        got.len(),
        base as usize + 4 * first,
        words(&|i| got[i]),
        words(&want)
    )
}

/// Copies `c` back once more (pageable) and says how it compares with `want`.
fn reread(
    d: &mut GuestDevice,
    c: u64,
    bytes: u64,
    want: impl Fn(usize) -> u32,
) -> Result<String, String> {
    let mut again = vec![0u8; bytes as usize];
    d.copy_dtoh(&mut again, c).map_err(|e| e.to_string())?;
    Ok(mismatch(&from_u32s(&again), again.as_ptr(), want))
}

/// `c = a + b`, then `c += a` until `until` exists (at most 2000 times), checked.
fn vadd(
    d: &mut GuestDevice,
    n: u32,
    ready: Option<&str>,
    until: Option<&str>,
) -> Result<String, String> {
    let e = |e: DeviceError| e.to_string();
    let m = d.module_load(PTX).map_err(e)?;
    let bytes = u64::from(n) * 4;
    let (a, b, c) = (
        d.mem_alloc(bytes).map_err(e)?,
        d.mem_alloc(bytes).map_err(e)?,
        d.mem_alloc(bytes).map_err(e)?,
    );
    let ha: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761) >> 8).collect();
    // b from pinned memory (host_alloc: the GPU reads it in place).
    let hb = d.host_alloc(bytes).map_err(e)?;
    let hbv: Vec<u32> = (0..n).map(|i| i ^ 0x5a5a).collect();
    // SAFETY: `hb.host` points at `hb.len >= bytes` bytes of this process's DMA memory,
    // valid until host_free, not otherwise referenced while this slice lives.
    unsafe { std::slice::from_raw_parts_mut(hb.host, bytes as usize) }.copy_from_slice(&u32s(&hbv));
    // Memory only the CPU touches, checked at the end: corrupted, it is no GPU's doing.
    let canary_of = |i: usize| (i as u32).wrapping_mul(0x9e37_79b1) ^ 0xc0ff_ee00;
    let canary: Vec<u32> = (0..n as usize).map(canary_of).collect();
    d.copy_htod(a, &u32s(&ha)).map_err(e)?;
    d.copy_dtod(b, hb.dev, bytes).map_err(e)?;
    d.memset(c, 0xdead_beef, 4, u64::from(n)).map_err(e)?;
    let mut back = vec![0u8; bytes as usize];
    d.copy_dtoh(&mut back, c).map_err(e)?;
    let filled = from_u32s(&back);
    if filled.iter().any(|&x| x != 0xdead_beef) {
        let again = reread(d, c, bytes, |_| 0xdead_beef)?;
        return Err(format!(
            "memset: {} (read again: {again})",
            mismatch(&filled, back.as_ptr(), |_| 0xdead_beef)
        ));
    }
    if let Some(r) = ready {
        std::fs::write(r, b"1").map_err(|x| format!("{r}: {x}"))?;
    }
    let grid = [n.div_ceil(256), 1, 1];
    let launch = |d: &mut GuestDevice, x: u64, y: u64| {
        let p = vadd_params(x, y, c, n);
        d.launch(&Launch {
            module: m,
            entry: "vadd",
            grid,
            block: [256, 1, 1],
            shared_bytes: 0,
            params: &p,
        })
    };
    let m0 = d.marker().map_err(e)?;
    launch(d, a, b).map_err(e)?;
    let mut iters = 0u32;
    let start = Instant::now();
    loop {
        let go_on = until.is_some_and(|f| !Path::new(f).exists());
        if !go_on || iters >= 2000 || start.elapsed() > Duration::from_secs(600) {
            break;
        }
        launch(d, a, c).map_err(e)?;
        iters += 1;
        if iters.is_multiple_of(8) {
            d.synchronize().map_err(e)?;
        }
    }
    let m1 = d.marker().map_err(e)?;
    d.wait(m1).map_err(e)?;
    let gpu_ns = d
        .marker_time_ns(m1)
        .map_err(e)?
        .saturating_sub(d.marker_time_ns(m0).map_err(e)?);
    // The result, once into pinned memory and once pageable.
    let out = d.host_alloc(bytes).map_err(e)?;
    // SAFETY: as for `hb`.
    let pinned = unsafe { std::slice::from_raw_parts_mut(out.host, bytes as usize) };
    d.copy_dtoh(pinned, c).map_err(e)?;
    d.copy_dtoh(&mut back, c).map_err(e)?;
    let cpu = mismatch(&canary, canary.as_ptr().cast(), canary_of);
    if cpu != "ok" {
        return Err(format!("CPU-only memory changed: {cpu}"));
    }
    let got = from_u32s(&back);
    let want = |i: usize| ha[i].wrapping_mul(iters + 1).wrapping_add(hbv[i]);
    let bad = (0..n as usize).filter(|&i| got[i] != want(i)).count();
    if bad > 0 || pinned[..] != back[..] {
        let again = reread(d, c, bytes, want)?;
        return Err(format!(
            "after {iters} accumulations: pageable {}; pinned {}; read again: {again}",
            mismatch(&got, back.as_ptr(), want),
            mismatch(&from_u32s(pinned), pinned.as_ptr(), want),
        ));
    }
    for p in [a, b, c] {
        d.mem_free(p).map_err(e)?;
    }
    d.host_free(hb.host).map_err(e)?;
    d.host_free(out.host).map_err(e)?;
    d.module_unload(m).map_err(e)?;
    globals(d, n.min(4096))?;
    Ok(format!(
        "n={n} iters={iters} gpu_us={} globals=ok",
        gpu_ns / 1000
    ))
}

/// Large copies in a loop for `secs` seconds, each checked: from the heap into a buffer of
/// the `memmap=` range, mapped through /dev/mem as the CUDA processes map their staging
/// buffers (uncached: a copy takes milliseconds, so the guest switches to the other instance
/// in the middle of copies), and back. Instance `k` (< 16) uses its own MiB of the range.
/// Copies whose vector registers another process's context switch clobbered (a kernel that
/// does not save the state glibc's routines use) come out with wrong bytes.
fn copies(secs: u64, k: u64) -> Result<String, String> {
    let n = 400_000usize;
    use vgpu_linux_tools::dma::{DmaPool, reserved_range};
    let cmdline = std::fs::read_to_string("/proc/cmdline").map_err(|e| e.to_string())?;
    let (gpa, len) = reserved_range(&cmdline).ok_or("no memmap= range")?;
    let at = (32 + k) << 20;
    if len < at + (1 << 20) {
        return Err(format!("the memmap= range ({len:#x} bytes) is too small"));
    }
    let mut pool = DmaPool::map(gpa + at, 1 << 20).map_err(|e| e.to_string())?;
    let buf = pool
        .alloc(n, 4096)
        .ok_or_else(|| "the memmap= range is too small".to_string())?;
    let seed = std::process::id();
    let src: Vec<u8> = (0..n)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed)
                .to_le_bytes()[1]
        })
        .collect();
    let mut back = vec![0u8; n];
    let start = Instant::now();
    let mut rounds = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        buf.write(0, &src).ok_or("write")?;
        back.fill(0);
        buf.read(0, &mut back).ok_or("read")?;
        rounds += 1;
        if let Some(i) = (0..n).find(|&i| back[i] != src[i]) {
            let bad = (0..n).filter(|&i| back[i] != src[i]).count();
            return Err(format!(
                "round {rounds}: {bad} of {n} bytes wrong from byte {i}: {:02x?}",
                &back[i..(i + 16).min(n)]
            ));
        }
    }
    Ok(format!("rounds={rounds}"))
}

/// A store to an unmapped address: the sticky error must say illegal address.
fn fault(d: &mut GuestDevice) -> Result<String, String> {
    let m = d.module_load(PTX).map_err(|e| e.to_string())?;
    let p = 0x10u64.to_le_bytes();
    d.launch(&Launch {
        module: m,
        entry: "poke",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
        params: &p,
    })
    .map_err(|e| format!("launch refused: {e}"))?;
    match d.synchronize() {
        Err(err @ DeviceError::IllegalAddress(_)) => {
            // Sticky: later work fails with the same error.
            let again = d.mem_alloc(256).and_then(|x| d.copy_htod(x, &[1; 4]));
            if again != Err(err.clone()) {
                return Err(format!("not sticky: {again:?}"));
            }
            Ok(format!("sticky=\"{err}\""))
        }
        other => Err(format!("expected an illegal address, got {other:?}")),
    }
}

/// Per-launch cost: `n` (≤ 256) launches through the backend, then `n` through the bare
/// driver's path, on the same channel, nine rounds each (after a warm-up), alternating;
/// medians.
fn bench(d: &mut GuestDevice, n: u64) -> Result<String, String> {
    let e = |e: DeviceError| e.to_string();
    let m: ModuleId = d.module_load(PTX).map_err(e)?;
    let x = d.mem_alloc(256).map_err(e)?;
    let p = x.to_le_bytes();
    let l = Launch {
        module: m,
        entry: "nothing",
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
        params: &p,
    };
    let (mut lib, mut bare) = (Vec::new(), Vec::new());
    // Rounds of at most 256 launches: fewer than the channel's ring holds, so issuing never
    // waits for the GPU to make room and the issue time is the CPU's cost per launch.
    let n = n.min(256);
    for round in 0..10 {
        d.synchronize().map_err(e)?;
        let t = Instant::now();
        for _ in 0..n {
            d.launch(&l).map_err(e)?;
        }
        let issue = t.elapsed();
        d.synchronize().map_err(e)?;
        let lib_t = (issue, t.elapsed());
        let t = Instant::now();
        d.bare_launches(m, "nothing", &p, n).map_err(e)?;
        let issue = t.elapsed();
        d.synchronize().map_err(e)?;
        let bare_t = (issue, t.elapsed());
        if round > 0 {
            // Round 0 warms the module cache and the pools.
            lib.push(lib_t);
            bare.push(bare_t);
        }
    }
    let per = |v: &[(Duration, Duration)], f: fn(&(Duration, Duration)) -> Duration| {
        let mut ns: Vec<f64> = v
            .iter()
            .map(|t| f(t).as_nanos() as f64 / n as f64)
            .collect();
        ns.sort_by(f64::total_cmp);
        ns[ns.len() / 2]
    };
    let (li, bi) = (per(&lib, |t| t.0), per(&bare, |t| t.0));
    let (lt, bt) = (per(&lib, |t| t.1), per(&bare, |t| t.1));
    Ok(format!(
        "launches={n} issue_ns lib={li:.0} bare={bi:.0} diff={:.0} ratio={:.3} total_ns lib={lt:.0} bare={bt:.0} diff={:.0} ratio={:.3}",
        li - bi,
        li / bi,
        lt - bt,
        lt / bt
    ))
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    let num = |d: u64| args.get(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(d);
    if mode == "copies" {
        // No GPU: the guest's own memory and register state.
        let k = args.get(2).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match copies(num(20).clamp(1, 3600), k.min(15)) {
            Ok(s) => println!("CHECK copies ok=1 {s}"),
            Err(s) => {
                println!("CHECK copies ok=0 {s}");
                std::process::exit(1);
            }
        }
        return;
    }
    if !matches!(mode, "vadd" | "fault" | "hold" | "info" | "bench") {
        println!(
            "usage: cuda-guest-check vadd N [--ready F] [--until F] | fault [--wait F] [--done F] | hold | info | bench N | copies SECS [K]"
        );
        std::process::exit(2);
    }
    if mode == "fault"
        && let Some(w) = flag(&args, "--wait")
    {
        let t = Instant::now();
        while !Path::new(w).exists() && t.elapsed() < Duration::from_secs(180) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut d = match GuestDevice::open() {
        Ok(d) => d,
        Err(e) => {
            println!("CHECK {mode} ok=0 open: {e}");
            std::process::exit(3);
        }
    };
    let slot = d.slot();
    let para = d.is_para();
    let r = match mode {
        "vadd" => vadd(
            &mut d,
            u32::try_from(num(4096).clamp(1, 1 << 24)).unwrap_or(4096),
            flag(&args, "--ready"),
            flag(&args, "--until"),
        ),
        "fault" => {
            let r = fault(&mut d);
            if let Some(f) = flag(&args, "--done") {
                let _ = std::fs::write(f, b"1");
            }
            r
        }
        "bench" => bench(&mut d, num(2000).clamp(1, 1 << 20)),
        "hold" => {
            println!("CHECK hold slot={slot}");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        _ => Ok(d.describe()),
    };
    match r {
        Ok(s) => {
            let tag = if mode == "bench" { "BENCH" } else { "CHECK" };
            println!("{tag} {mode} ok=1 slot={slot} para={para} {s}");
        }
        Err(s) => {
            println!("CHECK {mode} ok=0 slot={slot} para={para} {s}");
            std::process::exit(1);
        }
    }
}
