//! The SVG plots of `fairness`: each VM's share of the GPU per accounting window over time
//! (`shares_over_time`: only the windows of Jain's index are drawn; the others — the ramp-up,
//! where VMs start, windows with fewer than two VMs active, where they stop, and the last one —
//! are shaded and named in the legend), each VM's share
//! against its target (`share_vs_target`, with the range of its per-window shares), and the
//! distribution of the daemon's preemption and switch latencies (`latency_cdf`).

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::chart::{self, DESC_FONT, GRID, Swatch, TICK_FONT};
use crate::chart_axis::{self, Ticked};
use crate::chart_cdf;
use crate::error::BenchError;
use crate::fairness_metrics::{Figures, Window};

fn s(x: &dyn std::fmt::Display) -> String {
    x.to_string()
}

/// Colour of VM `i` of `n`.
fn color(i: usize, n: usize) -> RGBColor {
    let c = HSLColor(i as f64 / n.max(1) as f64, 0.7, 0.42).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

/// Shade of the windows not counted in the figures.
const SHADE: RGBColor = RGBColor(234, 234, 234);
/// VMs named in a legend row at most (more: the lines are left unnamed).
const MAX_NAMED: usize = 10;

/// Seconds since the first window of `f` of each window's start, and the window length.
fn window_secs(f: &Figures) -> (Vec<f64>, f64) {
    let t0 = f.windows.first().map_or(0, |w| w.start_ns);
    (
        f.windows
            .iter()
            .map(|w| w.start_ns.saturating_sub(t0) as f64 / 1e9)
            .collect(),
        f.window_ns as f64 / 1e9,
    )
}

/// Whether window `w` is one of Jain's index (measured, two or more VMs active): the windows
/// where the figures compare VMs, drawn as lines; the others are shaded.
fn compared(w: &Window) -> bool {
    w.measured && w.jain.is_some()
}

/// Per VM, the points (window middle in s, share of the window's GPU time in %) of the
/// `compared` windows, split where those windows are not contiguous.
pub fn share_lines(f: &Figures, vms: usize) -> Vec<Vec<Vec<(f64, f64)>>> {
    let (start, len) = window_secs(f);
    (0..vms)
        .map(|i| {
            let mut lines: Vec<Vec<(f64, f64)>> = Vec::new();
            let mut prev: Option<usize> = None;
            for (k, w) in f.windows.iter().enumerate().filter(|(_, w)| compared(w)) {
                if prev.is_none_or(|p| p + 1 != k) {
                    lines.push(Vec::new());
                }
                let tot: u64 = w.gpu_ns.iter().sum();
                let pct = 100.0 * w.gpu_ns.get(i).copied().unwrap_or(0) as f64 / tot.max(1) as f64;
                if let Some(l) = lines.last_mut() {
                    l.push((start[k] + len / 2.0, pct));
                }
                prev = Some(k);
            }
            lines
        })
        .collect()
}

/// The time spans (s) of the runs of windows that are not `compared`.
pub fn unmeasured_spans(f: &Figures) -> Vec<(f64, f64)> {
    let (start, len) = window_secs(f);
    let mut spans: Vec<(f64, f64)> = Vec::new();
    let mut prev: Option<usize> = None;
    for (k, _) in f.windows.iter().enumerate().filter(|(_, w)| !compared(w)) {
        match spans.last_mut() {
            Some(s) if prev == Some(k - 1) => s.1 = start[k] + len,
            _ => spans.push((start[k], start[k] + len)),
        }
        prev = Some(k);
    }
    spans
}

/// Share (%) of each VM in every measured window over time.
pub fn shares_over_time(
    path: &Path,
    title: &str,
    names: &[String],
    f: &Figures,
    ramp_ms: f64,
) -> Result<(), BenchError> {
    shares_inner(path, title, names, f, ramp_ms).map_err(BenchError::chart(path))
}

fn shares_inner(
    path: &Path,
    title: &str,
    names: &[String],
    f: &Figures,
    ramp_ms: f64,
) -> Result<(), String> {
    let n = names.len();
    let (start, len) = window_secs(f);
    let end = start.last().map_or(1.0, |s| s + len);
    let lines = share_lines(f, n);
    let targets: Vec<f64> = f.vms.iter().map(|v| 100.0 * v.target).collect();
    let one_target = targets.windows(2).all(|w| (w[0] - w[1]).abs() < 1e-9);
    let points: Vec<f64> = lines.iter().flatten().flatten().map(|p| p.1).collect();
    let y = chart_axis::capped(chart_axis::choose(&points, &targets, false), 100.0);
    let x = chart_axis::linear(end / 1.05);

    let mut entries: Vec<(String, Swatch)> = Vec::new();
    if n <= MAX_NAMED {
        entries.extend(
            names
                .iter()
                .enumerate()
                .map(|(i, nm)| (nm.clone(), Swatch::Line(color(i, n)))),
        );
    }
    entries.push(("target share".into(), Swatch::Dash(BLACK)));
    entries.push(("VMs starting / stopping".into(), Swatch::Fill(SHADE)));
    let note = format!(
        "Lines: each VM's share of the GPU time of a {:.0} ms accounting window; dashed: target \
         share (weight / sum of weights).\nShaded: windows outside Jain's index — the first \
         {ramp_ms:.0} ms after the first GPU use, windows with fewer than two VMs active, the last.",
        len * 1e3
    );
    let root = SVGBackend::new(path, (1300, 640)).into_drawing_area();
    let body = chart::frame(&root, title, &entries, &note)?;
    let mut c = ChartBuilder::on(&body)
        .margin_left(10)
        .margin_right(25)
        .margin_top(10)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(
            Ticked::new(RangedCoordf64::from(x.lo..x.hi), &x.ticks),
            Ticked::new(RangedCoordf64::from(y.lo..y.hi), &y.ticks),
        )
        .map_err(|e| s(&e))?;
    c.configure_mesh()
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&|v| chart_axis::label(*v))
        .y_label_formatter(&|v| chart_axis::label(*v))
        .x_label_style(TICK_FONT)
        .y_label_style(TICK_FONT)
        .axis_desc_style(DESC_FONT)
        .x_desc("time since the first GPU use (s)")
        .y_desc("share of the window's GPU time (%)")
        .draw()
        .map_err(|e| s(&e))?;
    c.draw_series(
        unmeasured_spans(f)
            .into_iter()
            .map(|(a, b)| Rectangle::new([(a, y.lo), (b.min(x.hi), y.hi)], SHADE.filled())),
    )
    .map_err(|e| s(&e))?;
    let mut tline = |t: f64, col: RGBColor| {
        c.draw_series(std::iter::once(DashedPathElement::new(
            vec![(0.0, t), (end, t)],
            8,
            6,
            col.stroke_width(2),
        )))
        .map(|_| ())
        .map_err(|e| s(&e))
    };
    if one_target {
        if let Some(t) = targets.first() {
            tline(*t, BLACK)?;
        }
    } else {
        for (i, t) in targets.iter().enumerate() {
            tline(*t, color(i, n))?;
        }
    }
    for (i, segments) in lines.into_iter().enumerate() {
        let col = color(i, n);
        c.draw_series(
            segments
                .into_iter()
                .map(|pts| PathElement::new(pts, col.stroke_width(2))),
        )
        .map_err(|e| s(&e))?;
    }
    root.present().map_err(|e| s(&e))?;
    Ok(())
}

