//! `vgpu-bench apps --preempt M,...`: the application suite's kernels under the preemption
//! methods (issue 23). Every configuration runs as it is (its default: `slice`) and once per
//! method (`CONFIG+METHOD`: a VM's `--gpu preempt=M`, an in-process run's `VGPU_CUDA_PREEMPT=M`);
//! this module reads what the engine did with the method (the library's `"preempt"` report
//! in-process, the VMM's `--stats` `gpu.checkpoint` in a VM) and reports, per program, the
//! method used and the time against the same configuration without it (the never-preempted
//! overhead: nothing preempts a lone program), with the geomean over the programs.

use serde_json::Value;

use crate::exp_apps::Cell;
use crate::overhead_output::geomean;
use crate::report::median;

/// The preemption methods `--preempt` takes.
pub const METHODS: [&str; 4] = ["slice", "checkpoint", "restart", "auto"];

/// The configuration name of `base` run under `method`.
pub fn variant(base: &str, method: &str) -> String {
    format!("{base}+{method}")
}

/// `(base, method)` of a variant's name; `None` for a configuration run as it is.
pub fn split(config: &str) -> Option<(&str, &str)> {
    config.split_once('+')
}

/// What the engine did under a method in one run (the counters of `pgpu::CkptStats`; all zero
/// under `slice`, which transforms nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Used {
    pub method: String,
    pub modules_transformed: u64,
    pub fallback_modules: u64,
    pub fallback_launches: u64,
    /// Launches run transformed (restarting or checkpointing).
    pub transformed: u64,
    pub restart: u64,
    pub sliced: u64,
    pub preemptions: u64,
    /// With `--preempt-test` (in-process): runs that ended preempted and were resumed.
    pub forced_preempted: Option<u64>,
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

impl Used {
    /// From the library's report (`vgpu-cuda-stats: {...}`, its `"preempt"` object).
    pub fn from_lib_report(stats: &Value) -> Option<Used> {
        let p = stats.get("preempt")?;
        let e = &p["engine"];
        Some(Used {
            method: p["method"].as_str()?.to_string(),
            modules_transformed: n(e, "modules_transformed"),
            fallback_modules: n(e, "fallback_modules"),
            fallback_launches: n(e, "fallback_launches"),
            transformed: n(e, "launches_transformed"),
            restart: n(e, "restart_launches"),
            sliced: n(e, "sliced_launches"),
            preemptions: n(e, "preemptions"),
            forced_preempted: p.get("forced").map(|f| n(f, "preempted")),
        })
    }

    /// From a VM's `--stats` document (`gpu.checkpoint`, absent under `slice`).
    pub fn from_vm_stats(doc: &Value, method: &str) -> Used {
        let c = &doc["gpu"]["checkpoint"];
        Used {
            method: method.to_string(),
            modules_transformed: n(c, "modules_transformed"),
            fallback_modules: n(c, "fallback_modules"),
            fallback_launches: n(c, "fallback_launches"),
            transformed: n(c, "launches"),
            restart: n(c, "restart_launches"),
            sliced: n(c, "sliced_launches"),
            preemptions: n(c, "preemptions"),
            forced_preempted: None,
        }
    }

    /// `checkpoint N, restart N, slice N` of the launches the engine counted (slicing by
    /// fallback included as `fallback`).
    pub fn describe(&self) -> String {
        if self.method == "slice" {
            return "slice (selected)".into();
        }
        let mut s = format!(
            "checkpoint {}, restart {}, slice {}",
            self.transformed.saturating_sub(self.restart),
            self.restart,
            self.sliced
        );
        if self.fallback_modules + self.fallback_launches > 0 {
            s.push_str(&format!(
                "; fallback to slice: {} module(s), {} launch(es)",
                self.fallback_modules, self.fallback_launches
            ));
        }
        s
    }

    pub fn json(&self) -> Value {
        serde_json::json!({
            "method": self.method,
            "modules_transformed": self.modules_transformed,
            "fallback_modules": self.fallback_modules,
            "fallback_launches": self.fallback_launches,
            "checkpoint_launches": self.transformed.saturating_sub(self.restart),
            "restart_launches": self.restart,
            "sliced_launches": self.sliced,
            "preemptions": self.preemptions,
            "forced_preempted": self.forced_preempted,
            "used": self.describe(),
        })
    }
}

