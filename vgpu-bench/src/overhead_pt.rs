//! The overhead experiment against the pass-through baseline (`pt`, `--gpu mode=pt`): GPUvm's
//! FV/PT and PV/PT next to FV/native and PV/native — per benchmark, per phase and as geometric
//! means — and GPUvm's table of them (`overhead-table.md`, `summary.json`'s `gpuvm_table`).

use std::path::Path;

use crate::error::BenchError;
use crate::exp_overhead::{PT, Table};
use crate::overhead_output::{geomean, ratio, total};
use crate::overhead_vm::{Bench, PHASES};

/// One benchmark of a configuration against the same benchmark under pt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BenchVsPt {
    /// upload + kernel + download + free.
    pub total: f64,
    /// With each run's init added to both sides.
    pub with_init: f64,
    /// upload, kernel, download, free.
    pub phases: [f64; 4],
}

/// Collects a configuration's ratios against pt (at the same size) while its benchmarks are
/// gone through; empty when pt did not run at that size.
pub(crate) struct VsPt<'a> {
    pt: Option<&'a Table<'a>>,
    totals: Vec<f64>,
    with_inits: Vec<f64>,
    phases: [Vec<f64>; 4],
    init: Option<f64>,
}

impl<'a> VsPt<'a> {
    /// Against the pt table of `t`'s size among `tables`, if there is one.
    pub fn new(tables: &'a [Table<'a>], t: &Table) -> Self {
        let pt = tables
            .iter()
            .find(|p| p.config.name == PT && p.size == t.size);
        VsPt {
            pt,
            totals: Vec::new(),
            with_inits: Vec::new(),
            phases: Default::default(),
            init: pt.map(|p| ratio(t.data.init.ns, p.data.init.ns)),
        }
    }

    /// `b` (of a run whose init took `init_ns`) against pt's benchmark of the same name; counted
    /// in the geometric means. None without pt or when pt lacks the benchmark.
    pub fn bench(&mut self, b: &Bench, init_ns: u64) -> Option<BenchVsPt> {
        let pt = self.pt?;
        let pb = pt.data.benches.iter().find(|p| p.name == b.name)?;
        let (tot, ptot) = (total(b).ns, total(pb).ns);
        let r = BenchVsPt {
            total: ratio(tot, ptot),
            with_init: ratio(tot + init_ns, ptot + pt.data.init.ns),
            phases: std::array::from_fn(|k| ratio(b.phases[k].ns, pb.phases[k].ns)),
        };
        self.totals.push(r.total);
        self.with_inits.push(r.with_init);
        for (v, x) in self.phases.iter_mut().zip(r.phases) {
            v.push(x);
        }
        Some(r)
    }

    /// The init ratio against pt (None without pt).
    pub fn init(&self) -> Option<f64> {
        self.init
    }

    /// Geometric means so far (None without pt or without a benchmark in common).
    pub fn ratios(&self) -> Option<Ratios> {
        (!self.totals.is_empty()).then(|| Ratios {
            total: geomean(&self.totals),
            with_init: geomean(&self.with_inits),
            init: self.init.unwrap_or(0.0),
            phases: std::array::from_fn(|k| geomean(&self.phases[k])),
        })
    }
}

/// Geometric means of one configuration at one size against a baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ratios {
    pub total: f64,
    pub with_init: f64,
    pub init: f64,
    /// upload, kernel, download, free.
    pub phases: [f64; 4],
}

impl Ratios {
    pub fn json(&self) -> serde_json::Value {
        let phases: serde_json::Map<String, serde_json::Value> = PHASES
            .iter()
            .zip(self.phases)
            .map(|(n, v)| (n.to_string(), serde_json::json!(v)))
            .collect();
        serde_json::json!({
            "geomean_slowdown": self.total,
            "geomean_slowdown_with_init": self.with_init,
            "init": self.init,
            "phase_geomean_slowdown": phases,
        })
    }
}

/// One row of GPUvm's table: a configuration at a size, against native and against pt.
pub(crate) struct Row {
    pub config: String,
    pub size: String,
    pub vs_native: Ratios,
    pub vs_pt: Option<Ratios>,
}

/// `summary.json`'s `gpuvm_table`: the rows in run order.
pub(crate) fn table_json(rows: &[Row]) -> serde_json::Value {
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "config": r.config,
                    "size": r.size,
                    "vs_native": r.vs_native.json(),
                    "vs_pt": r.vs_pt.map(|v| v.json()),
                })
            })
            .collect(),
    )
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |x| format!("{x:.2}"))
}

