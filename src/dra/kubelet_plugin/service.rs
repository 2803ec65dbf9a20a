//! The `DRAPlugin` service: `NodePrepareResources` and `NodeUnprepareResources`, one answer
//! per claim (the API's per-claim `error` field), idempotent and checkpointed
//! ([`super::checkpoint`]). Claims are handled one at a time: the kubelet sends few, and one
//! lock over the checkpoint keeps its file and the CDI specs in step.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{watch, Mutex};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::api::dra::dra_plugin_server::DraPlugin;
use super::api::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use super::checkpoint::{Checkpoint, CheckpointError, ClaimEntry, ClaimState, PreparedDevice};
use super::dynamic_mig::{self, ClaimName, DynamicMig};
use super::{cdi, claim, devices};
use crate::builtin_plugin::api::ContainerAllocateResponse;
use crate::builtin_plugin::{DeviceListing, Inventory};
use crate::dra::api::ResourceSlice;
use crate::dra::consumable;
use crate::dra::dynamic::DynamicDevice;
use crate::dra::DRIVER;

/// What preparing needs: the API, this node, where specs and the checkpoint go, and the
/// devices the agent publishes and has applied.
pub struct Preparer {
    pub client: kube::Client,
    pub node_name: String,
    pub cdi_root: PathBuf,
    pub checkpoint_path: PathBuf,
    /// The latest published slices: a claim's device must be among them.
    pub slices: watch::Receiver<Arc<Vec<ResourceSlice>>>,
    /// The applied devices as the built-in plugin would advertise them: what each needs.
    pub inventory: watch::Receiver<Arc<Inventory>>,
    /// How devices are named to the runtime beside the claim's own CDI device.
    pub listing: Arc<DeviceListing>,
    pub checkpoint: Mutex<Checkpoint>,
    /// Makes and destroys the instances of dynamic-MIG devices.
    pub dynamic_mig: DynamicMig,
}

impl Preparer {
    /// Load the checkpoint and clean up after an earlier run: claims still `preparing` are
    /// forgotten and their specs removed (the kubelet got no answer and will ask again), and any
    /// spec of this plugin without a prepared claim is removed.
    pub fn recover(mut self) -> Result<Self, RecoverError> {
        let mut checkpoint = Checkpoint::load(&self.checkpoint_path)?;
        checkpoint.claims.retain(|uid, entry| {
            let keep = entry.state == ClaimState::Prepared;
            if !keep {
                info!(claim = %uid, "a prepare was interrupted; its CDI spec is removed");
            }
            keep
        });
        self.remove_stale_specs(&checkpoint)?;
        checkpoint.save(&self.checkpoint_path)?;
        dynamic_mig::recover(&self.dynamic_mig, |uid| checkpoint.prepared(uid).is_some())
            .map_err(RecoverError::DynamicMig)?;
        self.checkpoint = Mutex::new(checkpoint);
        Ok(self)
    }

    fn remove_stale_specs(&self, checkpoint: &Checkpoint) -> Result<(), RecoverError> {
        let entries = match std::fs::read_dir(&self.cdi_root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(cause) => {
                return Err(RecoverError::ListSpecs {
                    dir: self.cdi_root.clone(),
                    cause,
                })
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(uid) = name.to_str().and_then(cdi::claim_of_spec_file) else {
                continue;
            };
            if checkpoint.prepared(uid).is_none() {
                info!(claim = %uid, "removing a CDI spec no prepared claim owns");
                remove_file(&entry.path())?;
            }
        }
        Ok(())
    }

    /// Prepare one claim, or say why not.
    pub async fn prepare(&self, claim: &Claim) -> NodePrepareResourceResponse {
        let mut checkpoint = self.checkpoint.lock().await;
        let result = match checkpoint.prepared(&claim.uid) {
            Some(devices) => Ok(devices.to_vec()),
            None => self.prepare_new(claim, &mut checkpoint).await,
        };
        match result {
            Ok(devices) => NodePrepareResourceResponse {
                devices: devices.iter().map(Device::from).collect(),
                error: String::new(),
            },
            Err(error) => {
                warn!(claim = %format!("{}/{}", claim.namespace, claim.name), %error,
                      "cannot prepare the claim");
                NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error: error.to_string(),
                }
            }
        }
    }

