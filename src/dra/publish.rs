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
//!
//! An API server with `DRAPartitionableDevices` off (the 1.34 and 1.35 default) accepts
//! counters and silently drops them. Slices with counter sets are written first and each write's
//! answer is checked ([`pool::counters_dropped`]); at the first loss the publisher stops, and
//! from then on (until the agent restarts) publishes [`super::without_counters`]: no counters,
//! dynamic-MIG GPUs whole only, so no overlapping placements are ever offered. Written first,
//! the counter slices leave the aborted generation incomplete: the scheduler allocates nothing
//! from it before the pool without counters replaces it.
//!
//! Consumable devices ([`super::consumable`]) are found dropped the same way
//! (`DRAConsumableCapacity` off, the default before 1.36): their slices are written first, and
//! at the first answer without `allowMultipleAllocations` the publisher stops and from then on
//! publishes [`super::consumable::fixed_shares`]: each such GPU as fixed MPS shares, never a
//! device one claim would get whole while the node shares it. Should the scheduler allocate the
//! stored device in the milliseconds before, the claim's allocation has no `consumedCapacity`
//! and its Prepare is refused (and the device is no longer published).
//!
//! Taints ([`super::taints`]) are found dropped the same way (`DRADeviceTaints` off, the default
//! before 1.36): slices with a tainted device are written right after the counter slices, and
//! at the first answer without its taints the publisher stops and from then on publishes
//! [`super::taints::without_tainted`]: faulted devices withdrawn instead of tainted. Until that
//! next write (milliseconds) a faulted device stands untainted, as every device did before
//! taints existed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use tokio::sync::watch;
use tracing::{info, warn};

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
    /// What the API server was found dropping, by [`Lost`]: from then on the publisher writes
    /// what that server keeps ([`Publisher::as_the_server_keeps`]).
    losses: [Loss; Lost::ALL.len()],
    published: Published,
}

/// One kind of field the server may drop: found (publish without it from then on) and
/// reported (the outcome that says so was returned, once).
#[derive(Default)]
struct Loss {
    found: AtomicBool,
    reported: AtomicBool,
}

/// What one publish did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The API already held these slices: nothing was written.
    Unchanged,
    /// The pool was rewritten at this generation.
    Written { generation: i64 },
    /// The API server was found dropping counters (`DRAPartitionableDevices` off), by this
    /// publish or by a withdrawal since the last one: the pool was rewritten at this generation
    /// without them and without dynamic MIG placements ([`super::without_counters`]), as every
    /// later publish will be. Reported once.
    CountersDropped { generation: i64 },
    /// The API server was found dropping device taints (`DRADeviceTaints` off): the pool was
    /// rewritten (or already stood) at this generation with the faulted devices withdrawn
    /// instead of tainted, as every later publish will be. Reported once.
    TaintsDropped { generation: i64 },
    /// The API server was found dropping consumable capacity (`DRAConsumableCapacity` off):
    /// the pool was rewritten at this generation with each consumable GPU as fixed MPS shares
    /// ([`super::consumable::fixed_shares`]), as every later publish will be. Reported once.
    ConsumableDropped { generation: i64 },
}

