//! The plugin manager, run inside the agent: one endpoint per advertised resource, registered
//! with the kubelet; re-registered when the kubelet restarts; re-advertised when the agent
//! applies a profile; device health from NVML.
//!
//! Kubelet restarts are seen by polling `kubelet.sock`'s identity: a restarted kubelet recreates
//! it (and clears the directory of plugin sockets), so every endpoint is served again on a
//! fresh socket and registered again, as the NVIDIA plugin does.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use super::cdi::DeviceListing;
use super::inventory::{Inventory, ResourceDevices};
use super::server::{register, Endpoint, KUBELET_SOCKET};
use super::socket_name;
use crate::gpu::xid::Faults;
use crate::gpu::{Gpus, SharedGpus};

/// Where the manager works and how often it looks.
#[derive(Debug, Clone)]
pub struct ManagerSettings {
    /// The kubelet's device-plugins directory.
    pub dir: PathBuf,
    /// The agent's NVML session, for device health.
    pub gpus: SharedGpus,
    /// Devices that raised a critical XID: advertised Unhealthy from the moment they do.
    pub faults: Faults,
    /// How often device health is read from NVML.
    pub health_interval: Duration,
    /// How often `kubelet.sock` is checked for a kubelet restart (and failed registrations
    /// retried).
    pub kubelet_poll: Duration,
    /// How Allocate names the devices: `NVIDIA_VISIBLE_DEVICES` and/or CDI.
    pub device_listing: DeviceListing,
}

/// Handle to the running manager; cheap to clone.
#[derive(Clone)]
pub struct PluginManager {
    settings: Arc<ManagerSettings>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Served>,
    /// The `kubelet.sock` the endpoints were last registered with.
    kubelet: Option<SocketId>,
}

struct Served {
    devices: watch::Sender<Arc<ResourceDevices>>,
    endpoint: Option<Endpoint>,
    registered: bool,
}

impl PluginManager {
    /// Start the kubelet watch and the health loop; nothing is advertised until [`update`].
    ///
    /// [`update`]: PluginManager::update
    pub fn start(settings: ManagerSettings) -> PluginManager {
        let manager = PluginManager {
            settings: Arc::new(settings),
            state: Arc::default(),
        };
        tokio::spawn(manager.clone().watch_kubelet());
        tokio::spawn(manager.clone().watch_health());
        manager
    }

