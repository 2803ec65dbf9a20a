//! The agent's Prometheus metrics (prometheus-client registry, OpenMetrics text on `/metrics`).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `gpu_share_reconciles_total` | counter | `result`: success, failed, noop |
//! | `gpu_share_reconcile_failures_total` | counter | `reason`: a short PascalCase reason (InvalidProfile, DrainTimeout, ApplyFailed, ApiError, ...) |
//! | `gpu_share_evictions_total` | counter | `outcome`: evicted, blocked |
//! | `gpu_share_reconcile_duration_seconds` | histogram | |
//! | `gpu_share_profile_info` | gauge | `profile`, `hash`: 1 for the applied profile only |
//! | `gpu_share_state` | gauge | `state`: one-hot over pending, draining, applying, success, failed, blocked |
//!
//! Label values are fixed sets or short reasons chosen by the agent (never user input beyond
//! the profile key), so cardinality stays small.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Reconcile results, pre-registered at 0 so rates work from the first scrape.
pub const RESULTS: [&str; 3] = ["success", "failed", "noop"];
/// Eviction outcomes, pre-registered at 0.
pub const EVICTION_OUTCOMES: [&str; 2] = ["evicted", "blocked"];
/// The published states of `gpu-share.dev/profile.state`; `gpu_share_state` is one-hot over them.
pub const STATES: [&str; 6] = [
    "pending", "draining", "applying", "success", "failed", "blocked",
];

