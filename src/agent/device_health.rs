//! What the agent does when a GPU or MIG device raises a critical XID: the NVML
//! door's watcher ([`crate::gpu::xid`]) records the fault, which the built-in plugin and the
//! DRA plugin read as device health; here each new fault becomes a warning in the log, a
//! `DeviceUnhealthy` Warning Event on the Node (what `kubectl describe node` shows) and the
//! `gpu_share_critical_xids_total` / `gpu_share_unhealthy_devices` metrics.

use std::path::PathBuf;

use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;
use tracing::warn;

use super::events::event_action;
use super::metrics::Metrics;
use crate::gpu::xid::{watch_xids, Fault, Faults};

/// The Event reason of a device faulted by a critical XID.
pub const DEVICE_UNHEALTHY: &str = "DeviceUnhealthy";

/// Start watching for critical XIDs; the returned record is what device health reads.
pub fn start(
    library: Option<PathBuf>,
    recorder: Recorder,
    node_ref: k8s_openapi::api::core::v1::ObjectReference,
    metrics: Metrics,
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
    tokio::spawn(async move {
        while let Some(fault) = rx.recv().await {
            let note = fault.describe();
            warn!(device = fault.device(), xid = fault.xid, "{note}");
            metrics.device_faulted(fault.xid, record.all().len());
            let event = Event {
                type_: EventType::Warning,
                reason: DEVICE_UNHEALTHY.into(),
                action: event_action("HealthCheck", &note),
                note: Some(note),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &node_ref).await {
                warn!(error = %e, "could not publish an event");
            }
        }
    });
    faults
}
