//! The sharing-profile format, `version: v1`.
//!
//! One profile per ConfigMap key; the node label `gpu-share.dev/profile` names the key. A profile
//! is a list of rules; each rule selects GPUs and gives them exactly one sharing mode:
//!
//! ```yaml
//! version: v1
//! plugin: {renameByDefault: false}
//! rules:
//!   - name: partitioned
//!     devices: [0, 1, 2, 3]
//!     mig: {1g.10gb: 7}
//!   - devices: ["4-7"]
//!     timeSlicing: {replicas: 4}
//! ```
//!
//! With `agent --plugin dra`, a rule may instead say `dynamicMig: true`: the scheduler then
//! picks each claim's MIG profile and placement, and the agent makes the instance at Prepare.
//!
//! Unknown fields are errors: a misspelt key silently ignored is how the NVIDIA plugin's users
//! lose a day (its config parse is not strict).
//!
//! Every count has an upper bound, checked by `validate` and stated in the JSON schema, so that
//! a typo cannot make the agent build a billion devices:
//!
//! | what | range | why |
//! |---|---|---|
//! | profile text | at most [`MAX_PROFILE_BYTES`] (1 MiB) | a ConfigMap cannot hold more (Kubernetes: "the data stored in a ConfigMap cannot exceed 1 MiB"); refused before parsing |
//! | `rules` | 1 to [`MAX_RULES`] (1024) | a node has at most 64 GPUs, so more rules than that cannot all select one; 1024 leaves room for product rules |
//! | `devices` indices | 0 to [`MAX_GPU_INDEX`] (63) | NVML numbers a node's GPUs from 0; the largest single systems have 16 |
//! | `timeSlicing.replicas` | 2 to [`MAX_TIME_SLICING_REPLICAS`] (1024) | each replica is one device listed to the kubelet; a node runs at most 110 pods by default, so more are never used |
//! | `mps.replicas` | 2 to [`MAX_MPS_REPLICAS`] (48) | the MPS server's client limit |
//! | `mps.activeThreadPercentage` | 1 to 100 | a percentage |
//! | `mig` counts | 1 to [`MAX_MIG_COUNT`] (7) | no GPU holds more than 7 GPU instances (the schema says so; `validate` checks each count against the catalog's per-model limit) |

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The largest profile text read, in bytes: a ConfigMap's data cannot exceed 1 MiB, so a larger
/// profile is a mistake; it is refused before it is parsed (parsing 50 MB took minutes and GBs).
pub const MAX_PROFILE_BYTES: usize = 1024 * 1024;

/// The most rules a profile may have. A node has at most [`MAX_GPU_INDEX`] + 1 GPUs, so at most
/// that many index rules can each select a GPU; the rest of the room is for product rules.
pub const MAX_RULES: usize = 1024;

/// The largest GPU index a `devices` list may name. NVML numbers a node's GPUs 0, 1, …; the
/// largest single systems (DGX-2, HGX with NVSwitch) have 16, so 64 leaves room and still
/// catches a typo such as 99999.
pub const MAX_GPU_INDEX: u32 = 63;

/// The largest count of one MIG profile: no GPU holds more than 7 GPU instances (A100, H100,
/// H200: 7 compute slices; data/mig-catalog.yaml, from the MIG User Guide).
pub const MAX_MIG_COUNT: i64 = 7;

/// The fewest time-slicing replicas: the NVIDIA device plugin refuses `replicas < 2` ("number of
/// replicas must be >= 2"); one replica is not sharing, so a profile says `exclusive: true`.
pub const MIN_TIME_SLICING_REPLICAS: i64 = 2;

/// The most time-slicing replicas per device. The NVIDIA device plugin sets no cap, but each
/// replica is one device it lists to the kubelet (and the built-in plugin builds one per replica),
/// while a node runs at most 110 pods by default (Kubernetes' `maxPods`): 1024 per GPU or MIG
/// device is more than any node can schedule, and keeps a typo such as 1000000000 from exhausting
/// memory.
pub const MAX_TIME_SLICING_REPLICAS: i64 = 1024;

/// The MPS server accepts at most 48 clients per device on compute capability >= 7.5 (16 on
/// older GPUs); NVIDIA's MPS daemon refuses more replicas ("invalid device maximum allowed
/// replicas exceeded").
pub const MAX_MPS_REPLICAS: i64 = 48;

