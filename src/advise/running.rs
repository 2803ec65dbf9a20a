//! The fleet as the solver starts from it: each GPU's mode and instances now, and running pods
//! matched to the devices their node has now (step 1 of the solver's module doc): to the very
//! devices they name ([`HeldDevice`]), else to any free device of their kind.

use std::collections::BTreeMap;

use super::demand::{HeldDevice, Need, Phase, PodDemand};
use super::state::{add_client, units, GpuState, NodeState, Role, Unit};
use super::supply::NodeNow;
use crate::mig;
use crate::sharing::PlannedMode;

pub(super) fn start_state(now: &NodeNow) -> NodeState {
    let gpus = now
        .observed
        .gpus
        .iter()
        .zip(&now.modes)
        .map(|(gpu, mode)| {
            let model = gpu.mig.and(mig::catalog().model_by_product(&gpu.product));
            let mig_on = gpu.mig.is_some_and(|m| m.current);
            let role = match mode {
                // A dynamic GPU's instances are claims': advice sees them as MIG it must keep.
                PlannedMode::Mig { .. } | PlannedMode::DynamicMig => Role::Mig,
                PlannedMode::TimeSlicing { .. } => Role::TimeSliced,
                PlannedMode::Mps { .. } => Role::Mps,
                PlannedMode::Exclusive => Role::Exclusive,
            };
            let existing = if mig_on && role == Role::Mig {
                gpu.instances.clone()
            } else {
                Vec::new()
            };
            let mut instances = BTreeMap::new();
            for e in &existing {
                *instances.entry(e.profile.clone()).or_insert(0) += 1;
            }
            GpuState {
                index: gpu.index,
                model,
                memory_mib: gpu.memory_mib.or(model.map(|m| m.total_memory_mib)),
                existing,
                current: mode.clone(),
                role,
                instances,
                used: BTreeMap::new(),
                running: BTreeMap::new(),
                pinned: BTreeMap::new(),
                destroyed: 0,
                clients: 0,
                client_memory_mib: 0,
                max_client_mib: 0,
                relayout_memo: Default::default(),
            }
        })
        .collect();
    NodeState {
        name: now.name.clone(),
        gpus,
        pods: Vec::new(),
    }
}

/// Match a running pod to devices its node has now: the `held` ones when it names them, else
/// any free ones of its kind; false (and nothing changed) when they are not there.
pub(super) fn keep_running(node: &mut NodeState, need: &Need, held: &[HeldDevice]) -> bool {
    if !held.is_empty() {
        return keep_on_held(node, need, held);
    }
    let (unit, count) = units(need);
    let mut trial = node.gpus.clone();
    for _ in 0..count {
        let Some(g) = trial.iter().position(|g| holds_now(g, &unit)) else {
            return false;
        };
        let gpu = &mut trial[g];
        match &unit {
            Unit::Mig { .. } => {
                let p = free_instance_now(gpu, &unit).expect("holds_now checked");
                *gpu.used.entry(p.clone()).or_insert(0) += 1;
                *gpu.running.entry(p).or_insert(0) += 1;
            }
            Unit::Shared { memory_mib } | Unit::Mps { memory_mib } => add_client(gpu, *memory_mib),
            Unit::Whole => add_client(gpu, None),
        }
    }
    node.gpus = trial;
    true
}

/// Whether `gpu`, as it is now, has a free device for a running `unit`.
fn holds_now(gpu: &GpuState, unit: &Unit) -> bool {
    match (unit, &gpu.current) {
        (Unit::Mig { .. }, PlannedMode::Mig { .. }) => free_instance_now(gpu, unit).is_some(),
        (Unit::Shared { .. }, PlannedMode::TimeSlicing { replicas }) => {
            u64::from(gpu.clients) < *replicas
        }
        (Unit::Mps { .. }, PlannedMode::Mps { replicas, .. }) => u64::from(gpu.clients) < *replicas,
        (Unit::Whole, PlannedMode::Exclusive) => gpu.role == Role::Exclusive && gpu.clients == 0,
        _ => false,
    }
}