/// Per VM the smallest and largest share (fraction) among the VMs active beside it in one
/// measured window (the windows its `share` is made of); `None` without such a window.
pub fn share_ranges(f: &Figures, vms: usize) -> Vec<Option<(f64, f64)>> {
    (0..vms)
        .map(|i| {
            let v: Vec<f64> = f
                .windows
                .iter()
                .filter(|w| w.measured && w.active.get(i) == Some(&true))
                .filter_map(|w| {
                    let tot: u64 = (0..w.gpu_ns.len())
                        .filter(|&j| w.active[j])
                        .map(|j| w.gpu_ns[j])
                        .sum();
                    (tot > 0).then(|| w.gpu_ns[i] as f64 / tot as f64)
                })
                .collect();
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (!v.is_empty()).then_some((lo, hi))
        })
        .collect()
}

/// Per VM two bars: its measured share (with the range of its per-window shares) and its target
/// share (%).
pub fn share_vs_target(
    path: &Path,
    title: &str,
    names: &[String],
    f: &Figures,
) -> Result<(), BenchError> {
    targets_inner(path, title, names, f).map_err(BenchError::chart(path))
}

fn targets_inner(path: &Path, title: &str, names: &[String], f: &Figures) -> Result<(), String> {
    let n = names.len().min(f.vms.len());
    let ranges = share_ranges(f, n);
    let values: Vec<f64> = f
        .vms
        .iter()
        .take(n)
        .flat_map(|v| [v.share, v.target])
        .chain(ranges.iter().flatten().flat_map(|(a, b)| [*a, *b]))
        .map(|v| 100.0 * v)
        .collect();
    let y = chart_axis::capped(chart_axis::choose(&values, &[], false), 100.0);
    let measured = RGBColor(0, 114, 178);
    let target = RGBColor(190, 190, 190);
    let entries = [
        ("measured share".to_string(), Swatch::Fill(measured)),
        (
            "target (weight / sum of weights)".to_string(),
            Swatch::Fill(target),
        ),
    ];
    let note = "Measured: a VM's GPU time over that of the VMs active beside it, in the measured \
                windows.\nError bars: its smallest and largest share in one such window.";
    let width = (300 + 70 * n as u32).clamp(900, 2000);
    let root = SVGBackend::new(path, (width, 640)).into_drawing_area();
    let body = chart::frame(&root, title, &entries, note)?;
    let ticks: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let mut c = ChartBuilder::on(&body)
        .margin_left(10)
        .margin_right(25)
        .margin_top(10)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(
            Ticked::new(RangedCoordf64::from(-0.5..n as f64 - 0.5), &ticks),
            Ticked::new(RangedCoordf64::from(y.lo..y.hi), &y.ticks),
        )
        .map_err(|e| s(&e))?;
    let fmt_x = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    c.configure_mesh()
        .disable_x_mesh()
        .bold_line_style(GRID.stroke_width(1))
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|v| chart_axis::label(*v))
        .x_label_style(TICK_FONT)
        .y_label_style(TICK_FONT)
        .axis_desc_style(DESC_FONT)
        .y_desc("share of GPU time (%)")
        .draw()
        .map_err(|e| s(&e))?;
    for (k, col) in [measured, target].into_iter().enumerate() {
        c.draw_series(f.vms.iter().take(n).enumerate().map(|(i, v)| {
            let val = 100.0 * if k == 0 { v.share } else { v.target };
            let x0 = i as f64 - 0.38 + 0.38 * k as f64;
            Rectangle::new([(x0 + 0.02, 0.0), (x0 + 0.36, val)], col.filled())
        }))
        .map_err(|e| s(&e))?;
    }
    let style = BLACK.stroke_width(1);
    for (i, r) in ranges.iter().enumerate() {
        let Some((lo, hi)) = r else { continue };
        let (xc, lo, hi) = (i as f64 - 0.19, 100.0 * lo, 100.0 * hi);
        c.draw_series([
            PathElement::new(vec![(xc, lo), (xc, hi)], style),
            PathElement::new(vec![(xc - 0.06, lo), (xc + 0.06, lo)], style),
            PathElement::new(vec![(xc - 0.06, hi), (xc + 0.06, hi)], style),
        ])
        .map_err(|e| s(&e))?;
    }
    root.present().map_err(|e| s(&e))?;
    Ok(())
}