/// A sharing profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Profile {
    /// Format version; `v1`.
    pub version: String,
    /// Free text for people reading the ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Options passed on to the device plugin.
    #[serde(default)]
    pub plugin: PluginOptions,
    /// Which GPUs share how. A GPU that no rule selects stays exclusive (one whole GPU, MIG off).
    /// 1 to 1024 rules.
    #[schemars(length(min = 1, max = MAX_RULES))]
    pub rules: Vec<Rule>,
}

/// Device-plugin options that apply to the whole node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginOptions {
    /// Advertise shared GPUs as `<name>.shared` (e.g. `nvidia.com/gpu.shared`) so pods opt in.
    #[serde(default)]
    pub rename_by_default: bool,
    /// Refuse requests for more than one shared device (the plugin's default: false for
    /// time-slicing, true for MPS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_requests_greater_than_one: Option<bool>,
    /// How MIG devices are advertised; derived from the rules when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_strategy: Option<MigStrategy>,
}

/// The device plugin's MIG strategy.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    /// MIG-enabled GPUs are advertised as whole `nvidia.com/gpu`.
    None,
    /// Every GPU has the same single MIG profile; instances are advertised as `nvidia.com/gpu`.
    Single,
    /// Each MIG profile is its own resource, `nvidia.com/mig-<profile>`.
    Mixed,
}

impl fmt::Display for MigStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        })
    }
}

/// One rule: which GPUs, and how they are shared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rule {
    /// A name for messages and events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Which GPUs this rule applies to.
    pub devices: DeviceSelector,
    /// No sharing: each GPU is one whole `nvidia.com/gpu`, MIG off. Only `true` is meaningful.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<bool>,
    /// Time-slicing: each GPU is advertised `replicas` times. Beside `mig`, time-slices each MIG
    /// device instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicing>,
    /// CUDA MPS: `replicas` clients share each GPU through one control daemon. Beside `mig`
    /// (built-in plugin only), each MIG device gets its own daemon and `replicas` clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<Mps>,
    /// MIG: the GPU-instance profiles to create on each selected GPU, name → count (1 to 7:
    /// no GPU holds more than 7 GPU instances).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "counts::mig"
    )]
    #[schemars(schema_with = "counts::mig_schema")]
    pub mig: Option<BTreeMap<String, i64>>,
    /// Dynamic MIG (`agent --plugin dra` only): publish every MIG placement each selected GPU
    /// could hold and let the scheduler choose one per ResourceClaim; the agent creates the
    /// instance when the kubelet prepares the claim and destroys it when the claim is done
    /// (docs/dra.md, "Dynamic MIG"). Selected GPUs without MIG are published as whole GPUs.
    /// Only `true` is meaningful.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_mig: Option<bool>,
}

/// Time-slicing settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeSlicing {
    /// How many pods may share each device: 2 to 1024. Each replica is one device the plugin
    /// lists to the kubelet, and a node runs at most 110 pods by default, so more than 1024 per
    /// GPU (or per MIG device) are never used.
    #[serde(deserialize_with = "counts::time_slicing_replicas")]
    #[schemars(range(min = MIN_TIME_SLICING_REPLICAS, max = MAX_TIME_SLICING_REPLICAS))]
    pub replicas: i64,
}

/// Why `timeSlicing` has no `consumable` (said after serde's "unknown field"): a share sized in
/// memory or compute would promise an isolation nothing enforces.
pub const TIME_SLICING_NOT_CONSUMABLE: &str = "time-slicing is never offered as consumable: it isolates neither memory nor compute (every share sees the whole GPU's memory and all its SMs in turn), so a share sized in memory or compute would promise what nothing enforces; use `mps: {replicas: N, consumable: {...}}`, whose limits MPS enforces per claim";

/// MPS settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mps {
    /// How many clients share each GPU; 2 to 48 (the MPS server's client limit on Volta+).
    #[serde(deserialize_with = "counts::mps_replicas")]
    #[schemars(range(min = 2, max = MAX_MPS_REPLICAS))]
    pub replicas: i64,
    /// Default `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` per client, 1–100.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "counts::active_thread_percentage"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub active_thread_percentage: Option<i64>,
    /// Default pinned device memory per client: `auto` (GPU memory / replicas) or a quantity
    /// such as `8Gi`, `8G`, `8192Mi`, `8192M`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_memory_limit: Option<String>,
    /// Fractional GPUs (`agent --plugin dra` only): each GPU is published as one DRA device
    /// that up to `replicas` claims share, each claim asking for its own memory and compute
    /// (`capacity: {requests: {memory: 10Gi, compute: 25}}`); the scheduler packs claims until
    /// the GPU's memory, its compute (100 %) or its `replicas` clients run out, and each claim's
    /// MPS limits are set from what it was given (docs/dra.md, "Fractional GPUs"). Beside
    /// `mig`, each MIG device is such a device. The daemon then has no defaults of its own, so
    /// `activeThreadPercentage` and `pinnedMemoryLimit` are not given beside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumable: Option<Consumable>,
}

