//! Value axes of the charts, chosen from the data: a linear axis from 0 with 4 to 8 "nice"
//! ticks (1, 2, 2.5 or 5 × 10^k apart), or a log axis on the 1-2-5 sequence (or decades when
//! that would give too many ticks) when the data span a factor of 10 or more. Every value given
//! lies inside the range, so no bar or error bar is cut off, and the tick labels are short and
//! distinct ("0.5", "1", "20", not "10.0" twice).

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

/// A value axis: its range, whether it is logarithmic, and the values that get a tick, a label
/// and a grid line.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    pub log: bool,
    pub lo: f64,
    pub hi: f64,
    pub ticks: Vec<f64>,
}

/// A plotters coordinate on `inner` (linear or log) with the axis's ticks as its only key
/// points: grid lines at the labelled ticks only, no light lines. (plotters' `WithKeyPoints`
/// cannot take a label formatter on an `f64` axis.)
pub struct Ticked<R> {
    inner: R,
    ticks: Vec<f64>,
}

impl<R: Ranged<ValueType = f64>> Ticked<R> {
    pub fn new(inner: R, ticks: &[f64]) -> Self {
        Self {
            inner,
            ticks: ticks.to_vec(),
        }
    }
}

impl<R: Ranged<ValueType = f64>> Ranged for Ticked<R> {
    type ValueType = f64;
    type FormatOption = DefaultFormatting;

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn axis_pixel_range(&self, limit: (i32, i32)) -> Range<i32> {
        self.inner.axis_pixel_range(limit)
    }
}

/// Data spanning this factor or more get a log axis (where every value is positive).
pub const LOG_SPAN: f64 = 10.0;
/// Most ticks a log axis on the 1-2-5 sequence may have before it falls back to decades.
const MAX_LOG_TICKS: usize = 10;

impl Axis {
    /// Whether `v` is inside the range.
    #[cfg(test)]
    pub fn contains(&self, v: f64) -> bool {
        v >= self.lo && v <= self.hi
    }
}

/// An axis for the finite values of `values` (non-finite ones are ignored); `log_allowed`:
/// whether a log axis may be chosen. `include` values (e.g. 1.0 for relative times) are
/// always in range.
pub fn choose(values: &[f64], include: &[f64], log_allowed: bool) -> Axis {
    let v: Vec<f64> = values
        .iter()
        .chain(include)
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    if v.is_empty() {
        return linear(1.0);
    }
    if log_allowed && min > 0.0 && max / min >= LOG_SPAN {
        log(min, max)
    } else {
        linear(max)
    }
}

/// Linear axis from `min(0, ..)` to a nice value at or above `max` with 5% headroom.
pub fn linear(max: f64) -> Axis {
    let top = if max > 0.0 { max * 1.05 } else { 1.0 };
    // The smallest step of 1, 2, 2.5, 5 × 10^k that covers `top` in at most 8 steps.
    let mag = 10f64.powf((top / 8.0).log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| (top / s).ceil() <= 8.0)
        .unwrap_or(10.0 * mag);
    let n = (top / step).ceil().max(1.0) as usize;
    let ticks: Vec<f64> = (0..=n).map(|k| round_sig(k as f64 * step)).collect();
    Axis {
        log: false,
        lo: 0.0,
        hi: ticks[n],
        ticks,
    }
}

/// `a` with its top lowered to `cap` where it overshoots it (a share in % never exceeds 100:
/// the headroom would only add an empty band); the ticks above `cap` go, `cap` gets one.
pub fn capped(mut a: Axis, cap: f64) -> Axis {
    if a.hi > cap && a.lo < cap {
        a.ticks.retain(|t| *t <= cap);
        if a.ticks.last().is_none_or(|t| *t < cap) {
            a.ticks.push(cap);
        }
        a.hi = cap;
    }
    a
}

/// The 1-2-5 (or 1-only) sequence between two decades around `[min, max]`.
fn sequence(min: f64, max: f64, mantissas: &[f64]) -> Vec<f64> {
    let (d0, d1) = (
        min.log10().floor() as i32 - 1,
        max.log10().ceil() as i32 + 1,
    );
    (d0..=d1)
        .flat_map(|d| mantissas.iter().map(move |m| round_sig(m * 10f64.powi(d))))
        .collect()
}

