//! Runtime configuration of the scheduler: a struct with defaults, parsed from `key=value` strings.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Durations are written as everywhere else on the command lines (`500us`, `2ms`).
pub use vgpu_proto::units::parse_duration;

/// A scheduling policy (used within one priority class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Fifo,
    Credit,
    Band,
    Timeslice,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [Self::Fifo, Self::Credit, Self::Band, Self::Timeslice];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Credit => "credit",
            Self::Band => "band",
            Self::Timeslice => "timeslice",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Self::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ConfigError::BadValue {
                key: "policy".into(),
                value: s.into(),
            })
    }
}

/// What a run is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// The `gpu_time` the engine reported, capped at the wall time the VM held the GPU.
    Engine,
    /// The wall time from the grant to the report (for reports that cannot be trusted, e.g. from
    /// VM processes over a socket).
    Wall,
}

/// A refused configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    #[error("bad value {value:?} for {key}")]
    BadValue { key: String, value: String },
    #[error("expected key=value, got {0:?}")]
    Syntax(String),
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
}

/// Scheduler configuration. Every field is runtime configuration; `Default` gives the documented
/// defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Policy of every priority class without an entry in `class_policy` (`policy=`).
    pub policy: PolicyKind,
    /// Policy per priority class (`policy.N=`).
    pub class_policy: BTreeMap<u8, PolicyKind>,
    /// TIMESLICE slice length (`slice=`, default 2 ms as NVIDIA's time-sliced vGPU scheduler).
    pub slice: Duration,
    /// TIMESLICE slice while more than `many_vms` VMs share a class (`slice_many=`, default
    /// 1 ms as NVIDIA above 8 vGPUs; `off` = always `slice`).
    pub slice_many: Option<Duration>,
    /// See `slice_many` (`many_vms=`, default 8).
    pub many_vms: usize,
    /// CREDIT replenishment period (`credit_period=`, default 100 ms).
    pub credit_period: Duration,
    /// BAND budget period (`band_period=`, default 100 ms).
    pub band_period: Duration,
    /// BAND wait for the current VM's next submission (`band_wait=`, default 500 µs; 0 = off).
    pub band_wait: Duration,
    /// TIMESLICE: a VM that gets work preempts the running VM of its class when it is behind
    /// in weighted GPU time by more than `wake_granularity` (`wake_preempt=`, default true).
    pub wake_preempt: bool,
    /// TIMESLICE wake-up preemption threshold (`wake_granularity=`, default 500 µs).
    pub wake_granularity: Duration,
    /// A submission of a higher class preempts a running lower class (`priority_preempt=`).
    pub priority_preempt: bool,
    /// What a run is charged (`charge=engine|wall`).
    pub charge: Charge,
    /// Accounting window (`window=`, default 100 ms).
    pub window: Duration,
    /// Accounting windows kept (`history=`, default 600).
    pub history: usize,
    /// Most VMs registered at once (`max_vms=`, default 1024).
    pub max_vms: usize,
    /// Most jobs queued per VM (`max_pending=`, default 65536): bounds FIFO's queue.
    pub max_pending: u64,
    /// Largest weight (`max_weight=`, default 10000).
    pub max_weight: u32,
    /// Filling (`fill=on|off`, default off; `policy=fikit` = `policy=timeslice,fill=on`): while
    /// the VMs of higher classes are in the idle gaps between their kernels, lower-class
    /// kernels predicted to fit the gap run (see README.md, "Filling").
    pub fill: bool,
    /// A higher-class submission lets a filler predicted to end within this finish instead of
    /// preempting it (`fill_bound=`, default 50 µs).
    pub fill_bound: Duration,
    /// Slice of lower-class runs while a higher VM's gap is not predicted yet (`fill_slice=`,
    /// default 200 µs).
    pub fill_slice: Duration,
    /// Predicted gaps shorter than this are left idle (`fill_min=`, default 20 µs).
    pub fill_min: Duration,
    /// A higher VM with no gap predicted yet constrains lower classes (short slices) until it
    /// has been idle this long (`fill_idle=`, default 5 ms).
    pub fill_idle: Duration,
    /// The longest the GPU is kept idle for a higher VM that is due (past the low quantile of
    /// its gaps, before their third quartile) (`fill_hold=`, default 300 µs; 0: never).
    pub fill_hold: Duration,
    /// Samples an estimate needs before it is used (`fill_samples=`, default 2).
    pub fill_samples: u32,
    /// Kernel identities remembered per VM (`fill_kernels=`, default 256; least recently used
    /// evicted).
    pub fill_kernels: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Timeslice,
            class_policy: BTreeMap::new(),
            slice: Duration::from_millis(2),
            slice_many: Some(Duration::from_millis(1)),
            many_vms: 8,
            credit_period: Duration::from_millis(100),
            band_period: Duration::from_millis(100),
            band_wait: Duration::from_micros(500),
            wake_preempt: true,
            wake_granularity: Duration::from_micros(500),
            priority_preempt: true,
            charge: Charge::Engine,
            window: Duration::from_millis(100),
            history: 600,
            max_vms: 1024,
            max_pending: 65_536,
            max_weight: 10_000,
            fill: false,
            fill_bound: Duration::from_micros(50),
            fill_slice: Duration::from_micros(200),
            fill_min: Duration::from_micros(20),
            fill_idle: Duration::from_millis(5),
            fill_hold: Duration::from_micros(300),
            fill_samples: 2,
            fill_kernels: 256,
        }
    }
}