    async fn prepare_new(
        &self,
        claim: &Claim,
        checkpoint: &mut Checkpoint,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let object = claim::fetch(&self.client, &claim.namespace, &claim.name, &claim.uid).await?;
        let allocated = claim::allocated_devices(&object, DRIVER, &self.node_name)?;
        let (answer, spec) = match self.answer(claim, &allocated, checkpoint) {
            Ok(answered) => answered,
            Err(e) => return Err(self.undo_dynamic(claim, e)),
        };
        let path = cdi::spec_path(&self.cdi_root, &claim.uid);
        let mut entry = ClaimEntry {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: ClaimState::Preparing,
            devices: Vec::new(),
        };
        checkpoint.claims.insert(claim.uid.clone(), entry.clone());
        checkpoint.save(&self.checkpoint_path)?;
        let written = match &spec {
            Some(spec) => {
                let text = serde_json::to_string_pretty(spec).expect("plain data serializes");
                crate::atomic_file::replace_if_changed(
                    &path,
                    text.as_bytes(),
                    crate::atomic_file::READABLE_BY_ALL,
                )
                .map(|_| ())
                .map_err(|source| PrepareError::WriteSpec {
                    path: path.clone(),
                    source,
                })
            }
            None => remove_file(&path).map_err(PrepareError::from),
        };
        entry.state = ClaimState::Prepared;
        entry.devices = answer.clone();
        checkpoint.claims.insert(claim.uid.clone(), entry);
        let saved = written.and_then(|()| Ok(checkpoint.save(&self.checkpoint_path)?));
        if let Err(e) = saved {
            // Not prepared after all: no spec, no entry, so the kubelet's retry starts afresh
            // (a file still saying `preparing` is cleaned up at the next start).
            checkpoint.claims.remove(&claim.uid);
            let _ = remove_file(&path);
            let _ = checkpoint.save(&self.checkpoint_path);
            return Err(self.undo_dynamic(claim, e));
        }
        info!(claim = %format!("{}/{}", claim.namespace, claim.name), devices = answer.len(),
              "prepared the claim");
        Ok(answer)
    }

    /// A prepare that failed after making some of the claim's dynamic devices destroys them:
    /// nothing is left for a claim that was not prepared. `error` with what undoing said.
    fn undo_dynamic(&self, claim: &Claim, error: PrepareError) -> PrepareError {
        match self.dynamic_mig.unprepare(&claim_name(claim).as_ref()) {
            Ok(()) => error,
            Err(undo) => PrepareError::UndoFailed {
                error: Box::new(error),
                undo,
            },
        }
    }

