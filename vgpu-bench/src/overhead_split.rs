//! Where the download phase and init go, per configuration of `overhead`: the download phase
//! split into the copies into system memory (as the driver waits for them, and as the device
//! times them by destination in `counters.path`) and the CPU reading the results, and init
//! split into its parts (`gpu_driver::InitParts`); each against native. Written into
//! summary.json (`download_split`, `init_split`) and as extra rows of overhead.csv.

use crate::exp_overhead::Table;
use crate::overhead_output::{geomean, ratio};
use crate::overhead_vm::{COPY_KINDS, DOWNLOAD_PARTS, DeviceCopies, init_part_names};

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// The device's copies of one kind as JSON: runs, engine time, MiB and µs per MiB.
fn copies_json(c: &DeviceCopies) -> serde_json::Value {
    let mib = c.bytes as f64 / f64::from(1 << 20);
    serde_json::json!({
        "copies": c.n,
        "us": us(c.ns),
        "mib": mib,
        "us_per_mib": if mib > 0.0 { us(c.ns) / mib } else { 0.0 },
    })
}

/// `download_split` of configuration `t` against `base` (native, same size): per part the
/// time summed over the workloads (medians), the geomean slowdown over the workloads; the same
/// reads repeated right after the phase (`reread_us`: the read without first touches of its
/// destination); and the device's copy timings by destination.
pub(crate) fn download_json(t: &Table, base: &Table) -> serde_json::Value {
    let mut parts = serde_json::Map::new();
    for (k, name) in DOWNLOAD_PARTS.iter().enumerate() {
        let mut slow = Vec::new();
        let mut sum = 0u64;
        for b in &t.data.benches {
            sum += b.download_parts[k].ns;
            if let Some(nb) = base.data.benches.iter().find(|n| n.name == b.name) {
                slow.push(ratio(b.download_parts[k].ns, nb.download_parts[k].ns));
            }
        }
        parts.insert(
            (*name).to_string(),
            serde_json::json!({ "us": us(sum), "geomean_slowdown": geomean(&slow) }),
        );
    }
    parts.insert(
        "reread_us".into(),
        serde_json::json!(us(t.data.benches.iter().map(|b| b.reread_ns).sum())),
    );
    let mut device = serde_json::Map::new();
    for (c, name) in t.data.copies.iter().zip(COPY_KINDS) {
        device.insert(format!("copy_{name}"), copies_json(c));
    }
    parts.insert("device".into(), serde_json::Value::Object(device));
    serde_json::Value::Object(parts)
}

/// `init_split` of `t` against `base`: each part's time (median over the repetitions) and its
/// slowdown; the device's launch preparation (module loads included, which happen at a
/// workload's first launch, in its kernel phase, not in init); the guest's heap high-water mark.
pub(crate) fn init_json(t: &Table, base: &Table) -> serde_json::Value {
    let mut parts = serde_json::Map::new();
    for (k, name) in init_part_names().iter().enumerate() {
        parts.insert(
            (*name).to_string(),
            serde_json::json!({
                "us": us(t.data.init_parts[k]),
                "slowdown": ratio(t.data.init_parts[k], base.data.init_parts[k]),
            }),
        );
    }
    parts.insert(
        "launch_prep_us".into(),
        serde_json::json!(us(t.data.launch_prep_ns)),
    );
    parts.insert(
        "guest_heap_used_mib".into(),
        serde_json::json!(t.data.heap_used_mib),
    );
    serde_json::Value::Object(parts)
}

/// overhead.csv rows (`config,size,benchmark,phase,time_us,slowdown,mmio_exits,ok`) of the
/// splits: per workload `download_copy` and `download_read`; per run `init_<part>` rows with
/// benchmark `init` (their MMIO column is empty: the driver counts exits per phase only).
pub(crate) fn csv_rows(t: &Table, base: &Table) -> Vec<String> {
    let mut rows = Vec::new();
    for (k, name) in init_part_names().iter().enumerate() {
        rows.push(format!(
            "{},{},init,init_{name},{:.1},{:.3},,1",
            t.config.name,
            t.size,
            us(t.data.init_parts[k]),
            ratio(t.data.init_parts[k], base.data.init_parts[k]),
        ));
    }
    for b in &t.data.benches {
        let Some(nb) = base.data.benches.iter().find(|n| n.name == b.name) else {
            continue;
        };
        for (k, name) in DOWNLOAD_PARTS.iter().enumerate() {
            let (p, np) = (b.download_parts[k], nb.download_parts[k]);
            rows.push(format!(
                "{},{},{},{name},{:.1},{:.3},{},{}",
                t.config.name,
                t.size,
                b.name,
                us(p.ns),
                ratio(p.ns, np.ns),
                p.mmio,
                u8::from(b.ok)
            ));
        }
    }
    rows
}