/// One variant's never-preempted overhead: per program the median GPU-side time (the program's
/// own `gpu_ms`) and whole run against its base configuration's, and their geomeans.
#[derive(Debug, Clone, PartialEq)]
pub struct Overhead {
    pub config: String,
    pub base: String,
    pub method: String,
    /// (program, GPU-side ratio, whole-run ratio, what the engine used).
    pub programs: Vec<(String, f64, f64, String)>,
    pub gpu_geomean: f64,
    pub total_geomean: f64,
    /// Programs whose every passing run under the method printed the checksum of the base
    /// configuration's runs (all alike); the integer programs must, a floating-point one may
    /// differ in the last bits where the transformed code rounds differently.
    pub same_checksum: Vec<String>,
    pub checksum_differs: Vec<String>,
}

/// The one checksum every passing run of `c` printed, if they agree.
fn checksum(c: &Cell) -> Option<u64> {
    let mut sums = c.samples.iter().filter(|s| s.pass).map(|s| s.checksum);
    let first = sums.next()??;
    sums.all(|s| s == Some(first)).then_some(first)
}

fn medians(c: &Cell) -> (f64, f64) {
    let pass: Vec<_> = c.samples.iter().filter(|s| s.pass).collect();
    let gpu: Vec<f64> = pass.iter().map(|s| s.app_gpu_ms).collect();
    let tot: Vec<f64> = pass.iter().map(|s| s.total_ms).collect();
    (median(&gpu), median(&tot))
}

/// The overhead of every variant among `configs` against its base.
pub fn overheads(configs: &[String], cells: &[Cell]) -> Vec<Overhead> {
    let find = |p: &str, c: &str| cells.iter().find(|x| x.program == p && x.config == c);
    let mut out = Vec::new();
    for cfg in configs {
        let Some((base, method)) = split(cfg) else {
            continue;
        };
        let mut programs = Vec::new();
        let (mut same, mut differs) = (Vec::new(), Vec::new());
        for c in cells.iter().filter(|c| &c.config == cfg) {
            let Some(b) = find(&c.program, base) else {
                continue;
            };
            match (checksum(c), checksum(b)) {
                (Some(x), Some(y)) if x == y => same.push(c.program.clone()),
                _ => differs.push(c.program.clone()),
            }
            let ((g, t), (bg, bt)) = (medians(c), medians(b));
            let r = |x: f64, y: f64| if y > 0.0 && x > 0.0 { x / y } else { 0.0 };
            let used = c
                .samples
                .iter()
                .rev()
                .find_map(|s| s.preempt.as_ref())
                .map(Used::describe)
                .unwrap_or_else(|| "-".into());
            programs.push((c.program.clone(), r(g, bg), r(t, bt), used));
        }
        let pos = |f: fn(&(String, f64, f64, String)) -> f64| {
            let v: Vec<f64> = programs.iter().map(f).filter(|x| *x > 0.0).collect();
            geomean(&v)
        };
        out.push(Overhead {
            config: cfg.clone(),
            base: base.to_string(),
            method: method.to_string(),
            gpu_geomean: pos(|p| p.1),
            total_geomean: pos(|p| p.2),
            programs,
            same_checksum: same,
            checksum_differs: differs,
        });
    }
    out
}

