//! Cross-checks of CPU references against independent computations (f64, plain sums, hand cases).

use suite::{Expect, Size};

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn matmul_reference_is_close_to_f64_product() {
    let inst = suite::find("matmul").unwrap().instance(Size::Medium);
    let (a, b) = (f32s(&inst.buffers[0].init), f32s(&inst.buffers[1].init));
    let Expect::F32 { values, abs, .. } = &inst.buffers[2].expect else {
        panic!()
    };
    let n = 32;
    assert!(*abs > 0.0 && *abs < 1e-3, "tolerance {abs}");
    for r in 0..n {
        for c in 0..n {
            let exact: f64 = (0..n)
                .map(|k| f64::from(a[r * n + k]) * f64::from(b[k * n + c]))
                .sum();
            assert!(
                (exact - f64::from(values[r * n + c])).abs() <= f64::from(*abs),
                "C[{r}][{c}]"
            );
        }
    }
}

#[test]
fn reduction_total_is_the_plain_sum() {
    let inst = suite::find("reduction").unwrap().instance(Size::Medium);
    let sum: u64 = inst.buffers[0]
        .init
        .chunks(4)
        .map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap())))
        .sum();
    let Expect::Exact { bytes, .. } = &inst.buffers[2].expect else {
        panic!()
    };
    assert_eq!(u64s(bytes), [sum]);
    let Expect::Exact { bytes, .. } = &inst.buffers[1].expect else {
        panic!()
    };
    assert_eq!(u64s(bytes).iter().sum::<u64>(), sum);
}

#[test]
fn stencil_step_keeps_a_uniform_field_without_power() {
    let src = vec![300.0f32; 12];
    let out = suite::hand::stencil::step(&src, &[0.0; 12], 3, 4);
    assert_eq!(out, src);
}

#[test]
fn stencil_launches_ping_pong() {
    let inst = suite::find("stencil").unwrap().instance(Size::Small);
    assert!(inst.launches.len() >= 2);
    for (k, l) in inst.launches.iter().enumerate() {
        assert_eq!(l.params[0], suite::Param::Buffer(k % 2));
        assert_eq!(l.params[1], suite::Param::Buffer((k + 1) % 2));
    }
}

#[test]
fn graph_counts_match_levels() {
    let inst = suite::find("graph").unwrap().instance(Size::Small);
    let (Expect::Exact { bytes: lv, .. }, Expect::Exact { bytes: ct, .. }) =
        (&inst.buffers[2].expect, &inst.buffers[3].expect)
    else {
        panic!()
    };
    let levels: Vec<u32> = lv
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let counts: Vec<u32> = ct
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let reached = levels.iter().filter(|&&l| l != u32::MAX).count() as u32;
    assert_eq!(counts.iter().sum::<u32>(), reached);
    assert!(reached > levels.len() as u32 / 2, "most nodes reachable");
}

#[test]
fn spin_checks_only_the_lower_bound() {
    let inst = suite::hand::spin::instance_with(5000, 1, 4, Size::Small);
    let good: Vec<u8> = [5000u64, 9999, 5001, 70000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert!(inst.check(&[&good]).is_ok());
    let bad: Vec<u8> = [5000u64, 4999, 5001, 70000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert!(inst.check(&[&bad]).is_err());
}