/// What claims of a consumable MPS GPU may ask for, per capacity: the amount a claim that asks
/// nothing gets (`default`), the least any claim gets (`min`), and the step amounts are rounded
/// up to (`step`, from `min`). These become the device's `requestPolicy` (`default`,
/// `validRange: {min, step}`), which the scheduler applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Consumable {
    /// Pinned device memory per claim (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`), sizes such as
    /// `4Gi` or `512Mi`.
    pub memory: MemoryPolicy,
    /// Share of the GPU's SMs per claim, in percent (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`),
    /// 1 to 100.
    pub compute: ComputePolicy,
}

/// The memory request policy of a consumable MPS GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MemoryPolicy {
    /// What a claim that asks for no memory gets, e.g. `4Gi`.
    pub default: String,
    /// The least a claim gets; smaller asks are rounded up to it, e.g. `1Gi`.
    pub min: String,
    /// Asks are rounded up to `min` plus a whole number of steps, e.g. `1Gi`.
    pub step: String,
}

/// The compute request policy of a consumable MPS GPU, in percent of its SMs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ComputePolicy {
    /// What a claim that asks for no compute gets, 1 to 100.
    #[schemars(range(min = 1, max = 100))]
    pub default: i64,
    /// The least a claim gets, 1 to 100.
    #[schemars(range(min = 1, max = 100))]
    pub min: i64,
    /// Asks are rounded up to `min` plus a whole number of steps, 1 to 99.
    #[schemars(range(min = 1, max = 99))]
    pub step: i64,
}

/// Which GPUs a rule selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    /// `devices: all`.
    All,
    /// `devices: [0, 1, "4-7"]`: GPU indices as NVML numbers them.
    Indices(Vec<u32>),
    /// `devices: {product: "NVIDIA H100*"}`: NVML product names, `*` matching any text.
    Product(String),
}

impl DeviceSelector {
    /// Whether the GPU at `index` with product name `product` is selected.
    pub fn selects(&self, index: u32, product: &str) -> bool {
        match self {
            DeviceSelector::All => true,
            DeviceSelector::Indices(list) => list.contains(&index),
            DeviceSelector::Product(pattern) => glob_matches(pattern, product),
        }
    }
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::All => f.write_str("all"),
            DeviceSelector::Indices(list) => {
                let items: Vec<String> = list.iter().map(u32::to_string).collect();
                write!(f, "[{}]", items.join(", "))
            }
            DeviceSelector::Product(p) => write!(f, "product {p:?}"),
        }
    }
}

/// Case-insensitive glob where `*` matches any run of characters.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase();
    let text = text.to_ascii_lowercase();
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    if !text.ends_with(last) {
        return false;
    }
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

mod selector_serde {
    //! `devices:` takes three shapes; a hand-written visitor gives errors that say which.
    use super::DeviceSelector;
    use serde::de::{self, MapAccess, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::fmt;

    const EXPECTED: &str =
        "`all`, a list of GPU indices such as [0, 1, \"4-7\"], or {product: \"NVIDIA H100*\"}";

    impl<'de> Deserialize<'de> for DeviceSelector {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(SelectorVisitor)
        }
    }

    struct SelectorVisitor;

