//! The SVG bar chart of `overhead`, in the form of GPUvm's figure: per group (a benchmark, the
//! geometric mean, init) one bar per configuration, height = time relative to native, with
//! min–max error bars over the repetitions. The value axis is chosen from the data
//! (`chart_axis`: linear from 0, or log when the bars span a factor of 10), so that no bar or
//! error bar is cut off; grid lines only at the labelled ticks; a legend row above the plot.

use std::path::Path;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::chart_axis::{self, Axis, Ticked};
use crate::error::BenchError;
use plotters::coord::types::RangedCoordf64;

/// One bar: the figure (median over the repetitions) and the smallest and largest of the
/// repetitions (`min == max == value` when there is nothing to show).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    pub value: f64,
    pub min: f64,
    pub max: f64,
}

impl Bar {
    /// A bar at `value` with the range of `reps` (their min and max; `value` included).
    pub fn with_range(value: f64, reps: &[f64]) -> Self {
        let finite = || reps.iter().copied().filter(|x| x.is_finite());
        Self {
            value,
            min: finite().fold(value, f64::min),
            max: finite().fold(value, f64::max),
        }
    }
}

/// The bars of one configuration, one per group of the chart.
pub struct Series {
    pub config: String,
    pub bars: Vec<Bar>,
}

/// What `draw` draws.
pub struct BarChart<'a> {
    pub title: String,
    /// A line under the plot saying what the bars, error bars and groups are.
    pub note: String,
    pub y_desc: String,
    /// Group names (x labels), in order.
    pub groups: Vec<String>,
    /// A dashed vertical line before each of these group indices (sets the summary groups apart).
    pub dividers: Vec<usize>,
    /// The value every bar is relative to (drawn as a solid line across the plot).
    pub reference: f64,
    pub series: Vec<&'a Series>,
}

/// Colours of the configurations, in order (native grey; then colour-blind-safe hues).
const COLORS: [RGBColor; 8] = [
    RGBColor(110, 110, 110),
    RGBColor(213, 94, 0),
    RGBColor(230, 159, 0),
    RGBColor(0, 114, 178),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(40, 40, 40),
];

const FONT: &str = "sans-serif";

impl BarChart<'_> {
    /// The value axis: every bar and error bar end, and the reference, inside it.
    pub fn axis(&self) -> Axis {
        let v: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.bars.iter().flat_map(|b| [b.value, b.min, b.max]))
            .collect();
        chart_axis::choose(&v, &[self.reference], true)
    }

    /// The x position of the centre of bar `j` (of `k` per group) in group `i`, and the width of
    /// a bar.
    fn slot(&self, i: usize, j: usize) -> (f64, f64) {
        let k = self.series.len().max(1) as f64;
        let w = 0.8 / k;
        (i as f64 - 0.4 + w * (j as f64 + 0.5), w)
    }
}

/// How a legend entry is drawn.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Swatch {
    /// A filled box (bars, shaded areas).
    Fill(RGBColor),
    /// A line (a series of points).
    Line(RGBColor),
    /// A dashed line (a reference level).
    Dash(RGBColor),
}

/// Height of the title and legend rows above a chart, and of a line of the note under it.
const HEAD: u32 = 92;
const NOTE_LINE: u32 = 20;

