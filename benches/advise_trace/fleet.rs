//! The simulated fleet every policy runs on: each node's GPUs as NVML would show them, the
//! profile it runs, the devices that profile advertises, and which pod holds which device.
//!
//! One placement model for all policies (the comparison is only fair that way):
//! - [`Fleet::apply`] changes a node's profile the way the agent does: `plan_for` on the node as
//!   it is (so MIG instances the new layout can keep stay where they are), the plan's
//!   `geometry.destroy` counted as instances destroyed, and the pods the agent's drain evicts:
//!   those on destroyed MIG instances and on GPUs whose MIG mode changes (a change between
//!   whole-GPU modes evicts nobody: [`carry_holders`]).
//! - [`Fleet::schedule`] places pending pods on free devices the way a bin-packing scheduler
//!   would (the same rule advise's `keep_running` matches running pods with): a MIG pod takes a
//!   free instance of its named profile, or the free instance with the least memory that holds
//!   its memory need; time-sliced and MPS pods join the fullest GPU of their mode with a free
//!   replica; pods are taken largest first.

use gpu_share::advise::{HeldDevice, Need, PodDemand};
use gpu_share::gpu::{MigMode, ObservedNode};
use gpu_share::mig::{catalog, ExistingInstance};
use gpu_share::plan::plan_for;
use gpu_share::profile::Profile;
use gpu_share::sharing::{PlannedMode, PluginKind};

/// GPUs per node.
pub const GPUS_PER_NODE: u32 = 8;

/// How a GPU's whole-GPU devices are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whole {
    Exclusive,
    TimeSliced,
    Mps,
}

/// A device pods can hold, with the pods holding it (at most `replicas`).
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// A MIG instance (`profile`, placement start), or none for the whole GPU.
    pub instance: Option<(String, u32)>,
    /// The instance's memory (the GPU's for the whole GPU).
    pub memory_mib: u64,
    pub replicas: u32,
    pub holders: Vec<usize>,
}

/// One GPU: its devices as the current profile shares it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimGpu {
    /// `Some` for a whole GPU, none under MIG.
    pub whole: Option<Whole>,
    pub devices: Vec<Device>,
}

impl SimGpu {
    pub fn in_use(&self) -> bool {
        self.devices.iter().any(|d| !d.holders.is_empty())
    }
}

/// One node.
#[derive(Debug, Clone)]
pub struct SimNode {
    pub name: String,
    /// `h100`, `h200` or `a100-80gb` (a `--gpu` spec without the count).
    pub model: &'static str,
    pub observed: ObservedNode,
    /// The profile it runs now (its label value and the profile).
    pub profile: Option<(String, Profile)>,
    pub gpus: Vec<SimGpu>,
}

/// Where a running pod is: node, GPU, device.
pub type Place = (usize, usize, usize);

/// What a profile change did to a node.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Applied {
    pub instances_destroyed: usize,
    pub evicted: Vec<usize>,
}

/// The fleet, and where each pod of the trace runs.
pub struct Fleet {
    pub nodes: Vec<SimNode>,
    /// By trace pod index: where it runs, none when it does not.
    pub placed: Vec<Option<Place>>,
}

/// The models of a mixed fleet, node `n` gets `MODELS[n % 3]`.
pub const MODELS: [&str; 3] = ["h100", "h200", "a100-80gb"];

impl Fleet {
    /// `nodes` fresh nodes of 8 GPUs (MIG off, no profile), models in turn, for `pods` pods.
    pub fn new(nodes: usize, pods: usize) -> Self {
        let nodes = (0..nodes)
            .map(|n| {
                let model = MODELS[n % MODELS.len()];
                let observed = ObservedNode::simulated(&[format!("{model}x{GPUS_PER_NODE}")]);
                let gpus = observed
                    .gpus
                    .iter()
                    .map(|g| SimGpu {
                        whole: Some(Whole::Exclusive),
                        devices: vec![whole_device(g.memory_mib.unwrap_or(0), 1)],
                    })
                    .collect();
                SimNode {
                    name: format!("node-{n}"),
                    model,
                    observed,
                    profile: None,
                    gpus,
                }
            })
            .collect();
        Fleet {
            nodes,
            placed: vec![None; pods],
        }
    }