    impl<'de> Visitor<'de> for SelectorVisitor {
        type Value = DeviceSelector;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(EXPECTED)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            if v == "all" {
                Ok(DeviceSelector::All)
            } else {
                Err(E::custom(format!("devices: {v:?} is not {EXPECTED}")))
            }
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut indices = Vec::new();
            while let Some(item) = seq.next_element::<IndexItem>()? {
                match item {
                    IndexItem::One(i) => indices.push(index_from(i)?),
                    IndexItem::Range(r) => {
                        indices.extend(parse_range(&r).map_err(de::Error::custom)?)
                    }
                }
                if indices.len() > MAX_INDICES {
                    return Err(de::Error::custom(format!(
                        "devices lists more than {MAX_INDICES} GPU indices"
                    )));
                }
            }
            Ok(DeviceSelector::Indices(indices))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut product = None;
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "product" if product.is_none() => product = Some(map.next_value::<String>()?),
                    "product" => return Err(de::Error::duplicate_field("product")),
                    other => return Err(de::Error::unknown_field(other, &["product"])),
                }
            }
            product
                .map(DeviceSelector::Product)
                .ok_or_else(|| de::Error::missing_field("product"))
        }
    }

    fn index_from<E: de::Error>(i: i64) -> Result<u32, E> {
        u32::try_from(i).map_err(|_| E::custom(format!("GPU index {i} is negative or too large")))
    }

    /// More indices than any node has GPUs: a typo such as "0-4294967295" is refused before it
    /// is expanded (found by fuzzing: it allocated 16 GiB).
    const MAX_INDICES: usize = 1024;

    /// A `devices` entry that is not an index or a range of them.
    #[derive(Debug, thiserror::Error)]
    enum RangeError {
        #[error("devices: {0:?} is not a GPU index or a range such as \"4-7\"")]
        NotARange(String),
        #[error("devices: range {0:?} runs backwards")]
        Backwards(String),
        #[error("devices: range {0:?} spans more than {MAX_INDICES} GPUs")]
        TooWide(String),
    }

    /// `"4-7"` → 4, 5, 6, 7; `"3"` → 3.
    fn parse_range(text: &str) -> Result<Vec<u32>, RangeError> {
        let bad = || RangeError::NotARange(text.to_string());
        let (lo, hi) = match text.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (text.trim(), text.trim()),
        };
        let lo: u32 = lo.parse().map_err(|_| bad())?;
        let hi: u32 = hi.parse().map_err(|_| bad())?;
        if lo > hi {
            return Err(RangeError::Backwards(text.to_string()));
        }
        if (hi - lo) as usize >= MAX_INDICES {
            return Err(RangeError::TooWide(text.to_string()));
        }
        Ok((lo..=hi).collect())
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IndexItem {
        One(i64),
        Range(String),
    }

    impl Serialize for DeviceSelector {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            match self {
                DeviceSelector::All => s.serialize_str("all"),
                DeviceSelector::Indices(list) => list.serialize(s),
                DeviceSelector::Product(p) => {
                    let mut m = s.serialize_map(Some(1))?;
                    m.serialize_entry("product", p)?;
                    m.end()
                }
            }
        }
    }
}

mod counts {
    //! Counts are read as any integer YAML can write, so a number too large for `i64` is
    //! refused with the field's name and range instead of a bare type error; the range itself
    //! is checked by `validate`, which names the profile and rule.
    use serde::de::{self, Deserializer, MapAccess, Visitor};
    use std::collections::BTreeMap;
    use std::fmt;

    /// One count field: its name as written in a profile and its valid range, for messages.
    struct Count {
        field: &'static str,
        min: i64,
        max: i64,
    }

    impl Count {
        fn too_large<E: de::Error>(&self, shown: impl fmt::Display) -> E {
            E::custom(format!(
                "{} is {shown}, but it must be between {} and {}",
                self.field, self.min, self.max
            ))
        }
    }

