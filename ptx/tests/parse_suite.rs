//! Every PTX file of the project's workload suite (hand-written kernels and real nvcc output)
//! must parse, with the expected entries and parameter layouts.

macro_rules! suite {
    ($($name:literal => $path:literal),* $(,)?) => {
        &[$(($name, include_str!($path))),*]
    };
}

const FILES: &[(&str, &str)] = suite! {
    "atomics64" => "../../suite/cuda/atomics64.ptx",
    "convert" => "../../suite/cuda/convert.ptx",
    "histogram" => "../../suite/cuda/histogram.ptx",
    "scan" => "../../suite/cuda/scan.ptx",
    "vote" => "../../suite/cuda/vote.ptx",
    "warp_reduce" => "../../suite/cuda/warp_reduce.ptx",
    "graph" => "../../suite/kernels/graph.ptx",
    "matmul" => "../../suite/kernels/matmul.ptx",
    "reduction" => "../../suite/kernels/reduction.ptx",
    "saxpy" => "../../suite/kernels/saxpy.ptx",
    "spin" => "../../suite/kernels/spin.ptx",
    "stencil" => "../../suite/kernels/stencil.ptx",
    "vecadd" => "../../suite/kernels/vecadd.ptx",
};

#[test]
fn all_suite_files_parse() {
    let mut failures = Vec::new();
    for (name, text) in FILES {
        match ptx::parse(text) {
            Ok(m) => {
                assert!(m.entries().count() >= 1, "{name}: no entries");
                for e in m.entries() {
                    assert!(e.instructions > 1, "{name}: empty entry");
                    let end = e.params.last().map_or(0, |p| p.offset + p.size);
                    assert_eq!(e.param_size, end, "{name}");
                }
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn nvcc_entries_are_named_after_files() {
    for (name, text) in &FILES[..6] {
        let m = ptx::parse(text).expect("parses");
        assert!(m.entry(name).is_some(), "{name}");
    }
}
