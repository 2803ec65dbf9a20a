//! The object store: one global resourceVersion, a bounded change history for watches, the
//! registry semantics of create / update / patch / delete, graceful pod deletion, the disruption
//! controller's PodDisruptionBudget status and the eviction subresource.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::kinds::{KindId, KindInfo, EVENTS, KINDS, PDBS, PODS, RESOURCE_SLICES};
use crate::patch;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::{success_status, ApiError};
use crate::{EvictionOutcome, EvictionRecord, Fault, PodTermination, RequestRecord, Verb};

/// (kind, namespace or "", name).
pub(crate) type Key = (KindId, String, String);

/// How many changes the watch history keeps before the oldest are compacted away.
const HISTORY_LIMIT: usize = 20_000;
/// How many paginated list snapshots are kept for `continue` tokens.
const SNAPSHOT_LIMIT: usize = 64;
/// The disruption controller forgets a disrupted pod that was not deleted within this time.
const DISRUPTED_POD_TIMEOUT: SignedDuration = SignedDuration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChangeType {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    kind: KindId,
    ns: String,
    typ: ChangeType,
    /// The object after the change (for a deletion: its last state, carrying the deletion's rv).
    obj: Value,
    /// The object before the change.
    prev: Option<Value>,
}

pub(crate) struct Watcher {
    pub id: u64,
    kind: KindId,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    tx: UnboundedSender<String>,
}

impl Watcher {
    fn selects(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

pub(crate) struct FaultRule {
    pub verb: Verb,
    pub resource: String,
    pub remaining: usize,
    pub fault: Fault,
}

struct ListSnapshot {
    rv: u64,
    kind: KindId,
    items: Vec<Value>,
}

/// What a watch request turns into.
pub(crate) enum WatchStart {
    Stream {
        id: u64,
        rx: UnboundedReceiver<String>,
    },
    /// The requested resourceVersion was compacted: send this ERROR event and close.
    Expired(String),
}

/// Parsed list/watch query parameters.
#[derive(Debug, Default, Clone)]
pub(crate) struct ListQuery {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub allow_bookmarks: bool,
    pub send_initial_events: Option<bool>,
}

pub(crate) struct State {
    pub rv: u64,
    /// A watch or exact list can start from any resourceVersion >= horizon.
    horizon: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    pub watchers: Vec<Watcher>,
    next_id: u64,
    pub faults: Vec<FaultRule>,
    pub requests: Vec<RequestRecord>,
    pub evictions: Vec<EvictionRecord>,
    snapshots: BTreeMap<u64, ListSnapshot>,
    pub termination: PodTermination,
    /// Pods whose graceful deletion waits for the simulated kubelet.
    awaiting_kubelet: HashSet<Key>,
    /// Timers to start after the state lock is released: (pod, uid, delay).
    pub pending_timers: Vec<(Key, String, Duration)>,
    pub pdb_expected: HashMap<(String, String), i32>,
    pub disruption_paused: bool,
    /// The `DRAPartitionableDevices` feature gate (see `crate::feature_gates`).
    pub partitionable_devices: bool,
    /// The `DRADeviceTaints` gate (on, as in 1.36): off, ResourceSlice writes lose their taints.
    pub device_taints: bool,
    /// The `DRAConsumableCapacity` gate (on, as in 1.36): off, ResourceSlice writes lose
    /// `allowMultipleAllocations` and every `requestPolicy`.
    pub consumable_capacity: bool,
    pub bookmark_interval: Duration,
    uid_seed: u64,
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn fmt_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta<'a>(obj: &'a Value, field: &str) -> Option<&'a Value> {
    obj.get("metadata").and_then(|m| m.get(field))
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj, field).and_then(Value::as_str).unwrap_or("")
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata object")
}

fn has_finalizers(obj: &Value) -> bool {
    meta(obj, "finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

fn is_terminating(obj: &Value) -> bool {
    meta(obj, "deletionTimestamp").is_some_and(|v| !v.is_null())
}

pub(crate) fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// The object without the fields a no-op comparison ignores.
fn comparable(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    o
}

/// Everything but metadata and status: what bumps `metadata.generation`.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Resolves an IntOrString against a total (percentages round up, as the disruption controller
/// does).
fn scaled(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            if let Some(p) = s.strip_suffix('%') {
                let p: i64 = p.trim().parse().ok()?;
                Some((p * total + 99) / 100)
            } else {
                s.trim().parse().ok()
            }
        }
        _ => None,
    }
}

impl State {
    pub fn new() -> State {
        let seed = {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            h.finish()
        };
        // Start well above 0 so "0" (any version) is never a real one.
        let rv = 1000;
        State {
            rv,
            horizon: rv,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            watchers: Vec::new(),
            next_id: 1,
            faults: Vec::new(),
            requests: Vec::new(),
            evictions: Vec::new(),
            snapshots: BTreeMap::new(),
            termination: PodTermination::Immediate,
            awaiting_kubelet: HashSet::new(),
            pending_timers: Vec::new(),
            pdb_expected: HashMap::new(),
            disruption_paused: false,
            partitionable_devices: true,
            device_taints: true,
            consumable_capacity: true,
            bookmark_interval: Duration::from_secs(1),
            uid_seed: seed,
        }
    }

    fn random(&mut self) -> u64 {
        // splitmix64
        self.uid_seed = self.uid_seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.uid_seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn new_uid(&mut self) -> String {
        let a = self.random();
        let b = self.random();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | (b >> 48) & 0x3fff,
            b & 0xffff_ffff_ffff
        )
    }