    impl<'de> Visitor<'de> for &Count {
        type Value = i64;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(
                f,
                "{}: a whole number from {} to {}",
                self.field, self.min, self.max
            )
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| self.too_large(v))
        }

        fn visit_i128<E: de::Error>(self, v: i128) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| self.too_large(v))
        }

        fn visit_u128<E: de::Error>(self, v: u128) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| self.too_large(v))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<i64, E> {
            Err(E::custom(format!(
                "{} is {v}, but it must be a whole number between {} and {}",
                self.field, self.min, self.max
            )))
        }
    }

    const TIME_SLICING_REPLICAS: Count = Count {
        field: "timeSlicing.replicas",
        min: super::MIN_TIME_SLICING_REPLICAS,
        max: super::MAX_TIME_SLICING_REPLICAS,
    };
    const MPS_REPLICAS: Count = Count {
        field: "mps.replicas",
        min: 2,
        max: super::MAX_MPS_REPLICAS,
    };
    const ACTIVE_THREAD_PERCENTAGE: Count = Count {
        field: "mps.activeThreadPercentage",
        min: 1,
        max: 100,
    };
    const MIG_COUNT: Count = Count {
        field: "the MIG count",
        min: 1,
        max: super::MAX_MIG_COUNT,
    };

    pub fn time_slicing_replicas<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        d.deserialize_any(&TIME_SLICING_REPLICAS)
    }

    pub fn mps_replicas<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        d.deserialize_any(&MPS_REPLICAS)
    }

    pub fn active_thread_percentage<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<i64>, D::Error> {
        d.deserialize_option(Optional(&ACTIVE_THREAD_PERCENTAGE))
    }

    pub fn mig<'de, D: Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, i64>>, D::Error> {
        d.deserialize_option(Optional(MigVisitor))
    }

    /// `null` is `None`, as for any optional field; anything else goes to the inner visitor.
    struct Optional<V>(V);

    impl<'de, V: Visitor<'de>> Visitor<'de> for Optional<V> {
        type Value = Option<V::Value>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            self.0.expecting(f)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self.0).map(Some)
        }
    }

    struct MigVisitor;

    /// One count of `{profile: count}`; serde_yaml's error path names the profile.
    struct MigCount;

    impl<'de> de::DeserializeSeed<'de> for MigCount {
        type Value = i64;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<i64, D::Error> {
            d.deserialize_any(&MIG_COUNT)
        }
    }

    impl<'de> Visitor<'de> for MigVisitor {
        type Value = BTreeMap<String, i64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("MIG profile: count pairs such as {1g.10gb: 7}")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                let count = map.next_value_seed(MigCount)?;
                if out.insert(name.clone(), count).is_some() {
                    return Err(de::Error::custom(format!("mig lists {name} twice")));
                }
            }
            Ok(out)
        }
    }

    pub fn mig_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "additionalProperties": {"type": "integer", "minimum": 1, "maximum": super::MAX_MIG_COUNT}
        })
    }
}

impl JsonSchema for DeviceSelector {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DeviceSelector".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Which GPUs a rule selects: `all`, a list of NVML indices (numbers or ranges such as \"4-7\"), or a product-name glob.",
            "oneOf": [
                {"const": "all"},
                {"type": "array", "minItems": 1, "maxItems": MAX_GPU_INDEX + 1, "items": {"oneOf": [
                    {"type": "integer", "minimum": 0, "maximum": MAX_GPU_INDEX},
                    {"type": "string", "pattern": "^[0-9]+(-[0-9]+)?$"}
                ]}},
                {"type": "object", "additionalProperties": false, "required": ["product"],
                 "properties": {"product": {"type": "string", "description": "NVML product name; `*` matches any text, case-insensitive"}}}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_matches("NVIDIA H100*", "NVIDIA H100 80GB HBM3"));
        assert!(glob_matches("*h100*", "NVIDIA H100 NVL"));
        assert!(glob_matches("NVIDIA A30", "nvidia a30"));
        assert!(!glob_matches("NVIDIA A30", "NVIDIA A30X"));
        assert!(!glob_matches("*H200", "NVIDIA H200 NVL"));
        assert!(glob_matches("NVIDIA*NVL", "NVIDIA H200 NVL"));
        assert!(!glob_matches("ab*ba", "aba"));
    }

    #[test]
    fn selectors_parse_in_three_shapes() {
        let all: DeviceSelector = serde_yaml::from_str("all").unwrap();
        assert_eq!(all, DeviceSelector::All);
        let list: DeviceSelector = serde_yaml::from_str("[0, \"2-4\", 7]").unwrap();
        assert_eq!(list, DeviceSelector::Indices(vec![0, 2, 3, 4, 7]));
        let p: DeviceSelector = serde_yaml::from_str("{product: 'NVIDIA H100*'}").unwrap();
        assert_eq!(p, DeviceSelector::Product("NVIDIA H100*".into()));
        let err = serde_yaml::from_str::<DeviceSelector>("some").unwrap_err();
        assert!(err.to_string().contains("\"some\" is not `all`"), "{err}");
        let err = serde_yaml::from_str::<DeviceSelector>("[-1]").unwrap_err();
        assert!(err.to_string().contains("GPU index -1"), "{err}");
        let err = serde_yaml::from_str::<DeviceSelector>("{model: x}").unwrap_err();
        assert!(err.to_string().contains("unknown field `model`"), "{err}");
    }
}
