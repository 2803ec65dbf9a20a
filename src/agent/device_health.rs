//! What the agent does when a GPU or MIG device raises a critical XID: the NVML
//! door's watcher ([`crate::gpu::xid`]) records the fault, which the built-in plugin and the
//! DRA plugin read as device health (and the DRA publisher as a taint); here each new fault
//! becomes a warning in the log, a `DeviceUnhealthy` Warning Event on the Node (what `kubectl
//! describe node` shows) and the `gpu_share_critical_xids_total` / `gpu_share_unhealthy_devices`
//! metrics.
//!
//! Healing (`--xid-heal-after`): a faulted device that raised no critical XID for the window
//! and that NVML still lists is healthy again, with a `DeviceHealed` Normal Event. A GPU that
//! fell off the bus (XID 79) is not listed, so it never heals this way; one that keeps failing
//! raises new XIDs, each of which starts the window again. Why a window and not NVIDIA's "until
//! restart": a transient fault (one ECC page retired, a driver timeout) should not take a GPU
//! away for good, and the window is long enough to see a fault repeat (docs/dra.md).

use std::path::PathBuf;
use std::time::Duration;

use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::events::event_action;
use super::metrics::Metrics;
use crate::gpu::xid::{watch_xids, Fault, Faults};
use crate::gpu::{Gpus, SharedGpus};

/// The Event reason of a device faulted by a critical XID.
pub const DEVICE_UNHEALTHY: &str = "DeviceUnhealthy";
/// The Event reason of a faulted device healthy again.
pub const DEVICE_HEALED: &str = "DeviceHealed";

/// Where the Events go and what they count in.
#[derive(Clone)]
pub struct Reporting {
    pub recorder: Recorder,
    pub node_ref: k8s_openapi::api::core::v1::ObjectReference,
    pub metrics: Metrics,
}

impl Reporting {
    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            action: event_action("HealthCheck", &note),
            note: Some(note),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &self.node_ref).await {
            warn!(error = %e, "could not publish an event");
        }
    }
}

/// Start watching for critical XIDs; the returned record is what device health reads. With a
/// non-zero `heal_after`, faults heal as the module doc says.
pub fn start(
    library: Option<PathBuf>,
    gpus: SharedGpus,
    heal_after: Duration,
    reporting: Reporting,
) -> Faults {
    let faults = Faults::default();
    let (tx, mut rx) = mpsc::unbounded_channel::<Fault>();
    if let Err(e) = watch_xids(library, faults.clone(), move |f| {
        let _ = tx.send(f);
    }) {
        warn!(error = %e, "cannot start the XID health watch");
        return faults;
    }
    let record = faults.clone();
    let report = reporting.clone();
    tokio::spawn(async move {
        while let Some(fault) = rx.recv().await {
            let note = fault.describe();
            warn!(device = fault.device(), xid = fault.xid, "{note}");
            report.metrics.device_faulted(fault.xid, record.all().len());
            report
                .event(EventType::Warning, DEVICE_UNHEALTHY, note)
                .await;
        }
    });
    if !heal_after.is_zero() {
        tokio::spawn(heal(faults.clone(), gpus, heal_after, reporting));
    }
    faults
}

/// Every quarter of the window (between 1 s and 30 s): heal the faults quiet for `window`
/// whose devices NVML still lists.
async fn heal(faults: Faults, gpus: SharedGpus, window: Duration, reporting: Reporting) {
    let tick = (window / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    loop {
        tokio::time::sleep(tick).await;
        let quiet = faults.quiet_for(window);
        if quiet.is_empty() {
            continue;
        }
        let gpus = gpus.clone();
        let listed = tokio::task::spawn_blocking(move || gpus.with(Gpus::observe)).await;
        let node = match listed {
            Ok(Ok(node)) => node,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the GPUs to heal quiet faults; trying again");
                continue;
            }
            Err(e) => {
                warn!(error = %e, "the GPU read for healing did not finish");
                continue;
            }
        };
        let listed: Vec<String> = quiet
            .into_iter()
            .filter(|device| node.lists(device))
            .collect();
        for fault in faults.heal(&listed, window) {
            let note = format!(
                "{} raised no critical XID for {} (last: XID {}) and NVML answers for it: it is \
                 healthy again and offered to new pods",
                fault.device(),
                crate::duration::show(window),
                fault.xid
            );
            info!(device = fault.device(), xid = fault.xid, "{note}");
            reporting.metrics.devices_healed(faults.all().len());
            reporting
                .event(EventType::Normal, DEVICE_HEALED, note)
                .await;
        }
    }
}
