//! The SVG bar chart of `overhead`, like GPUvm's figure: per benchmark a group of bars, one per
//! configuration, height = slowdown against native on a log scale.

use std::path::Path;

use plotters::prelude::*;

use crate::error::BenchError;

/// The bars of one configuration: (benchmark, slowdown) in benchmark order.
pub struct Series {
    pub config: String,
    pub size: String,
    pub values: Vec<(String, f64)>,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(90, 90, 90),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

fn err(path: &Path) -> impl Fn(String) -> BenchError + '_ {
    move |e| BenchError::Invalid(format!("{}: chart: {e}", path.display()))
}

/// Draws `series` (all of one size) into `path`.
pub fn draw(path: &Path, size: &str, series: &[&Series]) -> Result<(), BenchError> {
    let e = err(path);
    let Some(first) = series.first() else {
        return Ok(());
    };
    let names: Vec<&str> = first.values.iter().map(|(n, _)| n.as_str()).collect();
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().map(|v| v.1))
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    let (lo, hi) = (0.5f64, (max * 2.0).max(2.0));
    let root = SVGBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let n = names.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Slowdown vs native (log scale), size {size}"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(70)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n - 0.5, (lo..hi).log_scale())
        .map_err(|x| e(x.to_string()))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len() + 1)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names
                    .get(i as usize)
                    .map_or(String::new(), |s| s.to_string())
            } else {
                String::new()
            }
        })
        .y_desc("slowdown (×)")
        .draw()
        .map_err(|x| e(x.to_string()))?;
    let k = series.len() as f64;
    let width = 0.8 / k;
    for (j, s) in series.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        let x0 = |i: usize| i as f64 - 0.4 + width * j as f64;
        chart
            .draw_series(s.values.iter().enumerate().map(|(i, (_, v))| {
                let top = v.clamp(lo, hi);
                Rectangle::new([(x0(i), lo), (x0(i) + width, top)], color.filled())
            }))
            .map_err(|x| e(x.to_string()))?
            .label(s.config.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
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