    /// Change node `n` to `profile` (named `name`); a profile equal to the current one changes
    /// nothing. Panics if the profile does not plan on the node: every policy's profiles must.
    pub fn apply(&mut self, n: usize, name: &str, profile: &Profile) -> Applied {
        let node = &self.nodes[n];
        if node.profile.as_ref().is_some_and(|(_, p)| p == profile) {
            return Applied::default();
        }
        let plan = plan_for(name, profile, &node.observed, PluginKind::Nvidia).unwrap_or_else(
            |problems| panic!("{name} does not plan on {}: {problems:?}", node.name),
        );
        let mut applied = Applied::default();
        let node = &mut self.nodes[n];
        for (g, gpu_plan) in plan.gpus.iter().enumerate() {
            let observed = &mut node.observed.gpus[g];
            let memory = observed.memory_mib.unwrap_or(0);
            let destroyed = gpu_plan
                .geometry
                .as_ref()
                .map_or(0, |geo| geo.destroy.len());
            applied.instances_destroyed += destroyed;
            let new = match &gpu_plan.mode {
                PlannedMode::Mig { replicas, .. } => {
                    let target = gpu_plan
                        .geometry
                        .as_ref()
                        .expect("MIG plans have a geometry")
                        .target();
                    observed.mig = Some(MigMode {
                        current: true,
                        pending: true,
                    });
                    observed.instances = target
                        .iter()
                        .map(|t| ExistingInstance {
                            profile: t.profile.clone(),
                            placement: t.placement,
                            gi_id: None,
                        })
                        .collect();
                    let model = catalog()
                        .model_by_product(&observed.product)
                        .expect("MIG models are in the catalog");
                    SimGpu {
                        whole: None,
                        devices: target
                            .iter()
                            .map(|t| Device {
                                instance: Some((t.profile.clone(), t.placement.start)),
                                memory_mib: model
                                    .profile(&t.profile)
                                    .and_then(|p| p.memory_mib)
                                    .unwrap_or(0),
                                replicas: *replicas as u32,
                                holders: Vec::new(),
                            })
                            .collect(),
                    }
                }
                mode => {
                    if observed.mig.is_some() {
                        observed.mig = Some(MigMode::default());
                        observed.instances.clear();
                    }
                    let (whole, replicas) = match mode {
                        PlannedMode::TimeSlicing { replicas } => (Whole::TimeSliced, *replicas),
                        PlannedMode::Mps { replicas, .. } => (Whole::Mps, *replicas),
                        _ => (Whole::Exclusive, 1),
                    };
                    SimGpu {
                        whole: Some(whole),
                        devices: vec![whole_device(memory, replicas as u32)],
                    }
                }
            };
            let old = std::mem::replace(&mut node.gpus[g], new);
            applied
                .evicted
                .extend(carry_holders(old, &mut node.gpus[g]));
        }
        node.profile = Some((name.to_string(), profile.clone()));
        for &pod in &applied.evicted {
            self.placed[pod] = None;
        }
        // Holders that stayed may sit on a device at a new position in the list.
        for (g, gpu) in self.nodes[n].gpus.iter().enumerate() {
            for (d, device) in gpu.devices.iter().enumerate() {
                for &pod in &device.holders {
                    self.placed[pod] = Some((n, g, d));
                }
            }
        }
        applied
    }

    /// Place `pending` pods (trace index, need) on free devices, largest first; the ones placed.
    pub fn schedule(&mut self, pending: &[(usize, Need)]) -> Vec<usize> {
        let mut order: Vec<&(usize, Need)> = pending.iter().collect();
        order.sort_by_key(|(i, need)| (size_rank(need), *i));
        let mut free = self.free_devices();
        let mut placed = Vec::new();
        for (pod, need) in order {
            let Some(k) = best_device(&free, need) else {
                continue;
            };
            let (n, g, d) = free[k].place;
            let device = &mut self.nodes[n].gpus[g].devices[d];
            device.holders.push(*pod);
            free[k].taken += 1;
            self.placed[*pod] = Some((n, g, d));
            placed.push(*pod);
        }
        placed
    }

    /// A pod leaves: its device is free again.
    pub fn remove(&mut self, pod: usize) {
        if let Some((n, g, d)) = self.placed[pod].take() {
            self.nodes[n].gpus[g].devices[d]
                .holders
                .retain(|&p| p != pod);
        }
    }

    /// The device pod `pod` holds, as advise's demand names it (`gpu-share status` shows the
    /// same: the GPU's index and the MIG instance's placement start); none when it does not run.
    pub fn held_devices(&self, pod: usize) -> Vec<HeldDevice> {
        let Some((n, g, d)) = self.placed[pod] else {
            return Vec::new();
        };
        let instance = self.nodes[n].gpus[g].devices[d].instance.as_ref();
        vec![HeldDevice {
            gpu: self.nodes[n].observed.gpus[g].index,
            mig_placement_start: instance.map(|(_, start)| *start),
            mig_profile: instance.map(|(profile, _)| profile.clone()),
        }]
    }

