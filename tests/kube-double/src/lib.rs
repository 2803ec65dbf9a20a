//! A Kubernetes API server double for tests that drive the real kube client over HTTP.
//!
//! [`KubeDouble::start`] serves nodes, pods (with the eviction subresource and
//! PodDisruptionBudgets), configmaps, events (core/v1 and events.k8s.io/v1) and
//! coordination.k8s.io/v1 leases on `http://127.0.0.1:<random port>`, from its own tokio runtime
//! on a background thread, so sync and async tests can both use it. Objects are seeded and
//! inspected through typed k8s-openapi values; faults (error statuses, hangs, dropped watches,
//! compaction) are injected through the same handle. See the crate README for which documented
//! API semantics are implemented and which are not.
//!
//! ```no_run
//! use kube_double::{fixtures, KubeDouble};
//! let double = KubeDouble::start();
//! double.put_node(fixtures::node("gpu-1", &[("gpu-share.dev/profile", "small")]));
//! std::fs::write("/tmp/kubeconfig", double.kubeconfig_yaml()).unwrap();
//! // KUBECONFIG=/tmp/kubeconfig my-agent ...  or  kube::Client::try_from(double.client_config())
//! ```

#![forbid(unsafe_code)]

mod feature_gates;
mod kinds;
mod patch;
mod selectors;
mod server;
mod status;
mod store;
mod validation;
pub use validation::{is_qualified_name, quantity};

pub mod fixtures;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use kinds::{KindId, CORE_EVENTS, EVENTS, KINDS, PDBS, PODS, RESOURCE_SLICES};
use store::{Key, State};

/// An API verb, as RBAC names them. `Any` only matches, in [`KubeDouble::fail_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    Any,
}

/// What an injected fault does to a matching request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status and a matching `Status` body (`InternalError` for 500,
    /// `ServiceUnavailable` for 503, `TooManyRequests` with `Retry-After: 1` for 429, ...).
    Status(u16),
    /// Never answer: the request hangs until the client times out or the double stops.
    Hang,
    /// Answer normally, after this delay.
    Delay(Duration),
}

/// How the simulated kubelet finishes a graceful pod deletion (a DELETE or eviction of a pod
/// bound to a node, with a grace period above zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodTermination {
    /// The pod is gone at once (default): one DELETED event.
    Immediate,
    /// The pod stays `Terminating` (deletionTimestamp set, a MODIFIED event) for this long, or
    /// its grace period if shorter, then is deleted.
    After(Duration),
    /// The pod stays `Terminating` until [`KubeDouble::finish_pod_termination`].
    Manual,
}

/// One request the double received.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw query string.
    pub query: String,
    pub verb: Verb,
    /// `pods`, `pods/eviction`, `nodes/status`, `leases`, ...; "" for discovery and health.
    pub resource: String,
    /// The API group ("" for core).
    pub group: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub content_type: Option<String>,
    /// Who the API server records the write as: `fieldManager`, else the User-Agent's product
    /// (server.rs, `field_manager`).
    pub field_manager: String,
    /// The HTTP status; `None` while the request is still being answered (or hangs).
    pub code: Option<u16>,
    /// An injected fault answered it.
    pub injected: bool,
}

/// How an eviction request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// The pod was deleted (or, with a termination delay, is terminating).
    Evicted,
    /// A PodDisruptionBudget refused it (429).
    Blocked { pdb: String, message: String },
    /// Refused otherwise (404, 400, 500 for several PDBs, 403, ...).
    Rejected { message: String },
    /// An injected fault answered it.
    Injected,
}

/// One eviction attempt.
#[derive(Debug, Clone)]
pub struct EvictionRecord {
    pub namespace: String,
    pub pod: String,
    /// The HTTP status returned (201 when evicted, 429 when a budget blocked it).
    pub code: u16,
    pub outcome: EvictionOutcome,
    pub at: SystemTime,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    handle: tokio::runtime::Handle,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the state, then starts the pod-termination timers it scheduled.
    pub(crate) fn with<R>(self: &Arc<Self>, f: impl FnOnce(&mut State) -> R) -> R {
        let (r, timers) = {
            let mut st = self.lock();
            let r = f(&mut st);
            (r, std::mem::take(&mut st.pending_timers))
        };
        for (key, uid, delay) in timers {
            let shared = Arc::clone(self);
            self.handle.spawn(async move {
                tokio::time::sleep(delay).await;
                // Finishing a termination schedules no timers, so the plain lock is enough.
                shared.lock().finish_termination(&key, Some(&uid));
            });
        }
        r
    }
}

