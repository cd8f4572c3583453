//! The SVG plots of `fairness`: each VM's share of the GPU per accounting window over time
//! (lines, the measured windows shaded), and each VM's share against its target (bars).

use std::path::Path;

use plotters::prelude::*;

use crate::error::BenchError;
use crate::fairness_metrics::Figures;

fn err(path: &Path) -> impl Fn(String) -> BenchError + '_ {
    move |e| BenchError::Invalid(format!("{}: chart: {e}", path.display()))
}

fn color(i: usize, n: usize) -> RGBColor {
    let c = HSLColor(i as f64 / n.max(1) as f64, 0.65, 0.45).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

/// Share (%) of each VM in every window over time, from the first window with GPU use.
pub fn shares_over_time(
    path: &Path,
    title: &str,
    names: &[String],
    f: &Figures,
) -> Result<(), BenchError> {
    let e = err(path);
    let t0 = f.windows.first().map_or(0, |w| w.start_ns);
    let secs = |ns: u64| (ns - t0) as f64 / 1e9;
    let end = f
        .windows
        .last()
        .map_or(1.0, |w| secs(w.start_ns + f.window_ns));
    let n = names.len();
    let peak = f
        .windows
        .iter()
        .flat_map(|w| {
            let tot: u64 = w.gpu_ns.iter().sum();
            w.gpu_ns
                .iter()
                .map(move |g| 100.0 * *g as f64 / tot.max(1) as f64)
        })
        .fold(0.0f64, f64::max);
    let root = SVGBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..end.max(0.1), 0f64..(peak * 1.1).max(1.0))
        .map_err(|x| e(x.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("time since the first GPU use (s)")
        .y_desc("share of the window's GPU time (%)")
        .draw()
        .map_err(|x| e(x.to_string()))?;
    // Shade the windows counted in the figures.
    let shade = RGBColor(235, 235, 235).filled();
    chart
        .draw_series(f.windows.iter().filter(|w| w.measured).map(|w| {
            let x = secs(w.start_ns);
            Rectangle::new(
                [(x, 0.0), (x + f.window_ns as f64 / 1e9, peak * 1.1)],
                shade,
            )
        }))
        .map_err(|x| e(x.to_string()))?;
    for (i, name) in names.iter().enumerate() {
        let c = color(i, n);
        let pts: Vec<(f64, f64)> = f
            .windows
            .iter()
            .map(|w| {
                let tot: u64 = w.gpu_ns.iter().sum();
                let mid = secs(w.start_ns) + f.window_ns as f64 / 2e9;
                (mid, 100.0 * w.gpu_ns[i] as f64 / tot.max(1) as f64)
            })
            .collect();
        let s = chart
            .draw_series(std::iter::once(PathElement::new(pts, c.stroke_width(2))))
            .map_err(|x| e(x.to_string()))?;
        if n <= 16 {
            s.label(name.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 15, y)], c.stroke_width(2)));
        }
    }
    if n <= 16 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(x.to_string()))?;
    }
    root.present().map_err(|x| e(x.to_string()))?;
    Ok(())
}

/// Per VM two bars: its measured share and its target share (%).
pub fn share_vs_target(
    path: &Path,
    title: &str,
    names: &[String],
    f: &Figures,
) -> Result<(), BenchError> {
    let e = err(path);
    let n = names.len();
    let top = f
        .vms
        .iter()
        .flat_map(|v| [v.share, v.target])
        .fold(0.0f64, f64::max)
        * 110.0;
    let root = SVGBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..top.max(1.0))
        .map_err(|x| e(x.to_string()))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.min(32) + 1)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("share of GPU time (%)")
        .draw()
        .map_err(|x| e(x.to_string()))?;
    let measured = RGBColor(31, 119, 180);
    let target = RGBColor(200, 200, 200);
    for (k, (label, c)) in [("measured", measured), ("target", target)]
        .into_iter()
        .enumerate()
    {
        chart
            .draw_series(f.vms.iter().enumerate().map(|(i, v)| {
                let val = 100.0 * if k == 0 { v.share } else { v.target };
                let x0 = i as f64 - 0.4 + 0.4 * k as f64;
                Rectangle::new([(x0, 0.0), (x0 + 0.4, val)], c.filled())
            }))
            .map_err(|x| e(x.to_string()))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))?;
    Ok(())
}
