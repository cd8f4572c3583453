//! Configuration parsing (`key=value`) and the windowed GPU-time accounting.

use std::time::Duration;

use scheduler::{Accounting, Charge, Config, ConfigError, PolicyKind, VmId, parse_duration};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn defaults_are_documented_values() {
    let c = Config::default();
    assert_eq!(c.policy, PolicyKind::Timeslice);
    assert_eq!(
        (c.slice, c.window, c.band_wait),
        (ms(2), ms(100), Duration::from_micros(500))
    );
    assert_eq!(Config::parse("").unwrap(), c);
}

#[test]
fn parses_every_key() {
    let c = Config::parse(
        "policy=band, slice=1ms credit_period=50ms,band_period=20ms,band_wait=100us,\
         wake_preempt=false,wake_granularity=1ms,priority_preempt=false,charge=wall,\
         window=10ms,history=5,max_vms=3,max_weight=7,max_pending=9,policy.2=fifo,slice_many=500us,many_vms=4",
    )
    .unwrap();
    assert_eq!(c.policy, PolicyKind::Band);
    assert_eq!(
        (c.slice, c.credit_period, c.band_period),
        (ms(1), ms(50), ms(20))
    );
    assert_eq!(c.band_wait, Duration::from_micros(100));
    assert!(!c.wake_preempt && !c.priority_preempt);
    assert_eq!(c.wake_granularity, ms(1));
    assert_eq!(c.charge, Charge::Wall);
    assert_eq!(
        (c.window, c.history, c.max_vms, c.max_weight),
        (ms(10), 5, 3, 7)
    );
    assert_eq!(
        (c.policy_of(2), c.policy_of(1)),
        (PolicyKind::Fifo, PolicyKind::Band)
    );
    assert_eq!(
        "policy=FIFO".parse::<Config>().unwrap().policy,
        PolicyKind::Fifo
    );
}

#[test]
fn rejects_bad_configuration() {
    let bad = [
        ("nope=1", ConfigError::UnknownKey("nope".into())),
        ("slice", ConfigError::Syntax("slice".into())),
        (
            "slice=2",
            ConfigError::BadValue {
                key: "slice".into(),
                value: "2".into(),
            },
        ),
        ("slice=0ms", ConfigError::Zero("slice")),
        ("slice_many=0ms", ConfigError::Zero("slice_many")),
        ("window=0s", ConfigError::Zero("window")),
        ("history=0", ConfigError::Zero("history")),
        (
            "policy=lottery",
            ConfigError::BadValue {
                key: "policy".into(),
                value: "lottery".into(),
            },
        ),
        (
            "policy.300=fifo",
            ConfigError::UnknownKey("policy.300".into()),
        ),
        (
            "charge=maybe",
            ConfigError::BadValue {
                key: "charge".into(),
                value: "maybe".into(),
            },
        ),
        (
            "max_vms=-1",
            ConfigError::BadValue {
                key: "max_vms".into(),
                value: "-1".into(),
            },
        ),
    ];
    for (text, err) in bad {
        assert_eq!(Config::parse(text), Err(err), "{text}");
    }
    let zero = Config {
        slice: Duration::ZERO,
        ..Config::default()
    };
    assert!(scheduler::Scheduler::new(zero).is_err());
}

#[test]
fn durations_need_a_unit_and_do_not_overflow() {
    assert_eq!(parse_duration("250us"), Some(Duration::from_micros(250)));
    assert_eq!(parse_duration("250µs"), Some(Duration::from_micros(250)));
    assert_eq!(parse_duration("3s"), Some(Duration::from_secs(3)));
    assert_eq!(parse_duration("7ns"), Some(Duration::from_nanos(7)));
    for bad in [
        "",
        "ms",
        "1.5ms",
        "-1ms",
        "1 h",
        "99999999999999999999s",
        "18446744073709551615s",
    ] {
        assert_eq!(parse_duration(bad), None, "{bad}");
    }
}

#[test]
fn accounting_splits_runs_across_windows() {
    let mut a = Accounting::new(ms(10), 100);
    // A run from 5 ms to 25 ms: 5 + 10 + 5 across three windows.
    a.charge(VmId(1), ms(20), ms(25));
    a.charge(VmId(2), ms(3), ms(28));
    let w: Vec<_> = a.windows().collect();
    assert_eq!(w.len(), 3);
    assert_eq!(w[0].start, ms(0));
    assert_eq!(w[0].per_vm[&VmId(1)], ms(5));
    assert_eq!(w[1].per_vm[&VmId(1)], ms(10));
    assert_eq!(
        (w[2].per_vm[&VmId(1)], w[2].per_vm[&VmId(2)]),
        (ms(5), ms(3))
    );
    assert_eq!(w[2].total(), ms(8));
    assert_eq!(a.total(VmId(1)), ms(20));
    assert_eq!(a.total(VmId(3)), Duration::ZERO);
}

#[test]
fn accounting_keeps_only_its_history_and_survives_huge_values() {
    let mut a = Accounting::new(ms(10), 3);
    for i in 1..=10 {
        a.charge(VmId(1), ms(10), ms(10 * i));
    }
    let w: Vec<_> = a.windows().collect();
    assert_eq!(
        w.iter().map(|w| w.start).collect::<Vec<_>>(),
        [ms(70), ms(80), ms(90)]
    );
    a.charge(VmId(1), Duration::MAX, Duration::MAX);
    assert_eq!(a.windows().count(), 3);
    assert_eq!(a.total(VmId(1)), Duration::MAX, "saturates");
    let mut z = Accounting::new(Duration::ZERO, 0);
    z.charge(VmId(1), ms(1), ms(1));
    assert_eq!(z.windows().count(), 1);
}