    /// What a container given a dynamic device gets, making it first: the device's UUID, as
    /// for any MIG device or GPU, rewritten for the listing strategies.
    fn dynamic_edits(
        &self,
        claim: &Claim,
        name: &str,
        device: &DynamicDevice,
    ) -> Result<ContainerAllocateResponse, DeviceProblem> {
        let uuid = self
            .dynamic_mig
            .prepare(&claim_name(claim).as_ref(), name, device)?;
        let mut allocation = ContainerAllocateResponse::default();
        allocation
            .envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), uuid.clone());
        self.listing.apply(&[uuid], "", &mut allocation);
        allocation.annotations.clear();
        Ok(allocation)
    }

    /// The answer and the CDI spec for `allocated` (none when no device has edits), each
    /// device checked against the latest published slices, and each share of a consumable
    /// device against what it was given and what the claims prepared before hold
    /// (`checkpoint`). Every problem is named, not only the first.
    fn answer(
        &self,
        claim: &Claim,
        allocated: &[claim::AllocatedDevice],
        checkpoint: &Checkpoint,
    ) -> Result<(Vec<PreparedDevice>, Option<cdi::Spec>), PrepareError> {
        let slices = self.slices.borrow().clone();
        let inventory = self.inventory.borrow().clone();
        let mut problems = Vec::new();
        let mut answer: Vec<PreparedDevice> = Vec::new();
        let mut edits = Vec::new();
        for a in allocated {
            let Some(device) = devices::find_published(&slices, &a.pool, &a.device) else {
                problems.push(DeviceProblem::NotPublished {
                    device: a.device.clone(),
                    request: a.request.clone(),
                    node: self.node_name.clone(),
                });
                continue;
            };
            let share = if device.is_consumable() {
                match consumable::share_of(device, &a.consumed_capacity) {
                    Ok(share) => Some(share),
                    Err(e) => {
                        problems.push(e.into());
                        continue;
                    }
                }
            } else {
                None
            };
            let edits_of = match (DynamicDevice::of(device), share) {
                (Some(dynamic), _) => self.dynamic_edits(claim, &a.device, &dynamic),
                (None, Some(share)) => {
                    devices::consumable_edits(device, share, &inventory, &self.listing)
                        .map_err(DeviceProblem::from)
                }
                (None, None) => devices::container_edits(device, &inventory, &self.listing)
                    .map_err(DeviceProblem::from),
            };
            match edits_of {
                Ok(allocation) => {
                    // A device allocated for several requests is prepared once (a share of a
                    // consumable device is its own each time: its own shareID and limits).
                    if let Some(seen) = answer
                        .iter_mut()
                        .find(|d| d.device_name == a.device && d.share_id == a.share_id)
                    {
                        seen.request_names.push(a.request.clone());
                        continue;
                    }
                    // The claim's own CDI device only where it has edits: with `cdi-cri`
                    // and no `envvar`, a device that is not an MPS share has none.
                    let device_edits = cdi::edits(&allocation);
                    let entry = cdi::entry_name(&a.device, a.share_id.as_deref());
                    let mut cdi_device_ids = Vec::new();
                    if !device_edits.is_empty() {
                        cdi_device_ids.push(cdi::device_id(&claim.uid, &entry));
                        edits.push((entry, device_edits));
                    }
                    cdi_device_ids.extend(allocation.cdi_devices.into_iter().map(|d| d.name));
                    answer.push(PreparedDevice {
                        request_names: vec![a.request.clone()],
                        pool_name: a.pool.clone(),
                        device_name: a.device.clone(),
                        cdi_device_ids,
                        share_id: a.share_id.clone(),
                        share,
                    });
                }
                Err(e) => problems.push(e),
            }
        }
        if problems.is_empty() {
            problems.extend(over_committed(&slices, &answer, checkpoint));
        }
        let shown = || format!("{}/{}", claim.namespace, claim.name);
        if !problems.is_empty() {
            return Err(PrepareError::Devices {
                claim: shown(),
                problems: DeviceProblems(problems),
            });
        }
        // A share's limits are its own: merged with another device's, one would be lost.
        if let Some(share) = answer.iter().find(|d| d.share.is_some()) {
            if edits.len() > 1 {
                return Err(PrepareError::Merge {
                    claim: shown(),
                    source: cdi::MergeError::ShareBesideOthers {
                        share: share.device_name.clone(),
                        others: edits.len() - 1,
                    },
                });
            }
        }
        let edits = cdi::merge_claim_edits(edits).map_err(|source| PrepareError::Merge {
            claim: shown(),
            source,
        })?;
        let spec = (!edits.is_empty()).then(|| cdi::spec(&claim.uid, edits));
        Ok((answer, spec))
    }

    /// Unprepare one claim: its spec and checkpoint entry go. A claim never prepared (or
    /// unprepared already) succeeds, as the kubelet may ask again after a restart.
    pub async fn unprepare(&self, claim: &Claim) -> NodeUnprepareResourceResponse {
        let mut checkpoint = self.checkpoint.lock().await;
        if let Err(error) = self.dynamic_mig.unprepare(&claim_name(claim).as_ref()) {
            warn!(claim = %format!("{}/{}", claim.namespace, claim.name), %error,
                  "cannot unprepare the claim yet");
            return NodeUnprepareResourceResponse {
                error: error.to_string(),
            };
        }
        let result =
            remove_file(&cdi::spec_path(&self.cdi_root, &claim.uid)).and_then(|()| {
                if checkpoint.claims.remove(&claim.uid).is_some() {
                    checkpoint.save(&self.checkpoint_path)?;
                    info!(claim = %format!("{}/{}", claim.namespace, claim.name), "unprepared the claim");
                }
                Ok(())
            });
        NodeUnprepareResourceResponse {
            error: result.err().map(|e| e.to_string()).unwrap_or_default(),
        }
    }
}

/// Why the plugin could not clean up after an earlier run at start; each variant says its
/// cause in its message (a cause is said once).
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("dynamic MIG: {0}")]
    DynamicMig(dynamic_mig::DynamicMigError),
    #[error("cannot list {}: {cause}", dir.display())]
    ListSpecs { dir: PathBuf, cause: std::io::Error },
    #[error("cannot remove {}: {cause}", path.display())]
    RemoveSpec {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
}

