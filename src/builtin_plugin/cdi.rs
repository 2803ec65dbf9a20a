//! How an `Allocate` answer names its devices to the container runtime: the
//! `NVIDIA_VISIBLE_DEVICES` variable (the NVIDIA container runtime's legacy mode) and/or CDI
//! device names, the NVIDIA plugin's `deviceListStrategy` (docs/sources.md#device-plugin-config).
//! Pure: [`DeviceListing::apply`] rewrites the response [`ResourceDevices::allocate`] built.
//!
//! What the NVIDIA plugin does (k8s-device-plugin `internal/plugin/server.go`,
//! `getAllocateResponse` and `updateResponseForCDI`), and so what this does:
//!
//! - the devices are the request's IDs with the replica suffix (`::<n>`) stripped, each once;
//! - `cdi-annotations`: one annotation `<prefix>nvidia-device-plugin_<response id>` whose value is
//!   the CDI names joined by commas (the CDI library's `UpdateAnnotations` key and value);
//! - `cdi-cri`: the CDI names in the response's `cdi_devices` (kubelet 1.28+, containerd 1.7+,
//!   CRI-O 1.24+ pass them to the runtime);
//! - when only CDI strategies are chosen, no `NVIDIA_VISIBLE_DEVICES` (the early return for
//!   `AllCDIEnabled`); the MPS settings stay either way.
//!
//! The CDI names: NVIDIA's plugin names devices `k8s.device-plugin.nvidia.com/gpu=<UUID>` and
//! writes that spec itself (vendor set in its `plugin-manager.go`, spec generated through
//! nvcdi with the UUID namer). gpu-share does not generate specs; it names the devices of the
//! spec a stock `nvidia-ctk cdi generate` writes: kind `nvidia.com/gpu` (the command's default
//! vendor and class), device names by UUID (the command's default `--device-name-strategy` is
//! `index` and `uuid`; older toolkits default to `index` alone and need
//! `--device-name-strategy=uuid`). GPU and MIG devices alike are named by their UUID
//! (`GPU-…`, `MIG-…`). `--cdi-kind` names another kind, e.g. the NVIDIA plugin's.
//!
//! [`ResourceDevices::allocate`]: super::inventory::ResourceDevices::allocate

use std::collections::BTreeSet;

use super::api;

/// The kind (`vendor/class`) of the devices in `nvidia-ctk cdi generate`'s default spec.
pub const DEFAULT_KIND: &str = "nvidia.com/gpu";
/// The CDI annotation prefix container runtimes read (the NVIDIA plugin's default).
pub const DEFAULT_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// The plugin part of the annotation key, as the NVIDIA plugin writes it.
const ANNOTATION_PLUGIN: &str = "nvidia-device-plugin";
const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// One way of telling the runtime which devices a container gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum DeviceListStrategy {
    /// `NVIDIA_VISIBLE_DEVICES` with the UUIDs (NVIDIA container runtime or hook).
    Envvar,
    /// CDI device names in the Allocate response's `cdi_devices` field.
    CdiCri,
    /// CDI device names in a `cdi.k8s.io/` container annotation.
    CdiAnnotations,
}

/// The chosen strategies, the CDI kind and the annotation prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceListing {
    strategies: BTreeSet<DeviceListStrategy>,
    kind: String,
    annotation_prefix: String,
}

impl Default for DeviceListing {
    /// `envvar` alone: what the plugin answered before CDI (and the NVIDIA plugin's default).
    fn default() -> Self {
        DeviceListing {
            strategies: BTreeSet::from([DeviceListStrategy::Envvar]),
            kind: DEFAULT_KIND.into(),
            annotation_prefix: DEFAULT_ANNOTATION_PREFIX.into(),
        }
    }
}

/// A device-listing setting the plugin cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    #[error("no device list strategy given (envvar, cdi-cri, cdi-annotations)")]
    NoStrategy,
    #[error("invalid CDI kind {kind:?}: {why}")]
    Kind { kind: String, why: &'static str },
    #[error("CDI annotation prefix {0:?} must end with '/' (like {DEFAULT_ANNOTATION_PREFIX:?})")]
    AnnotationPrefix(String),
}

