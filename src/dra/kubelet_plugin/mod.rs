//! The kubelet DRA plugin (`--plugin dra`): registers driver `gpu.gpu-share.dev` with the
//! kubelet and prepares the ResourceClaims the scheduler allocated from the node's published
//! devices, writing a CDI spec per claim (docs/dra.md, "The kubelet plugin").
//!
//! - [`registration`]: the `Registration` service on
//!   `<registration dir>/gpu.gpu-share.dev-reg.sock`; `GetInfo` names the DRA socket.
//! - [`service`]: the `DRAPlugin` v1 service on `<plugin dir>/dra.sock`:
//!   `NodePrepareResources` reads each claim, maps its devices to the published ones and
//!   writes the CDI spec ([`cdi`]); `NodeUnprepareResources` removes it; both checkpointed
//!   ([`checkpoint`]) and answered per claim.
//! - [`health`]: the `DRAResourceHealth` v1alpha1 service on the same socket: every published
//!   device's health (critical XIDs) streamed to the kubelet.
//! - [`claim`], [`devices`]: the ResourceClaim's allocation, and what each device needs (the
//!   built-in plugin's `Allocate` answer for the same device).

pub mod api;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod devices;
pub mod dynamic_mig;
pub mod health;
pub mod mig_journal;
pub mod registration;
pub mod service;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{watch, Mutex};

use crate::builtin_plugin::{DeviceListing, Inventory};
use crate::dra::api::ResourceSlice;
use crate::dra::DRIVER;
use crate::gpu::xid::Faults;
use crate::kubelet::serving::Serving;
use api::dra::dra_plugin_server::DraPluginServer;
use api::health::dra_resource_health_server::DraResourceHealthServer;
use api::registration::registration_server::RegistrationServer;
use health::HealthService;
use registration::RegistrationService;
use service::{DraService, Preparer};

/// The kubelet's plugin-registration directory, watched by its plugin manager.
pub const DEFAULT_REGISTRATION_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// This driver's directory: the DRA socket and the checkpoint.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/gpu.gpu-share.dev";
/// Where container runtimes read CDI specs (the CDI default for dynamic specs).
pub const DEFAULT_CDI_ROOT: &str = "/var/run/cdi";
/// The DRA socket's name in the plugin directory.
pub const DRA_SOCKET: &str = "dra.sock";

/// The registration socket's name: `<driver>-reg.sock`, the kubelet plugin convention.
pub fn registration_socket_name() -> String {
    format!("{DRIVER}-reg.sock")
}

/// The kubelet's word that it did not register the plugin, as it said it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the kubelet did not register the DRA plugin: {0}")]
pub struct NotRegistered(pub String);

/// Where the plugin lives on the node.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node_name: String,
    pub registration_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub cdi_root: PathBuf,
}

/// What the plugin prepares from: the published slices and the applied devices.
pub struct Inputs {
    pub slices: watch::Receiver<Arc<Vec<ResourceSlice>>>,
    pub inventory: watch::Receiver<Arc<Inventory>>,
    /// `--device-list-strategy` and `--cdi-kind`, as for the built-in plugin: with `cdi-cri`
    /// each device's answer also names `<kind>=<uuid>` (the NVIDIA CDI spec's device, with the
    /// device nodes); without `envvar` the claim's spec sets no `NVIDIA_VISIBLE_DEVICES`.
    pub listing: DeviceListing,
    /// Devices that raised a critical XID, streamed as Unhealthy to the kubelet.
    pub faults: Faults,
    /// NVML and the journal, for dynamic-MIG devices (the journal is shared with the
    /// reconcile, which publishes from it).
    pub dynamic_mig: dynamic_mig::DynamicMig,
}

/// Asks the agent's reconcile to run now, and so to republish the pool: the kubelet
/// (re)registered the plugin (a restarted kubelet deleted the node's slices first: a pod waited
/// 3 min 54 s for the next resync on a real 1.36 node), or a Prepare met a MIG instance made
/// out of band on a dynamic GPU (the devices it overlaps are withdrawn by the reconcile, which
/// would otherwise find it only at its next resync while the scheduler keeps allocating them),
/// or a device was faulted or healed (its taint goes on or off at once: `dra::taints`).
#[derive(Debug, Clone)]
pub struct RepublishRequests(Arc<watch::Sender<u64>>);

impl Default for RepublishRequests {
    fn default() -> Self {
        RepublishRequests(Arc::new(watch::channel(0).0))
    }
}