/// What one write of the pool did.
enum Wrote {
    Nothing,
    Pool {
        generation: i64,
    },
    /// Stopped at the first slice the server stored without a field it was sent.
    Dropped(Lost),
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
            losses: Default::default(),
            published,
        }
    }

    /// A receiver of what this publisher announces (for the kubelet DRA plugin).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Vec<ResourceSlice>>> {
        self.published.subscribe()
    }

    /// Make the API's pool equal to `desired` ([`super::resource_slices`]; its generation is
    /// replaced by the pool's next one when anything changes).
    /// On a server found dropping a field, `desired` is published as that server keeps it
    /// ([`Publisher::as_the_server_keeps`]).
    pub async fn publish(&self, desired: Vec<ResourceSlice>) -> Result<Outcome, kube::Error> {
        let mut desired = self.as_the_server_keeps(desired);
        loop {
            let existing = self.list().await?;
            let outcome = match self.write(&existing, desired.clone()).await? {
                Wrote::Nothing => {
                    let generation = existing.first().map_or(0, |s| s.spec.pool.generation);
                    self.unreported(generation).unwrap_or(Outcome::Unchanged)
                }
                Wrote::Pool { generation } => self
                    .unreported(generation)
                    .unwrap_or(Outcome::Written { generation }),
                // Once each: the pool as the server keeps it has nothing more of that kind to
                // drop (no counters, no taints, no consumable devices).
                Wrote::Dropped(lost) => {
                    self.found(lost);
                    desired = self.as_the_server_keeps(desired);
                    continue;
                }
            };
            self.announce(desired, outcome, &existing);
            return Ok(outcome);
        }
    }

    /// `slices` as this publisher writes them, for each field the server was found dropping:
    /// consumable GPUs as fixed shares, then no counters, then tainted devices withdrawn.
    fn as_the_server_keeps(&self, mut slices: Vec<ResourceSlice>) -> Vec<ResourceSlice> {
        for lost in Lost::ALL {
            if self.loss(lost).found.load(Ordering::Relaxed) {
                slices = lost.as_the_server_keeps(&slices);
            }
        }
        slices
    }

    fn loss(&self, lost: Lost) -> &Loss {
        &self.losses[lost as usize]
    }

    /// A loss found and not reported yet, as the outcome that reports it (in [`Lost::ALL`]'s
    /// order; another found by the same publish is reported by the next).
    fn unreported(&self, generation: i64) -> Option<Outcome> {
        Lost::ALL
            .into_iter()
            .find(|&lost| {
                let loss = self.loss(lost);
                loss.found.load(Ordering::Relaxed) && !loss.reported.swap(true, Ordering::Relaxed)
            })
            .map(|lost| lost.outcome(generation))
    }

    /// The server was found dropping `lost`: from now on the pool is written as it keeps it.
    fn found(&self, lost: Lost) {
        self.loss(lost).found.store(true, Ordering::Relaxed);
        warn!("{}", lost.warning());
    }

    /// Before a re-partition: republish the pool without the devices `next` (the slices the
    /// new plan publishes) does not hold alike, so the scheduler stops allocating them before
    /// the drain; the devices that stay are published throughout. Returns the withdrawn names.
    pub async fn withdraw(&self, next: &[ResourceSlice]) -> Result<Vec<String>, kube::Error> {
        let next = self.as_the_server_keeps(next.to_vec());
        let existing = self.list().await?;
        let gone = pool::withdrawn(&existing, &next);
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        let remaining = pool::without(&existing, &gone);
        match self.write(&existing, remaining.clone()).await? {
            Wrote::Nothing => self.announce(remaining, Outcome::Unchanged, &existing),
            Wrote::Pool { generation } => {
                self.announce(remaining, Outcome::Written { generation }, &existing)
            }
            // The aborted generation is incomplete, so nothing of the pool is allocatable
            // until the publish after the apply writes it without counters.
            Wrote::Dropped(lost) => self.found(lost),
        }
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
            Outcome::Written { generation }
            | Outcome::CountersDropped { generation }
            | Outcome::TaintsDropped { generation }
            | Outcome::ConsumableDropped { generation } => generation,
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
    ) -> Result<Wrote, kube::Error> {
        let floor = *self.last_generation.lock().expect("not poisoned");
        let Some(update) = pool::pool_update(existing, desired, &self.owner, floor) else {
            return Ok(Wrote::Nothing);
        };
        let carried = self.carry_out(&update).await;
        // Even a write cut short used this generation: the next one goes above it.
        *self.last_generation.lock().expect("not poisoned") = update.generation;
        if let Carried::StoppedAt(lost) = carried? {
            return Ok(Wrote::Dropped(lost));
        }
        info!(
            generation = update.generation,
            created = update.create.len(),
            replaced = update.replace.len(),
            deleted = update.delete.len(),
            "ResourceSlices published"
        );
        Ok(Wrote::Pool {
            generation: update.generation,
        })
    }

    /// Creates and replaces first, slices with counter sets or a consumable device before
    /// those with a tainted device before the others, deletes last (see the module doc); a
    /// slice already gone is not an error. Stops at the first slice the server stored without
    /// a field it was sent ([`Lost`]): the rest is not written.
    async fn carry_out(&self, update: &PoolUpdate) -> Result<Carried, kube::Error> {
        let post = crate::field_manager::post(crate::field_manager::AGENT);
        let turn = |s: &ResourceSlice| {
            if !s.spec.shared_counters.is_empty()
                || s.spec.devices.iter().any(|d| d.is_consumable())
            {
                0
            } else if s.spec.devices.iter().any(|d| !d.taints.is_empty()) {
                1
            } else {
                2
            }
        };
        for pass in 0..3 {
            for slice in update.create.iter().filter(|s| turn(s) == pass) {
                let stored = self.api.create(&post, slice).await?;
                if let Some(lost) = lost_in(slice, &stored) {
                    return Ok(Carried::StoppedAt(lost));
                }
            }
            for slice in update.replace.iter().filter(|s| turn(s) == pass) {
                let name = slice.metadata.name.as_deref().unwrap_or_default();
                let stored = self.api.replace(name, &post, slice).await?;
                if let Some(lost) = lost_in(slice, &stored) {
                    return Ok(Carried::StoppedAt(lost));
                }
            }
        }
        for name in &update.delete {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Carried::All)
    }
}