/// Why the CDI refresh command did not refresh the spec.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("`{command}` did not finish within {} s", REFRESH_TIMEOUT.as_secs())]
    TimedOut { command: String },
    #[error("cannot run `{command}`: {source}")]
    NotRun {
        command: String,
        source: std::io::Error,
    },
    /// It ran and failed: its exit status and the end of its output.
    #[error("`{command}` failed ({status}): {output}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        output: String,
    },
}

impl DeviceListing {
    /// Checked: at least one strategy, a `vendor/class` kind as the CDI spec defines them, and
    /// an annotation prefix ending in `/`.
    pub fn new(
        strategies: &[DeviceListStrategy],
        kind: &str,
        annotation_prefix: &str,
    ) -> Result<Self, ListingError> {
        if strategies.is_empty() {
            return Err(ListingError::NoStrategy);
        }
        check_kind(kind)?;
        check_annotation_prefix(annotation_prefix)?;
        Ok(DeviceListing {
            strategies: strategies.iter().copied().collect(),
            kind: kind.into(),
            annotation_prefix: annotation_prefix.into(),
        })
    }

    pub fn includes(&self, strategy: DeviceListStrategy) -> bool {
        self.strategies.contains(&strategy)
    }

    /// The fully qualified CDI name of a GPU or MIG device: `<kind>=<uuid>`.
    pub fn device_name(&self, uuid: &str) -> String {
        format!("{}={uuid}", self.kind)
    }

    /// Rewrite one container's allocation for the chosen strategies. `request_ids` are the
    /// kubelet's device IDs (`<uuid>` or `<uuid>::<n>`); `response_id` makes the annotation key
    /// unique among the container's allocations (the NVIDIA plugin uses a random UUID).
    pub fn apply(
        &self,
        request_ids: &[String],
        response_id: &str,
        response: &mut api::ContainerAllocateResponse,
    ) {
        let names: Vec<String> = unique_devices(request_ids)
            .into_iter()
            .map(|uuid| self.device_name(uuid))
            .collect();
        if !names.is_empty() {
            if self.includes(DeviceListStrategy::CdiAnnotations) {
                response.annotations.insert(
                    format!(
                        "{}{ANNOTATION_PLUGIN}_{response_id}",
                        self.annotation_prefix
                    ),
                    names.join(","),
                );
            }
            if self.includes(DeviceListStrategy::CdiCri) {
                response.cdi_devices.extend(
                    names
                        .iter()
                        .map(|name| api::CdiDevice { name: name.clone() }),
                );
            }
        }
        if !self.includes(DeviceListStrategy::Envvar) {
            response.envs.remove(VISIBLE_DEVICES);
        }
    }
}

/// The devices behind kubelet IDs: the replica suffix stripped, each device once, in order.
fn unique_devices(ids: &[String]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for id in ids {
        let device = crate::kubelet::pod_resources::device_uuid(id);
        if !out.contains(&device) {
            out.push(device);
        }
    }
    out
}

/// For clap: a checked `--cdi-kind`.
pub fn parse_kind(kind: &str) -> Result<String, ListingError> {
    check_kind(kind).map(|()| kind.to_string())
}

/// For clap: a checked `--cdi-annotation-prefix`.
pub fn parse_annotation_prefix(prefix: &str) -> Result<String, ListingError> {
    check_annotation_prefix(prefix).map(|()| prefix.to_string())
}

fn check_annotation_prefix(prefix: &str) -> Result<(), ListingError> {
    if prefix.len() < 2 || !prefix.ends_with('/') {
        return Err(ListingError::AnnotationPrefix(prefix.to_string()));
    }
    Ok(())
}