pub fn overheads_json(o: &[Overhead]) -> Value {
    Value::Array(
        o.iter()
            .map(|v| {
                serde_json::json!({
                    "config": v.config, "base": v.base, "method": v.method,
                    "gpu_side_geomean": v.gpu_geomean, "total_geomean": v.total_geomean,
                    "same_checksum": v.same_checksum, "checksum_differs": v.checksum_differs,
                    "programs": v.programs.iter().map(|(p, g, t, u)| serde_json::json!({
                        "program": p, "gpu_side": g, "total": t, "used": u,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// The summary line's part: `inproc+checkpoint gpu-side 1.03x total 1.01x, ...`.
pub fn line(o: &[Overhead]) -> String {
    o.iter()
        .map(|v| {
            let n = v.same_checksum.len() + v.checksum_differs.len();
            format!(
                "{} gpu-side {:.3}x total {:.3}x (checksums as without it: {}/{n}{})",
                v.config,
                v.gpu_geomean,
                v.total_geomean,
                v.same_checksum.len(),
                if v.checksum_differs.is_empty() {
                    String::new()
                } else {
                    format!(", not: {}", v.checksum_differs.join(" "))
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps_exec::Sample;

    fn s(total: f64, gpu: f64, used: Option<Used>) -> Sample {
        Sample {
            pass: true,
            total_ms: total,
            app_gpu_ms: gpu,
            checksum: Some(7),
            preempt: used,
            ..Sample::default()
        }
    }

    #[test]
    fn reports_parse() {
        let lib: Value = serde_json::from_str(
            r#"{"preempt":{"method":"auto","engine":{"modules_transformed":1,
            "launches_transformed":5,"restart_launches":2,"sliced_launches":7,"preemptions":3,
            "fallback_modules":0,"fallback_launches":1},"forced":{"preempted":9}}}"#,
        )
        .unwrap();
        let u = Used::from_lib_report(&lib).unwrap();
        assert_eq!((u.transformed, u.restart, u.sliced), (5, 2, 7));
        assert_eq!(u.forced_preempted, Some(9));
        assert_eq!(
            u.describe(),
            "checkpoint 3, restart 2, slice 7; fallback to slice: 0 module(s), 1 launch(es)"
        );
        assert!(Used::from_lib_report(&serde_json::json!({"phases_ns": {}})).is_none());
        let vm: Value =
            serde_json::from_str(r#"{"gpu":{"checkpoint":{"launches":4,"preemptions":0}}}"#)
                .unwrap();
        let u = Used::from_vm_stats(&vm, "checkpoint");
        assert_eq!((u.transformed, u.method.as_str()), (4, "checkpoint"));
        assert_eq!(
            Used::from_vm_stats(&serde_json::json!({}), "slice").describe(),
            "slice (selected)"
        );
    }

    #[test]
    fn overhead_against_the_same_configuration_without_the_method() {
        assert_eq!(split("full+auto"), Some(("full", "auto")));
        assert_eq!(split("full"), None);
        let used = Used {
            method: "checkpoint".into(),
            transformed: 2,
            ..Used::default()
        };
        let cell = |p: &str, c: &str, v: Vec<Sample>| Cell {
            program: p.into(),
            config: c.into(),
            samples: v,
        };
        let cells = vec![
            cell("a", "inproc", vec![s(10.0, 2.0, None), s(12.0, 2.0, None)]),
            cell(
                "a",
                "inproc+checkpoint",
                vec![s(11.0, 2.2, Some(used.clone()))],
            ),
            cell("b", "inproc", vec![s(10.0, 4.0, None)]),
            cell(
                "b",
                "inproc+checkpoint",
                vec![Sample {
                    checksum: Some(8),
                    ..s(10.0, 4.4, Some(used))
                }],
            ),
        ];
        let cfg = vec!["inproc".to_string(), "inproc+checkpoint".to_string()];
        let o = overheads(&cfg, &cells);
        assert_eq!(o.len(), 1);
        assert_eq!(
            (o[0].base.as_str(), o[0].method.as_str()),
            ("inproc", "checkpoint")
        );
        assert!((o[0].gpu_geomean - 1.1).abs() < 1e-9, "{o:?}");
        assert!((o[0].programs[0].2 - 1.0).abs() < 1e-9);
        assert_eq!(o[0].programs[1].3, "checkpoint 2, restart 0, slice 0");
        assert_eq!(
            (o[0].same_checksum.clone(), o[0].checksum_differs.clone()),
            (vec!["a".to_string()], vec!["b".to_string()])
        );
        assert!(
            line(&o).contains("inproc+checkpoint gpu-side 1.100x total 1.000x (checksums as without it: 1/2, not: b)"),
            "{}",
            line(&o)
        );
    }
}