/// Histogram buckets from 10 ms (a no-op reconcile) to 30 min (a long drain), in seconds.
const DURATION_BUCKETS: [f64; 15] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProfileLabels {
    profile: String,
    hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabels {
    xid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

struct Inner {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    failures: Family<ReasonLabels, Counter>,
    evictions: Family<OutcomeLabels, Counter>,
    duration: Histogram,
    profile: Family<ProfileLabels, Gauge>,
    /// The label set `profile` holds now; also serializes `set_profile` calls.
    current_profile: Mutex<Option<ProfileLabels>>,
    state: Family<StateLabels, Gauge>,
    /// The state that is 1 now; also serializes `set_state` calls.
    current_state: Mutex<Option<String>>,
    critical_xids: Family<XidLabels, Counter>,
    unhealthy_devices: Gauge,
}

/// The agent's metrics. Cheap to clone; all clones share one registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let reconciles = Family::<ResultLabels, Counter>::default();
        let failures = Family::<ReasonLabels, Counter>::default();
        let evictions = Family::<OutcomeLabels, Counter>::default();
        let duration = Histogram::new(DURATION_BUCKETS);
        let profile = Family::<ProfileLabels, Gauge>::default();
        let state = Family::<StateLabels, Gauge>::default();
        let critical_xids = Family::<XidLabels, Counter>::default();
        let unhealthy_devices = Gauge::default();

        // Counter names without `_total`: prometheus-client appends it.
        registry.register(
            "gpu_share_reconciles",
            "Reconciles of the node's GPUs with its profile, by result",
            reconciles.clone(),
        );
        registry.register(
            "gpu_share_reconcile_failures",
            "Failed reconciles, by reason",
            failures.clone(),
        );
        registry.register(
            "gpu_share_evictions",
            "Pod eviction attempts, by outcome (blocked: a PodDisruptionBudget refused it)",
            evictions.clone(),
        );
        registry.register(
            "gpu_share_reconcile_duration_seconds",
            "Time one reconcile took, drains included",
            duration.clone(),
        );
        registry.register(
            "gpu_share_profile_info",
            "The profile applied to this node (1), with its content hash",
            profile.clone(),
        );
        registry.register(
            "gpu_share_state",
            "The node's published profile state (1 for the current one)",
            state.clone(),
        );
        registry.register(
            "gpu_share_critical_xids",
            "Devices that raised a critical XID error, by XID (each device counted once)",
            critical_xids.clone(),
        );
        registry.register(
            "gpu_share_unhealthy_devices",
            "GPUs and MIG devices reported unhealthy after a critical XID, since the agent started",
            unhealthy_devices.clone(),
        );

        for r in RESULTS {
            let _ = reconciles.get_or_create(&ResultLabels { result: r.into() });
        }
        for r in super::outcome::Reason::ALL {
            let _ = failures.get_or_create(&ReasonLabels {
                reason: r.as_str().into(),
            });
        }
        for o in EVICTION_OUTCOMES {
            let _ = evictions.get_or_create(&OutcomeLabels { outcome: o.into() });
        }
        for s in STATES {
            let _ = state.get_or_create(&StateLabels { state: s.into() });
        }

        Metrics {
            inner: Arc::new(Inner {
                registry,
                reconciles,
                failures,
                evictions,
                duration,
                profile,
                current_profile: Mutex::new(None),
                state,
                current_state: Mutex::new(None),
                critical_xids,
                unhealthy_devices,
            }),
        }
    }

    /// One reconcile finished: `result` is `success`, `failed` or `noop`.
    pub fn reconciled(&self, result: &str, duration: Duration) {
        self.inner
            .reconciles
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
        self.inner.duration.observe(duration.as_secs_f64());
    }

    /// A reconcile failed for `reason` (short PascalCase: InvalidProfile, DrainTimeout, ...).
    pub fn failed(&self, reason: &str) {
        self.inner
            .failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// One eviction attempt: `evicted` or `blocked` (a PodDisruptionBudget said 429).
    pub fn eviction(&self, outcome: &str) {
        self.inner
            .evictions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The profile now applied, as `(profile key, content hash)`, or none (no label). The
    /// previous label set is removed, so exactly one series (or none) is 1.
    pub fn set_profile(&self, profile: Option<(&str, &str)>) {
        let mut current = self
            .inner
            .current_profile
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let next = profile.map(|(p, h)| ProfileLabels {
            profile: p.to_string(),
            hash: h.to_string(),
        });
        if *current == next {
            return;
        }
        if let Some(old) = current.take() {
            self.inner.profile.remove(&old);
        }
        if let Some(labels) = &next {
            self.inner.profile.get_or_create(labels).set(1);
        }
        *current = next;
    }

    /// The published state: `state` becomes 1, every other state 0. A state outside
    /// [`STATES`] gets its own series while it is current (removed when it no longer is).
    pub fn set_state(&self, state: &str) {
        let mut current = self
            .inner
            .current_state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // The new one first, then the old one: a scrape in between sees two states rather
        // than none.
        self.inner
            .state
            .get_or_create(&StateLabels {
                state: state.to_string(),
            })
            .set(1);
        if let Some(old) = current.take().filter(|old| old != state) {
            let labels = StateLabels { state: old };
            if STATES.contains(&labels.state.as_str()) {
                self.inner.state.get_or_create(&labels).set(0);
            } else {
                self.inner.state.remove(&labels);
            }
        }
        *current = Some(state.to_string());
    }

    /// A device newly faulted by critical XID `xid`; `unhealthy` devices are faulted now.
    pub fn device_faulted(&self, xid: u64, unhealthy: usize) {
        let labels = XidLabels {
            xid: xid.to_string(),
        };
        self.inner.critical_xids.get_or_create(&labels).inc();
        self.inner.unhealthy_devices.set(unhealthy as i64);
    }

    /// Faulted devices healed: `unhealthy` are left.
    pub fn devices_healed(&self, unhealthy: usize) {
        self.inner.unhealthy_devices.set(unhealthy as i64);
    }

    /// The registry as OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample line `name{labels}` (labels as encoded), if present.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().expect("numeric sample"))
        })
    }

    #[test]
    fn counters_start_at_zero_and_count() {
        let m = Metrics::new();
        let t = m.encode();
        assert!(t.ends_with("# EOF\n"), "{t}");
        assert!(t.contains("# TYPE gpu_share_reconciles counter"), "{t}");
        assert_eq!(
            sample(&t, r#"gpu_share_reconciles_total{result="success"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&t, r#"gpu_share_evictions_total{outcome="blocked"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &t,
                r#"gpu_share_reconcile_failures_total{reason="InvalidProfile"}"#
            ),
            Some(0.0)
        );

        m.reconciled("success", Duration::from_millis(20));
        m.reconciled("success", Duration::from_secs(90));
        m.reconciled("noop", Duration::from_millis(5));
        m.failed("DrainTimeout");
        m.failed("DrainSlotTimeout");
        m.eviction("evicted");
        m.eviction("evicted");
        m.eviction("blocked");
        let t = m.encode();
        assert_eq!(
            sample(&t, r#"gpu_share_reconciles_total{result="success"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&t, r#"gpu_share_reconciles_total{result="noop"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, r#"gpu_share_reconciles_total{result="failed"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(
                &t,
                r#"gpu_share_reconcile_failures_total{reason="DrainTimeout"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &t,
                r#"gpu_share_reconcile_failures_total{reason="DrainSlotTimeout"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, r#"gpu_share_evictions_total{outcome="evicted"}"#),
            Some(2.0)
        );
        assert_eq!(
            sample(&t, r#"gpu_share_evictions_total{outcome="blocked"}"#),
            Some(1.0)
        );
    }

    #[test]
    fn duration_histogram_buckets() {
        let m = Metrics::new();
        m.reconciled("success", Duration::from_millis(20));
        m.reconciled("success", Duration::from_secs(90));
        m.reconciled("failed", Duration::from_secs(3600));
        let t = m.encode();
        assert!(
            t.contains("# TYPE gpu_share_reconcile_duration_seconds histogram"),
            "{t}"
        );
        let bucket = |le: &str| {
            sample(
                &t,
                &format!(r#"gpu_share_reconcile_duration_seconds_bucket{{le="{le}"}}"#),
            )
        };
        assert_eq!(bucket("0.01"), Some(0.0));
        assert_eq!(bucket("0.025"), Some(1.0));
        assert_eq!(bucket("60.0"), Some(1.0));
        assert_eq!(bucket("300.0"), Some(2.0));
        assert_eq!(bucket("1800.0"), Some(2.0));
        assert_eq!(bucket("+Inf"), Some(3.0));
        assert_eq!(
            sample(&t, "gpu_share_reconcile_duration_seconds_count"),
            Some(3.0)
        );
        let sum = sample(&t, "gpu_share_reconcile_duration_seconds_sum").unwrap();
        assert!((sum - 3690.02).abs() < 1e-6, "{sum}");
    }

    #[test]
    fn profile_info_keeps_only_the_current_profile() {
        let m = Metrics::new();
        assert!(!m.encode().contains("gpu_share_profile_info{"));
        m.set_profile(Some(("small", "abc123")));
        let t = m.encode();
        assert!(t.contains("# TYPE gpu_share_profile_info gauge"), "{t}");
        assert_eq!(
            sample(
                &t,
                r#"gpu_share_profile_info{profile="small",hash="abc123"}"#
            ),
            Some(1.0)
        );
        m.set_profile(Some(("small", "def456")));
        m.set_profile(Some(("small", "def456")));
        let t = m.encode();
        assert_eq!(
            sample(
                &t,
                r#"gpu_share_profile_info{profile="small",hash="abc123"}"#
            ),
            None,
            "{t}"
        );
        assert_eq!(
            sample(
                &t,
                r#"gpu_share_profile_info{profile="small",hash="def456"}"#
            ),
            Some(1.0)
        );
        assert_eq!(t.matches("gpu_share_profile_info{").count(), 1, "{t}");
        m.set_profile(None);
        assert!(!m.encode().contains("gpu_share_profile_info{"));
    }

    #[test]
    fn state_is_one_hot() {
        let m = Metrics::new();
        let t = m.encode();
        for s in STATES {
            assert_eq!(
                sample(&t, &format!(r#"gpu_share_state{{state="{s}"}}"#)),
                Some(0.0),
                "{t}"
            );
        }
        for current in ["pending", "draining", "applying", "success", "failed"] {
            m.set_state(current);
            m.set_state(current);
            let t = m.encode();
            for s in STATES {
                let want = if s == current { 1.0 } else { 0.0 };
                assert_eq!(
                    sample(&t, &format!(r#"gpu_share_state{{state="{s}"}}"#)),
                    Some(want),
                    "state {current}: {t}"
                );
            }
        }
    }

    #[test]
    fn unknown_state_is_removed_when_left() {
        let m = Metrics::new();
        m.set_state("resuming");
        let t = m.encode();
        assert_eq!(
            sample(&t, r#"gpu_share_state{state="resuming"}"#),
            Some(1.0)
        );
        m.set_state("success");
        let t = m.encode();
        assert_eq!(sample(&t, r#"gpu_share_state{state="resuming"}"#), None);
        assert_eq!(sample(&t, r#"gpu_share_state{state="success"}"#), Some(1.0));
        assert_eq!(t.matches("gpu_share_state{").count(), STATES.len(), "{t}");
    }

    #[test]
    fn clones_share_the_registry() {
        let m = Metrics::new();
        let c = m.clone();
        c.eviction("evicted");
        assert_eq!(
            sample(
                &m.encode(),
                r#"gpu_share_evictions_total{outcome="evicted"}"#
            ),
            Some(1.0)
        );
    }
}
