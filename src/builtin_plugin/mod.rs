//! gpu-share's own device plugin (`--plugin builtin`): the kubelet device-plugin API v1beta1
//! over gRPC on Unix sockets, served from the agent process, for profiles the stock NVIDIA
//! plugin cannot express (whole GPUs shared in different ways on one node, MPS beside MIG, one
//! MIG profile with different replica counts per GPU).
//!
//! - What it cannot express is `crate::validate`'s to say (the built-in plugin's limits),
//!   beside the NVIDIA plugin's refusals (`nvidia_plugin::check_profile`).
//! - [`inventory`] (pure): from the applied plan and the GPUs NVML shows, the devices of every
//!   advertised resource (`<uuid>` or `<uuid>::<n>` replica IDs), health, and what `Allocate`
//!   and `GetPreferredAllocation` answer.
//! - [`cdi`] (pure): how `Allocate` names the devices to the runtime, `--device-list-strategy`
//!   as NVIDIA's (`envvar`, `cdi-cri`, `cdi-annotations`), CDI names `nvidia.com/gpu=<uuid>`.
//! - [`server`]: one `DevicePlugin` endpoint per resource, socket named as NVIDIA's
//!   (`nvidia-gpu.sock`, `nvidia-mig-1g.10gb.sock`).
//! - [`manager`]: registers the endpoints with the kubelet, registers again when `kubelet.sock`
//!   is recreated (kubelet restart), re-advertises when the agent applies a new profile, and
//!   marks devices Unhealthy when NVML stops listing them; on agent shutdown stops the
//!   endpoints and removes their sockets.
//!
//! What the driver must support: MPS needs `nvidia-cuda-mps-control` from the driver's compute
//! utilities (`gpu-share doctor --profile` checks it); each MPS resource gets one daemon whose
//! `CUDA_VISIBLE_DEVICES` names only its whole GPUs, so MPS on some GPUs beside MIG on others
//! needs nothing beyond a MIG-capable driver (the catalog's `min_driver`). MPS *inside* MIG
//! devices (`mig` with `mps` in one rule) gets one daemon per MIG device, as the MIG User Guide
//! shows; `validate` states what that needs (`crate::mps::MPS_ON_MIG_NEEDS`): the minimum driver could not
//! be sourced (CUDA 11.4 / R470 is commonly cited, unverified).

pub mod api;
pub mod cdi;
pub mod inventory;
pub mod manager;
pub mod server;

pub use cdi::{DeviceListStrategy, DeviceListing};
pub use inventory::{DeviceEntry, Inventory, MpsClient, ResourceDevices};
pub use manager::{ManagerSettings, PluginManager};

/// The kubelet's device-plugin directory: `kubelet.sock` and the plugins' sockets.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Where a container finds an MPS pipe directory (the NVIDIA plugin's layout).
pub const CONTAINER_MPS_ROOT: &str = "/mps";

/// The socket file NVIDIA's plugin uses for `resource`: `nvidia-gpu.sock`,
/// `nvidia-mig-1g.10gb.sock`. Its rule (internal/plugin/server.go `getPluginSocketPath` with
/// `ResourceName.Split`, k8s-device-plugin v0.20.0): `nvidia-` and what follows the first `/`,
/// whatever the prefix. The one rule for the built-in plugin and for `doctor`, which looks for
/// the sockets either plugin makes.
pub fn socket_name(resource: &str) -> String {
    let local = resource.split_once('/').map_or(resource, |(_, name)| name);
    format!("nvidia-{local}.sock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_named_like_nvidias() {
        assert_eq!(socket_name("nvidia.com/gpu"), "nvidia-gpu.sock");
        assert_eq!(
            socket_name("nvidia.com/mig-1g.10gb"),
            "nvidia-mig-1g.10gb.sock"
        );
        assert_eq!(
            socket_name("nvidia.com/gpu.shared"),
            "nvidia-gpu.shared.sock"
        );
        // Outside nvidia.com/ (a renamed resource): the prefix goes all the same.
        assert_eq!(socket_name("example.com/gpu"), "nvidia-gpu.sock");
        assert_eq!(socket_name("gpu"), "nvidia-gpu.sock");
    }
}
