//! The advise solver: which GPU of which node serves each pod, and so what each GPU becomes.
//!
//! A documented greedy, not an exact optimiser. The objective is lexicographic: unschedulable
//! demand, then pods evicted, then MIG instances destroyed, then GPUs used. The greedy follows
//! that order as follows:
//!
//! 1. Running pods stay where they are: each is matched to a device its node has now (a free
//!    MIG instance of its profile, a replica of a time-sliced or MPS GPU, an exclusive GPU). A
//!    running pod whose device is not there is reported evicted and placed again as pending.
//!    A pod that names its devices (`devices` in the demand) is matched to those very devices
//!    (before the pods that name none); no later step destroys an instance it names. For a pod that names none, which instance
//!    it holds is unknown, so no later step destroys any instance of its profile on the GPU it
//!    was matched to. Either way placing pending demand never evicts.
//! 2. Pending pods, largest first (whole GPUs, then MIG by size, then MPS, then shared), go where
//!    they cost least, compared as ([`Cost`]) instances destroyed, then GPUs newly used, then
//!    capacity left over on the GPU (best fit). A free instance or replica on a GPU in use costs
//!    nothing; adding an instance uses the MIG geometry solver ([`crate::mig::solve`]), which
//!    keeps the most existing instances; an idle GPU is claimed only when no GPU in use fits
//!    without destroying; destroying an idle instance comes last. A pod that fits nowhere is
//!    unschedulable.
//!
//! What it does not do: move a running pod to make room (so a pending pod that fits only if a
//! running one moves stays unschedulable), or repack GPUs to release more of them.
//!
//! With the NVIDIA device plugin a node's whole GPUs share one mode (exclusive, time-slicing or
//! MPS, with one setting), and MPS cannot share a node with MIG: claims that would break that
//! are refused, so every proposal passes `validate`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use super::demand::{Need, Phase, PodDemand};
use super::running::{keep_running, start_state, Pristine};
use super::state::{
    add_client, units, GpuState, NodeState, Role, Unit, MAX_MPS_CLIENTS, MAX_TIME_SLICES,
};
use super::supply::NodeNow;
use crate::mig::{self, ExistingInstance, Geometry, GpuModel};
use crate::sharing::PluginKind;

/// What a placement costs, compared in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cost {
    pub destroyed: u32,
    pub new_gpus: u32,
    pub leftover: u32,
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            destroyed: self.destroyed + o.destroyed,
            new_gpus: self.new_gpus + o.new_gpus,
            leftover: self.leftover + o.leftover,
        }
    }
}