    /// Advertise `inventory`: new lists go out on the open ListAndWatch streams, new resources
    /// get an endpoint and a registration, and resources no longer planned are advertised empty
    /// and closed.
    pub async fn update(&self, inventory: Inventory) {
        let mut state = self.state.lock().await;
        let gone: Vec<String> = state
            .resources
            .keys()
            .filter(|r| !inventory.resources.contains_key(*r))
            .cloned()
            .collect();
        for resource in gone {
            let served = state.resources.remove(&resource).expect("listed above");
            served
                .devices
                .send_replace(Arc::new(ResourceDevices::empty(&resource)));
            // Give open streams a moment to carry the empty list before the socket closes.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Some(endpoint) = served.endpoint {
                endpoint.stop().await;
            }
            info!(resource, "resource no longer advertised");
        }
        let counts = inventory.counts();
        for (resource, devices) in inventory.resources {
            match state.resources.get(&resource) {
                Some(served) => {
                    served.devices.send_replace(Arc::new(devices));
                }
                None => {
                    let (tx, _) = watch::channel(Arc::new(devices));
                    state.resources.insert(
                        resource.clone(),
                        Served {
                            devices: tx,
                            endpoint: None,
                            registered: false,
                        },
                    );
                }
            }
        }
        info!(?counts, "advertising");
        let kubelet = kubelet_inode(&self.settings.dir);
        self.serve_and_register(&mut state, kubelet, false).await;
    }

    /// Stop serving (agent shutdown): every endpoint stops and its socket file is removed, as the
    /// NVIDIA plugin does on SIGTERM. Only the sockets this manager created go; `kubelet.sock`
    /// and other plugins' sockets stay. Nothing is advertised afterwards.
    pub async fn shutdown(&self) {
        let mut state = self.state.lock().await;
        let endpoints: Vec<Endpoint> = std::mem::take(&mut state.resources)
            .into_values()
            .filter_map(|s| s.endpoint)
            .collect();
        let count = endpoints.len();
        futures::future::join_all(endpoints.into_iter().map(Endpoint::stop)).await;
        info!(
            endpoints = count,
            "device-plugin endpoints stopped, sockets removed"
        );
    }

    /// Devices currently advertised per resource (for logs and tests).
    pub async fn counts(&self) -> BTreeMap<String, usize> {
        let state = self.state.lock().await;
        state
            .resources
            .iter()
            .map(|(r, s)| (r.clone(), s.devices.borrow().devices.len()))
            .collect()
    }

    /// Start missing endpoints (all of them when `restart`) and register the unregistered ones.
    async fn serve_and_register(
        &self,
        state: &mut State,
        kubelet: Option<SocketId>,
        restart: bool,
    ) {
        let dir = &self.settings.dir;
        for (resource, served) in &mut state.resources {
            let socket = dir.join(socket_name(resource));
            if restart || !socket.exists() {
                if let Some(old) = served.endpoint.take() {
                    old.stop().await;
                }
                served.registered = false;
            }
            if served.endpoint.is_none() {
                let listing = Arc::new(self.settings.device_listing.clone());
                match Endpoint::start(&socket, served.devices.subscribe(), listing) {
                    Ok(e) => served.endpoint = Some(e),
                    Err(e) => {
                        warn!(resource, socket = %socket.display(), error = %e, "cannot serve the device-plugin endpoint");
                        continue;
                    }
                }
            }
            if served.registered || kubelet.is_none() {
                continue;
            }
            match register(dir, &socket_name(resource), resource).await {
                Ok(()) => {
                    info!(resource, endpoint = %socket_name(resource), "registered with the kubelet");
                    served.registered = true;
                }
                Err(e) => warn!(resource, error = %e, "registration failed; will retry"),
            }
        }
        state.kubelet = kubelet;
    }

    /// Poll `kubelet.sock`: a new file means a restarted kubelet; serve and register again.
    async fn watch_kubelet(self) {
        let mut tick = tokio::time::interval(self.settings.kubelet_poll);
        loop {
            tick.tick().await;
            let now = kubelet_inode(&self.settings.dir);
            let mut state = self.state.lock().await;
            let restarted = now.is_some() && now != state.kubelet;
            if restarted && !state.resources.is_empty() {
                info!("kubelet.sock was recreated (kubelet restart): registering again");
            }
            let pending = state.resources.values().any(|s| !s.registered);
            if restarted || (pending && now.is_some()) {
                self.serve_and_register(&mut state, now, restarted).await;
            } else {
                state.kubelet = now;
            }
        }
    }

    /// Mark devices NVML no longer lists, that raised a critical XID, or whose MPS daemon is
    /// down, Unhealthy, and back when they return (an XID's mark stays). Runs every health
    /// interval, and at once when a device is newly faulted.
    async fn watch_health(self) {
        let mut tick = tokio::time::interval(self.settings.health_interval);
        let mut faulted = self.settings.faults.subscribe();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                Ok(()) = faulted.changed() => {}
            }
            let (gpus, faults) = (self.settings.gpus.clone(), self.settings.faults.clone());
            let present = tokio::task::spawn_blocking(move || {
                let node = gpus.with(Gpus::observe)?;
                Ok::<_, crate::gpu::GpuError>(faults.healthy_devices(&node))
            })
            .await;
            let present = match present {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    warn!(error = %e, "cannot read device health from NVML");
                    continue;
                }
                Err(_) => continue,
            };
            let state = self.state.lock().await;
            // MPS devices are only usable while their control daemon runs (NVIDIA's plugin
            // waits for it before registering); the agent's reconcile restarts a dead one.
            let pipes: Vec<PathBuf> = state
                .resources
                .values()
                .flat_map(|s| {
                    let devices = s.devices.borrow();
                    let dirs: Vec<PathBuf> = devices
                        .mps_pipe_dirs()
                        .into_iter()
                        .map(PathBuf::from)
                        .collect();
                    dirs
                })
                .collect();
            let live: BTreeSet<&std::path::Path> = pipes
                .iter()
                .filter(|p| crate::mps::daemon::is_running(p))
                .map(PathBuf::as_path)
                .collect();
            for (resource, served) in &state.resources {
                let changed = served.devices.send_if_modified(|devices| {
                    let mut next = (**devices).clone();
                    let changed = next.set_health(&present, &live);
                    if changed {
                        *devices = Arc::new(next);
                    }
                    changed
                });
                if changed {
                    let unhealthy = served
                        .devices
                        .borrow()
                        .devices
                        .iter()
                        .filter(|d| !d.healthy)
                        .count();
                    warn!(resource, unhealthy, "device health changed");
                }
            }
        }
    }
}

/// A file's identity: its inode and change time (an inode number alone may be reused at once
/// by a socket deleted and created again).
type SocketId = (u64, i64, i64);

fn kubelet_inode(dir: &std::path::Path) -> Option<SocketId> {
    std::fs::metadata(dir.join(KUBELET_SOCKET))
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}