/// Why a claim was not prepared; the kubelet reads it in the claim's `error`.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Claim(#[from] claim::ClaimError),
    /// Devices of the claim this node cannot give, every one named.
    #[error("ResourceClaim {claim}: {problems}")]
    Devices {
        claim: String,
        problems: DeviceProblems,
    },
    #[error("ResourceClaim {claim}: {source}")]
    Merge {
        claim: String,
        source: cdi::MergeError,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("cannot write the CDI spec {}: {source}", path.display())]
    WriteSpec {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Files(#[from] RecoverError),
    /// The claim failed, and destroying the dynamic devices made for it failed too.
    #[error("{error}; undoing its dynamic MIG devices failed: {undo}")]
    UndoFailed {
        error: Box<PrepareError>,
        undo: dynamic_mig::DynamicMigError,
    },
}

/// The shares of consumable devices in `answer` that, with those the prepared claims of
/// `checkpoint` hold, would give out more of a device than it publishes: the scheduler never
/// allocates so, so such an allocation did not come from it (or the device shrank), and
/// preparing it would hand memory or compute out twice.
fn over_committed(
    slices: &[ResourceSlice],
    answer: &[PreparedDevice],
    checkpoint: &Checkpoint,
) -> Vec<DeviceProblem> {
    let mut problems = Vec::new();
    let mut checked = std::collections::BTreeSet::new();
    for new in answer.iter().filter(|d| d.share.is_some()) {
        if !checked.insert(&new.device_name) {
            continue;
        }
        let Some(device) = devices::find_published(slices, &new.pool_name, &new.device_name) else {
            continue;
        };
        let same =
            |d: &&PreparedDevice| d.device_name == new.device_name && d.pool_name == new.pool_name;
        let held: Vec<consumable::Share> = checkpoint
            .claims
            .values()
            .flat_map(|c| c.devices.iter())
            .chain(answer.iter())
            .filter(same)
            .filter_map(|d| d.share)
            .collect();
        if let Some(why) = consumable::over_capacity(device, &held) {
            problems.push(DeviceProblem::OverCommitted(why));
        }
    }
    problems
}

/// Why one allocated device cannot be given to the claim's containers.
#[derive(Debug, thiserror::Error)]
pub enum DeviceProblem {
    #[error(transparent)]
    Share(#[from] consumable::ShareError),
    /// The shares prepared on a consumable device would exceed it (the sentence says which).
    #[error("{0}")]
    OverCommitted(String),
    #[error("device {device} (request {request:?}) is not among the devices gpu-share publishes on node {node}")]
    NotPublished {
        device: String,
        request: String,
        node: String,
    },
    #[error(transparent)]
    Device(#[from] devices::DeviceError),
    #[error(transparent)]
    DynamicMig(#[from] dynamic_mig::DynamicMigError),
}

/// The problems of one claim, said together (`; `).
#[derive(Debug)]
pub struct DeviceProblems(pub Vec<DeviceProblem>);

impl std::fmt::Display for DeviceProblems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let each: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&each.join("; "))
    }
}

/// A claim's UID and `namespace/name`, for the dynamic-MIG journal and its messages.
struct OwnedClaimName {
    uid: String,
    shown: String,
}

impl OwnedClaimName {
    fn as_ref(&self) -> ClaimName<'_> {
        ClaimName {
            uid: &self.uid,
            shown: &self.shown,
        }
    }
}

fn claim_name(claim: &Claim) -> OwnedClaimName {
    OwnedClaimName {
        uid: claim.uid.clone(),
        shown: format!("{}/{}", claim.namespace, claim.name),
    }
}

/// Remove `path`; already gone is fine.
fn remove_file(path: &std::path::Path) -> Result<(), RecoverError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(cause) => Err(RecoverError::RemoveSpec {
            path: path.to_path_buf(),
            cause,
        }),
    }
}

/// The gRPC face of a [`Preparer`].
pub struct DraService(pub Arc<Preparer>);

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = BTreeMap::new();
        for claim in request.into_inner().claims {
            let answer = self.0.prepare(&claim).await;
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse {
            claims: claims.into_iter().collect(),
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = BTreeMap::new();
        for claim in request.into_inner().claims {
            let answer = self.0.unprepare(&claim).await;
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodeUnprepareResourcesResponse {
            claims: claims.into_iter().collect(),
        }))
    }
}