/// A free instance now for a MIG unit: of its profile, or the smallest holding its memory.
fn free_instance_now(gpu: &GpuState, unit: &Unit) -> Option<String> {
    let Unit::Mig {
        profile,
        memory_mib,
    } = unit
    else {
        return None;
    };
    let free = |p: &str| {
        gpu.instances.get(p).copied().unwrap_or(0) > gpu.used.get(p).copied().unwrap_or(0)
    };
    match profile {
        Some(p) => free(p).then(|| p.clone()),
        None => {
            let model = gpu.model?;
            gpu.instances
                .keys()
                .filter(|p| free(p))
                .filter_map(|p| model.profile(p))
                .filter(|p| p.memory_mib.is_some_and(|m| m >= memory_mib.unwrap_or(0)))
                .min_by_key(|p| p.memory_mib)
                .map(|p| p.name.clone())
        }
    }
}

/// Which nodes are still as they started, and which of those started alike. Two such nodes
/// cost the same for any pod, and the solver keeps the first of equal costs, so only the first
/// of each class needs evaluating: placing a pod then looks at the nodes in use plus one node
/// per kind of idle node, not at every node (a fleet of 5,000 alike nodes is one class).
pub(super) struct Pristine {
    /// Per node, its class: nodes whose GPUs started the same share one.
    class: Vec<usize>,
    touched: Vec<bool>,
}

impl Pristine {
    pub(super) fn of(nodes: &[NodeState]) -> Self {
        let mut classes: std::collections::HashMap<String, usize> = Default::default();
        let class = nodes
            .iter()
            .map(|n| {
                // Everything a GPU's cost depends on (memo empty at the start); not the name.
                let next = classes.len();
                *classes.entry(format!("{:?}", n.gpus)).or_insert(next)
            })
            .collect();
        Pristine {
            class,
            touched: vec![false; nodes.len()],
        }
    }

    /// A pod was placed on node `n`: it is no longer like the others of its class.
    pub(super) fn touch(&mut self, n: usize) {
        self.touched[n] = true;
    }

    /// Whether node `n` can be skipped: untouched, and its class was evaluated already in this
    /// placement (`seen`: classes evaluated so far).
    pub(super) fn same_as_seen(&self, n: usize, seen: &mut Vec<bool>) -> bool {
        if self.touched[n] {
            return false;
        }
        let c = self.class[n];
        if seen.len() <= c {
            seen.resize(c + 1, false);
        }
        std::mem::replace(&mut seen[c], true)
    }
}

/// Pin a running pod to the devices it names: each must be on its node now and of its kind (a
/// MIG instance with a free replica, a whole GPU in the pod's mode with room); MIG instances it
/// holds are kept by placement, so only they are protected from destroys (`GpuState::pinned`).
fn keep_on_held(node: &mut NodeState, need: &Need, held: &[HeldDevice]) -> bool {
    let (unit, count) = units(need);
    if held.len() != count as usize {
        return false;
    }
    let mut trial = node.gpus.clone();
    for device in held {
        let Some(gpu) = trial.iter_mut().find(|g| g.index == device.gpu) else {
            return false;
        };
        let kept = match (&unit, device.mig_placement_start) {
            (Unit::Mig { .. }, Some(start)) => pin_instance(gpu, &unit, start),
            (Unit::Mig { .. }, None) | (_, Some(_)) => false,
            _ if holds_now(gpu, &unit) => {
                match &unit {
                    Unit::Shared { memory_mib } | Unit::Mps { memory_mib } => {
                        add_client(gpu, *memory_mib)
                    }
                    _ => add_client(gpu, None),
                }
                true
            }
            _ => false,
        };
        if !kept {
            return false;
        }
    }
    node.gpus = trial;
    true
}

