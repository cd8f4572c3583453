//! Self-consistency of every workload instance: validation, reference accepted, perturbations rejected, determinism, sizes.

use suite::{Expect, Instance, Mismatch, Size, Value, Workload};

fn every() -> Vec<&'static Workload> {
    suite::all().collect()
}

/// Outputs that differ from the reference in element `index` of buffer `buf`, by more than
/// any tolerance; `None` when that buffer cannot be perturbed (a spin bound of 0).
fn perturbed(inst: &Instance, buf: usize, index: usize) -> Option<Vec<Vec<u8>>> {
    let mut out = inst.reference_outputs();
    let b = &mut out[buf];
    match &inst.buffers[buf].expect {
        Expect::Ignore => return None,
        Expect::Exact { elem, .. } => b[index * elem.size()] ^= 1,
        Expect::F32 { values, abs, .. } => {
            let v = values[index];
            let bad = if v.is_nan() {
                0.0
            } else {
                v + v.abs() + 2.0 * abs + 1.0
            };
            b[index * 4..index * 4 + 4].copy_from_slice(&bad.to_le_bytes());
        }
        Expect::U64AtLeast { min, .. } => {
            let bad = min.checked_sub(1)?;
            b[index * 8..index * 8 + 8].copy_from_slice(&bad.to_le_bytes());
        }
    }
    Some(out)
}

fn elements(e: &Expect) -> usize {
    match e {
        Expect::Ignore => 0,
        Expect::Exact { elem, bytes } => bytes.len() / elem.size(),
        Expect::F32 { values, .. } => values.len(),
        Expect::U64AtLeast { count, .. } => *count,
    }
}

fn check_instance(inst: &Instance) {
    let name = inst.workload;
    inst.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    let reference = inst.reference_outputs();
    let slices: Vec<&[u8]> = reference.iter().map(Vec::as_slice).collect();
    let sum = inst
        .check(&slices)
        .unwrap_or_else(|e| panic!("{name}: reference rejected: {e}"));
    assert!(
        sum.buffers >= 1 && sum.elements >= 1,
        "{name}: nothing checked"
    );
    assert_eq!(sum.buffers, inst.read_back().count());
    for buf in inst.read_back() {
        let n = elements(&inst.buffers[buf].expect);
        for index in [0, n / 2, n - 1] {
            let Some(bad) = perturbed(inst, buf, index) else {
                continue;
            };
            let slices: Vec<&[u8]> = bad.iter().map(Vec::as_slice).collect();
            match inst.check(&slices) {
                Err(Mismatch::Value {
                    buffer, index: i, ..
                }) => {
                    assert_eq!((buffer, i), (buf, index), "{name}: wrong place reported");
                }
                other => panic!("{name}: perturbed buffer {buf}[{index}] gave {other:?}"),
            }
        }
        let mut short = reference.clone();
        short[buf].pop();
        let slices: Vec<&[u8]> = short.iter().map(Vec::as_slice).collect();
        assert!(
            matches!(inst.check(&slices), Err(Mismatch::Length { buffer, .. }) if buffer == buf)
        );
    }
    assert!(matches!(
        inst.check(&slices[1..]),
        Err(Mismatch::OutputCount { .. })
    ));
}

#[test]
fn small_and_medium_instances_are_self_consistent() {
    for w in every() {
        for size in [Size::Small, Size::Medium] {
            check_instance(&w.instance(size));
        }
    }
}

#[test]
fn large_instances_are_valid() {
    for w in every() {
        let inst = w.instance(Size::Large);
        inst.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", w.name));
        let reference = inst.reference_outputs();
        let slices: Vec<&[u8]> = reference.iter().map(Vec::as_slice).collect();
        inst.check(&slices)
            .unwrap_or_else(|e| panic!("{}: {e}", w.name));
    }
}

#[test]
fn generation_is_deterministic_and_sizes_differ() {
    for w in every() {
        let a = w.instance(Size::Small);
        assert_eq!(a, w.instance(Size::Small), "{}", w.name);
        assert_ne!(a.buffers, w.instance(Size::Medium).buffers, "{}", w.name);
    }
}

#[test]
fn sizes_match_their_budgets() {
    for w in every() {
        // Xl is left out: building it (host references included) takes seconds per workload in
        // a debug build; `xl_instances_are_valid_and_fit_their_memory` checks it on request.
        let [s, m, l] = [Size::Small, Size::Medium, Size::Large]
            .map(|size| w.instance(size).approx_thread_instrs);
        // Small: well under 10 ms at 1e8 thread-instructions/s. Medium: a few ms.
        assert!(s <= 400_000, "{}: small is {s}", w.name);
        assert!(
            (100_000..=1_500_000).contains(&m),
            "{}: medium is {m}",
            w.name
        );
        assert!(s < m && m < l, "{}: {s} {m} {l}", w.name);
    }
}