/// GPUvm's table as Markdown: per size, each configuration's geomean slowdown against native
/// and against pt (init excluded, then with init, init alone, and per phase).
pub(crate) fn table_markdown(rows: &[Row], backend: &str, reps: usize) -> String {
    let mut md = format!(
        "# Overhead: GPUvm's table (backend {backend}, medians of {reps} run{})\n\n\
         Geometric means over the workloads of time / native time and time / pass-through (pt) \
         time; `total` is upload + kernel + download + free (init excluded), `with init` adds \
         each run's driver set-up to both sides. FV/PT and PV/PT are the `/pt` columns of the \
         full and para rows.\n",
        if reps == 1 { "" } else { "s" }
    );
    let mut sizes: Vec<&str> = Vec::new();
    for r in rows {
        if !sizes.contains(&r.size.as_str()) {
            sizes.push(&r.size);
        }
    }
    for s in sizes {
        md.push_str(&format!(
            "\n## size {s}\n\n| configuration | /native | /pt | with init /native | with init /pt | \
             init /native | init /pt | upload /native | upload /pt | kernel /native | kernel /pt \
             | download /native | download /pt |\n|{}\n",
            " --- |".repeat(13)
        ));
        for r in rows.iter().filter(|r| r.size == s) {
            let (n, p) = (&r.vs_native, r.vs_pt.as_ref());
            md.push_str(&format!(
                "| {} | {:.2} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} |\n",
                r.config,
                n.total,
                cell(p.map(|p| p.total)),
                n.with_init,
                cell(p.map(|p| p.with_init)),
                n.init,
                cell(p.map(|p| p.init)),
                n.phases[0],
                cell(p.map(|p| p.phases[0])),
                n.phases[1],
                cell(p.map(|p| p.phases[1])),
                n.phases[2],
                cell(p.map(|p| p.phases[2])),
            ));
        }
    }
    md
}

/// overhead.csv's header: the columns before the pt ratio, then `slowdown_vs_pt`.
pub(crate) const CSV_HEADER: &str =
    "config,size,benchmark,phase,time_us,slowdown,mmio_exits,ok,slowdown_vs_pt";

/// Gives every row the header's number of fields: a row written without a ratio against pt
/// (one field short) gets an empty `slowdown_vs_pt`. No field of these rows holds a comma.
pub(crate) fn pad_csv(rows: &mut [String]) {
    let fields = CSV_HEADER.split(',').count();
    for r in rows {
        let have = r.split(',').count();
        for _ in have..fields {
            r.push(',');
        }
    }
}