/// The change a placement makes to one GPU.
#[derive(Debug, Clone)]
enum Change {
    /// Take a free MIG instance of this profile.
    UseInstance(&'static str),
    /// New proposed instances (one more of `profile`), destroying this many existing ones.
    Relayout { profile: &'static str },
    /// One more pod on a whole GPU of this role.
    Join { memory_mib: Option<u64> },
    /// Take an idle GPU for this role, destroying its instances.
    Claim {
        role: Role,
        memory_mib: Option<u64>,
        profile: Option<&'static str>,
    },
}

/// What the solver decided.
#[derive(Debug, Clone)]
pub struct Solution {
    pub nodes: Vec<NodeState>,
    /// Running pods whose device is not on their node now, by index into the demand.
    pub evicted: Vec<usize>,
    /// Pods that fit nowhere, with why.
    pub unschedulable: Vec<(usize, String)>,
}

/// Geometry answers by (model, wanted, existing): many GPUs of a fleet are alike.
type SolveKey = (&'static str, Vec<(String, u32)>, Vec<(String, u32, u32)>);

/// The search over a fleet.
pub struct Solver {
    plugin: PluginKind,
    cache: RefCell<HashMap<SolveKey, Option<Geometry>>>,
    /// [`smallest_profile`] answers by (model, memory): asked for every GPU a pod could use.
    smallest: RefCell<HashMap<(&'static str, u64), Option<&'static str>>>,
}

impl Solver {
    pub fn new(plugin: PluginKind) -> Self {
        Solver {
            plugin,
            cache: RefCell::new(HashMap::new()),
            smallest: RefCell::new(HashMap::new()),
        }
    }

    /// Serve `pods` (their needs classified in `needs`, none for pods without GPU requests) on
    /// `nodes` as they are now.
    pub fn solve(&self, nodes: &[NodeNow], pods: &[PodDemand], needs: &[Option<Need>]) -> Solution {
        let mut state: Vec<NodeState> = nodes.iter().map(start_state).collect();
        let mut pristine = Pristine::of(&state);
        let by_name: HashMap<String, usize> = (state.iter().enumerate())
            .map(|(n, s)| (s.name.clone(), n))
            .collect();
        let mut evicted = Vec::new();
        let mut pending: Vec<usize> = Vec::new();
        // Pods that name their devices first: a pod that names none then takes a free device
        // beside them, never one a later pod names.
        let mut order: Vec<usize> = (0..pods.len()).collect();
        order.sort_by_key(|&i| pods[i].devices.is_empty());
        for i in order {
            let pod = &pods[i];
            let Some(need) = &needs[i] else { continue };
            match (pod.phase, pod.node.as_deref()) {
                (Phase::Running, Some(node)) => {
                    // A node outside the supply: its pods are not advise's to move.
                    let Some(&n) = by_name.get(node) else {
                        continue;
                    };
                    if keep_running(&mut state[n], need, &pod.devices) {
                        pristine.touch(n);
                        state[n].pods.push(i);
                    } else {
                        evicted.push(i);
                        pending.push(i);
                    }
                }
                _ => pending.push(i),
            }
        }
        evicted.sort_unstable();
        pending.sort_by_key(|&i| {
            (
                size_rank(needs[i].as_ref().expect("pending pods have a need")),
                i,
            )
        });
        let mut unschedulable = Vec::new();
        for i in pending {
            let need = needs[i].as_ref().expect("pending pods have a need");
            match self.place_pending(&mut state, &mut pristine, need) {
                Some(n) => {
                    pristine.touch(n);
                    state[n].pods.push(i);
                }
                None => unschedulable.push((i, self.why_not(nodes, need))),
            }
        }
        Solution {
            nodes: state,
            evicted,
            unschedulable,
        }
    }

    /// Place a pending pod on the node where it costs least; the node's index.
    /// Of nodes still as they started alike, only the first is evaluated ([`Pristine`]).
    fn place_pending(
        &self,
        nodes: &mut [NodeState],
        pristine: &mut Pristine,
        need: &Need,
    ) -> Option<usize> {
        let (unit, count) = units(need);
        let mut seen = Vec::new();
        if count == 1 {
            let mut best: Option<(Cost, usize, usize, Change)> = None;
            for (n, node) in nodes.iter().enumerate() {
                if pristine.same_as_seen(n, &mut seen) {
                    continue;
                }
                let bound = best.as_ref().map(|b| b.0);
                if let Some((cost, g, change)) = self.best_on_node(node, &unit, bound) {
                    if best.as_ref().is_none_or(|b| cost < b.0) {
                        best = Some((cost, n, g, change));
                    }
                }
                // Nothing beats a free fit that fills its GPU.
                if best.as_ref().is_some_and(|b| b.0 == Cost::default()) {
                    break;
                }
            }
            let (_, n, g, change) = best?;
            self.apply(&mut nodes[n].gpus[g], change);
            return Some(n);
        }
        let mut best: Option<(Cost, usize, NodeState)> = None;
        for (n, node) in nodes.iter().enumerate() {
            if pristine.same_as_seen(n, &mut seen) {
                continue;
            }
            let mut trial = node.clone();
            let mut total = Cost::default();
            let mut fits = true;
            for _ in 0..count {
                match self.best_on_node(&trial, &unit, None) {
                    Some((cost, g, change)) => {
                        total = total + cost;
                        self.apply(&mut trial.gpus[g], change);
                    }
                    None => {
                        fits = false;
                        break;
                    }
                }
            }
            if fits && best.as_ref().is_none_or(|b| total < b.0) {
                best = Some((total, n, trial));
            }
        }
        let (_, n, trial) = best?;
        nodes[n] = trial;
        Some(n)
    }

    /// The cheapest GPU of `node` for one unit. `bound`: a cost found elsewhere; GPUs that
    /// cannot beat it are not evaluated.
    fn best_on_node(
        &self,
        node: &NodeState,
        unit: &Unit,
        bound: Option<Cost>,
    ) -> Option<(Cost, usize, Change)> {
        let ctx = NodeCtx::of(node);
        let mut best: Option<(Cost, usize, Change)> = None;
        for (g, gpu) in node.gpus.iter().enumerate() {
            let beat = best.as_ref().map(|b| b.0).into_iter().chain(bound).min();
            // Claiming an idle GPU costs a new GPU: it cannot beat a free fit.
            if !gpu.in_use() && beat.is_some_and(|b| b.destroyed == 0 && b.new_gpus == 0) {
                continue;
            }
            // An idle GPU just like an earlier idle one of this node costs the same.
            if !gpu.in_use() && node.gpus[..g].iter().any(|e| same_idle(e, gpu)) {
                continue;
            }
            if let Some((cost, change)) = self.evaluate(gpu, &ctx, unit) {
                if beat.is_none_or(|b| cost < b) {
                    best = Some((cost, g, change));
                }
            }
        }
        best
    }

    /// What placing `unit` on `gpu` costs, and the change; none when it cannot go there.
    fn evaluate(&self, gpu: &GpuState, ctx: &NodeCtx, unit: &Unit) -> Option<(Cost, Change)> {
        match unit {
            Unit::Mig {
                profile,
                memory_mib,
            } => self.evaluate_mig(gpu, ctx, profile.as_deref(), *memory_mib),
            Unit::Shared { memory_mib } => {
                self.evaluate_whole(gpu, ctx, Role::TimeSliced, *memory_mib)
            }
            Unit::Mps { memory_mib } => self.evaluate_whole(gpu, ctx, Role::Mps, *memory_mib),
            Unit::Whole => self.evaluate_whole(gpu, ctx, Role::Exclusive, None),
        }
    }

    fn evaluate_mig(
        &self,
        gpu: &GpuState,
        ctx: &NodeCtx,
        profile: Option<&str>,
        memory_mib: Option<u64>,
    ) -> Option<(Cost, Change)> {
        let model = gpu.model?;
        let profile: &'static str = match profile {
            Some(p) => &model.profile(p)?.name,
            None => self.smallest(model, memory_mib?)?,
        };
        if self.plugin == PluginKind::Nvidia && ctx.mps_in_use {
            return None;
        }
        let new_gpus = u32::from(!gpu.in_use());
        if gpu.role == Role::Mig {
            let have = gpu.instances.get(profile).copied().unwrap_or(0);
            if have > gpu.used.get(profile).copied().unwrap_or(0) {
                let cost = Cost {
                    destroyed: 0,
                    new_gpus,
                    leftover: gpu.free_slices(&gpu.instances),
                };
                return Some((cost, Change::UseInstance(profile)));
            }
            let (destroyed, leftover) = self.relayout_cost(model, gpu, profile)?;
            let cost = Cost {
                destroyed: destroyed.saturating_sub(gpu.destroyed),
                new_gpus,
                leftover,
            };
            return Some((cost, Change::Relayout { profile }));
        }
        if gpu.in_use() || !gpu.mig_capable() {
            return None;
        }
        // One instance of a profile the model has fits an empty GPU (it has placements).
        let slices = model.profile(profile).map_or(0, |p| p.slice_count);
        let cost = Cost {
            destroyed: 0,
            new_gpus: 1,
            leftover: model.compute_slices.saturating_sub(slices),
        };
        Some((
            cost,
            Change::Claim {
                role: Role::Mig,
                memory_mib: None,
                profile: Some(profile),
            },
        ))
    }

    /// [`Solver::relayout`]'s instances destroyed and slices left, remembered on the GPU.
    fn relayout_cost(
        &self,
        model: &'static GpuModel,
        gpu: &GpuState,
        profile: &'static str,
    ) -> Option<(u32, u32)> {
        if let Some((_, hit)) = gpu
            .relayout_memo
            .borrow()
            .iter()
            .find(|(p, _)| *p == profile)
        {
            return *hit;
        }
        let answer = self
            .relayout(model, gpu, profile)
            .map(|(instances, g)| (g.destroy.len() as u32, gpu.free_slices(&instances)));
        gpu.relayout_memo.borrow_mut().push((profile, answer));
        answer
    }

    /// The proposed instances plus one `profile`, keeping every instance pods hold and as many
    /// free ones as fit; none when even the held ones and the new one do not fit, or when the
    /// layout would destroy an instance of a profile running pods use.
    fn relayout(
        &self,
        model: &'static GpuModel,
        gpu: &GpuState,
        profile: &str,
    ) -> Option<(BTreeMap<String, u32>, Geometry)> {
        let new_slices = model.profile(profile).map_or(u32::MAX, |p| p.slice_count);
        if gpu.free_slices(&gpu.used) < new_slices {
            return None; // not even without every free instance
        }
        let mut wanted = gpu.instances.clone();
        *wanted.entry(profile.to_string()).or_insert(0) += 1;
        if gpu.free_slices(&gpu.instances) >= new_slices {
            if let Some(g) = self.geometry(model, &wanted, &gpu.existing) {
                return self.keeps_running(gpu, &g).then_some((wanted, g));
            }
        }
        // Drop the free instances, then add them back one by one while they fit.
        let mut base = gpu.used.clone();
        base.retain(|_, n| *n > 0);
        *base.entry(profile.to_string()).or_insert(0) += 1;
        // The planner's layout for a count may keep another instance of a profile than the one
        // a pod names: more free instances can bring it back, and can move it off again.
        let mut best = self.geometry(model, &base, &gpu.existing)?;
        for (p, n) in &gpu.instances {
            let free = n.saturating_sub(gpu.used.get(p).copied().unwrap_or(0));
            for _ in 0..free {
                let mut more = base.clone();
                *more.entry(p.clone()).or_insert(0) += 1;
                if let Some(g) = self.geometry(model, &more, &gpu.existing) {
                    if self.keeps_running(gpu, &g) || !self.keeps_running(gpu, &best) {
                        base = more;
                        best = g;
                    }
                }
            }
        }
        self.keeps_running(gpu, &best).then_some((base, best))
    }

    fn keeps_running(&self, gpu: &GpuState, geometry: &Geometry) -> bool {
        geometry.destroy.iter().all(|d| {
            gpu.running.get(&d.profile).copied().unwrap_or(0) == 0
                && !gpu.pinned.contains_key(&d.placement.start)
        })
    }

    fn evaluate_whole(
        &self,
        gpu: &GpuState,
        ctx: &NodeCtx,
        role: Role,
        memory_mib: Option<u64>,
    ) -> Option<(Cost, Change)> {
        let (limit, ok_memory) = match role {
            Role::TimeSliced => (MAX_TIME_SLICES, fits_memory(gpu, memory_mib)),
            Role::Mps => (MAX_MPS_CLIENTS, ctx.mps_fits(gpu, memory_mib)),
            _ => (1, true),
        };
        if !ok_memory {
            return None;
        }
        if gpu.in_use() {
            if gpu.role != role || gpu.clients >= limit {
                return None;
            }
            let cost = Cost {
                destroyed: 0,
                new_gpus: 0,
                leftover: limit - gpu.clients - 1,
            };
            return Some((cost, Change::Join { memory_mib }));
        }
        if self.plugin == PluginKind::Nvidia {
            let other_whole = ctx.whole_in_use.is_some_and(|r| r != role);
            let mps_beside_mig = role == Role::Mps && ctx.has_mig;
            if other_whole || mps_beside_mig {
                return None;
            }
        }
        let destroyed = if gpu.role == Role::Mig {
            gpu.existing.len() as u32
        } else {
            0
        };
        let cost = Cost {
            destroyed,
            new_gpus: 1,
            leftover: limit - 1,
        };
        Some((
            cost,
            Change::Claim {
                role,
                memory_mib,
                profile: None,
            },
        ))
    }

    fn smallest(&self, model: &'static GpuModel, memory_mib: u64) -> Option<&'static str> {
        *self
            .smallest
            .borrow_mut()
            .entry((model.key.as_str(), memory_mib))
            .or_insert_with(|| smallest_profile(model, memory_mib))
    }

    fn geometry(
        &self,
        model: &'static GpuModel,
        wanted: &BTreeMap<String, u32>,
        existing: &[ExistingInstance],
    ) -> Option<Geometry> {
        let key: SolveKey = (
            model.key.as_str(),
            wanted.iter().map(|(p, n)| (p.clone(), *n)).collect(),
            existing
                .iter()
                .map(|e| (e.profile.clone(), e.placement.start, e.placement.size))
                .collect(),
        );
        if let Some(hit) = self.cache.borrow().get(&key) {
            return hit.clone();
        }
        let answer = mig::solve(model, wanted, existing).ok();
        self.cache.borrow_mut().insert(key, answer.clone());
        answer
    }

    /// Why a need fits on no node: the sentence for the report.
    fn why_not(&self, nodes: &[NodeNow], need: &Need) -> String {
        match need {
            Need::Mig {
                profile: Some(p), ..
            } => {
                let offered = nodes.iter().flat_map(|n| &n.observed.gpus).any(|g| {
                    mig::catalog()
                        .model_by_product(&g.product)
                        .is_some_and(|m| m.profile(p).is_some())
                });
                if offered {
                    format!("no GPU has room for a {p} instance without moving running pods")
                } else {
                    format!("no GPU in the supply has the MIG profile {p}")
                }
            }
            Need::Mig {
                memory_mib: Some(m),
                ..
            } => {
                format!(
                    "no GPU has room for a MIG instance of {} GiB without moving running pods",
                    gib(*m)
                )
            }
            Need::Whole { count } => format!("no node has {count} idle GPU(s) it can give whole"),
            Need::Shared { .. } => "no GPU can take another time-sliced pod".into(),
            Need::Mps { .. } => "no GPU can take another MPS client".into(),
            Need::Mig { .. } => "unreachable: MIG need without a profile or memory".into(),
        }
    }
}

/// Two idle GPUs that any placement treats alike: same model, mode now and instances.
fn same_idle(a: &GpuState, b: &GpuState) -> bool {
    !a.in_use()
        && a.role == b.role
        && a.memory_mib == b.memory_mib
        && a.model.map(|m| m as *const GpuModel) == b.model.map(|m| m as *const GpuModel)
        && a.current == b.current
        && a.existing == b.existing
}

/// `7.5` for 7680 MiB.
pub fn gib(mib: u64) -> String {
    let g = mib as f64 / 1024.0;
    if g.fract() == 0.0 {
        format!("{g:.0}")
    } else {
        format!("{g:.1}")
    }
}

/// The smallest MIG profile of `model` with at least `memory_mib`, fewest compute slices on a
/// tie; plain profiles only (no `+me`/`-me` media-engine variants).
pub fn smallest_profile(model: &GpuModel, memory_mib: u64) -> Option<&str> {
    model
        .gpu_instance_profiles
        .iter()
        .filter(|p| !p.name.contains(['+', '-']))
        .filter(|p| p.memory_mib.is_some_and(|m| m >= memory_mib))
        .min_by_key(|p| (p.memory_mib, p.slice_count))
        .map(|p| p.name.as_str())
}

fn fits_memory(gpu: &GpuState, memory_mib: Option<u64>) -> bool {
    match (memory_mib, gpu.memory_mib) {
        (Some(need), Some(total)) => gpu.client_memory_mib + need <= total,
        _ => true,
    }
}

/// Facts about a node that decide what the NVIDIA plugin lets it hold.
struct NodeCtx<'a> {
    node: &'a NodeState,
    whole_in_use: Option<Role>,
    has_mig: bool,
    mps_in_use: bool,
    /// The node's MPS memory cap per client now (one setting per node with the NVIDIA plugin).
    mps_limit_mib: u64,
}

impl<'a> NodeCtx<'a> {
    fn of(node: &'a NodeState) -> Self {
        let used = || node.gpus.iter().filter(|g| g.in_use());
        NodeCtx {
            node,
            whole_in_use: used().map(|g| g.role).find(|r| *r != Role::Mig),
            has_mig: node.gpus.iter().any(|g| g.role == Role::Mig),
            mps_in_use: used().any(|g| g.role == Role::Mps),
            mps_limit_mib: used()
                .filter(|g| g.role == Role::Mps)
                .map(|g| g.max_client_mib)
                .max()
                .unwrap_or(0),
        }
    }

    /// Whether one more MPS client with `memory_mib` on `gpu` keeps every MPS GPU of the node
    /// within its memory at the node's (possibly raised) per-client cap.
    fn mps_fits(&self, gpu: &GpuState, memory_mib: Option<u64>) -> bool {
        let limit = self.mps_limit_mib.max(memory_mib.unwrap_or(0));
        if limit == 0 {
            return true;
        }
        let this = std::iter::once((gpu.index, gpu.clients, gpu.memory_mib));
        let others = self
            .node
            .gpus
            .iter()
            .filter(|g| g.in_use() && g.role == Role::Mps && g.index != gpu.index)
            .map(|g| (g.index, g.clients, g.memory_mib));
        this.chain(others).all(|(i, clients, mem)| {
            let clients = u64::from(clients) + u64::from(i == gpu.index);
            mem.is_none_or(|m| clients * limit <= m)
        })
    }
}

impl Solver {
    /// Make the change on the GPU.
    fn apply(&self, gpu: &mut GpuState, change: Change) {
        gpu.relayout_memo.get_mut().clear();
        match change {
            Change::UseInstance(p) => *gpu.used.entry(p.to_string()).or_insert(0) += 1,
            Change::Relayout { profile } => {
                let model = gpu.model.expect("a relayout was evaluated on a MIG model");
                let (instances, geometry) = self
                    .relayout(model, gpu, profile)
                    .expect("evaluated to fit");
                gpu.instances = instances;
                gpu.destroyed = geometry.destroy.len() as u32;
                *gpu.used.entry(profile.to_string()).or_insert(0) += 1;
            }
            Change::Join { memory_mib, .. } => add_client(gpu, memory_mib),
            Change::Claim {
                role,
                memory_mib,
                profile,
            } => {
                if gpu.role == Role::Mig {
                    gpu.destroyed = gpu.existing.len() as u32;
                }
                gpu.role = role;
                gpu.instances.clear();
                if let Some(p) = profile {
                    gpu.instances.insert(p.to_string(), 1);
                    gpu.used.insert(p.to_string(), 1);
                } else {
                    add_client(gpu, memory_mib);
                }
            }
        }
    }
}

/// Larger needs first: whole GPUs, MIG by memory and slices, MPS, shared.
fn size_rank(need: &Need) -> (u8, std::cmp::Reverse<u64>) {
    use std::cmp::Reverse;
    match need {
        Need::Whole { count } => (0, Reverse(u64::from(*count))),
        Need::Mig {
            profile,
            memory_mib,
            count,
        } => {
            let per = profile
                .as_deref()
                .and_then(|p| mig::catalog().models.iter().find_map(|m| m.profile(p)))
                .and_then(|p| p.memory_mib)
                .or(*memory_mib)
                .unwrap_or(0);
            (1, Reverse(per * u64::from(*count)))
        }
        Need::Mps { count, memory_mib } => {
            (2, Reverse(memory_mib.unwrap_or(0) * u64::from(*count)))
        }
        Need::Shared { count, memory_mib } => {
            (3, Reverse(memory_mib.unwrap_or(0) * u64::from(*count)))
        }
    }
}