/// A running Kubernetes API double. Dropping it stops the server and closes all connections.
pub struct KubeDouble {
    shared: Arc<Shared>,
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

fn to_value<K: Serialize>(obj: &K) -> Value {
    serde_json::to_value(obj).expect("kube-double: serialize object")
}

fn from_value<K: DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).expect("kube-double: stored object does not deserialize")
}

fn kind_of<K: k8s_openapi::Resource>() -> KindId {
    kinds::lookup_type(K::GROUP, K::URL_PATH_SEGMENT).unwrap_or_else(|| {
        panic!(
            "kube-double does not serve {}/{} ({})",
            K::GROUP,
            K::URL_PATH_SEGMENT,
            K::KIND
        )
    })
}

fn key_for(kind: KindId, namespace: Option<&str>, name: &str) -> Key {
    let ns = if KINDS[kind].namespaced {
        namespace.unwrap_or("default").to_string()
    } else {
        String::new()
    };
    (kind, ns, name.to_string())
}

impl KubeDouble {
    /// Starts the double on 127.0.0.1 with a free port.
    pub fn start() -> KubeDouble {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).expect("kube-double: bind 127.0.0.1")
    }

    /// Starts the double on a given address (port 0 picks a free one).
    pub fn start_on(addr: SocketAddr) -> std::io::Result<KubeDouble> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("kube-double-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("kube-double: tokio runtime");
                let shared = Arc::new(Shared {
                    state: Mutex::new(State::new()),
                    handle: rt.handle().clone(),
                });
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(shared.clone()));
                    let app = server::router(shared);
                    tokio::select! {
                        r = axum::serve(listener, app) => {
                            if let Err(e) = r {
                                eprintln!("kube-double: server stopped: {e}");
                            }
                        }
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime here cancels every connection task (hung requests,
                // open watches).
            })?;
        let shared = ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("kube-double: server thread died"))??;
        Ok(KubeDouble {
            shared,
            addr,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.shared.with(f)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig for this double: plain http, no credentials, namespace `default`.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-double\n  cluster:\n    server: {url}\n\
             contexts:\n- name: kube-double\n  context:\n    cluster: kube-double\n    user: kube-double\n    namespace: default\n\
             current-context: kube-double\nusers:\n- name: kube-double\n  user: {{}}\n",
            url = self.url()
        )
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` (for a binary under test: `KUBECONFIG=path`).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// A kube client configuration for this double (default namespace `default`), with kube's
    /// defaults otherwise — including `default_retry: true`: the kube 5 client then retries
    /// 429, 503 and 504 answers by itself (up to 15 times, exponential backoff from 5 ms,
    /// honouring `Retry-After`), so a PodDisruptionBudget 429 on an eviction only surfaces after
    /// minutes. Set `default_retry = false` to see every answer (see [`Self::client_no_retry`]).
    pub fn client_config(&self) -> kube::Config {
        let mut c = kube::Config::new(self.url().parse().expect("kube-double: url"));
        c.default_namespace = "default".into();
        c
    }

    /// A kube client for this double. Call it inside a tokio runtime (the client spawns its
    /// connection tasks there).
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.client_config()).expect("kube-double: build kube client")
    }

    /// [`Self::client`] without kube's built-in retry of 429/503/504 answers.
    pub fn client_no_retry(&self) -> kube::Client {
        let mut c = self.client_config();
        c.default_retry = false;
        kube::Client::try_from(c).expect("kube-double: build kube client")
    }

    // ---------------------------------------------------------------------------------------
    // Generic typed access
    // ---------------------------------------------------------------------------------------

    /// Creates or replaces an object as a controller writing straight to storage would: status
    /// is kept as given, uid/creationTimestamp are filled in, the resourceVersion is new, and
    /// watches see ADDED or MODIFIED. Namespaced objects without a namespace go to `default`.
    /// Returns the stored object. Panics for a type the double does not serve.
    pub fn put<K>(&self, obj: K) -> K
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let kind = kind_of::<K>();
        from_value(self.with(|st| st.put(kind, to_value(&obj))))
    }

    /// An object, by namespace (ignored for cluster-scoped types) and name.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let key = key_for(kind_of::<K>(), namespace, name);
        self.with(|st| st.object(&key).cloned()).map(from_value)
    }

    /// All objects of a type, in one namespace or (None) all of them.
    pub fn list<K>(&self, namespace: Option<&str>) -> Vec<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let kind = kind_of::<K>();
        self.with(|st| st.objects_of(kind, namespace))
            .into_iter()
            .map(from_value)
            .collect()
    }

    /// Changes a stored object in place (as [`Self::put`] stores it). `None` if it is missing.
    pub fn modify<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut K),
    ) -> Option<K>
    where
        K: k8s_openapi::Resource + Serialize + DeserializeOwned,
    {
        let kind = kind_of::<K>();
        let key = key_for(kind, namespace, name);
        self.with(|st| {
            let mut obj: K = from_value(st.object(&key)?.clone());
            f(&mut obj);
            Some(from_value(st.put(kind, to_value(&obj))))
        })
    }

    /// Removes an object at once, bypassing graceful deletion and finalizers (watches see
    /// DELETED). Returns it, if it existed.
    pub fn remove<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: k8s_openapi::Resource + DeserializeOwned,
    {
        let key = key_for(kind_of::<K>(), namespace, name);
        self.with(|st| st.remove(&key)).map(from_value)
    }

    // ---------------------------------------------------------------------------------------
    // DRA: resource.k8s.io/v1 has no k8s-openapi type under the workspace's `v1_33`, so these
    // take and give JSON.
    // ---------------------------------------------------------------------------------------

    /// Every ResourceSlice, by name.
    pub fn resource_slices(&self) -> Vec<Value> {
        self.with(|st| st.objects_of(RESOURCE_SLICES, None))
    }

    /// Deletes a ResourceSlice, as the kubelet does with a node's slices when it restarts.
    pub fn remove_resource_slice(&self, name: &str) -> Option<Value> {
        let key = key_for(RESOURCE_SLICES, None, name);
        self.with(|st| st.remove(&key))
    }

    /// Stores a ResourceSlice as a controller would (see [`KubeDouble::put`]).
    pub fn put_resource_slice(&self, slice: Value) -> Value {
        self.with(|st| st.put(RESOURCE_SLICES, slice))
    }

    // ---------------------------------------------------------------------------------------
    // Nodes
    // ---------------------------------------------------------------------------------------

    pub fn put_node(&self, node: Node) -> Node {
        self.put(node)
    }

    pub fn node(&self, name: &str) -> Option<Node> {
        self.get(None, name)
    }

    pub fn nodes(&self) -> Vec<Node> {
        self.list(None)
    }

    /// Sets (`Some`) or removes (`None`) one label of a node, as `kubectl label` would.
    /// Panics if the node does not exist.
    pub fn set_node_label(&self, node: &str, key: &str, value: Option<&str>) -> Node {
        self.modify::<Node>(None, node, |n| {
            let labels = n.metadata.labels.get_or_insert_with(Default::default);
            match value {
                Some(v) => {
                    labels.insert(key.to_string(), v.to_string());
                }
                None => {
                    labels.remove(key);
                }
            }
        })
        .unwrap_or_else(|| panic!("kube-double: no node {node}"))
    }

    // ---------------------------------------------------------------------------------------
    // Pods
    // ---------------------------------------------------------------------------------------

    pub fn put_pod(&self, pod: Pod) -> Pod {
        self.put(pod)
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.get(Some(namespace), name)
    }

    /// Pods bound to a node (`spec.nodeName`), all namespaces, terminating ones included.
    pub fn pods_on(&self, node: &str) -> Vec<Pod> {
        self.list::<Pod>(None)
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .collect()
    }

    /// Sets the pod's `Ready` (and `ContainersReady`) condition, as the kubelet reports
    /// readiness. Panics if the pod does not exist.
    pub fn set_pod_ready(&self, namespace: &str, name: &str, ready: bool) -> Pod {
        let kind = PODS;
        let key = key_for(kind, Some(namespace), name);
        let v = self.with(|st| {
            let mut pod = st
                .object(&key)
                .cloned()
                .unwrap_or_else(|| panic!("kube-double: no pod {namespace}/{name}"));
            let status = if ready { "True" } else { "False" };
            if !pod["status"].is_object() {
                pod["status"] = json!({});
            }
            if !pod["status"]["conditions"].is_array() {
                pod["status"]["conditions"] = json!([]);
            }
            let conds = pod["status"]["conditions"].as_array_mut().expect("array");
            for t in ["Ready", "ContainersReady"] {
                match conds.iter_mut().find(|c| c["type"] == t) {
                    Some(c) => c["status"] = json!(status),
                    None => conds.push(json!({"type": t, "status": status})),
                }
            }
            st.put(kind, pod)
        });
        from_value(v)
    }

    /// Chooses how graceful pod deletions finish (default [`PodTermination::Immediate`]).
    pub fn set_pod_termination(&self, mode: PodTermination) {
        self.with(|st| st.termination = mode);
    }

    /// Ends a terminating pod's graceful deletion now (the pod is deleted unless finalizers
    /// hold it). Returns false if the pod is not terminating.
    pub fn finish_pod_termination(&self, namespace: &str, name: &str) -> bool {
        let key = key_for(PODS, Some(namespace), name);
        self.with(|st| st.finish_termination(&key, None))
    }

    // ---------------------------------------------------------------------------------------
    // ConfigMaps
    // ---------------------------------------------------------------------------------------

    pub fn put_configmap(&self, cm: ConfigMap) -> ConfigMap {
        self.put(cm)
    }

    pub fn configmap(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        self.get(Some(namespace), name)
    }

    /// Sets (`Some`) or removes (`None`) one `data` key. Panics if the ConfigMap is missing.
    pub fn update_configmap_key(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> ConfigMap {
        self.modify::<ConfigMap>(Some(namespace), name, |cm| {
            let data = cm.data.get_or_insert_with(Default::default);
            match value {
                Some(v) => {
                    data.insert(key.to_string(), v.to_string());
                }
                None => {
                    data.remove(key);
                }
            }
        })
        .unwrap_or_else(|| panic!("kube-double: no configmap {namespace}/{name}"))
    }

    // ---------------------------------------------------------------------------------------
    // PodDisruptionBudgets
    // ---------------------------------------------------------------------------------------

    /// Creates or replaces a PDB; its status is computed at once by the simulated disruption
    /// controller (unless paused).
    pub fn put_pdb(&self, pdb: PodDisruptionBudget) -> PodDisruptionBudget {
        let ns = pdb
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pdb.metadata.name.clone().unwrap_or_default();
        self.put(pdb);
        self.pdb(&ns, &name).expect("stored pdb")
    }

    pub fn pdb(&self, namespace: &str, name: &str) -> Option<PodDisruptionBudget> {
        self.get(Some(namespace), name)
    }

    /// Pins the number of pods a PDB expects (`status.expectedPods`), as the scale of the pods'
    /// controller would; `None` goes back to counting the pods the selector matches.
    pub fn set_pdb_expected_pods(&self, namespace: &str, name: &str, expected: Option<i32>) {
        self.with(|st| {
            let k = (namespace.to_string(), name.to_string());
            match expected {
                Some(n) => st.pdb_expected.insert(k, n),
                None => st.pdb_expected.remove(&k),
            };
            st.recompute_pdbs(namespace);
        });
    }

    /// Turns the API server's `DRAPartitionableDevices` feature gate on (the default, as in
    /// Kubernetes 1.36) or off (the 1.34 and 1.35 default): while off, ResourceSlice writes
    /// lose their counters as a real server drops them (`feature_gates`).
    pub fn set_partitionable_devices(&self, enabled: bool) {
        self.with(|st| st.partitionable_devices = enabled);
    }

    /// Turns the API server's `DRADeviceTaints` feature gate on (the default, beta in
    /// Kubernetes 1.36) or off (before 1.36): while off, ResourceSlice writes lose their devices'
    /// taints as a real server drops them (`feature_gates`).
    pub fn set_device_taints(&self, enabled: bool) {
        self.with(|st| st.device_taints = enabled);
    }

    /// Turns the API server's `DRAConsumableCapacity` feature gate on (the default, beta in
    /// Kubernetes 1.36) or off (before 1.36): while off, ResourceSlice writes lose
    /// `allowMultipleAllocations` and every capacity's `requestPolicy` as a real server drops
    /// them (`feature_gates`).
    pub fn set_consumable_capacity(&self, enabled: bool) {
        self.with(|st| st.consumable_capacity = enabled);
    }

    /// Stops (true) or resumes the simulated disruption controller. While stopped, PDB status is
    /// not recomputed; a PDB whose spec changed then has `observedGeneration < generation` and
    /// evictions get 429 "still being processed".
    pub fn pause_disruption_controller(&self, paused: bool) {
        self.with(|st| {
            st.disruption_paused = paused;
            if !paused {
                let namespaces: Vec<String> = st
                    .objects_of(PDBS, None)
                    .iter()
                    .filter_map(|p| p.pointer("/metadata/namespace").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect();
                for ns in namespaces {
                    st.recompute_pdbs(&ns);
                }
            }
        });
    }

    // ---------------------------------------------------------------------------------------
    // Events and leases
    // ---------------------------------------------------------------------------------------

    /// events.k8s.io/v1 Events (what kube-runtime's `Recorder` writes), oldest first.
    pub fn events(&self) -> Vec<Event> {
        let mut v = self.with(|st| st.objects_of(EVENTS, None));
        v.sort_by_key(|e| {
            e.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        });
        v.into_iter().map(from_value).collect()
    }

    /// core/v1 Events, oldest first.
    pub fn core_events(&self) -> Vec<CoreEvent> {
        let mut v = self.with(|st| st.objects_of(CORE_EVENTS, None));
        v.sort_by_key(|e| {
            e.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        });
        v.into_iter().map(from_value).collect()
    }

    pub fn leases(&self) -> Vec<Lease> {
        self.list(None)
    }

    pub fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.get(Some(namespace), name)
    }

    pub fn put_lease(&self, lease: Lease) -> Lease {
        self.put(lease)
    }

    // ---------------------------------------------------------------------------------------
    // Logs
    // ---------------------------------------------------------------------------------------

    /// Every eviction attempt so far, in order.
    pub fn evictions(&self) -> Vec<EvictionRecord> {
        self.with(|st| st.evictions.clone())
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.with(|st| st.requests.clone())
    }

    /// How many writes (create, update, patch, delete) of `resource` (its plural, as in
    /// [`RequestRecord::resource`]) arrived so far.
    pub fn writes_to(&self, resource: &str) -> usize {
        self.with(|st| {
            st.requests
                .iter()
                .filter(|r| r.resource == resource)
                .filter(|r| {
                    matches!(
                        r.verb,
                        Verb::Create | Verb::Update | Verb::Patch | Verb::Delete
                    )
                })
                .count()
        })
    }

    pub fn clear_requests(&self) {
        self.with(|st| st.requests.clear());
    }

    // ---------------------------------------------------------------------------------------
    // Faults and watch control
    // ---------------------------------------------------------------------------------------

    /// Makes the next `count` requests with this verb on this resource fail with `fault`.
    /// `resource` is the plural with an optional subresource (`"pods/eviction"`,
    /// `"nodes/status"`), optionally group-qualified (`"leases.coordination.k8s.io"`), or `"*"`.
    /// Rules are checked in the order they were added; each request consumes one match.
    pub fn fail_next(&self, verb: Verb, resource: &str, count: usize, fault: Fault) {
        if count == 0 {
            return;
        }
        self.with(|st| {
            st.faults.push(store::FaultRule {
                verb,
                resource: resource.to_string(),
                remaining: count,
                fault,
            })
        });
    }

    pub fn clear_faults(&self) {
        self.with(|st| st.faults.clear());
    }

    /// Ends every open watch now (the clients see their streams end). Returns how many.
    pub fn drop_watches(&self) -> usize {
        self.with(|st| st.drop_watches())
    }

    /// How many watches are open.
    pub fn open_watches(&self) -> usize {
        self.with(|st| st.watchers.len())
    }

    /// Compacts the history: every resourceVersion handed out so far becomes too old, so a
    /// watch resumed from one gets a 410 Expired ERROR event (and kube-runtime's watcher
    /// re-lists). Open watches are not affected; combine with [`Self::drop_watches`].
    pub fn compact(&self) {
        self.with(|st| st.compact());
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> String {
        self.with(|st| st.rv.to_string())
    }

    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK (default 1s; applies
    /// to watches opened afterwards).
    pub fn set_bookmark_interval(&self, every: Duration) {
        assert!(!every.is_zero(), "kube-double: zero bookmark interval");
        self.with(|st| st.bookmark_interval = every);
    }

    // ---------------------------------------------------------------------------------------
    // Waiting
    // ---------------------------------------------------------------------------------------

    /// Polls `cond` every 10 ms until it holds (true) or `timeout` passes (false). Blocks the
    /// calling thread: in an async test use [`Self::wait_until_async`].
    pub fn wait_until(&self, timeout: Duration, mut cond: impl FnMut(&KubeDouble) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`Self::wait_until`] for async tests (yields to the test's runtime between polls).
    pub async fn wait_until_async(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&KubeDouble) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for KubeDouble {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