/// Hold the instance at `start` of a MIG GPU for one more pod: the first holder takes it (it
/// counts as used), later ones share it while the GPU's MIG replicas allow. False when the GPU
/// is not MIG now, the instance is not there, or it does not serve `unit`.
fn pin_instance(gpu: &mut GpuState, unit: &Unit, start: u32) -> bool {
    let PlannedMode::Mig { replicas, .. } = &gpu.current else {
        return false;
    };
    if gpu.role != Role::Mig {
        return false;
    }
    let Some(instance) = gpu.existing.iter().find(|e| e.placement.start == start) else {
        return false;
    };
    if !serves(gpu, unit, &instance.profile) {
        return false;
    }
    let profile = instance.profile.clone();
    let holders = gpu.pinned.entry(start).or_insert(0);
    if u64::from(*holders) >= (*replicas).max(1) {
        return false;
    }
    *holders += 1;
    if *holders == 1 {
        *gpu.used.entry(profile).or_insert(0) += 1;
    }
    true
}

/// Whether an instance of `profile` on `gpu` serves a MIG `unit`: its named profile, or memory
/// at least its need.
fn serves(gpu: &GpuState, unit: &Unit, profile: &str) -> bool {
    match unit {
        Unit::Mig {
            profile: Some(p), ..
        } => p == profile,
        Unit::Mig {
            profile: None,
            memory_mib,
        } => gpu
            .model
            .and_then(|m| m.profile(profile))
            .and_then(|p| p.memory_mib)
            .is_some_and(|m| m >= memory_mib.unwrap_or(0)),
        _ => false,
    }
}

/// Every running pod's named device that is not on its node now, or does not fit how the pod
/// asks, as an error naming the pod, the node and the device. Pods on nodes outside the supply
/// are skipped (advise leaves them alone).
pub(super) fn check_held_devices(
    pods: &[PodDemand],
    needs: &[Option<Need>],
    nodes: &[NodeNow],
) -> Vec<String> {
    let mut errors = Vec::new();
    for (pod, need) in pods.iter().zip(needs) {
        if pod.devices.is_empty() {
            continue;
        }
        let at = |m: String| format!("pod {}: {m}", pod.id());
        let (Phase::Running, Some(node_name)) = (pod.phase, pod.node.as_deref()) else {
            errors.push(at("names devices but is not running on a node".into()));
            continue;
        };
        let Some(node) = nodes.iter().find(|n| n.name == node_name) else {
            continue;
        };
        let Some(need) = need else { continue };
        let (unit, count) = units(need);
        if pod.devices.len() != count as usize {
            errors.push(at(format!(
                "names {} device(s) but requests {count}",
                pod.devices.len()
            )));
        }
        for device in &pod.devices {
            if let Err(e) = check_device(node, &unit, device) {
                errors.push(at(format!("device {device} on node {node_name}: {e}")));
            }
        }
    }
    errors
}

/// Why a device a running pod names is not one it can hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum HeldDeviceError {
    #[error("no such GPU (the node has GPUs {0})")]
    NoSuchGpu(String),
    #[error("a MIG pod's device names its instance: migPlacementStart")]
    NoPlacement,
    #[error("the pod asks for a whole GPU, not a MIG instance")]
    NotWhole,
    #[error("no MIG instance there (GPU {gpu} has: {have})")]
    NoInstance { gpu: u32, have: String },
    #[error("the instance there is {found}, not {named}")]
    OtherProfile { found: String, named: String },
}