/// Draws the title, a legend row (a swatch and the name of each entry, centred) and the note
/// (lines split at `\n`) under the plot on `root`; returns the area left for the plot.
pub(crate) fn frame<'a>(
    root: &DrawingArea<SVGBackend<'a>, Shift>,
    title: &str,
    entries: &[(String, Swatch)],
    note: &str,
) -> Result<DrawingArea<SVGBackend<'a>, Shift>, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let (width, height) = root.dim_in_pixel();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (head, rest) = root.split_vertically(HEAD);
    let lines: Vec<&str> = note.lines().collect();
    let foot_h = 14 + NOTE_LINE * lines.len() as u32;
    let (body, foot) = rest.split_vertically(height - HEAD - foot_h);
    let center = Pos::new(HPos::Center, VPos::Center);
    head.draw(&Text::new(
        title.to_string(),
        (width as i32 / 2, 22),
        TextStyle::from((FONT, 24).into_font()).pos(center),
    ))
    .map_err(|x| e(&x))?;
    for (k, line) in lines.iter().enumerate() {
        foot.draw(&Text::new(
            line.to_string(),
            (width as i32 / 2, 10 + (NOTE_LINE * k as u32) as i32),
            (FONT, 15)
                .into_font()
                .color(&RGBColor(60, 60, 60))
                .pos(center),
        ))
        .map_err(|x| e(&x))?;
    }
    let font = TextStyle::from((FONT, 17).into_font());
    let gap = 28;
    let widths: Vec<i32> = entries
        .iter()
        .map(|(t, _)| {
            head.estimate_text_size(t, &font)
                .map_or(10 * t.len() as i32, |(w, _)| w as i32)
                + 30
        })
        .collect();
    let total: i32 = widths.iter().sum::<i32>() + gap * (entries.len() as i32 - 1).max(0);
    let (mut x, y) = ((width as i32 - total) / 2, 66);
    for ((text, swatch), w) in entries.iter().zip(&widths) {
        match *swatch {
            Swatch::Fill(c) => {
                head.draw(&Rectangle::new([(x, y - 8), (x + 22, y + 8)], c.filled()))
            }
            Swatch::Line(c) => head.draw(&PathElement::new(
                vec![(x, y), (x + 22, y)],
                c.stroke_width(3),
            )),
            Swatch::Dash(c) => head
                .draw(&PathElement::new(
                    vec![(x, y), (x + 8, y)],
                    c.stroke_width(2),
                ))
                .and_then(|()| {
                    head.draw(&PathElement::new(
                        vec![(x + 14, y), (x + 22, y)],
                        c.stroke_width(2),
                    ))
                }),
        }
        .map_err(|x| e(&x))?;
        head.draw(&Text::new(
            text.clone(),
            (x + 30, y),
            font.clone().pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(|x| e(&x))?;
        x += w + gap;
    }
    Ok(body)
}

/// The mesh style of every chart: light grey grid lines at the labelled ticks only, readable
/// fonts.
pub(crate) const GRID: RGBColor = RGBColor(222, 222, 222);
pub(crate) const TICK_FONT: (&str, u32) = (FONT, 16);
pub(crate) const DESC_FONT: (&str, u32) = (FONT, 18);

/// Draws `c` into `path` (SVG).
pub fn draw(path: &Path, c: &BarChart) -> Result<(), BenchError> {
    draw_inner(path, c).map_err(BenchError::chart(path))
}

fn draw_inner(path: &Path, c: &BarChart) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let groups = c.groups.len();
    let width = (260 + 95 * groups as u32).clamp(900, 2000);
    let root = SVGBackend::new(path, (width, 680)).into_drawing_area();
    let entries: Vec<(String, Swatch)> = c
        .series
        .iter()
        .enumerate()
        .map(|(j, s)| (s.config.clone(), Swatch::Fill(COLORS[j % COLORS.len()])))
        .collect();
    let body = frame(&root, &c.title, &entries, &c.note)?;
    let axis = c.axis();
    let names = &c.groups;
    let x_ticks: Vec<f64> = (0..groups).map(|i| i as f64).collect();
    let x_range = Ticked::new(RangedCoordf64::from(-0.5f64..groups as f64 - 0.5), &x_ticks);
    let fmt_x = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let fmt_y = |y: &f64| chart_axis::label(*y);
    let mut builder = ChartBuilder::on(&body);
    builder
        .margin_left(10)
        .margin_right(20)
        .margin_top(10)
        .x_label_area_size(40)
        .y_label_area_size(80);
    // One drawing routine for both kinds of value axis.
    macro_rules! plot {
        ($y_range:expr, $lo:expr) => {{
            let mut chart = builder
                .build_cartesian_2d(x_range, $y_range)
                .map_err(|x| e(&x))?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .bold_line_style(GRID.stroke_width(1))
                .light_line_style(TRANSPARENT)
                .x_label_formatter(&fmt_x)
                .y_label_formatter(&fmt_y)
                .x_label_style(TICK_FONT)
                .y_label_style(TICK_FONT)
                .axis_desc_style(DESC_FONT)
                .y_desc(c.y_desc.as_str())
                .draw()
                .map_err(|x| e(&x))?;
            let lo = $lo;
            let top = axis.hi;
            chart
                .draw_series(c.dividers.iter().map(|d| {
                    let x = *d as f64 - 0.5;
                    DashedPathElement::new(
                        vec![(x, lo), (x, top)],
                        6,
                        4,
                        RGBColor(120, 120, 120).stroke_width(1),
                    )
                }))
                .map_err(|x| e(&x))?;
            for (j, s) in c.series.iter().enumerate() {
                let color = COLORS[j % COLORS.len()];
                chart
                    .draw_series(s.bars.iter().enumerate().map(|(i, b)| {
                        let (xc, w) = c.slot(i, j);
                        let half = w * 0.45;
                        Rectangle::new([(xc - half, lo), (xc + half, b.value)], color.filled())
                    }))
                    .map_err(|x| e(&x))?;
            }
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(-0.5, c.reference), (groups as f64 - 0.5, c.reference)],
                    BLACK.stroke_width(1),
                )))
                .map_err(|x| e(&x))?;
            for (j, s) in c.series.iter().enumerate() {
                for (i, b) in s.bars.iter().enumerate() {
                    if b.max <= b.min {
                        continue;
                    }
                    let (xc, w) = c.slot(i, j);
                    let cap = w * 0.22;
                    let style = BLACK.stroke_width(1);
                    chart
                        .draw_series([
                            PathElement::new(vec![(xc, b.min), (xc, b.max)], style),
                            PathElement::new(vec![(xc - cap, b.min), (xc + cap, b.min)], style),
                            PathElement::new(vec![(xc - cap, b.max), (xc + cap, b.max)], style),
                        ])
                        .map_err(|x| e(&x))?;
                }
            }
        }};
    }
    let ticks = axis.ticks.clone();
    if axis.log {
        let inner: LogCoord<f64> = (axis.lo..axis.hi).log_scale().into();
        plot!(Ticked::new(inner, &ticks), axis.lo);
    } else {
        let inner = RangedCoordf64::from(axis.lo..axis.hi);
        plot!(Ticked::new(inner, &ticks), axis.lo);
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// The texts of an SVG file written by plotters (each `<text ...>` element's content).
#[cfg(test)]
pub(crate) fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split_once('>')?.1;
            Some(body.split_once("</text>")?.0.trim().to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(config: &str, bars: &[(f64, f64, f64)]) -> Series {
        Series {
            config: config.into(),
            bars: bars
                .iter()
                .map(|(value, min, max)| Bar {
                    value: *value,
                    min: *min,
                    max: *max,
                })
                .collect(),
        }
    }

    #[test]
    fn the_axis_holds_every_bar_and_error_bar() {
        // As measured: a 0.3x bar (the old fixed 0.5 floor dropped it) and a 31.7x init.
        let a = series(
            "native",
            &[(1.0, 0.9, 1.2), (1.0, 1.0, 1.0), (1.0, 0.8, 1.1)],
        );
        let b = series(
            "full",
            &[(0.45, 0.3, 0.5), (1.7, 1.6, 2.1), (28.0, 25.0, 31.7)],
        );
        let c = BarChart {
            title: String::new(),
            note: String::new(),
            y_desc: String::new(),
            groups: vec!["a".into(), "geomean".into(), "init".into()],
            dividers: vec![1],
            reference: 1.0,
            series: vec![&a, &b],
        };
        let axis = c.axis();
        assert!(axis.log);
        for s in &c.series {
            for bar in &s.bars {
                for v in [bar.value, bar.min, bar.max] {
                    assert!(axis.contains(v), "{v} outside {axis:?}");
                }
            }
        }
        // Bars start at the bottom of the axis and stay strictly above it.
        assert!(axis.lo < 0.3);
        let dir = std::env::temp_dir().join(format!("vgpu-bench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.svg");
        draw(&path, &c).unwrap();
        let texts = svg_texts(&std::fs::read_to_string(&path).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        // Every group and configuration is named once, tick labels too.
        let count = |t: &str| texts.iter().filter(|x| *x == t).count();
        for name in ["a", "geomean", "init", "native", "full"] {
            assert_eq!(count(name), 1, "{name}: {texts:?}");
        }
        for t in &axis.ticks {
            let l = chart_axis::label(*t);
            assert_eq!(count(&l), 1, "tick {l}: {texts:?}");
        }
    }

    #[test]
    fn bars_of_a_group_do_not_overlap() {
        let s = series("x", &[(1.0, 1.0, 1.0)]);
        let c = BarChart {
            title: String::new(),
            note: String::new(),
            y_desc: String::new(),
            groups: vec!["a".into(), "b".into()],
            dividers: vec![],
            reference: 1.0,
            series: vec![&s, &s, &s, &s, &s],
        };
        for i in 0..2 {
            let mut last = i as f64 - 0.5;
            for j in 0..5 {
                let (xc, w) = c.slot(i, j);
                assert!(xc - w * 0.45 > last, "{i} {j}");
                last = xc + w * 0.45;
            }
            assert!(last < i as f64 + 0.5);
        }
    }

    #[test]
    fn ranges_include_the_median_and_every_repetition() {
        let b = Bar::with_range(1.2, &[1.1, 1.3, f64::NAN, 1.25]);
        assert_eq!((b.min, b.max), (1.1, 1.3));
        let b = Bar::with_range(2.0, &[]);
        assert_eq!((b.value, b.min, b.max), (2.0, 2.0, 2.0));
    }
}