impl RepublishRequests {
    pub fn request(&self) {
        self.0.send_modify(|n| *n += 1);
    }

    /// A receiver that changes on each request.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

/// The running plugin: both sockets.
pub struct KubeletPlugin {
    dra: Serving,
    registration: Serving,
    registration_service: RegistrationService,
    republish: RepublishRequests,
}

/// Why the kubelet DRA plugin could not start; each variant says its cause in its message.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Recover(#[from] service::RecoverError),
    #[error("cannot serve {}: {cause}", socket.display())]
    Serve {
        socket: std::path::PathBuf,
        cause: std::io::Error,
    },
}

/// Each newly faulted or healed device asks for a republish, so its taint is written now and
/// not at the next resync.
fn republish_on_faults(faults: &crate::gpu::xid::Faults, republish: RepublishRequests) {
    let mut changed = faults.subscribe();
    tokio::spawn(async move {
        while changed.changed().await.is_ok() {
            republish.request();
        }
    });
}

impl KubeletPlugin {
    /// Recover from the checkpoint (see [`Preparer::recover`]), serve the DRA socket, then the
    /// registration socket (the kubelet dials the DRA socket as soon as it reads `GetInfo`).
    pub fn start(
        settings: &Settings,
        client: kube::Client,
        inputs: Inputs,
    ) -> Result<KubeletPlugin, StartError> {
        let dra_socket = settings.plugin_dir.join(DRA_SOCKET);
        let republish = inputs.dynamic_mig.republish.clone();
        republish_on_faults(&inputs.faults, republish.clone());
        let health = HealthService {
            slices: inputs.slices.clone(),
            faults: inputs.faults,
        };
        let preparer = Preparer {
            client,
            node_name: settings.node_name.clone(),
            cdi_root: settings.cdi_root.clone(),
            checkpoint_path: settings.plugin_dir.join(checkpoint::FILE),
            slices: inputs.slices,
            inventory: inputs.inventory,
            listing: Arc::new(inputs.listing),
            checkpoint: Mutex::default(),
            dynamic_mig: inputs.dynamic_mig,
        }
        .recover()?;
        let cannot_serve = |socket: &std::path::Path, cause: std::io::Error| StartError::Serve {
            socket: socket.to_path_buf(),
            cause,
        };
        for dir in [&settings.plugin_dir, &settings.registration_dir] {
            std::fs::create_dir_all(dir).map_err(|e| cannot_serve(dir, e))?;
        }
        let dra = Serving::start(&dra_socket, "DRA plugin endpoint", |_| {
            tonic::transport::Server::builder()
                .add_service(DraPluginServer::new(DraService(Arc::new(preparer))))
                .add_service(DraResourceHealthServer::new(health.clone()))
        })
        .map_err(|e| cannot_serve(&dra_socket, e))?;
        let registration_service =
            RegistrationService::new(DRIVER, &dra_socket.display().to_string(), republish.clone());
        let reg_socket = settings.registration_dir.join(registration_socket_name());
        let registration = match Serving::start_for_plugin_watcher(
            &reg_socket,
            "DRA registration endpoint",
            |_| {
                tonic::transport::Server::builder()
                    .add_service(RegistrationServer::new(registration_service.clone()))
            },
        ) {
            Ok(serving) => serving,
            Err(e) => {
                let _ = std::fs::remove_file(&dra_socket);
                return Err(cannot_serve(&reg_socket, e));
            }
        };
        Ok(KubeletPlugin {
            dra,
            registration,
            registration_service,
            republish,
        })
    }

    /// Changes on each [`RepublishRequests`] request: each registration the kubelet confirms,
    /// each Prepare that met an out-of-band instance.
    pub fn republish_requests(&self) -> watch::Receiver<u64> {
        self.republish.subscribe()
    }

    /// Whether the kubelet said it registered the plugin (`None`: it has not said yet).
    pub fn registered(&self) -> Option<Result<(), NotRegistered>> {
        self.registration_service.last_status().map(|s| {
            if s.plugin_registered {
                Ok(())
            } else {
                Err(NotRegistered(s.error))
            }
        })
    }

    /// Stop both endpoints and remove their sockets; the registration socket goes first, so the
    /// kubelet deregisters the driver. CDI specs and the checkpoint stay: prepared claims'
    /// containers keep running, and the next start answers for them.
    pub async fn shutdown(self) {
        self.registration.stop().await;
        self.dra.stop().await;
    }
}
