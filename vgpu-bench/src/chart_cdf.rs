//! An SVG chart of empirical CDFs of latencies (one step line per series, µs on a log axis when
//! the samples span a factor of 10): `fairness`'s daemon latencies, `priority`'s request
//! latencies per mode.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::chart::{self, DESC_FONT, GRID, Swatch, TICK_FONT};
use crate::chart_axis::{self, Ticked};
use crate::error::BenchError;

/// One curve: its legend name, its samples in ns, its colour.
pub struct Series<'a> {
    pub name: String,
    pub ns: &'a [u64],
    pub color: RGBColor,
}

fn s(x: &dyn std::fmt::Display) -> String {
    x.to_string()
}

/// The empirical CDF of `ns` as (µs, fraction at or below) steps.
pub fn points(ns: &[u64]) -> Vec<(f64, f64)> {
    let mut v: Vec<u64> = ns.to_vec();
    v.sort_unstable();
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .map(|(k, x)| (*x as f64 / 1e3, (k + 1) as f64 / n))
        .collect()
}

/// Draws the CDFs of `series` to `path`, with `note` under the legend.
pub fn draw(path: &Path, title: &str, series: &[Series], note: &str) -> Result<(), BenchError> {
    inner(path, title, series, note).map_err(BenchError::chart(path))
}

fn inner(path: &Path, title: &str, series: &[Series], note: &str) -> Result<(), String> {
    let pts: Vec<Vec<(f64, f64)>> = series.iter().map(|x| points(x.ns)).collect();
    // A log axis cannot show 0 µs: such samples sit at the axis' left end.
    let xs: Vec<f64> = pts
        .iter()
        .flat_map(|p| p.iter().map(|q| q.0))
        .filter(|v| *v > 0.0)
        .collect();
    let x = chart_axis::choose(&xs, &[], true);
    let y = chart_axis::linear(1.0 / 1.05);
    let entries: Vec<(String, Swatch)> = series
        .iter()
        .map(|x| (x.name.clone(), Swatch::Line(x.color)))
        .collect();
    let root = SVGBackend::new(path, (1100, 600)).into_drawing_area();
    let body = chart::frame(&root, title, &entries, note)?;
    let mut b = ChartBuilder::on(&body);
    b.margin_left(10)
        .margin_right(30)
        .margin_top(10)
        .x_label_area_size(55)
        .y_label_area_size(80);
    macro_rules! plot {
        ($x_range:expr) => {{
            let mut c = b
                .build_cartesian_2d(
                    $x_range,
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
                .x_desc(if x.log {
                    "latency (µs, log scale)"
                } else {
                    "latency (µs)"
                })
                .y_desc("fraction of samples at or below")
                .draw()
                .map_err(|e| s(&e))?;
            for (p, ser) in pts.iter().zip(series) {
                // Steps: each sample raises the curve at its latency.
                let mut steps = Vec::with_capacity(p.len() * 2);
                let mut prev = 0.0;
                for (v, q) in p {
                    let v = v.max(x.lo);
                    steps.push((v, prev));
                    steps.push((v, *q));
                    prev = *q;
                }
                c.draw_series(std::iter::once(PathElement::new(
                    steps,
                    ser.color.stroke_width(2),
                )))
                .map_err(|e| s(&e))?;
            }
        }};
    }
    if x.log {
        let inner: LogCoord<f64> = (x.lo..x.hi).log_scale().into();
        plot!(Ticked::new(inner, &x.ticks));
    } else {
        plot!(Ticked::new(RangedCoordf64::from(x.lo..x.hi), &x.ticks));
    }
    root.present().map_err(|e| s(&e))?;
    Ok(())
}