impl Config {
    /// The policy of a priority class.
    pub fn policy_of(&self, class: u8) -> PolicyKind {
        self.class_policy
            .get(&class)
            .copied()
            .unwrap_or(self.policy)
    }

    /// Parses `key=value` items over the defaults, e.g. `policy=band,band_wait=100us,policy.1=fifo`:
    /// the grammar of every option string (`vgpu_proto::units::pairs`), with whitespace
    /// separating items as commas do (a configuration written over several lines).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        for item in s.split_whitespace().flat_map(vgpu_proto::units::pairs) {
            let (k, v) = item.map_err(|e| ConfigError::Syntax(e.0))?;
            c.set(k, v)?;
        }
        c.validate()?;
        Ok(c)
    }

    /// Sets one key (see the field documentation for the keys).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let bad = || ConfigError::BadValue {
            key: key.into(),
            value: value.into(),
        };
        match key {
            "policy" if value.eq_ignore_ascii_case("fikit") => {
                self.policy = PolicyKind::Timeslice;
                self.fill = true;
            }
            "policy" => self.policy = value.parse()?,
            "fill" => {
                self.fill = match value {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    _ => return Err(bad()),
                }
            }
            "fill_bound" => self.fill_bound = parse_duration(value).ok_or_else(bad)?,
            "fill_slice" => self.fill_slice = parse_duration(value).ok_or_else(bad)?,
            "fill_min" => self.fill_min = parse_duration(value).ok_or_else(bad)?,
            "fill_idle" => self.fill_idle = parse_duration(value).ok_or_else(bad)?,
            "fill_hold" => self.fill_hold = parse_duration(value).ok_or_else(bad)?,
            "fill_samples" => self.fill_samples = value.parse().map_err(|_| bad())?,
            "fill_kernels" => self.fill_kernels = value.parse().map_err(|_| bad())?,
            "slice" => self.slice = parse_duration(value).ok_or_else(bad)?,
            "slice_many" if value == "off" => self.slice_many = None,
            "slice_many" => self.slice_many = Some(parse_duration(value).ok_or_else(bad)?),
            "many_vms" => self.many_vms = value.parse().map_err(|_| bad())?,
            "credit_period" => self.credit_period = parse_duration(value).ok_or_else(bad)?,
            "band_period" => self.band_period = parse_duration(value).ok_or_else(bad)?,
            "band_wait" => self.band_wait = parse_duration(value).ok_or_else(bad)?,
            "window" => self.window = parse_duration(value).ok_or_else(bad)?,
            "wake_preempt" => self.wake_preempt = value.parse().map_err(|_| bad())?,
            "wake_granularity" => self.wake_granularity = parse_duration(value).ok_or_else(bad)?,
            "priority_preempt" => self.priority_preempt = value.parse().map_err(|_| bad())?,
            "charge" => {
                self.charge = match value {
                    "engine" => Charge::Engine,
                    "wall" => Charge::Wall,
                    _ => return Err(bad()),
                }
            }
            "history" => self.history = value.parse().map_err(|_| bad())?,
            "max_vms" => self.max_vms = value.parse().map_err(|_| bad())?,
            "max_pending" => self.max_pending = value.parse().map_err(|_| bad())?,
            "max_weight" => self.max_weight = value.parse().map_err(|_| bad())?,
            _ => match key.strip_prefix("policy.") {
                Some(class) => {
                    let class: u8 = class
                        .parse()
                        .map_err(|_| ConfigError::UnknownKey(key.into()))?;
                    self.class_policy
                        .insert(class, value.parse().map_err(|_| bad())?);
                }
                None => return Err(ConfigError::UnknownKey(key.into())),
            },
        }
        Ok(())
    }

    /// Checks the values that must be non-zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let nonzero = [
            (self.slice.is_zero(), "slice"),
            (self.slice_many.is_some_and(|s| s.is_zero()), "slice_many"),
            (self.credit_period.is_zero(), "credit_period"),
            (self.band_period.is_zero(), "band_period"),
            (self.window.is_zero(), "window"),
            (self.history == 0, "history"),
            (self.max_vms == 0, "max_vms"),
            (self.max_pending == 0, "max_pending"),
            (self.max_weight == 0, "max_weight"),
            (self.fill_slice.is_zero(), "fill_slice"),
            (self.fill_samples == 0, "fill_samples"),
            (self.fill_kernels == 0, "fill_kernels"),
        ];
        match nonzero.into_iter().find(|(zero, _)| *zero) {
            Some((_, name)) => Err(ConfigError::Zero(name)),
            None => Ok(()),
        }
    }
}

impl FromStr for Config {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Self::parse(s)
    }
}