    fn generate_name(&mut self, prefix: &str) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut s = prefix.to_string();
        for _ in 0..5 {
            let i = (self.random() % ALPHABET.len() as u64) as usize;
            s.push(ALPHABET[i] as char);
        }
        s
    }

    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub fn object(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    pub fn objects_of(&self, kind: KindId, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((k, n, _), _)| *k == kind && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect()
    }

    // ---------------------------------------------------------------------------------------
    // Commits, history and watch fan-out
    // ---------------------------------------------------------------------------------------

    /// Stores (or with `None` removes) an object under a new resourceVersion, records the change
    /// and sends it to the watches that select it. Returns the stored object.
    fn commit(&mut self, key: &Key, new: Option<Value>) -> Value {
        let prev = self.objects.get(key).cloned();
        self.rv += 1;
        let rv = self.rv;
        let (typ, obj) = match new {
            Some(mut obj) => {
                meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
                self.objects.insert(key.clone(), obj.clone());
                let typ = if prev.is_some() {
                    ChangeType::Modified
                } else {
                    ChangeType::Added
                };
                (typ, obj)
            }
            None => {
                let mut obj = self.objects.remove(key).expect("deleting a stored object");
                meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
                self.awaiting_kubelet.remove(key);
                (ChangeType::Deleted, obj)
            }
        };
        let change = Change {
            rv,
            kind: key.0,
            ns: key.1.clone(),
            typ,
            obj: obj.clone(),
            prev,
        };
        self.fan_out(&change);
        self.history.push_back(change);
        while self.history.len() > HISTORY_LIMIT {
            if let Some(c) = self.history.pop_front() {
                self.horizon = c.rv;
            }
        }
        obj
    }

    /// The watch event (type, object) a change produces for one watch, if any: an object that
    /// starts matching the watch's selectors is ADDED, one that stops matching is DELETED.
    fn event_for(w: &Watcher, c: &Change) -> Option<(&'static str, Value)> {
        if w.kind != c.kind || w.ns.as_ref().is_some_and(|ns| *ns != c.ns) {
            return None;
        }
        match c.typ {
            ChangeType::Added => w.selects(&c.obj).then(|| ("ADDED", c.obj.clone())),
            ChangeType::Deleted => w.selects(&c.obj).then(|| ("DELETED", c.obj.clone())),
            ChangeType::Modified => {
                let now_in = w.selects(&c.obj);
                let was_in = c.prev.as_ref().is_some_and(|p| w.selects(p));
                match (was_in, now_in) {
                    (true, true) => Some(("MODIFIED", c.obj.clone())),
                    (false, true) => Some(("ADDED", c.obj.clone())),
                    (true, false) => {
                        let mut old = c.prev.clone().expect("previous object");
                        meta_mut(&mut old)
                            .insert("resourceVersion".into(), json!(c.rv.to_string()));
                        Some(("DELETED", old))
                    }
                    (false, false) => None,
                }
            }
        }
    }

    fn fan_out(&mut self, c: &Change) {
        self.watchers.retain(|w| match Self::event_for(w, c) {
            Some((typ, obj)) => w.tx.send(event_line(typ, &obj)).is_ok(),
            None => !w.tx.is_closed(),
        });
    }

    /// Sends a BOOKMARK at the current resourceVersion to one watch (through its queue, so it
    /// never overtakes an event).
    pub fn bookmark(&mut self, id: u64) {
        let rv = self.rv;
        if let Some(w) = self.watchers.iter().find(|w| w.id == id) {
            let k = &KINDS[w.kind];
            let obj = json!({
                "kind": k.kind,
                "apiVersion": k.api_version(),
                "metadata": {"resourceVersion": rv.to_string()},
            });
            let _ = w.tx.send(event_line("BOOKMARK", &obj));
        }
    }

    pub fn remove_watcher(&mut self, id: u64) {
        self.watchers.retain(|w| w.id != id);
    }

    /// Closes every open watch (the client sees the stream end).
    pub fn drop_watches(&mut self) -> usize {
        let n = self.watchers.len();
        self.watchers.clear();
        n
    }

    /// Forgets all history: any resourceVersion handed out so far becomes too old to watch from
    /// (410 Expired), as after an etcd compaction.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.horizon = self.rv;
        self.history.clear();
        self.snapshots.clear();
    }

    // ---------------------------------------------------------------------------------------
    // Controllers run after changes: the disruption controller and finalization.
    // ---------------------------------------------------------------------------------------

    fn after_change(&mut self, kind: KindId, ns: &str) {
        if kind == PODS || kind == PDBS {
            self.recompute_pdbs(ns);
        }
    }

    /// Removes an object whose deletion was only waiting for its finalizers (and, for a pod, the
    /// simulated kubelet).
    fn maybe_finalize(&mut self, key: &Key) {
        let done = self.objects.get(key).is_some_and(|o| {
            is_terminating(o) && !has_finalizers(o) && !self.awaiting_kubelet.contains(key)
        });
        if done {
            self.commit(key, None);
        }
    }

    /// The simulated kubelet has stopped the pod: delete it for good (unless finalizers hold it).
    pub fn finish_termination(&mut self, key: &Key, uid: Option<&str>) -> bool {
        let Some(obj) = self.objects.get(key) else {
            return false;
        };
        if !is_terminating(obj) || uid.is_some_and(|u| meta_str(obj, "uid") != u) {
            return false;
        }
        self.awaiting_kubelet.remove(key);
        self.maybe_finalize(key);
        self.after_change(key.0, &key.1.clone());
        true
    }

    pub fn recompute_pdbs(&mut self, ns: &str) {
        if self.disruption_paused {
            return;
        }
        let keys: Vec<Key> = self
            .objects
            .keys()
            .filter(|(k, n, _)| *k == PDBS && n == ns)
            .cloned()
            .collect();
        for key in keys {
            let pdb = self.objects[&key].clone();
            let status = self.pdb_status(&pdb);
            if pdb.get("status") != Some(&status) {
                let mut p = pdb;
                p["status"] = status;
                self.commit(&key, Some(p));
            }
        }
    }

    /// The status the disruption controller would write for a PDB now.
    fn pdb_status(&self, pdb: &Value) -> Value {
        let ns = meta_str(pdb, "namespace");
        let name = meta_str(pdb, "name");
        let selector = LabelSelector::from_object(pdb.pointer("/spec/selector"))
            .unwrap_or_else(|_| LabelSelector::nothing());
        let pods: Vec<&Value> = self
            .objects
            .iter()
            .filter(|((k, n, _), v)| *k == PODS && n == ns && selector.matches(v))
            .map(|(_, v)| v)
            .collect();
        let t = now();
        let mut disrupted = Map::new();
        if let Some(Value::Object(m)) = pdb.pointer("/status/disruptedPods") {
            for (pod, at) in m {
                let live = pods
                    .iter()
                    .any(|p| meta_str(p, "name") == pod && !is_terminating(p));
                let fresh = at
                    .as_str()
                    .and_then(|s| s.parse::<Timestamp>().ok())
                    .and_then(|at| at.checked_add(DISRUPTED_POD_TIMEOUT).ok())
                    .is_some_and(|deadline| deadline > t);
                if live && fresh {
                    disrupted.insert(pod.clone(), at.clone());
                }
            }
        }
        let override_expected = self
            .pdb_expected
            .get(&(ns.to_string(), name.to_string()))
            .map(|&n| i64::from(n));
        let expected = override_expected.unwrap_or(pods.len() as i64);
        let desired = if let Some(mu) = pdb.pointer("/spec/maxUnavailable") {
            (expected - scaled(mu, expected).unwrap_or(0)).max(0)
        } else if let Some(ma) = pdb.pointer("/spec/minAvailable") {
            scaled(ma, expected).unwrap_or(0)
        } else {
            0
        };
        let healthy = pods
            .iter()
            .filter(|p| {
                !is_terminating(p) && !disrupted.contains_key(meta_str(p, "name")) && pod_ready(p)
            })
            .count() as i64;
        let allowed = (healthy - desired).max(0);
        let (cond_status, reason) = if allowed > 0 {
            ("True", "SufficientPods")
        } else {
            ("False", "InsufficientPods")
        };
        let generation = meta(pdb, "generation").and_then(Value::as_i64).unwrap_or(1);
        let old_cond = pdb
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"))
            });
        let transition = match old_cond {
            Some(c)
                if c.get("status").and_then(Value::as_str) == Some(cond_status)
                    && c.get("lastTransitionTime").is_some() =>
            {
                c["lastTransitionTime"].clone()
            }
            _ => json!(fmt_time(t)),
        };
        let mut status = json!({
            "observedGeneration": generation,
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "conditions": [{
                "type": "DisruptionAllowed",
                "status": cond_status,
                "reason": reason,
                "message": "",
                "observedGeneration": generation,
                "lastTransitionTime": transition,
            }],
        });
        if !disrupted.is_empty() {
            status["disruptedPods"] = Value::Object(disrupted);
        }
        status
    }

    // ---------------------------------------------------------------------------------------
    // Seeding from the Rust API (writes as a controller or the kubelet would: status included)
    // ---------------------------------------------------------------------------------------

    pub fn put(&mut self, kind: KindId, mut obj: Value) -> Value {
        let k = &KINDS[kind];
        obj["apiVersion"] = json!(k.api_version());
        obj["kind"] = json!(k.kind);
        let name = meta_str(&obj, "name").to_string();
        assert!(
            !name.is_empty(),
            "kube-double: put a {} without a name",
            k.kind
        );
        let ns = if k.namespaced {
            let ns = meta_str(&obj, "namespace");
            if ns.is_empty() {
                "default".to_string()
            } else {
                ns.to_string()
            }
        } else {
            String::new()
        };
        let key: Key = (kind, ns.clone(), name);
        let old = self.objects.get(&key).cloned();
        let uid = match &old {
            Some(o) if meta_str(&obj, "uid").is_empty() => meta_str(o, "uid").to_string(),
            _ if meta_str(&obj, "uid").is_empty() => self.new_uid(),
            _ => meta_str(&obj, "uid").to_string(),
        };
        let created = match &old {
            Some(o) if meta(&obj, "creationTimestamp").is_none() => {
                meta(o, "creationTimestamp").cloned().unwrap_or(Value::Null)
            }
            _ => meta(&obj, "creationTimestamp")
                .cloned()
                .unwrap_or_else(|| json!(fmt_time(now()))),
        };
        let generation = if k.tracks_generation {
            match &old {
                Some(o) => {
                    let g = meta(o, "generation").and_then(Value::as_i64).unwrap_or(1);
                    Some(if spec_part(o) != spec_part(&obj) {
                        g + 1
                    } else {
                        g
                    })
                }
                None => Some(1),
            }
        } else {
            None
        };
        {
            let m = meta_mut(&mut obj);
            if k.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), created);
            m.remove("resourceVersion");
            if let Some(g) = generation {
                m.insert("generation".into(), json!(g));
            }
        }
        if let Some(o) = &old {
            if comparable(o) == comparable(&obj) {
                return o.clone();
            }
        }
        // A pod seeded as terminating stays so until finish_termination (the kubelet's part).
        if kind == PODS && is_terminating(&obj) && !old.as_ref().is_some_and(is_terminating) {
            self.awaiting_kubelet.insert(key.clone());
        }
        let stored = self.commit(&key, Some(obj));
        self.maybe_finalize(&key);
        self.after_change(kind, &ns);
        self.objects.get(&key).cloned().unwrap_or(stored)
    }

    /// Removes an object at once (no graceful deletion, no finalizers).
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        self.objects.get(key)?;
        let obj = self.commit(key, None);
        self.after_change(key.0, &key.1.clone());
        Some(obj)
    }

    // ---------------------------------------------------------------------------------------
    // REST verbs
    // ---------------------------------------------------------------------------------------

    /// Checks `apiVersion`/`kind` of a request body against the endpoint and fills them in.
    fn check_body(kind: &KindInfo, body: Value) -> Result<Value, ApiError> {
        let Value::Object(_) = body else {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        };
        let mut obj = body;
        let gv = kind.api_version();
        if let Some(v) = obj.get("apiVersion").and_then(Value::as_str) {
            if !v.is_empty() && v != gv {
                let msg = format!(
                    "the API version in the data ({v}) does not match the expected API version ({gv})"
                );
                return Err(ApiError::bad_request(msg));
            }
        }
        if let Some(v) = obj.get("kind").and_then(Value::as_str) {
            if !v.is_empty() && v != kind.kind {
                let msg = format!(
                    "the kind in the data ({v}) does not match the expected kind ({})",
                    kind.kind
                );
                return Err(ApiError::bad_request(msg));
            }
        }
        obj["apiVersion"] = json!(gv);
        obj["kind"] = json!(kind.kind);
        meta_mut(&mut obj);
        Ok(obj)
    }

    fn check_namespace(kind: &KindInfo, obj: &mut Value, ns: &str) -> Result<(), ApiError> {
        if kind.namespaced {
            let body_ns = meta_str(obj, "namespace");
            if body_ns.is_empty() {
                meta_mut(obj).insert("namespace".into(), json!(ns));
            } else if body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta_mut(obj).remove("namespace");
        }
        Ok(())
    }

    pub fn get(&self, kind: KindId, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&(kind, ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&KINDS[kind], name))
    }

    pub fn create(&mut self, kind_id: KindId, ns: &str, body: Value) -> Result<Value, ApiError> {
        let kind = &KINDS[kind_id];
        let mut obj = Self::check_body(kind, body)?;
        Self::check_namespace(kind, &mut obj, ns)?;
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
            name = self.generate_name(&prefix);
            meta_mut(&mut obj).insert("name".into(), json!(name));
        }
        if !valid_name(&name) {
            return Err(ApiError::invalid(
                kind,
                &name,
                "metadata.name",
                &format!(
                    "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let key: Key = (kind_id, ns.to_string(), name.clone());
        let key = if kind.namespaced {
            key
        } else {
            (kind_id, String::new(), name.clone())
        };
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        let uid = self.new_uid();
        {
            let m = meta_mut(&mut obj);
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(fmt_time(now())));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            if kind.tracks_generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        if kind_id == PODS {
            // The apiserver starts every pod Pending; the kubelet reports the rest.
            obj["status"] = json!({"phase": "Pending"});
        } else if kind_id == PDBS {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        self.admit(kind_id, &mut obj, None)?;
        let stored = self.commit(&key, Some(obj));
        self.after_change(kind_id, &key.1.clone());
        Ok(stored)
    }

    /// The object an update of `old` to `new` stores (before its resourceVersion).
    fn prepare_update(kind: &KindInfo, old: &Value, new: Value, sub: Option<&str>) -> Value {
        let mut result = if sub == Some("status") {
            let mut r = old.clone();
            match new.get("status") {
                Some(s) => r["status"] = s.clone(),
                None => {
                    if let Some(m) = r.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            r
        } else {
            let mut r = new;
            if kind.status_subresource {
                match old.get("status") {
                    Some(s) => r["status"] = s.clone(),
                    None => {
                        if let Some(m) = r.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            r
        };
        let old_meta = old.get("metadata").cloned().unwrap_or(json!({}));
        let m = meta_mut(&mut result);
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ] {
            match old_meta.get(field) {
                Some(v) => {
                    m.insert(field.into(), v.clone());
                }
                None => {
                    m.remove(field);
                }
            }
        }
        m.remove("resourceVersion");
        if kind.tracks_generation && sub != Some("status") && spec_part(old) != spec_part(&result) {
            let g = meta(old, "generation").and_then(Value::as_i64).unwrap_or(1);
            meta_mut(&mut result).insert("generation".into(), json!(g + 1));
        }
        result
    }

    /// Stores an updated object unless nothing changed (a no-op write keeps its
    /// resourceVersion and produces no watch event).
    fn commit_update(&mut self, key: &Key, old: &Value, new: Value) -> Value {
        if comparable(old) == comparable(&new) {
            return old.clone();
        }
        let stored = self.commit(key, Some(new));
        self.maybe_finalize(key);
        self.after_change(key.0, &key.1.clone());
        stored
    }

    pub fn update(
        &mut self,
        kind_id: KindId,
        ns: &str,
        name: &str,
        body: Value,
        sub: Option<&str>,
    ) -> Result<(u16, Value), ApiError> {
        let kind = &KINDS[kind_id];
        let mut obj = Self::check_body(kind, body)?;
        Self::check_namespace(kind, &mut obj, ns)?;
        let body_name = meta_str(&obj, "name");
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let key: Key = (kind_id, ns.to_string(), name.to_string());
        let Some(old) = self.objects.get(&key).cloned() else {
            if kind.allow_create_on_update && sub.is_none() {
                meta_mut(&mut obj).remove("resourceVersion");
                return self.create(kind_id, ns, obj).map(|o| (201, o));
            }
            return Err(ApiError::not_found(kind, name));
        };
        let rv = meta_str(&obj, "resourceVersion");
        if rv.is_empty() {
            if !kind.allow_unconditional_update {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                ));
            }
        } else if rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::stale(kind, name));
        }
        let mut new = Self::prepare_update(kind, &old, obj, sub);
        self.admit(kind_id, &mut new, Some(&old))?;
        Ok((200, self.commit_update(&key, &old, new)))
    }

    pub fn patch(
        &mut self,
        kind_id: KindId,
        ns: &str,
        name: &str,
        content_type: &str,
        body: &[u8],
        sub: Option<&str>,
    ) -> Result<(u16, Value), ApiError> {
        let kind = &KINDS[kind_id];
        let key: Key = (kind_id, ns.to_string(), name.to_string());
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let parse = || {
            serde_json::from_slice::<Value>(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        };
        let p = match media.as_str() {
            "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
            | "application/json-patch+json" => parse()?,
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                let mut e = ApiError::unsupported_media_type(&media);
                e.message = "server-side apply (application/apply-patch+yaml) is not implemented \
                             by kube-double; use a merge, strategic merge or JSON patch"
                    .into();
                return Err(e);
            }
            other => return Err(ApiError::unsupported_media_type(other)),
        };
        let Some(old) = self.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(kind, name));
        };
        let mut work = old.clone();
        match media.as_str() {
            "application/merge-patch+json" => {
                if !p.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut work, &p);
            }
            "application/strategic-merge-patch+json" => {
                patch::strategic_merge_patch(&mut work, &p).map_err(ApiError::unprocessable)?;
            }
            _ => patch::json_patch(&mut work, &p).map_err(ApiError::unprocessable)?,
        }
        if !work.is_object() {
            return Err(ApiError::unprocessable(
                "the patched object is not an object",
            ));
        }
        let rv = meta_str(&work, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&old, "resourceVersion") {
            return Err(ApiError::stale(kind, name));
        }
        let patched_name = meta_str(&work, "name");
        if patched_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({patched_name}) does not match the name on the URL ({name})"
            )));
        }
        if kind.namespaced && meta_str(&work, "namespace") != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let work = Self::check_body(kind, work)?;
        let mut new = Self::prepare_update(kind, &old, work, sub);
        self.admit(kind_id, &mut new, Some(&old))?;
        Ok((200, self.commit_update(&key, &old, new)))
    }

    /// What the API server does to a write before storing it: drops the fields whose feature
    /// gate is off (`crate::feature_gates`), then validates what is left.
    fn admit(&self, kind: KindId, obj: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
        if kind == RESOURCE_SLICES {
            crate::feature_gates::default_taint_times(obj, &fmt_time(now()));
            if !self.partitionable_devices {
                crate::feature_gates::drop_partitionable_devices_fields(obj, old);
            }
            if !self.device_taints {
                crate::feature_gates::drop_device_taints(obj, old);
            }
            if !self.consumable_capacity {
                crate::feature_gates::drop_consumable_capacity(obj, old);
            }
        }
        validate(kind, obj)
    }

    fn check_preconditions(kind: &KindInfo, obj: &Value, opts: &Value) -> Result<(), ApiError> {
        let name = meta_str(obj, "name");
        if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str) {
            let have = meta_str(obj, "uid");
            if !uid.is_empty() && uid != have {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"),
                ));
            }
        }
        if let Some(rv) = opts
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            let have = meta_str(obj, "resourceVersion");
            if !rv.is_empty() && rv != have {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"),
                ));
            }
        }
        Ok(())
    }

    /// DELETE: pods bound to a node terminate gracefully (per [`PodTermination`]); objects with
    /// finalizers are only marked; everything else goes at once. Returns the object.
    pub fn delete(
        &mut self,
        kind_id: KindId,
        ns: &str,
        name: &str,
        opts: &Value,
    ) -> Result<Value, ApiError> {
        let kind = &KINDS[kind_id];
        let key: Key = (kind_id, ns.to_string(), name.to_string());
        let Some(obj) = self.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(kind, name));
        };
        Self::check_preconditions(kind, &obj, opts)?;
        if kind_id == PODS {
            let phase = obj.pointer("/status/phase").and_then(Value::as_str);
            let bound = obj
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let grace = opts
                .get("gracePeriodSeconds")
                .and_then(Value::as_i64)
                .or_else(|| {
                    obj.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30);
            let grace = if !bound || matches!(phase, Some("Succeeded" | "Failed")) {
                0
            } else {
                grace.max(0)
            };
            if grace > 0 && self.termination != PodTermination::Immediate {
                if is_terminating(&obj) {
                    return Ok(obj);
                }
                let mut o = obj.clone();
                let at = now()
                    .checked_add(SignedDuration::from_secs(grace))
                    .unwrap_or_else(|_| now());
                {
                    let m = meta_mut(&mut o);
                    m.insert("deletionTimestamp".into(), json!(fmt_time(at)));
                    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                }
                let stored = self.commit(&key, Some(o));
                self.awaiting_kubelet.insert(key.clone());
                if let PodTermination::After(d) = self.termination {
                    let d = d.min(Duration::from_secs(grace as u64));
                    self.pending_timers.push((
                        key.clone(),
                        meta_str(&stored, "uid").to_string(),
                        d,
                    ));
                }
                self.after_change(kind_id, ns);
                return Ok(stored);
            }
        }
        if has_finalizers(&obj) {
            if is_terminating(&obj) {
                return Ok(obj);
            }
            let mut o = obj.clone();
            {
                let m = meta_mut(&mut o);
                m.insert("deletionTimestamp".into(), json!(fmt_time(now())));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            let stored = self.commit(&key, Some(o));
            self.after_change(kind_id, ns);
            return Ok(stored);
        }
        let stored = self.commit(&key, None);
        self.after_change(kind_id, ns);
        Ok(stored)
    }

    /// POST pods/{name}/eviction (policy/v1 Eviction): the PodDisruptionBudget check and delete
    /// of the apiserver's eviction subresource. Returns the HTTP code and Status on success.
    pub fn evict(&mut self, ns: &str, name: &str, body: &Value) -> Result<(u16, Value), ApiError> {
        let body_name = meta_str(body, "name");
        if body_name != name {
            return Err(ApiError::bad_request(
                "name in URL does not match name in Eviction object",
            ));
        }
        if let Some(v) = body.get("apiVersion").and_then(Value::as_str) {
            if v != "policy/v1" && v != "policy/v1beta1" {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({v}) does not match the expected API version (policy/v1)"
                )));
            }
        }
        let opts = body.get("deleteOptions").cloned().unwrap_or(json!({}));
        let key: Key = (PODS, ns.to_string(), name.to_string());
        let pod = self.get(PODS, ns, name)?;
        let phase = pod.pointer("/status/phase").and_then(Value::as_str);
        if matches!(phase, Some("Succeeded" | "Failed" | "Pending")) || is_terminating(&pod) {
            // Already disrupted or not yet running: the budget does not apply.
            self.delete(PODS, ns, name, &opts)?;
            return Ok((201, success_status(201)));
        }
        let pdbs: Vec<Value> = self
            .objects
            .iter()
            .filter(|((k, n, _), pdb)| {
                *k == PDBS
                    && n == ns
                    && LabelSelector::from_object(pdb.pointer("/spec/selector"))
                        .is_ok_and(|s| s.matches(&pod))
            })
            .map(|(_, v)| v.clone())
            .collect();
        if pdbs.len() > 1 {
            let mut e = ApiError::new(
                500,
                "",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            );
            e.details = None;
            return Err(e);
        }
        if let Some(pdb) = pdbs.into_iter().next() {
            let pdb_name = meta_str(&pdb, "name").to_string();
            let status = pdb.get("status").cloned().unwrap_or(json!({}));
            let int = |f: &str| status.get(f).and_then(Value::as_i64).unwrap_or(0);
            let unhealthy_ok = !pod_ready(&pod)
                && (pdb
                    .pointer("/spec/unhealthyPodEvictionPolicy")
                    .and_then(Value::as_str)
                    == Some("AlwaysAllow")
                    || (int("currentHealthy") >= int("desiredHealthy")
                        && int("desiredHealthy") > 0));
            if !unhealthy_ok {
                let generation = meta(&pdb, "generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                if int("observedGeneration") < generation {
                    let mut e = ApiError::too_many_requests(
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        10,
                    );
                    e.add_cause(
                        "DisruptionBudget",
                        &format!("The disruption budget {pdb_name} is still being processed by the server."),
                    );
                    e.blocking_pdb = Some(pdb_name.clone());
                    return Err(e);
                }
                let allowed = int("disruptionsAllowed");
                if allowed < 0 {
                    return Err(ApiError::new(
                        403,
                        "Forbidden",
                        format!("poddisruptionbudgets.policy \"{pdb_name}\" is forbidden: pdb disruptions allowed is negative"),
                    ));
                }
                if allowed == 0 {
                    let mut e = ApiError::too_many_requests(
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        0,
                    );
                    e.add_cause(
                        "DisruptionBudget",
                        &format!(
                            "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                            int("desiredHealthy"),
                            int("currentHealthy")
                        ),
                    );
                    e.blocking_pdb = Some(pdb_name.clone());
                    return Err(e);
                }
                // Decrement the budget and note the pod as disrupted, as the apiserver does
                // before deleting, so a concurrent eviction sees the smaller budget.
                let mut p = pdb.clone();
                p["status"]["disruptionsAllowed"] = json!(allowed - 1);
                if allowed - 1 == 0 {
                    if let Some(Value::Array(cs)) = p.pointer_mut("/status/conditions") {
                        for c in cs.iter_mut() {
                            if c["type"] == "DisruptionAllowed" {
                                c["status"] = json!("False");
                                c["reason"] = json!("InsufficientPods");
                                c["lastTransitionTime"] = json!(fmt_time(now()));
                            }
                        }
                    }
                }
                if !p["status"]["disruptedPods"].is_object() {
                    p["status"]["disruptedPods"] = json!({});
                }
                p["status"]["disruptedPods"][name] = json!(fmt_time(now()));
                let pdb_key: Key = (PDBS, ns.to_string(), pdb_name.clone());
                self.commit(&pdb_key, Some(p));
            }
        }
        // Mark the pod as a disruption target, then delete it.
        let mut p = pod.clone();
        let cond = json!({
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastTransitionTime": fmt_time(now()),
        });
        match p.pointer_mut("/status/conditions") {
            Some(Value::Array(cs)) => {
                cs.retain(|c| c["type"] != "DisruptionTarget");
                cs.push(cond);
            }
            _ => p["status"]["conditions"] = json!([cond]),
        }
        self.commit(&key, Some(p));
        self.delete(PODS, ns, name, &opts)?;
        Ok((201, success_status(201)))
    }

    // ---------------------------------------------------------------------------------------
    // List and watch
    // ---------------------------------------------------------------------------------------

    fn parse_rv(s: &str) -> Result<u64, ApiError> {
        s.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: \"{s}\": must be a non-negative integer"
            ))
        })
    }

    /// The objects of a kind as they were at resourceVersion `at` (within the history window),
    /// by undoing the later changes.
    fn state_at(&self, kind: KindId, at: u64) -> BTreeMap<Key, Value> {
        let mut objs: BTreeMap<Key, Value> = self
            .objects
            .iter()
            .filter(|(k, _)| k.0 == kind)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for c in self.history.iter().rev().take_while(|c| c.rv > at) {
            if c.kind != kind {
                continue;
            }
            let key: Key = (kind, c.ns.clone(), meta_str(&c.obj, "name").to_string());
            match (&c.typ, &c.prev) {
                (ChangeType::Added, _) => {
                    objs.remove(&key);
                }
                (_, Some(prev)) => {
                    objs.insert(key, prev.clone());
                }
                (_, None) => {}
            }
        }
        objs
    }

    /// The resourceVersion a list or watch needs the store to have reached first, if it is
    /// newer than the store (the caller waits a little for it, then answers 504).
    pub fn too_new(&self, q: &ListQuery) -> Option<u64> {
        let rv = q
            .resource_version
            .as_deref()
            .filter(|s| !s.is_empty() && *s != "0")?;
        let n = rv.parse::<u64>().ok()?;
        (n > self.rv).then_some(n)
    }

    pub fn list(
        &mut self,
        kind_id: KindId,
        ns: Option<&str>,
        q: &ListQuery,
    ) -> Result<Value, ApiError> {
        let kind = &KINDS[kind_id];
        let labels = LabelSelector::parse(q.label_selector.as_deref().unwrap_or(""))?;
        let fields = FieldSelector::parse(q.field_selector.as_deref().unwrap_or(""), kind)?;
        let (list_rv, items, offset) = if let Some(token) = q.continue_token.as_deref() {
            let (id, offset) = token
                .strip_prefix("kd1-")
                .and_then(|t| t.split_once('-'))
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<usize>().ok()?)))
                .ok_or_else(|| {
                    ApiError::bad_request("continue key is not valid: malformed token")
                })?;
            let snap = self.snapshots.get(&id).filter(|s| s.kind == kind_id).ok_or_else(|| {
                ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter.",
                )
            })?;
            (snap.rv, snap.items.clone(), offset)
        } else {
            let exact = q.resource_version_match.as_deref() == Some("Exact");
            let (at, objs) = match q.resource_version.as_deref() {
                Some(s) if exact && !s.is_empty() => {
                    let n = Self::parse_rv(s)?;
                    if n < self.horizon {
                        return Err(ApiError::expired(format!(
                            "too old resource version: {n} ({})",
                            self.horizon
                        )));
                    }
                    if n > self.rv {
                        return Err(ApiError::too_large_resource_version());
                    }
                    (n, self.state_at(kind_id, n))
                }
                Some(s) if !s.is_empty() && s != "0" => {
                    Self::parse_rv(s)?;
                    (self.rv, self.state_at(kind_id, self.rv))
                }
                _ => (self.rv, self.state_at(kind_id, self.rv)),
            };
            let items: Vec<Value> = objs
                .into_iter()
                .filter(|((_, n, _), v)| {
                    ns.is_none_or(|ns| ns == n) && labels.matches(v) && fields.matches(v)
                })
                .map(|(_, mut v)| {
                    if let Some(m) = v.as_object_mut() {
                        m.remove("kind");
                        m.remove("apiVersion");
                    }
                    v
                })
                .collect();
            (at, items, 0)
        };
        let limit = q.limit.filter(|&l| l > 0);
        let rest = items.len().saturating_sub(offset);
        let mut list_meta = json!({"resourceVersion": list_rv.to_string()});
        let page: Vec<Value> = match limit {
            Some(l) if rest > l => {
                let id = match q.continue_token.as_deref() {
                    Some(t) => t
                        .strip_prefix("kd1-")
                        .and_then(|t| t.split_once('-'))
                        .and_then(|(a, _)| a.parse::<u64>().ok())
                        .unwrap_or(0),
                    None => {
                        let id = self.next_id();
                        self.snapshots.insert(
                            id,
                            ListSnapshot {
                                rv: list_rv,
                                kind: kind_id,
                                items: items.clone(),
                            },
                        );
                        while self.snapshots.len() > SNAPSHOT_LIMIT {
                            self.snapshots.pop_first();
                        }
                        id
                    }
                };
                list_meta["continue"] = json!(format!("kd1-{id}-{}", offset + l));
                if labels.is_everything() && fields.is_empty() {
                    list_meta["remainingItemCount"] = json!(rest - l);
                }
                items[offset..offset + l].to_vec()
            }
            _ => items[offset.min(items.len())..].to_vec(),
        };
        Ok(json!({
            "kind": format!("{}List", kind.kind),
            "apiVersion": kind.api_version(),
            "metadata": list_meta,
            "items": page,
        }))
    }

    /// Registers a watch. Initial events (for resourceVersion "" or "0") or the replayed history
    /// (for a specific version) are queued before any later change, so none is lost or doubled.
    pub fn watch(
        &mut self,
        kind_id: KindId,
        ns: Option<&str>,
        name: Option<&str>,
        q: &ListQuery,
    ) -> Result<WatchStart, ApiError> {
        let kind = &KINDS[kind_id];
        let labels = LabelSelector::parse(q.label_selector.as_deref().unwrap_or(""))?;
        let mut fields = FieldSelector::parse(q.field_selector.as_deref().unwrap_or(""), kind)?;
        if let Some(n) = name {
            fields.add_name(n);
        }
        let rv = q.resource_version.as_deref().unwrap_or("");
        if q.send_initial_events == Some(true) {
            if q.resource_version_match.as_deref() != Some("NotOlderThan") {
                return Err(ApiError::unprocessable(
                    "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !q.allow_bookmarks {
                return Err(ApiError::unprocessable(
                    "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                ));
            }
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let w = Watcher {
            id: self.next_id(),
            kind: kind_id,
            ns: ns.map(str::to_string),
            labels,
            fields,
            tx,
        };
        let initial = match q.send_initial_events {
            Some(b) => b,
            None => rv.is_empty() || rv == "0",
        };
        if !rv.is_empty() && rv != "0" {
            let n = Self::parse_rv(rv)?;
            if n < self.horizon {
                let e =
                    ApiError::expired(format!("too old resource version: {n} ({})", self.horizon));
                return Ok(WatchStart::Expired(event_line("ERROR", &e.to_status())));
            }
            if !initial {
                for c in self.history.iter().filter(|c| c.rv > n) {
                    if let Some((typ, obj)) = Self::event_for(&w, c) {
                        let _ = w.tx.send(event_line(typ, &obj));
                    }
                }
            }
        }
        if initial {
            for ((k, n, _), obj) in &self.objects {
                if *k == kind_id && w.ns.as_ref().is_none_or(|ns| ns == n) && w.selects(obj) {
                    let _ = w.tx.send(event_line("ADDED", obj));
                }
            }
            if q.send_initial_events == Some(true) {
                let bm = json!({
                    "kind": kind.kind,
                    "apiVersion": kind.api_version(),
                    "metadata": {
                        "resourceVersion": self.rv.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                });
                let _ = w.tx.send(event_line("BOOKMARK", &bm));
            }
        }
        let id = w.id;
        self.watchers.push(w);
        Ok(WatchStart::Stream { id, rx })
    }

    // ---------------------------------------------------------------------------------------
    // Faults and logs
    // ---------------------------------------------------------------------------------------

    /// Takes the first fault rule that matches a request, if any.
    pub fn take_fault(&mut self, verb: Verb, resource: &str, qualified: &str) -> Option<Fault> {
        let i = self.faults.iter().position(|r| {
            r.remaining > 0
                && (r.verb == Verb::Any || r.verb == verb)
                && (r.resource == "*" || r.resource == resource || r.resource == qualified)
        })?;
        let rule = &mut self.faults[i];
        rule.remaining -= 1;
        let fault = rule.fault.clone();
        if rule.remaining == 0 {
            self.faults.remove(i);
        }
        Some(fault)
    }

    pub fn record_injected_eviction(&mut self, ns: &str, pod: &str, code: u16) {
        self.evictions.push(EvictionRecord {
            namespace: ns.to_string(),
            pod: pod.to_string(),
            code,
            outcome: EvictionOutcome::Injected,
            at: SystemTime::now(),
        });
    }

    pub fn record_eviction(
        &mut self,
        ns: &str,
        pod: &str,
        result: &Result<(u16, Value), ApiError>,
    ) {
        let (code, outcome) = match result {
            Ok((code, _)) => (*code, EvictionOutcome::Evicted),
            Err(e) => {
                let outcome = match &e.blocking_pdb {
                    Some(pdb) => EvictionOutcome::Blocked {
                        pdb: pdb.clone(),
                        message: e.message.clone(),
                    },
                    None => EvictionOutcome::Rejected {
                        message: e.message.clone(),
                    },
                };
                (e.code, outcome)
            }
        };
        self.evictions.push(EvictionRecord {
            namespace: ns.to_string(),
            pod: pod.to_string(),
            code,
            outcome,
            at: SystemTime::now(),
        });
    }
}

/// Field validation the apiserver applies to writes, where the agent could get it wrong:
/// ResourceSlices as `crate::validation` says; events.k8s.io/v1 Events need eventTime, type, reportingController, reportingInstance,
/// action and reason, with the apiserver's length limits.
fn validate(kind: KindId, obj: &Value) -> Result<(), ApiError> {
    if kind == RESOURCE_SLICES {
        return crate::validation::resource_slice(&KINDS[kind], meta_str(obj, "name"), obj);
    }
    if kind != EVENTS {
        return Ok(());
    }
    let name = meta_str(obj, "name");
    let k = &KINDS[kind];
    let s = |f: &str| obj.get(f).and_then(Value::as_str).unwrap_or("");
    if obj.get("eventTime").is_none_or(Value::is_null) {
        return Err(ApiError::invalid(k, name, "eventTime", "Required value"));
    }
    if !matches!(s("type"), "Normal" | "Warning") {
        let what = format!("Invalid value: \"{}\": has invalid value", s("type"));
        return Err(ApiError::invalid(k, name, "type", &what));
    }
    for (field, limit) in [
        ("reportingController", 253),
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
    ] {
        let v = s(field);
        if v.is_empty() {
            return Err(ApiError::invalid(k, name, field, "Required value"));
        }
        if v.len() > limit {
            let what = format!("Too long: may not be more than {limit} bytes");
            return Err(ApiError::invalid(k, name, field, &what));
        }
    }
    if s("note").len() > 1024 {
        return Err(ApiError::invalid(
            k,
            name,
            "note",
            "Too long: may not be more than 1024 bytes",
        ));
    }
    Ok(())
}

/// One line of a watch stream.
pub(crate) fn event_line(typ: &str, obj: &Value) -> String {
    let mut s = serde_json::to_string(&json!({"type": typ, "object": obj})).expect("json");
    s.push('\n');
    s
}