/// Why `device` is not a device of `node` that a pod asking for `unit` can hold.
fn check_device(node: &NodeNow, unit: &Unit, device: &HeldDevice) -> Result<(), HeldDeviceError> {
    let Some(gpu) = node.observed.gpus.iter().find(|g| g.index == device.gpu) else {
        let indexes: Vec<String> = node
            .observed
            .gpus
            .iter()
            .map(|g| g.index.to_string())
            .collect();
        return Err(HeldDeviceError::NoSuchGpu(indexes.join(", ")));
    };
    let is_mig = matches!(unit, Unit::Mig { .. });
    match (is_mig, device.mig_placement_start) {
        (true, None) => Err(HeldDeviceError::NoPlacement),
        (false, Some(_)) => Err(HeldDeviceError::NotWhole),
        (false, None) => Ok(()),
        (true, Some(start)) => {
            let Some(instance) = gpu.instances.iter().find(|i| i.placement.start == start) else {
                let have: Vec<String> = gpu
                    .instances
                    .iter()
                    .map(|i| format!("{} at {}", i.profile, i.placement.start))
                    .collect();
                return Err(HeldDeviceError::NoInstance {
                    gpu: gpu.index,
                    have: if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    },
                });
            };
            match &device.mig_profile {
                Some(p) if *p != instance.profile => Err(HeldDeviceError::OtherProfile {
                    found: instance.profile.clone(),
                    named: p.clone(),
                }),
                _ => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::advise::{advise, parse, Advice, Demand, Supply};
    use crate::plan::plan_for;
    use crate::sharing::PluginKind;

    /// Two H100s, each cut into seven 1g.10gb instances (placements 0..6) by the current profile.
    const TWO_SMALL: &str = "
nodes:
  - name: n1
    gpus: [h100x2]
    profileName: small
    profile: {version: v1, rules: [{devices: all, mig: {1g.10gb: 7}}]}
";

    /// A pod running on GPU 1's 1g instance at placement 6, named or not, and a pending 7g.80gb
    /// that needs a whole GPU's worth of slices.
    fn demand(device: &str) -> String {
        format!(
            "pods:
  - {{name: run-0, node: n1, phase: running, requests: {{nvidia.com/mig-1g.10gb: 1}}{device}}}
  - {{name: big, phase: pending, requests: {{nvidia.com/mig-7g.80gb: 1}}}}
"
        )
    }

    fn run(demand: &str) -> Result<Advice, Vec<String>> {
        let supply: Supply = parse("supply", TWO_SMALL).unwrap();
        let demand: Demand = parse("demand", demand).unwrap();
        advise(&demand, &supply, PluginKind::Nvidia)
    }

    /// Placement starts of the instances the proposal destroys on GPU `gpu`, planned as the
    /// agent would plan it on the node.
    fn destroyed_on(advice: &Advice, gpu: usize) -> Vec<u32> {
        let supply: Supply = parse("supply", TWO_SMALL).unwrap();
        let now = supply.nodes[0].now(PluginKind::Nvidia).unwrap();
        let node = &advice.nodes[0];
        let plan = plan_for(
            &node.profile_key,
            &node.profile,
            &now.observed,
            PluginKind::Nvidia,
        )
        .expect("the proposal plans");
        plan.gpus[gpu]
            .geometry
            .as_ref()
            .map(|g| g.destroy.iter().map(|d| d.placement.start).collect())
            .unwrap_or_default()
    }

    /// Before: a pod that names no device is matched to GPU 0's first free 1g, so GPU 1 looks
    /// idle and becomes the 7g: the instance the pod really holds (GPU 1, placement 6) is
    /// destroyed while advise reports no eviction (what the advise trace bench found).
    #[test]
    fn a_pod_naming_no_device_is_matched_to_any_and_its_real_instance_can_go() {
        let advice = run(&demand("")).unwrap();
        assert!(
            advice.unschedulable.is_empty(),
            "{:?}",
            advice.unschedulable
        );
        assert_eq!(advice.totals.pods_evicted, 0);
        assert!(destroyed_on(&advice, 1).contains(&6));
        assert!(destroyed_on(&advice, 0).is_empty());
    }

    /// After: the pod names GPU 1's instance at placement 6; it is kept, and the 7g goes on
    /// GPU 0 instead. Same demand served, same destroys, and the running pod stays.
    #[test]
    fn a_pod_naming_its_device_keeps_that_very_instance() {
        let device = ", devices: [{gpu: 1, migPlacementStart: 6, migProfile: 1g.10gb}]";
        let advice = run(&demand(device)).unwrap();
        assert!(
            advice.unschedulable.is_empty(),
            "{:?}",
            advice.unschedulable
        );
        assert_eq!(advice.totals.pods_evicted, 0);
        assert!(
            destroyed_on(&advice, 1).is_empty(),
            "GPU 1 keeps its instances"
        );
        assert_eq!(destroyed_on(&advice, 0).len(), 7, "GPU 0 becomes the 7g");
    }

    /// Only the instance the pod names is protected, not every instance of its profile: with
    /// the pod on GPU 1's 1g at placement 6, a pending 3g.40gb fits on GPU 1 at placement 0 by
    /// destroying the free 1g instances at 0 to 3 (H100: 3g + 3×1g). Before, a running 1g pod
    /// kept every 1g instance of its GPU, and the 3g was unschedulable. The layout is the one
    /// the agent's planner picks (`mig::solve`, ties to the lower placement): with only one 1g
    /// it would keep the 1g at 4, not 6, so free 1g instances are added back until the named
    /// one is kept.
    #[test]
    fn other_instances_of_the_named_profile_may_go() {
        let demand = format!(
            "{}  - {{name: mid, phase: pending, requests: {{nvidia.com/mig-3g.40gb: 1}}}}\n",
            demand(", devices: [{gpu: 1, migPlacementStart: 6}]")
        );
        let advice = run(&demand).unwrap();
        assert!(
            advice.unschedulable.is_empty(),
            "{:?}",
            advice.unschedulable
        );
        assert_eq!(advice.totals.pods_evicted, 0);
        assert_eq!(destroyed_on(&advice, 1), [0, 1, 2, 3]);
    }

    /// A named device the node does not have is refused, naming pod, node and device.
    #[test]
    fn a_device_not_on_the_node_is_an_error_naming_pod_node_and_device() {
        let errors = run(&demand(", devices: [{gpu: 5, migPlacementStart: 6}]")).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(
                "pod default/run-0: device GPU 5 instance at placement 6 on node n1: no such GPU"
            ),
            "{errors:?}"
        );
        let errors = run(&demand(
            ", devices: [{gpu: 1, migPlacementStart: 6, migProfile: 2g.20gb}]",
        ))
        .unwrap_err();
        assert!(
            errors[0].contains("on node n1: the instance there is 1g.10gb, not 2g.20gb"),
            "{errors:?}"
        );
        let errors = run(&demand(
            ", devices: [{gpu: 1, migPlacementStart: 5}, {gpu: 1, migPlacementStart: 6}]",
        ))
        .unwrap_err();
        assert!(
            errors[0].contains("names 2 device(s) but requests 1"),
            "{errors:?}"
        );
        let errors = run(&demand(", devices: [{gpu: 1}]")).unwrap_err();
        assert!(errors[0].contains("migPlacementStart"), "{errors:?}");
    }

    /// One H100 with a single 7g.80gb (no sharing). A pod that names no device, listed first,
    /// would take the one instance by count, and the pod that names it would then find it
    /// taken; matching the named pods first keeps the instance with its holder and reports the
    /// other evicted.
    #[test]
    fn pods_naming_their_device_are_matched_before_those_that_do_not() {
        let supply: Supply = parse(
            "supply",
            "nodes:\n  - name: n1\n    gpus: [h100]\n    profileName: big\n    profile: {version: v1, rules: [{devices: all, mig: {7g.80gb: 1}}]}\n",
        )
        .unwrap();
        let demand: Demand = parse(
            "demand",
            "pods:
  - {name: any, node: n1, phase: running, requests: {nvidia.com/mig-7g.80gb: 1}}
  - {name: mine, node: n1, phase: running, requests: {nvidia.com/mig-7g.80gb: 1}, devices: [{gpu: 0, migPlacementStart: 0}]}
",
        )
        .unwrap();
        let advice = advise(&demand, &supply, PluginKind::Nvidia).unwrap();
        assert_eq!(advice.nodes[0].pods, ["default/mine"]);
        assert_eq!(advice.nodes[0].pods_evicted, ["default/any"]);
    }
}
