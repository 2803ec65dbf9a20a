//! Publishing the node's pool through the Kubernetes API (`agent --plugin dra`): the writes
//! [`super::pool`] decides, with the kube client, and the node's published devices kept in a
//! watch channel for the kubelet DRA plugin (a claim may only be prepared on a device the
//! latest slices hold).
//!
//! No server-side apply: a replace carries the resourceVersion read just before (a 409 fails
//! the reconcile, which is retried with backoff), creates and deletes are plain. New and
//! changed slices are written before old ones are deleted; until the last write, consumers
//! see slices of two generations and use only the highest, whose pool is incomplete until
//! every slice of `resourceSliceCount` is there (the API's rule for pools).

use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use tokio::sync::watch;
use tracing::info;

use super::api::ResourceSlice;
use super::pool::{self, PoolUpdate};
use super::DRIVER;

/// The latest devices this node publishes, for the kubelet DRA plugin: every slice of the
/// pool as gpu-share computed it, after each publish and each withdrawal.
pub type Published = watch::Sender<Arc<Vec<ResourceSlice>>>;

/// Keeps this node's pool of gpu-share's driver equal to what the agent computed.
pub struct Publisher {
    api: Api<ResourceSlice>,
    node_name: String,
    owner: OwnerReference,
    /// The highest generation this agent wrote: the next is above it even if a list lagged.
    last_generation: Mutex<i64>,
    published: Published,
}

/// What one publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The API already held these slices: nothing was written.
    Unchanged,
    /// The pool was rewritten at this generation.
    Written { generation: i64 },
}

impl Publisher {
    /// A publisher for node `node_name` (uid `node_uid`, the slices' owner), telling
    /// `published` what it publishes.
    pub fn new(
        client: kube::Client,
        node_name: &str,
        node_uid: &str,
        published: Published,
    ) -> Self {
        Publisher {
            api: Api::all(client),
            node_name: node_name.to_string(),
            owner: pool::node_owner(node_name, node_uid),
            last_generation: Mutex::new(0),
            published,
        }
    }

    /// A receiver of what this publisher announces (for the kubelet DRA plugin).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Vec<ResourceSlice>>> {
        self.published.subscribe()
    }

    /// Make the API's pool equal to `desired` ([`super::resource_slices`]; its generation is
    /// replaced by the pool's next one when anything changes).
    pub async fn publish(&self, desired: Vec<ResourceSlice>) -> Result<Outcome, kube::Error> {
        let existing = self.list().await?;
        let outcome = self.write(&existing, desired.clone()).await?;
        self.announce(desired, outcome, &existing);
        Ok(outcome)
    }

    /// Before a re-partition: republish the pool without the devices `next` (the slices the
    /// new plan publishes) does not hold alike, so the scheduler stops allocating them before
    /// the drain; the devices that stay are published throughout. Returns the withdrawn names.
    pub async fn withdraw(&self, next: &[ResourceSlice]) -> Result<Vec<String>, kube::Error> {
        let existing = self.list().await?;
        let gone = pool::withdrawn(&existing, next);
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        let remaining = pool::without(&existing, &gone);
        let outcome = self.write(&existing, remaining.clone()).await?;
        self.announce(remaining, outcome, &existing);
        Ok(gone.into_iter().collect())
    }

    /// Tell the kubelet plugin's side what the pool now holds (`slices` at the generation in
    /// effect); receivers wake only when it differs from what they saw.
    fn announce(
        &self,
        mut slices: Vec<ResourceSlice>,
        outcome: Outcome,
        existing: &[ResourceSlice],
    ) {
        let generation = match outcome {
            Outcome::Written { generation } => generation,
            Outcome::Unchanged => existing.first().map_or(0, |s| s.spec.pool.generation),
        };
        for slice in &mut slices {
            slice.spec.pool.generation = generation;
        }
        self.published.send_if_modified(|current| {
            let changed = **current != slices;
            if changed {
                *current = Arc::new(slices);
            }
            changed
        });
    }

    /// This node's slices of gpu-share's driver, as the API holds them now.
    async fn list(&self) -> Result<Vec<ResourceSlice>, kube::Error> {
        let selector = format!("spec.nodeName={},spec.driver={DRIVER}", self.node_name);
        let list = self
            .api
            .list(&ListParams::default().fields(&selector))
            .await?;
        Ok(list.items)
    }

    async fn write(
        &self,
        existing: &[ResourceSlice],
        desired: Vec<ResourceSlice>,
    ) -> Result<Outcome, kube::Error> {
        let floor = *self.last_generation.lock().expect("not poisoned");
        let Some(update) = pool::pool_update(existing, desired, &self.owner, floor) else {
            return Ok(Outcome::Unchanged);
        };
        self.carry_out(&update).await?;
        *self.last_generation.lock().expect("not poisoned") = update.generation;
        info!(
            generation = update.generation,
            created = update.create.len(),
            replaced = update.replace.len(),
            deleted = update.delete.len(),
            "ResourceSlices published"
        );
        Ok(Outcome::Written {
            generation: update.generation,
        })
    }

    /// Creates and replaces first, deletes last (see the module doc); a slice already gone is
    /// not an error.
    async fn carry_out(&self, update: &PoolUpdate) -> Result<(), kube::Error> {
        let post = crate::field_manager::post(crate::field_manager::AGENT);
        for slice in &update.create {
            self.api.create(&post, slice).await?;
        }
        for slice in &update.replace {
            let name = slice.metadata.name.as_deref().unwrap_or_default();
            self.api.replace(name, &post, slice).await?;
        }
        for name in &update.delete {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