/// How far a write of the pool got.
enum Carried {
    All,
    StoppedAt(Lost),
}

/// What the server left out of a slice it stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    Consumable,
    Counters,
    Taints,
}

impl Lost {
    /// Every kind, in the order a stored slice is checked for them, the pool is rewritten for
    /// them and their outcomes are reported.
    const ALL: [Lost; 3] = [Lost::Consumable, Lost::Counters, Lost::Taints];

    /// Whether the server stored `sent` as `stored` without this field.
    fn dropped_from(self, sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
        match self {
            Lost::Consumable => pool::consumable_dropped(sent, stored),
            Lost::Counters => pool::counters_dropped(sent, stored),
            Lost::Taints => pool::taints_dropped(sent, stored),
        }
    }

    /// `slices` as a server dropping this field keeps them safe.
    fn as_the_server_keeps(self, slices: &[ResourceSlice]) -> Vec<ResourceSlice> {
        match self {
            Lost::Consumable => super::consumable::fixed_shares(slices),
            Lost::Counters => super::without_counters(slices),
            Lost::Taints => super::taints::without_tainted(slices),
        }
    }

    fn outcome(self, generation: i64) -> Outcome {
        match self {
            Lost::Consumable => Outcome::ConsumableDropped { generation },
            Lost::Counters => Outcome::CountersDropped { generation },
            Lost::Taints => Outcome::TaintsDropped { generation },
        }
    }

    fn warning(self) -> &'static str {
        match self {
            Lost::Consumable => {
                "the API server dropped allowMultipleAllocations (feature gate \
                 DRAConsumableCapacity off): consumable MPS GPUs are published as fixed shares \
                 instead"
            }
            Lost::Counters => {
                "the API server dropped the ResourceSlices' counters (feature gate \
                 DRAPartitionableDevices off): publishing without them, dynamic-MIG GPUs whole \
                 only"
            }
            Lost::Taints => {
                "the API server dropped the devices' taints (feature gate DRADeviceTaints off): \
                 faulted devices are withdrawn from the ResourceSlices instead of tainted"
            }
        }
    }
}

/// The first field (in [`Lost::ALL`]'s order) the server left out of `sent` when it stored it.
fn lost_in(sent: &ResourceSlice, stored: &ResourceSlice) -> Option<Lost> {
    Lost::ALL
        .into_iter()
        .find(|lost| lost.dropped_from(sent, stored))
}