    /// GPUs holding at least one pod.
    pub fn gpus_used(&self) -> usize {
        self.nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| g.in_use())
            .count()
    }

    /// Every device with a free replica, with what a pod needs to know to choose it.
    fn free_devices(&self) -> Vec<FreeDevice> {
        let mut free = Vec::new();
        for (n, node) in self.nodes.iter().enumerate() {
            for (g, gpu) in node.gpus.iter().enumerate() {
                for (d, device) in gpu.devices.iter().enumerate() {
                    if device.holders.len() < device.replicas as usize {
                        free.push(FreeDevice {
                            place: (n, g, d),
                            whole: gpu.whole,
                            profile: device.instance.as_ref().map(|(p, _)| p.clone()),
                            memory_mib: device.memory_mib,
                            replicas: device.replicas,
                            taken: device.holders.len() as u32,
                        });
                    }
                }
            }
        }
        free
    }
}

fn whole_device(memory_mib: u64, replicas: u32) -> Device {
    Device {
        instance: None,
        memory_mib,
        replicas,
        holders: Vec::new(),
    }
}

/// Move the pods of `old` onto the devices of `new` that are still theirs; the others are
/// evicted. As the agent drains (src/agent/drain.rs: "drain only what a MIG change disturbs"):
/// a pod on a MIG instance the layout keeps stays, one on a destroyed instance goes; turning
/// MIG on or off evicts the GPU's pods; a change between whole-GPU modes (exclusive,
/// time-slicing, MPS, their replicas) evicts nobody, so a GPU can hold more pods than its new
/// replicas until some leave.
fn carry_holders(old: SimGpu, new: &mut SimGpu) -> Vec<usize> {
    let mut evicted = Vec::new();
    for device in old.devices {
        let same = new
            .devices
            .iter_mut()
            .find(|d| d.instance == device.instance);
        match same {
            Some(d) => d.holders.extend(device.holders),
            None => evicted.extend(device.holders),
        }
    }
    evicted
}

/// A device with room, during one scheduling pass.
struct FreeDevice {
    place: Place,
    whole: Option<Whole>,
    profile: Option<String>,
    memory_mib: u64,
    replicas: u32,
    taken: u32,
}

/// The free device a pod takes: see the module doc.
fn best_device(free: &[FreeDevice], need: &Need) -> Option<usize> {
    let open = |f: &&FreeDevice| f.taken < f.replicas;
    let candidates = free.iter().enumerate().filter(|(_, f)| open(f));
    match need {
        Need::Mig {
            profile: Some(p), ..
        } => candidates
            .filter(|(_, f)| f.profile.as_deref() == Some(p))
            .map(|(k, _)| k)
            .next(),
        Need::Mig { memory_mib, .. } => candidates
            .filter(|(_, f)| f.profile.is_some() && f.memory_mib >= memory_mib.unwrap_or(0))
            .min_by_key(|(k, f)| (f.memory_mib, *k))
            .map(|(k, _)| k),
        Need::Shared { .. } => fullest(candidates, Whole::TimeSliced),
        Need::Mps { .. } => fullest(candidates, Whole::Mps),
        Need::Whole { .. } => candidates
            .filter(|(_, f)| f.whole == Some(Whole::Exclusive))
            .map(|(k, _)| k)
            .next(),
    }
}

/// The GPU of this mode with the most pods and a free replica (bin packing), first on a tie.
fn fullest<'a>(
    candidates: impl Iterator<Item = (usize, &'a FreeDevice)>,
    whole: Whole,
) -> Option<usize> {
    candidates
        .filter(|(_, f)| f.whole == Some(whole))
        .min_by_key(|(k, f)| (std::cmp::Reverse(f.taken), *k))
        .map(|(k, _)| k)
}

/// Larger needs first, as advise orders pending pods: MIG by memory, then MPS, then shared.
fn size_rank(need: &Need) -> (u8, std::cmp::Reverse<u64>) {
    use std::cmp::Reverse;
    match need {
        Need::Whole { .. } => (0, Reverse(0)),
        Need::Mig {
            profile,
            memory_mib,
            ..
        } => {
            let named = profile.as_deref().and_then(|p| {
                catalog()
                    .models
                    .iter()
                    .find_map(|m| m.profile(p))
                    .and_then(|p| p.memory_mib)
            });
            (1, Reverse(named.or(*memory_mib).unwrap_or(0)))
        }
        Need::Mps { .. } => (2, Reverse(0)),
        Need::Shared { .. } => (3, Reverse(0)),
    }
}

/// The pod's need as advise classifies it.
pub fn need_of(pod: &PodDemand) -> Need {
    pod.need()
        .expect("trace pods are valid demand")
        .expect("trace pods request a GPU")
}
