//! Layer 1, the kernel driver: `/proc/driver/nvidia/version` and the device nodes, or a
//! Jetson/Tegra integrated GPU (no `/proc/driver/nvidia`, an L4T release file or a device tree
//! that says `nvidia,tegra…`).

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use super::{Check, Ctx, DriverVersion, Facts};
use crate::gpu::tegra::{self, Tegra, TegraFiles};

const NAME: &str = "driver";

pub(super) fn check(ctx: &Ctx<'_>, facts: &mut Facts) -> Check {
    let path = &ctx.paths.driver_version;
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return match tegra::detect(&tegra_files(ctx)) {
                Ok(Some(tegra)) => tegra_check(tegra, facts),
                Err(e) => Check::failed(
                    NAME,
                    e.to_string(),
                    "a Jetson/Tegra is known by /etc/nv_tegra_release, \
                     /sys/devices/soc0/family and the device tree; make them readable and \
                     consistent (or point --tegra-release / --device-tree at the right files)",
                ),
                Ok(None) => Check::failed(
                    NAME,
                    format!(
                        "no NVIDIA kernel module loaded: {} does not exist",
                        path.display()
                    ),
                    "install the NVIDIA driver and load it (`sudo modprobe nvidia`); if it \
                     refuses, `sudo dmesg | grep -i -e nvrm -e nvidia` says why (Secure Boot \
                     needs a signed module; a kernel upgrade needs the module rebuilt: DKMS)",
                ),
            };
        }
        Err(e) => {
            return Check::failed(
                NAME,
                format!("cannot read {}: {e}", path.display()),
                "run the doctor as root, or with the host's /proc mounted (--host-root)",
            )
        }
    };
    let Some((version, open)) = parse_module_version(&text) else {
        return Check::failed(
            NAME,
            format!(
                "{} has no driver version on its `NVRM version:` line: {:?}",
                path.display(),
                text.lines().next().unwrap_or("")
            ),
            "the module loaded is not a driver the doctor knows; reinstall the NVIDIA driver",
        );
    };
    let flavour = if open { "open" } else { "proprietary" };
    let mut check = Check::new(NAME, "");
    let nodes = device_nodes(&ctx.paths.dev);
    let mut seen = Vec::new();
    if nodes.ctl {
        seen.push("nvidiactl".to_string());
    }
    if nodes.uvm {
        seen.push("nvidia-uvm".to_string());
    }
    seen.extend(nodes.gpus.iter().map(|n| format!("nvidia{n}")));
    check.found = format!(
        "NVIDIA kernel module {version} ({flavour}); device nodes in {}: {}",
        ctx.paths.dev.display(),
        if seen.is_empty() {
            "none".into()
        } else {
            seen.join(", ")
        }
    );
    let mut missing = Vec::new();
    if !nodes.ctl {
        missing.push("nvidiactl".to_string());
    }
    if nodes.gpus.is_empty() {
        missing.push("nvidia<N> (one per GPU)".to_string());
    }
    if !missing.is_empty() {
        check.fail(
            format!(
                "the module is loaded but device nodes are missing: {}",
                missing.join(", ")
            ),
            "create them: `sudo nvidia-modprobe -c 0 -u` (or run `nvidia-smi` once as root); \
             in a container, the NVIDIA runtime or the pod's device mounts must pass /dev/nvidia* in",
        );
    } else if !nodes.uvm {
        check.warn(
            "/dev/nvidia-uvm is missing: CUDA programs fail with \"no CUDA-capable device\" \
             until the nvidia-uvm module is loaded",
            "`sudo modprobe nvidia-uvm && sudo nvidia-modprobe -u -c 0`",
        );
    }
    facts.kernel = Some(version);
    check
}

/// The version and whether it is the open kernel module, from the `NVRM version:` line, e.g.
/// `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:48 UTC 2025` or
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (...)`.
fn parse_module_version(text: &str) -> Option<(DriverVersion, bool)> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let version = line.split_whitespace().find_map(DriverVersion::parse)?;
    Some((version, line.contains("Open Kernel Module")))
}

struct DeviceNodes {
    ctl: bool,
    uvm: bool,
    /// N of each `/dev/nvidiaN`, sorted.
    gpus: Vec<u32>,
}

fn device_nodes(dev: &Path) -> DeviceNodes {
    let mut gpus: Vec<u32> = fs::read_dir(dev)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let n = name.to_str()?.strip_prefix("nvidia")?;
            (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .then(|| n.parse().ok())
                .flatten()
        })
        .collect();
    gpus.sort_unstable();
    DeviceNodes {
        ctl: dev.join("nvidiactl").exists(),
        uvm: dev.join("nvidia-uvm").exists(),
        gpus,
    }
}

/// Where the doctor looks for a Tegra's files: its own path options, the rest under the root.
fn tegra_files(ctx: &Ctx<'_>) -> TegraFiles {
    TegraFiles {
        release: ctx.paths.tegra_release.clone(),
        device_trees: vec![ctx.paths.device_tree.clone()],
        ..TegraFiles::under(&ctx.paths.root)
    }
}

fn tegra_check(tegra: Tegra, facts: &mut Facts) -> Check {
    let check = Check::new(
        NAME,
        format!(
            "Jetson/Tegra integrated GPU ({}): time-slicing only (no NVML, no MIG, no MPS)",
            tegra.describe()
        ),
    );
    facts.tegra = Some(tegra);
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_proprietary_and_the_open_module_lines() {
        let (v, open) = parse_module_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:48 UTC 2025\n\
             GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n",
        )
        .unwrap();
        assert_eq!((v.to_string(), open), ("580.65.06".into(), false));
        let (v, open) = parse_module_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.124.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Feb 20 03:08:34 UTC 2025\n",
        )
        .unwrap();
        assert_eq!((v.to_string(), open), ("570.124.06".into(), true));
        assert!(parse_module_version("garbage\n").is_none());
    }
}
