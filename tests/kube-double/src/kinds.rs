//! The resource types the double serves, with the per-type registry behaviour the real
//! apiserver's strategies define (create-on-update, unconditional update, status subresource,
//! field selectors).

/// One served resource type.
#[derive(Debug)]
pub(crate) struct KindInfo {
    /// API group, "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// The URL path segment (`pods`, `leases`, ...).
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// A `/status` subresource exists: the main endpoint ignores `.status`, the subresource
    /// ignores everything else.
    pub status_subresource: bool,
    /// `PUT` to a missing object creates it (leases and events).
    pub allow_create_on_update: bool,
    /// `PUT` without `metadata.resourceVersion` is accepted (all but leases).
    pub allow_unconditional_update: bool,
    /// `metadata.generation` is maintained (bumped on spec changes).
    pub tracks_generation: bool,
    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    pub fields: &'static [&'static str],
}

impl KindInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods`, `leases.coordination.k8s.io`: how the apiserver names a resource in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// Index into [`KINDS`].
pub(crate) type KindId = usize;

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingComponent",
    "reportingController",
    "source",
    "type",
];

pub(crate) const KINDS: &[KindInfo] = &[
    KindInfo {
        group: "",
        version: "v1",
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: false,
        fields: &["spec.unschedulable"],
    },
    KindInfo {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: true,
        fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    KindInfo {
        group: "",
        version: "v1",
        plural: "configmaps",
        kind: "ConfigMap",
        namespaced: true,
        status_subresource: false,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: false,
        fields: &[],
    },
    KindInfo {
        group: "",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        allow_create_on_update: true,
        allow_unconditional_update: true,
        tracks_generation: false,
        fields: EVENT_FIELDS,
    },
    KindInfo {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        allow_create_on_update: true,
        allow_unconditional_update: true,
        tracks_generation: false,
        fields: EVENT_FIELDS,
    },
    KindInfo {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        allow_create_on_update: true,
        allow_unconditional_update: false,
        tracks_generation: false,
        fields: &[],
    },
    KindInfo {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        kind: "PodDisruptionBudget",
        namespaced: true,
        status_subresource: true,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: true,
        fields: &[],
    },
    // resource.k8s.io/v1 (DRA), from the apiserver's registry strategies
    // (kubernetes/kubernetes pkg/registry/resource/resourceslice/strategy.go): cluster-scoped,
    // no create on update, unconditional updates allowed, `metadata.generation` set to 1 on
    // create and bumped on any spec change, selectable fields `spec.nodeName` and `spec.driver`
    // (`toSelectableFields`). DeviceClass (.../deviceclass/strategy.go): the same without extra
    // selectable fields.
    KindInfo {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceslices",
        kind: "ResourceSlice",
        namespaced: false,
        status_subresource: false,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: true,
        fields: &["spec.nodeName", "spec.driver"],
    },
    KindInfo {
        group: "resource.k8s.io",
        version: "v1",
        plural: "deviceclasses",
        kind: "DeviceClass",
        namespaced: false,
        status_subresource: false,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: true,
        fields: &[],
    },
    // resource.k8s.io/v1 ResourceClaim (the registry's resourceclaim strategy): namespaced,
    // `/status` written by the scheduler (allocation) and the kubelet (reservedFor), generation
    // bumped on spec changes, no create on update.
    KindInfo {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaims",
        kind: "ResourceClaim",
        namespaced: true,
        status_subresource: true,
        allow_create_on_update: false,
        allow_unconditional_update: true,
        tracks_generation: true,
        fields: &[],
    },
];

pub(crate) const PODS: KindId = 1;
pub(crate) const CORE_EVENTS: KindId = 3;
pub(crate) const EVENTS: KindId = 4;
pub(crate) const PDBS: KindId = 6;
pub(crate) const RESOURCE_SLICES: KindId = 7;

/// The kind served at `group`/`version`/`plural`.
pub(crate) fn lookup(group: &str, version: &str, plural: &str) -> Option<KindId> {
    KINDS
        .iter()
        .position(|k| k.group == group && k.version == version && k.plural == plural)
}

/// The kind for a k8s-openapi type (by group and plural, any version).
pub(crate) fn lookup_type(group: &str, plural: &str) -> Option<KindId> {
    KINDS
        .iter()
        .position(|k| k.group == group && k.plural == plural)
}
