//! Device health from XID errors: an NVML event set watches every GPU for critical XIDs, and a
//! device that raises one is unhealthy. NVIDIA's device plugin keeps it so until it restarts
//! (`internal/rm/health.go` in NVIDIA/k8s-device-plugin v0.17+), so a transient fault takes a
//! GPU away for good; here a fault can also heal: [`Faults::heal`] forgets the devices that
//! raised no critical XID for a window and that NVML still answers for (the agent's
//! `--xid-heal-after`; see `agent::device_health`).
//!
//! An XID on a MIG device (the event carries its GPU-instance and compute-instance ids) faults
//! that MIG device only; one on the whole GPU faults the GPU and every MIG device on it.
//! Application XIDs (the program's fault, not the device's) are logged and ignored: the list
//! is NVIDIA's plugin's.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::{Device, Nvml};
use tokio::sync::watch;
use tracing::{info, warn};

use super::raw::{mig_device_ids, wait_event, RawEvent};
use super::{GpuError, NvmlGpus, ObservedNode};

/// XIDs caused by the application rather than the device, which NVIDIA's plugin does not count
/// against a device's health: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU
/// stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
/// timeout (k8s-device-plugin `applicationErrorXids`; meanings from NVIDIA's XID catalog).
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// How long one wait for an event lasts (NVIDIA's plugin waits 5 s).
const WAIT_MS: u32 = 5000;
/// Before trying again after NVML failed under the watcher.
const RETRY: Duration = Duration::from_secs(30);

/// Whether an XID makes a device unhealthy.
pub fn is_critical(xid: u64) -> bool {
    !APPLICATION_XIDS.contains(&xid)
}

/// One device's critical XID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The physical GPU (`GPU-…`).
    pub gpu_uuid: String,
    /// The MIG device the XID is attributed to (`MIG-…`); `None`: the whole GPU.
    pub mig_uuid: Option<String>,
    pub xid: u64,
}

impl Fault {
    /// The faulted device: the MIG device, or the GPU.
    pub fn device(&self) -> &str {
        self.mig_uuid.as_deref().unwrap_or(&self.gpu_uuid)
    }

    /// For Events and logs: which device, which XID, and what follows.
    pub fn describe(&self) -> String {
        let scope = match &self.mig_uuid {
            Some(mig) => format!("MIG device {mig} (on {})", self.gpu_uuid),
            None => format!("GPU {} (and any MIG device on it)", self.gpu_uuid),
        };
        format!(
            "{scope} raised critical XID {}; it is reported unhealthy to the kubelet (under \
             --plugin dra also tainted), so no new pod gets it, until it raises no critical XID \
             for the agent's --xid-heal-after while NVML still answers for it, or the agent \
             restarts (check `nvidia-smi -q` and the kernel log; a GPU reset is often needed)",
            self.xid
        )
    }
}

/// The devices faulted now: since the agent started, less those healed. Cheap to clone; clones
/// share the record and its change signal.
#[derive(Debug, Clone)]
pub struct Faults {
    by_device: Arc<Mutex<BTreeMap<String, Record>>>,
    changed: watch::Sender<usize>,
}