/// Writes `dir/overhead-table.md`.
pub(crate) fn write_markdown(dir: &Path, text: &str) -> Result<(), BenchError> {
    let path = dir.join("overhead-table.md");
    std::fs::write(&path, text).map_err(|source| BenchError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use gpu_driver::suite_run::Phase;

    use super::*;
    use crate::backend::Backend;
    use crate::exp_overhead::{Args, CONFIGS};
    use crate::overhead_vm::RunData;

    /// A run of workloads `a` and `b` whose phases take `a` and `b` ns each, after `init` ns.
    fn run(init: u64, a: u64, b: u64) -> RunData {
        let bench = |name: &str, ns| Bench {
            name: name.into(),
            ok: true,
            phases: [Phase { ns, mmio: 0 }; 4],
            ..Bench::default()
        };
        RunData {
            init: Phase { ns: init, mmio: 0 },
            benches: vec![bench("a", a), bench("b", b)],
            ..RunData::default()
        }
    }

    fn config(name: &str) -> &'static crate::exp_overhead::ConfigDef {
        CONFIGS.iter().find(|c| c.name == name).unwrap()
    }

    fn table(name: &str, data: RunData) -> Table<'static> {
        Table {
            config: config(name),
            gpu: String::new(),
            guest_args: String::new(),
            size: "small",
            runs: vec![data.clone()],
            data,
        }
    }

    #[test]
    fn ratios_against_pt_sit_next_to_those_against_native() {
        let out = std::env::temp_dir().join(format!("vgpu-bench-ovpt-{}", std::process::id()));
        let a = Args {
            backend: Backend::Sim,
            out: out.clone(),
            sizes: vec!["small".into()],
            configs: vec![],
            reps: 1,
            sys_mib: None,
            memory_mib: None,
            quick: false,
            gpu_extra: None,
            vmm: None,
        };
        // native a 100 b 400 init 10; pt 2x native (init 40); full 3x native (init 60), so
        // FV/PT = 1.5 everywhere; para-multicall equals pt.
        let tables = [
            table("native", run(10, 100, 400)),
            table(PT, run(40, 200, 800)),
            table("full", run(60, 300, 1200)),
            table("para-multicall", run(40, 200, 800)),
        ];
        let line = crate::overhead_output::write(&a, &["small".into()], 1, &tables, &[]).unwrap();
        let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
        let (json, csv, md, svg) = (
            read("summary.json"),
            read("overhead.csv"),
            read("overhead-table.md"),
            read("overhead-small.svg"),
        );
        std::fs::remove_dir_all(&out).unwrap();
        let s: serde_json::Value = serde_json::from_str(&json).unwrap();
        let close = |v: &serde_json::Value, want: f64| {
            assert!((v.as_f64().unwrap() - want).abs() < 1e-9, "{v} vs {want}");
        };
        let full = &s["results"][2];
        assert_eq!(full["config"], "full");
        close(&full["geomean_slowdown"], 3.0);
        close(&full["vs_pt"]["geomean_slowdown"], 1.5);
        close(&full["vs_pt"]["init"], 1.5);
        close(&full["vs_pt"]["geomean_slowdown_with_init"], 1.5);
        for p in PHASES {
            close(&full["vs_pt"]["phase_geomean_slowdown"][p], 1.5);
            close(&full["benchmarks"][0]["phases"][p]["slowdown_vs_pt"], 1.5);
        }
        close(&full["benchmarks"][1]["slowdown_vs_pt"], 1.5);
        close(&s["results"][3]["vs_pt"]["geomean_slowdown"], 1.0);
        close(&s["results"][0]["vs_pt"]["geomean_slowdown"], 0.5);
        // GPUvm's table: every configuration against both baselines.
        let rows = s["gpuvm_table"].as_array().unwrap();
        assert_eq!(rows.len(), 4);
        close(&rows[2]["vs_native"]["geomean_slowdown"], 3.0);
        close(&rows[2]["vs_pt"]["geomean_slowdown"], 1.5);
        assert!(
            md.contains("| full | 3.00 | 1.50 | 3.05 | 1.50 | 6.00 | 1.50 |"),
            "{md}"
        );
        assert!(md.contains("| pt | 2.00 | 1.00 |"), "{md}");
        // The CSV's last column, and the one-line summary's FV/PT.
        assert!(
            csv.lines().next().unwrap().ends_with(",slowdown_vs_pt"),
            "{csv}"
        );
        assert!(
            csv.contains("full,small,b,kernel,1.2,3.000,0,1,1.500"),
            "{csv}"
        );
        assert!(
            csv.contains("full,small,init,init,0.1,6.000,0,1,1.500"),
            "{csv}"
        );
        assert!(
            line.contains("full/small 3.00x") && line.contains("1.50x pt"),
            "{line}"
        );
        // pt is a bar series of its own in the chart.
        let texts = crate::chart::svg_texts(&svg);
        assert_eq!(texts.iter().filter(|t| *t == PT).count(), 1, "{texts:?}");
    }

    #[test]
    fn csv_rows_without_the_pt_column_get_an_empty_one() {
        let mut rows = vec![
            "full,small,a,upload,1.0,2.000,0,1".to_string(),
            "full,small,a,kernel,1.0,2.000,0,1,1.500".to_string(),
        ];
        pad_csv(&mut rows);
        assert_eq!(rows[0], "full,small,a,upload,1.0,2.000,0,1,");
        assert_eq!(rows[1], "full,small,a,kernel,1.0,2.000,0,1,1.500");
    }

    #[test]
    fn without_pt_the_columns_are_empty() {
        let tables = [
            table("native", run(10, 100, 400)),
            table("full", run(60, 300, 1200)),
        ];
        let mut v = VsPt::new(&tables, &tables[1]);
        assert!(v.bench(&tables[1].data.benches[0], 60).is_none());
        assert!(v.init().is_none() && v.ratios().is_none());
        let rows = [Row {
            config: "full".into(),
            size: "small".into(),
            vs_native: Ratios {
                total: 3.0,
                with_init: 3.0,
                init: 6.0,
                phases: [3.0; 4],
            },
            vs_pt: None,
        }];
        let md = table_markdown(&rows, "sim", 1);
        assert!(
            md.contains("| full | 3.00 | – | 3.00 | – | 6.00 | – |"),
            "{md}"
        );
        assert!(table_json(&rows)[0]["vs_pt"].is_null());
    }
}