/// The CDFs of the daemon's preemption and switch latencies (µs, log axis when they span 10×).
pub fn latency_cdf(
    path: &Path,
    title: &str,
    preempt_ns: &[u64],
    switch_ns: &[u64],
) -> Result<(), BenchError> {
    let series = [
        chart_cdf::Series {
            name: format!("preemption ({} samples)", preempt_ns.len()),
            ns: preempt_ns,
            color: RGBColor(213, 94, 0),
        },
        chart_cdf::Series {
            name: format!("switch ({} samples)", switch_ns.len()),
            ns: switch_ns,
            color: RGBColor(0, 114, 178),
        },
    ];
    let note = "Preemption: the daemon sends Preempt -> that VM's engine stopped; switch: one VM's \
                engine stopped -> the next VM's engine started (vgpud's report)";
    chart_cdf::draw(path, title, &series, note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fairness_metrics::VmFig;
    use crate::report::Percentiles;

    const MS: u64 = 1_000_000;

    /// Windows of 100 ms with `gpu` ms per VM; measured as given; every VM active.
    fn figures(gpu: &[(&[u64], bool)], weights: &[u32]) -> Figures {
        let wsum: u32 = weights.iter().sum();
        Figures {
            window_ns: 100 * MS,
            windows: gpu
                .iter()
                .enumerate()
                .map(|(k, (g, m))| Window {
                    start_ns: (k as u64 + 5) * 100 * MS,
                    gpu_ns: g.iter().map(|x| x * MS).collect(),
                    measured: *m,
                    active: vec![true; g.len()],
                    jain: m.then_some(1.0),
                    max_error: None,
                })
                .collect(),
            vms: weights
                .iter()
                .map(|w| VmFig {
                    id: None,
                    gpu_ns: 0,
                    share_run: 0.0,
                    share: 0.5,
                    expected: 0.5,
                    target: f64::from(*w) / f64::from(wsum),
                    error: 0.0,
                    measured_windows: 0,
                    jobs_completed: 0,
                    preempted: 0,
                    grants: 0,
                    evicted: false,
                })
                .collect(),
            jain_min: None,
            jain_mean: None,
            jain_windows: 0,
            share_error_max: 0.0,
            window_error_max: 0.0,
            utilization: 0.0,
            preempt_us: Percentiles::of(&[]),
            switch_us: Percentiles::of(&[]),
            steady_preempt: None,
        }
    }

    #[test]
    fn start_and_stop_spikes_are_left_out_and_shaded() {
        // VM 0 alone at the start (100%) and at the end: not measured.
        let f = figures(
            &[
                (&[90, 0], false),
                (&[50, 50], true),
                (&[40, 60], true),
                (&[90, 10], false),
            ],
            &[1, 1],
        );
        let lines = share_lines(&f, 2);
        let ms = |l: &[Vec<(f64, f64)>]| -> Vec<Vec<(u64, u64)>> {
            l.iter()
                .map(|s| {
                    s.iter()
                        .map(|(t, p)| ((t * 1e3).round() as u64, p.round() as u64))
                        .collect()
                })
                .collect()
        };
        assert_eq!(ms(&lines[0]), [vec![(150, 50), (250, 40)]]);
        assert_eq!(ms(&lines[1]), [vec![(150, 50), (250, 60)]]);
        assert_eq!(unmeasured_spans(&f), [(0.0, 0.1), (0.3, 0.4)]);
        // The y axis is chosen from what is drawn: not stretched to 100% by the spike.
        let pts: Vec<f64> = lines.iter().flatten().flatten().map(|p| p.1).collect();
        let y = chart_axis::choose(&pts, &[50.0], false);
        assert!(y.hi >= 60.0 && y.hi < 90.0, "{y:?}");
    }

    #[test]
    fn windows_outside_jain_split_the_lines() {
        // Window 1 is not measured; window 3 is measured with one VM active (the other
        // stopping), so it has no Jain's index either.
        let mut f = figures(
            &[
                (&[5, 5], true),
                (&[5, 5], false),
                (&[5, 5], true),
                (&[9, 1], true),
                (&[5, 5], true),
            ],
            &[1, 1],
        );
        f.windows[3].jain = None;
        assert_eq!(share_lines(&f, 2)[0].len(), 3);
        assert_eq!(unmeasured_spans(&f), [(0.1, 0.2), (0.3, 0.4)]);
    }

    #[test]
    fn share_ranges_count_only_active_vms_of_measured_windows() {
        let mut f = figures(
            &[
                (&[10, 30, 0], true),
                (&[20, 20, 40], true),
                (&[90, 5, 5], false),
            ],
            &[1, 1, 2],
        );
        f.windows[0].active[2] = false;
        let r = share_ranges(&f, 3);
        assert_eq!(r[0], Some((0.25, 0.25)));
        assert_eq!(r[1], Some((0.25, 0.75)));
        assert_eq!(r[2], Some((0.5, 0.5)));
        f.windows[1].active[2] = false;
        assert_eq!(share_ranges(&f, 3)[2], None);
    }

    #[test]
    fn cdf_ends_at_one_and_rises() {
        let c = chart_cdf::points(&[3000, 1000, 2000, 2000]);
        assert_eq!(c.first(), Some(&(1.0, 0.25)));
        assert_eq!(c.last(), Some(&(3.0, 1.0)));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert!(chart_cdf::points(&[]).is_empty());
    }

    #[test]
    fn charts_are_written_with_every_name_once() {
        let f = figures(
            &[
                (&[90, 0], false),
                (&[50, 50], true),
                (&[40, 60], true),
                (&[1, 1], false),
            ],
            &[1, 1],
        );
        let dir = std::env::temp_dir().join(format!("vgpu-bench-fchart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let names = vec!["vmA".to_string(), "vmB".to_string()];
        shares_over_time(&dir.join("s.svg"), "t", &names, &f, 100.0).unwrap();
        share_vs_target(&dir.join("t.svg"), "t", &names, &f).unwrap();
        latency_cdf(&dir.join("l.svg"), "t", &[0, 10_000, 900_000], &[5_000]).unwrap();
        let read = |n: &str| chart::svg_texts(&std::fs::read_to_string(dir.join(n)).unwrap());
        let (sh, ta, la) = (read("s.svg"), read("t.svg"), read("l.svg"));
        std::fs::remove_dir_all(&dir).unwrap();
        let count = |texts: &[String], t: &str| texts.iter().filter(|x| *x == t).count();
        for texts in [&sh, &ta] {
            for nm in &names {
                assert_eq!(count(texts, nm), 1, "{nm}: {texts:?}");
            }
        }
        assert_eq!(count(&sh, "VMs starting / stopping"), 1, "{sh:?}");
        assert_eq!(count(&sh, "target share"), 1, "{sh:?}");
        assert_eq!(count(&la, "preemption (3 samples)"), 1, "{la:?}");
        assert_eq!(count(&la, "latency (µs, log scale)"), 1, "{la:?}");
    }
}