/// A CDI kind, `vendor/class`: the vendor of letters, digits, `-`, `_` and `.`, the class of
/// letters, digits, `-` and `_`, each starting and ending with a letter or digit (the CDI
/// parser's `ValidateVendorName` and `ValidateClassName`).
pub fn check_kind(kind: &str) -> Result<(), ListingError> {
    let bad = |why: &'static str| {
        Err(ListingError::Kind {
            kind: kind.to_string(),
            why,
        })
    };
    let Some((vendor, class)) = kind.split_once('/') else {
        return bad("expected vendor/class, e.g. nvidia.com/gpu");
    };
    let ok = |part: &str, extra: &[char]| {
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        edge(part.chars().next())
            && edge(part.chars().last())
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
    };
    if !ok(vendor, &['-', '_', '.']) {
        return bad("the vendor may hold letters, digits, '-', '_' and '.', and starts and ends with a letter or digit");
    }
    if !ok(class, &['-', '_']) {
        return bad("the class may hold letters, digits, '-' and '_', and starts and ends with a letter or digit");
    }
    Ok(())
}

/// The longest a CDI refresh command may run.
pub const REFRESH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Run the operator's CDI refresh command (`--cdi-refresh-command`, split on whitespace, e.g.
/// `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml --device-name-strategy=uuid`) so
/// the CDI spec names the MIG devices a reconfiguration created: the runtime refuses a
/// container whose CDI device is not in a spec. NVIDIA's MIG manager does the same after a MIG
/// change (its `refresh-cdi` hook, nvidia-stack.md §2.4). The error quotes the command and the
/// end of its output.
pub async fn refresh(command: &[String]) -> Result<(), RefreshError> {
    let Some((program, args)) = command.split_first() else {
        return Ok(());
    };
    let shown = command.join(" ");
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(REFRESH_TIMEOUT, run)
        .await
        .map_err(|_| RefreshError::TimedOut {
            command: shown.clone(),
        })?
        .map_err(|source| RefreshError::NotRun {
            command: shown.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let output = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
    let output = output.trim();
    // The end of the output says why; at most about 400 bytes of it.
    let start = output
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| output.len() - i <= 400)
        .unwrap_or(output.len());
    Err(RefreshError::Failed {
        command: shown,
        status: out.status,
        output: output[start..].to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_refresh_that_fails_quotes_the_command_and_its_output() {
        let ok = ["true".to_string()];
        assert!(super::refresh(&ok).await.is_ok());
        assert!(super::refresh(&[]).await.is_ok());
        let failing: Vec<String> = ["sh", "-c", "echo no such spec dir >&2; exit 3"]
            .map(String::from)
            .to_vec();
        let e = super::refresh(&failing).await.unwrap_err();
        assert!(matches!(e, super::RefreshError::Failed { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.starts_with("`sh -c echo no such spec dir >&2; exit 3` failed"),
            "{e}"
        );
        assert!(e.ends_with("no such spec dir"), "{e}");
        let missing = ["/nonexistent/nvidia-ctk".to_string()];
        let e = super::refresh(&missing).await.unwrap_err();
        assert!(matches!(e, super::RefreshError::NotRun { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("cannot run `/nonexistent/nvidia-ctk`"), "{e}");
    }

    use super::*;
    use DeviceListStrategy::{CdiAnnotations, CdiCri, Envvar};

    /// What `ResourceDevices::allocate` answers for an MPS replica.
    fn allocated(uuids: &str) -> api::ContainerAllocateResponse {
        let mut r = api::ContainerAllocateResponse::default();
        r.envs.insert(VISIBLE_DEVICES.into(), uuids.into());
        r.envs
            .insert("CUDA_MPS_PIPE_DIRECTORY".into(), "/mps/x/pipe".into());
        r.mounts.push(api::Mount {
            container_path: "/mps/x/pipe".into(),
            host_path: "/run/nvidia/mps/x/pipe".into(),
            read_only: false,
        });
        r
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn cdi_names(r: &api::ContainerAllocateResponse) -> Vec<&str> {
        r.cdi_devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn envvar_alone_leaves_the_response_as_it_was() {
        let listing = DeviceListing::default();
        let mut r = allocated("GPU-a");
        listing.apply(&ids(&["GPU-a::3"]), "id", &mut r);
        assert_eq!(r, allocated("GPU-a"));
    }

    #[test]
    fn cdi_cri_names_each_device_once_and_drops_the_envvar() {
        let listing =
            DeviceListing::new(&[CdiCri], DEFAULT_KIND, DEFAULT_ANNOTATION_PREFIX).unwrap();
        let mut r = allocated("GPU-a,MIG-b");
        listing.apply(&ids(&["GPU-a::0", "GPU-a::1", "MIG-b"]), "id", &mut r);
        assert_eq!(
            cdi_names(&r),
            ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=MIG-b"]
        );
        assert!(!r.envs.contains_key(VISIBLE_DEVICES));
        assert!(r.annotations.is_empty());
        // MPS settings are kept, as the NVIDIA plugin keeps them.
        assert_eq!(r.envs["CUDA_MPS_PIPE_DIRECTORY"], "/mps/x/pipe");
        assert_eq!(r.mounts.len(), 1);
    }

    #[test]
    fn cdi_annotations_use_nvidias_key_and_a_custom_prefix() {
        let listing =
            DeviceListing::new(&[CdiAnnotations], DEFAULT_KIND, DEFAULT_ANNOTATION_PREFIX).unwrap();
        let mut r = allocated("GPU-a,GPU-b");
        listing.apply(&ids(&["GPU-a", "GPU-b"]), "1234", &mut r);
        assert_eq!(r.annotations.len(), 1);
        assert_eq!(
            r.annotations["cdi.k8s.io/nvidia-device-plugin_1234"],
            "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"
        );
        assert!(r.cdi_devices.is_empty());
        assert!(!r.envs.contains_key(VISIBLE_DEVICES));

        let custom = DeviceListing::new(
            &[CdiAnnotations],
            "k8s.device-plugin.nvidia.com/gpu",
            "custom.cdi.k8s.io/",
        )
        .unwrap();
        let mut r = allocated("GPU-a");
        custom.apply(&ids(&["GPU-a"]), "1234", &mut r);
        assert_eq!(
            r.annotations["custom.cdi.k8s.io/nvidia-device-plugin_1234"],
            "k8s.device-plugin.nvidia.com/gpu=GPU-a"
        );
    }

    #[test]
    fn envvar_beside_cdi_keeps_the_envvar() {
        let listing = DeviceListing::new(
            &[Envvar, CdiCri, CdiAnnotations, CdiCri],
            DEFAULT_KIND,
            DEFAULT_ANNOTATION_PREFIX,
        )
        .unwrap();
        let mut r = allocated("GPU-a");
        listing.apply(&ids(&["GPU-a::2"]), "x", &mut r);
        assert_eq!(r.envs[VISIBLE_DEVICES], "GPU-a");
        assert_eq!(cdi_names(&r), ["nvidia.com/gpu=GPU-a"]);
        assert_eq!(r.annotations.len(), 1);
    }

    #[test]
    fn no_devices_no_cdi_entries() {
        let listing =
            DeviceListing::new(&[CdiCri, CdiAnnotations], DEFAULT_KIND, "cdi.k8s.io/").unwrap();
        let mut r = api::ContainerAllocateResponse::default();
        listing.apply(&[], "x", &mut r);
        assert_eq!(r, api::ContainerAllocateResponse::default());
    }

    #[test]
    fn settings_are_checked() {
        assert!(DeviceListing::new(&[], DEFAULT_KIND, "cdi.k8s.io/").is_err());
        for kind in [
            "nvidia.com/gpu",
            "k8s.device-plugin.nvidia.com/gpu",
            "management.nvidia.com/gpu",
            "vendor_x/class-1",
        ] {
            assert_eq!(check_kind(kind), Ok(()), "{kind}");
        }
        for kind in [
            "gpu",
            "nvidia.com/",
            "/gpu",
            "nvidia.com/gpu.x",
            "-nvidia.com/gpu",
            "nvidia.com/gpu=",
            "nvidia.com/a/b",
        ] {
            assert!(check_kind(kind).is_err(), "{kind}");
        }
        assert!(DeviceListing::new(&[CdiCri], DEFAULT_KIND, "cdi.k8s.io").is_err());
        assert!(DeviceListing::new(&[CdiCri], DEFAULT_KIND, "/").is_err());
    }
}