/// Xl (real GPUs only): every instance valid, its reference accepted, more work than large, and
/// the largest workload's buffers and PTX fit the driver pool and VRAM that `Size::Xl` asks for.
/// Ignored by default (seconds per workload in a debug build); run it with
/// `cargo test --release -p suite --test instances -- --ignored`.
#[test]
#[ignore]
fn xl_instances_are_valid_and_fit_their_memory() {
    let mut biggest = 0usize;
    for w in every() {
        let inst = w.instance(Size::Xl);
        inst.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", w.name));
        let reference = inst.reference_outputs();
        let slices: Vec<&[u8]> = reference.iter().map(Vec::as_slice).collect();
        inst.check(&slices)
            .unwrap_or_else(|e| panic!("{}: {e}", w.name));
        let large = w.instance(Size::Large).approx_thread_instrs;
        assert!(inst.approx_thread_instrs > large, "{}", w.name);
        // Staging: every buffer and the PTX in the pool at once, each 256-byte aligned.
        let bytes: usize = inst
            .buffers
            .iter()
            .map(|b| b.init.len().next_multiple_of(256))
            .sum();
        biggest = biggest.max(bytes + inst.ptx.len().next_multiple_of(256));
    }
    let pool = (Size::Xl.sys_pool_mib() << 20) as usize;
    // Room left for the channel's ring, stream and semaphores (well under 8 MiB).
    assert!(
        biggest + (8 << 20) <= pool,
        "{biggest} bytes vs a {pool}-byte pool"
    );
    // VRAM holds the buffers and the driver's VRAM pool (half the aperture) besides.
    assert!(
        biggest <= (Size::Xl.vram_mib().unwrap() << 20) as usize / 2,
        "{biggest}"
    );
}

#[test]
fn names_unique_entries_declared_and_found() {
    let all = every();
    assert_eq!(all.len(), 13);
    for (i, w) in all.iter().enumerate() {
        assert!(
            all[i + 1..].iter().all(|o| o.name != w.name),
            "duplicate {}",
            w.name
        );
        assert!(w.ptx.contains(".address_size 64"), "{}", w.name);
        assert!(
            w.ptx.contains(&format!(".entry {}(", w.entry)),
            "{}",
            w.name
        );
        assert_eq!(suite::find(w.name).map(|f| f.name), Some(w.name));
        assert!(!w.about.is_empty());
    }
    assert!(suite::find("nope").is_none());
    assert_eq!(Size::from_name("medium"), Some(Size::Medium));
    assert_eq!(Size::from_name("huge"), None);
}

#[test]
fn mismatch_messages_name_buffer_and_values() {
    let inst = suite::find("reduction").unwrap().instance(Size::Small);
    let mut out = inst.reference_outputs();
    out[2][0] ^= 4;
    let slices: Vec<&[u8]> = out.iter().map(Vec::as_slice).collect();
    let err = inst.check(&slices).unwrap_err();
    let Mismatch::Value {
        expected: Value::U64(e),
        got: Value::U64(g),
        ..
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!(e ^ g, 4);
    let text = err.to_string();
    assert!(text.contains("buffer 2 (total) element 0"), "{text}");
}

#[test]
fn buffers_not_read_back_are_not_looked_at() {
    let inst = suite::find("vecadd").unwrap().instance(Size::Small);
    let reference = inst.reference_outputs();
    let slices: Vec<&[u8]> = vec![&[], &[], &reference[2]];
    assert!(inst.check(&slices).is_ok());
}

/// `.param` types declared by `.entry name(...)` in `ptx`, in order.
fn declared_params(ptx: &str, entry: &str) -> Vec<String> {
    let start = ptx.find(&format!(".entry {entry}(")).expect("entry");
    let end = start + ptx[start..].find(')').expect("param list end");
    ptx[start..end]
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".param "))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn launch_params_match_the_ptx_declarations() {
    for w in every() {
        let inst = w.instance(Size::Small);
        for l in &inst.launches {
            let decl = declared_params(inst.ptx, l.entry);
            assert_eq!(decl.len(), l.params.len(), "{}", w.name);
            for (d, p) in decl.iter().zip(&l.params) {
                let ok = match p {
                    suite::Param::Buffer(_) | suite::Param::U64(_) | suite::Param::I64(_) => {
                        matches!(d.as_str(), ".u64" | ".s64" | ".b64")
                    }
                    suite::Param::U32(_) | suite::Param::I32(_) => {
                        matches!(d.as_str(), ".u32" | ".s32" | ".b32")
                    }
                    suite::Param::F32(_) => d == ".f32",
                    suite::Param::F64(_) => d == ".f64",
                };
                assert!(ok, "{}: {p:?} passed for a {d} parameter", w.name);
            }
        }
    }
}