/// Log axis: from the largest sequence value at or below `min / 1.15` (the smallest bar still
/// shows as a bar) to the smallest at or above `max * 1.1`.
pub fn log(min: f64, max: f64) -> Axis {
    let (lo_v, hi_v) = (min / 1.15, max * 1.1);
    let pick = |m: &[f64]| {
        let s = sequence(lo_v, hi_v, m);
        let lo = s
            .iter()
            .copied()
            .filter(|x| *x <= lo_v)
            .fold(s[0], f64::max);
        let hi = s
            .iter()
            .copied()
            .filter(|x| *x >= hi_v)
            .fold(s[s.len() - 1], f64::min);
        let ticks: Vec<f64> = s.into_iter().filter(|x| *x >= lo && *x <= hi).collect();
        Axis {
            log: true,
            lo,
            hi,
            ticks,
        }
    };
    let a = pick(&[1.0, 2.0, 5.0]);
    if a.ticks.len() <= MAX_LOG_TICKS {
        a
    } else {
        pick(&[1.0])
    }
}

/// `v` rounded to 12 significant digits (so that 0.1 × 3 is 0.3 and labels come out short).
fn round_sig(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(11 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// A tick label: the shortest decimal form of `v` ("0.5", "1", "2.5", "100").
pub fn label(v: f64) -> String {
    let s = format!("{}", round_sig(v));
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(a: &Axis, values: &[f64]) {
        for v in values {
            assert!(a.contains(*v), "{v} outside {a:?}");
        }
        assert!(a.ticks.len() >= 2, "{a:?}");
        assert!(a.ticks.windows(2).all(|w| w[0] < w[1]), "{a:?}");
        assert_eq!(a.ticks.first(), Some(&a.lo));
        assert_eq!(a.ticks.last(), Some(&a.hi));
        let labels: Vec<String> = a.ticks.iter().map(|t| label(*t)).collect();
        let mut uniq = labels.clone();
        uniq.dedup();
        assert_eq!(labels, uniq, "labels not distinct: {labels:?}");
        assert!(labels.iter().all(|l| l.len() <= 6), "{labels:?}");
    }

    #[test]
    fn small_spans_are_linear_from_zero() {
        let v = [0.93, 1.0, 1.24, 2.9];
        let a = choose(&v, &[1.0], true);
        assert!(!a.log);
        assert_eq!(a.lo, 0.0);
        assert_eq!(label(a.hi), "3.5");
        check(&a, &v);
    }

    #[test]
    fn wide_spans_are_log_and_keep_the_smallest_bar() {
        // A bar at 0.3x was cut off by the old fixed 0.5 lower bound.
        let v = [0.3, 1.0, 4.8, 31.7];
        let a = choose(&v, &[1.0], true);
        assert!(a.log);
        assert!(a.lo < 0.3 && a.lo > 0.1, "{a:?}");
        check(&a, &v);
        let labels: Vec<String> = a.ticks.iter().map(|t| label(*t)).collect();
        assert_eq!(labels, ["0.2", "0.5", "1", "2", "5", "10", "20", "50"]);
    }

    #[test]
    fn very_wide_spans_fall_back_to_decades() {
        let v = [0.02, 1.0, 900.0];
        let a = choose(&v, &[], true);
        assert!(a.log);
        check(&a, &v);
        assert!(a.ticks.len() <= MAX_LOG_TICKS);
        assert!(
            a.ticks
                .iter()
                .all(|t| (t.log10() - t.log10().round()).abs() < 1e-9),
            "{a:?}"
        );
    }

    #[test]
    fn zero_or_log_refused_stays_linear() {
        let v = [0.0, 1.0, 40.0];
        let a = choose(&v, &[], true);
        assert!(!a.log);
        check(&a, &v);
        let a = choose(&[0.5, 60.0], &[], false);
        assert!(!a.log);
        check(&a, &[0.5, 60.0]);
        let a = choose(&[f64::NAN], &[], true);
        check(&a, &[]);
    }

    #[test]
    fn linear_steps_are_nice() {
        for (max, hi) in [
            (0.9, 1.0),
            (27.5, 30.0),
            (100.0, 120.0),
            (3.7, 4.0),
            (0.033, 0.035),
        ] {
            let a = linear(max);
            check(&a, &[max]);
            assert_eq!(a.hi, hi, "{max}: {a:?}");
            assert!((4..=9).contains(&a.ticks.len()), "{max}: {a:?}");
        }
    }

    #[test]
    fn shares_stop_at_100_percent() {
        let a = capped(choose(&[12.0, 99.0], &[], false), 100.0);
        assert_eq!(a.hi, 100.0);
        check(&a, &[12.0, 99.0, 100.0]);
        // An axis under the cap is left alone.
        assert_eq!(capped(linear(40.0), 100.0), linear(40.0));
    }

    #[test]
    fn labels_are_short() {
        assert_eq!(label(0.1 * 3.0), "0.3");
        assert_eq!(label(10.0), "10");
        assert_eq!(label(2.5), "2.5");
        assert_eq!(label(0.0), "0");
    }
}
