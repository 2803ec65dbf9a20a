//! The synthetic trace: inference tenants arriving and leaving over simulated hours, seeded so
//! every policy (and every run) sees the same pods at the same times.
//!
//! Six tenant classes, each a pod of one GPU device, written as advise's demand reads a Pod
//! (`gpu-share advise`'s demand format, docs/advise.md): four MIG-isolated model sizes (three
//! sized by memory, so each GPU model gets the smallest instance holding them, and one naming
//! `nvidia.com/mig-2g.20gb`, which only the H100 and A100 offer), MPS clients capped at 10 GiB
//! and time-sliced pods. Arrivals are Poisson with a daily swing (±50% around the mean, by
//! thinning), durations exponential; a steady-state population is there at time 0.

use std::collections::BTreeMap;

use gpu_share::advise::{Phase, PodDemand};

/// A small seeded generator (SplitMix64): the trace must be the same on every run and machine,
/// and nothing else in the bench needs randomness, so no crate is pulled in for it.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so `ln` is finite.
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Exponentially distributed with this mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
}

/// What a tenant's pod asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// A model that fits 1g on an H100 (9 GiB): 1g.10gb on H100/A100, 1g.18gb on H200.
    Mig1g,
    /// `nvidia.com/mig-2g.20gb` by name (H100 and A100 80GB only).
    Mig2g,
    /// 39 GiB: 3g.40gb on H100/A100, 3g.71gb on H200.
    Mig3g,
    /// 79 GiB: 7g.80gb on H100/A100, 7g.141gb on H200.
    Mig7g,
    /// An MPS client with a 10 GiB memory cap.
    Mps,
    /// A time-sliced pod.
    Shared,
}

impl Class {
    pub const ALL: [Class; 6] = [
        Class::Mig1g,
        Class::Mig2g,
        Class::Mig3g,
        Class::Mig7g,
        Class::Mps,
        Class::Shared,
    ];

    /// Share of arrivals, in percent.
    fn weight(self) -> u32 {
        match self {
            Class::Mig1g => 30,
            Class::Mig2g | Class::Mig3g | Class::Mps | Class::Shared => 15,
            Class::Mig7g => 10,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Class::Mig1g => "mig-1g",
            Class::Mig2g => "mig-2g",
            Class::Mig3g => "mig-3g",
            Class::Mig7g => "mig-7g",
            Class::Mps => "mps",
            Class::Shared => "shared",
        }
    }

    /// The pod's requests and annotations, as advise's demand reads them.
    fn request(self) -> (&'static str, Vec<(&'static str, &'static str)>) {
        let mig = |gib| {
            vec![
                ("gpu-share.dev/isolation", "mig"),
                ("gpu-share.dev/memory-gib", gib),
            ]
        };
        match self {
            Class::Mig1g => ("nvidia.com/gpu", mig("9")),
            Class::Mig2g => ("nvidia.com/mig-2g.20gb", vec![]),
            Class::Mig3g => ("nvidia.com/gpu", mig("39")),
            Class::Mig7g => ("nvidia.com/gpu", mig("79")),
            Class::Mps => (
                "nvidia.com/gpu",
                vec![
                    ("gpu-share.dev/isolation", "mps"),
                    ("gpu-share.dev/memory-gib", "10"),
                ],
            ),
            Class::Shared => (
                "nvidia.com/gpu",
                vec![("gpu-share.dev/isolation", "shared")],
            ),
        }
    }

    /// The pod as advise's demand, pending or running on `node`.
    pub fn demand(self, name: String, node: Option<&str>) -> PodDemand {
        let (resource, annotations) = self.request();
        PodDemand {
            namespace: "trace".into(),
            name,
            phase: if node.is_some() {
                Phase::Running
            } else {
                Phase::Pending
            },
            node: node.map(str::to_string),
            requests: BTreeMap::from([(resource.to_string(), 1)]),
            annotations: annotations
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            devices: Vec::new(),
        }
    }

    fn pick(rng: &mut SplitMix64) -> Class {
        let total: u32 = Class::ALL.iter().map(|c| c.weight()).sum();
        let mut at = (rng.next_u64() % u64::from(total)) as u32;
        for class in Class::ALL {
            if at < class.weight() {
                return class;
            }
            at -= class.weight();
        }
        unreachable!("weights sum to total")
    }
}

/// One tenant pod: alive from `arrive` (inclusive) to `depart` (exclusive), in rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePod {
    pub class: Class,
    pub arrive: u32,
    pub depart: u32,
}

/// The knobs of a trace.
#[derive(Debug, Clone)]
pub struct TraceSpec {
    pub nodes: usize,
    pub hours: f64,
    pub round_minutes: f64,
    pub seed: u64,
    /// Mean share of the fleet's compute slices the alive pods' lower bound asks for.
    pub load: f64,
    /// Mean pod lifetime.
    pub mean_hours: f64,
}

impl TraceSpec {
    pub fn rounds(&self) -> u32 {
        (self.hours * 60.0 / self.round_minutes).round() as u32
    }
}

/// Mean compute slices one arrival needs at least (`run::lower_bound_slices` of its class),
/// weighted by the arrival mix.
fn mean_slices(slices_of: &dyn Fn(Class) -> f64) -> f64 {
    let total: u32 = Class::ALL.iter().map(|c| c.weight()).sum();
    Class::ALL
        .iter()
        .map(|&c| slices_of(c) * f64::from(c.weight()))
        .sum::<f64>()
        / f64::from(total)
}

/// The trace for a fleet of `spec.nodes` nodes × 8 GPUs of 7 compute slices. `slices_of` is
/// the lower bound's slices per class, so `load` means the same for every fleet.
pub fn generate(spec: &TraceSpec, slices_of: &dyn Fn(Class) -> f64) -> Vec<TracePod> {
    let mut rng = SplitMix64::new(spec.seed ^ (spec.nodes as u64).wrapping_mul(0x1000_0001));
    let fleet_slices = spec.nodes as f64 * 8.0 * 7.0;
    let alive_mean = spec.load * fleet_slices / mean_slices(slices_of);
    let per_hour = alive_mean / spec.mean_hours; // Little's law
    let round_h = spec.round_minutes / 60.0;
    let to_round = |h: f64| (h / round_h).ceil() as u32;
    let mut pods = Vec::new();
    let mut add = |rng: &mut SplitMix64, at_h: f64| {
        let class = Class::pick(rng);
        let arrive = to_round(at_h);
        let depart = to_round(at_h + rng.exponential(spec.mean_hours)).max(arrive + 1);
        pods.push(TracePod {
            class,
            arrive,
            depart,
        });
    };
    for _ in 0..alive_mean.round() as usize {
        add(&mut rng, 0.0);
    }
    let peak = per_hour * 1.5;
    let mut t = 0.0;
    loop {
        t += rng.exponential(1.0 / peak);
        if t >= spec.hours {
            break;
        }
        let rate = per_hour * (1.0 + 0.5 * (2.0 * std::f64::consts::PI * t / 24.0).sin());
        if rng.unit() <= rate / peak {
            add(&mut rng, t);
        }
    }
    pods
}