/// One faulted device: its first fault, when that came, and when the last critical XID came.
#[derive(Debug, Clone)]
struct Record {
    fault: Fault,
    since: SystemTime,
    last: Instant,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            by_device: Arc::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl Faults {
    /// Record `fault`; true if its device was not faulted before. A repeated fault keeps the
    /// first one's XID and time but starts the quiet window again.
    pub fn record(&self, fault: Fault) -> bool {
        let mut by_device = self.lock();
        let now = Instant::now();
        let new = match by_device.get_mut(fault.device()) {
            Some(record) => {
                record.last = now;
                false
            }
            None => {
                let device = fault.device().to_string();
                let since = SystemTime::now();
                let last = now;
                by_device.insert(device, Record { fault, since, last });
                true
            }
        };
        let count = by_device.len();
        drop(by_device);
        if new {
            self.changed.send_replace(count);
        }
        new
    }

    /// Every fault with the time its device was first faulted.
    pub fn all_since(&self) -> Vec<(Fault, SystemTime)> {
        self.lock()
            .values()
            .map(|r| (r.fault.clone(), r.since))
            .collect()
    }

    /// The faulted devices (`Fault::device`) whose last critical XID is at least `quiet` ago.
    pub fn quiet_for(&self, quiet: Duration) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, r)| r.last.elapsed() >= quiet)
            .map(|(device, _)| device.clone())
            .collect()
    }

    /// Forget the faults of `devices` that are still quiet for `quiet` (a new XID since
    /// [`Faults::quiet_for`] keeps a device faulted); returns the healed faults.
    pub fn heal(&self, devices: &[String], quiet: Duration) -> Vec<Fault> {
        let mut by_device = self.lock();
        let mut healed = Vec::new();
        for device in devices {
            if by_device
                .get(device)
                .is_some_and(|r| r.last.elapsed() >= quiet)
            {
                healed.extend(by_device.remove(device).map(|r| r.fault));
            }
        }
        let count = by_device.len();
        drop(by_device);
        if !healed.is_empty() {
            self.changed.send_replace(count);
        }
        healed
    }

    /// Every fault, by device.
    pub fn all(&self) -> Vec<Fault> {
        self.lock().values().map(|r| r.fault.clone()).collect()
    }

    /// Wakes whenever a device is newly faulted or healed (the value: how many are faulted).
    pub fn subscribe(&self) -> watch::Receiver<usize> {
        self.changed.subscribe()
    }

    /// The UUIDs of `node`'s devices that are healthy: present and not faulted, a MIG device
    /// not on a faulted GPU.
    pub fn healthy_devices(&self, node: &ObservedNode) -> std::collections::BTreeSet<String> {
        let faulted = self.lock();
        let mut healthy = std::collections::BTreeSet::new();
        for gpu in &node.gpus {
            let Some(uuid) = &gpu.uuid else { continue };
            if faulted.contains_key(uuid) {
                continue;
            }
            healthy.insert(uuid.clone());
            let migs = gpu.compute_instances.iter().filter_map(|c| c.uuid.as_ref());
            healthy.extend(migs.filter(|m| !faulted.contains_key(*m)).cloned());
        }
        healthy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Record>> {
        self.by_device.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Watch every GPU for critical XIDs on a thread of its own (NVML's wait blocks), with its own
/// NVML session so the agent's other NVML calls never wait behind it. Each newly faulted device
/// is recorded in `faults` and passed to `on_fault`. When NVML fails the watch starts again
/// after 30 s; when no GPU supports XID events it ends, saying so.
pub fn watch_xids(
    library: Option<PathBuf>,
    faults: Faults,
    on_fault: impl Fn(Fault) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("xid-watch".into())
        .spawn(move || loop {
            match watch_session(library.as_deref(), &faults, &on_fault) {
                Ok(()) => return,
                Err(e) => warn!(error = %e, "XID health watch failed; trying again in 30s"),
            }
            std::thread::sleep(RETRY);
        })
}

/// One NVML session of the watch; returns Ok only when there is nothing to watch.
fn watch_session(
    library: Option<&std::path::Path>,
    faults: &Faults,
    on_fault: &impl Fn(Fault),
) -> Result<(), GpuError> {
    let gpus = NvmlGpus::open(library)?;
    let nvml = &gpus.nvml;
    let wrap = |what: &'static str| {
        move |cause| GpuError::Wrapper {
            index: 0,
            what,
            cause,
        }
    };
    let count = nvml.device_count().map_err(wrap("count GPUs"))?;
    let mut set = nvml
        .create_event_set()
        .map_err(wrap("create an event set"))?;
    let mut watched = 0;
    for index in 0..count {
        let device = gpus.device(index)?;
        let supported = device
            .supported_event_types()
            .unwrap_or(EventTypes::empty());
        if !supported.contains(EventTypes::CRITICAL_XID_ERROR) {
            continue;
        }
        set = device
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| GpuError::Wrapper {
                index,
                what: "register for XID events",
                cause: e.error,
            })?;
        watched += 1;
    }
    if watched == 0 {
        info!("no GPU reports XID events: device health follows NVML's device list only");
        return Ok(());
    }
    info!(gpus = watched, "watching for critical XID errors");
    loop {
        let event =
            wait_event(nvml, &set, WAIT_MS).map_err(|cause| GpuError::Call { index: 0, cause })?;
        if let Some(fault) = event.and_then(|e| fault_of(nvml, e)) {
            if faults.record(fault.clone()) {
                on_fault(fault);
            }
        }
    }
}

/// The fault an event means, if it is a critical XID on a device NVML can name.
fn fault_of(nvml: &Nvml, event: RawEvent) -> Option<Fault> {
    if event.event_type & EventTypes::CRITICAL_XID_ERROR.bits() == 0 {
        return None;
    }
    // SAFETY: the handle NVML put in the event, for the session that delivered it.
    let gpu = unsafe { Device::new(event.device, nvml) };
    let gpu_uuid = gpu.uuid().ok()?;
    if !is_critical(event.data) {
        info!(gpu = %gpu_uuid, xid = event.data, "application XID (the program's fault, not the device's): ignored");
        return None;
    }
    let mig_uuid = match (event.gpu_instance, event.compute_instance) {
        (Some(gi), Some(ci)) => mig_uuid(nvml, &gpu, (gi, ci)),
        _ => None,
    };
    Some(Fault {
        gpu_uuid,
        mig_uuid,
        xid: event.data,
    })
}

/// The UUID of the MIG device with these ids on `gpu`.
fn mig_uuid(nvml: &Nvml, gpu: &Device<'_>, ids: (u32, u32)) -> Option<String> {
    let max = gpu.mig_device_count().ok()?;
    (0..max).find_map(|i| {
        let mig = gpu.mig_device_by_index(i).ok()?;
        // SAFETY: a live MIG device handle of this session, only passed back to NVML.
        let handle = unsafe { mig.handle() };
        (mig_device_ids(nvml, handle).ok()? == ids).then(|| mig.uuid().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ObservedGpu;

    fn fault(gpu: &str, mig: Option<&str>) -> Fault {
        Fault {
            gpu_uuid: gpu.into(),
            mig_uuid: mig.map(str::to_string),
            xid: 79,
        }
    }

    #[test]
    fn a_fault_heals_only_after_its_quiet_window_and_a_repeat_restarts_the_window() {
        let faults = Faults::default();
        let mut changes = faults.subscribe();
        assert!(faults.record(fault("GPU-a", None)));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        let window = Duration::from_millis(200);
        assert!(faults.quiet_for(window).is_empty(), "just faulted");
        assert!(faults.heal(&["GPU-a".into()], window).is_empty());
        std::thread::sleep(window);
        assert_eq!(faults.quiet_for(window), ["GPU-a"]);
        // A repeat before the heal: the window starts again, the first fault's time stays.
        let first = faults.all_since()[0].1;
        assert!(!faults.record(Fault {
            xid: 48,
            ..fault("GPU-a", None)
        }));
        assert!(
            faults.heal(&["GPU-a".into()], window).is_empty(),
            "faulted again"
        );
        assert_eq!(faults.all_since()[0], (fault("GPU-a", None), first));
        assert!(
            !changes.has_changed().unwrap(),
            "a repeat changes nothing published"
        );
        std::thread::sleep(window);
        assert_eq!(
            faults.heal(&["GPU-a".into()], window),
            [fault("GPU-a", None)]
        );
        assert!(faults.all().is_empty());
        assert!(
            changes.has_changed().unwrap(),
            "a heal wakes the publishers"
        );
        // Faulted again later: a new fault, with a new time.
        assert!(faults.record(fault("GPU-a", None)));
        assert!(faults.all_since()[0].1 > first);
    }

    #[test]
    fn application_xids_are_not_critical() {
        assert!(is_critical(79), "fallen off the bus");
        assert!(is_critical(48), "double-bit ECC");
        for xid in APPLICATION_XIDS {
            assert!(!is_critical(xid), "{xid}");
        }
    }

    #[test]
    fn a_gpu_fault_takes_its_mig_devices_and_a_mig_fault_only_itself() {
        let mut node = ObservedNode::simulated(&["h100".into(), "h100".into()]);
        let with_migs = |g: &mut ObservedGpu, migs: &[&str]| {
            for (i, m) in migs.iter().enumerate() {
                g.compute_instances
                    .push(crate::gpu::ObservedComputeInstance {
                        gi_id: i as u32,
                        ci_id: 0,
                        profile_id: 0,
                        uuid: Some(m.to_string()),
                    });
            }
        };
        node.gpus[0].uuid = Some("GPU-0".into());
        node.gpus[1].uuid = Some("GPU-1".into());
        with_migs(&mut node.gpus[0], &["MIG-a", "MIG-b"]);
        with_migs(&mut node.gpus[1], &["MIG-c", "MIG-d"]);
        let faults = Faults::default();
        let mut changes = faults.subscribe();
        assert!(faults.record(fault("GPU-0", None)));
        assert!(faults.record(fault("GPU-1", Some("MIG-c"))));
        assert!(
            !faults.record(fault("GPU-1", Some("MIG-c"))),
            "already faulted"
        );
        assert!(changes.has_changed().unwrap());
        assert_eq!(*changes.borrow_and_update(), 2);
        let healthy: Vec<String> = faults.healthy_devices(&node).into_iter().collect();
        assert_eq!(healthy, ["GPU-1", "MIG-d"]);
    }
}
