//! Layer 4, the container runtime: containerd has an NVIDIA runtime (a `runtimes.<name>` whose
//! `options.BinaryName` is nvidia-container-runtime), ideally as its default, and/or CDI specs
//! for `nvidia.com/gpu` exist. The files are read ([`super::containerd`], [`super::cdi`]), never
//! guessed at.

use std::fs;
use std::path::{Path, PathBuf};

use super::cdi::read_cdi;
use super::containerd::{read_containerd, Containerd, Runtime};
use super::options::is_embedded_containerd;
use super::{find_program, Check, Ctx, Facts};

const NAME: &str = "container-runtime";

/// The one command that sets containerd up for NVIDIA GPUs.
const CONFIGURE: &str = "`sudo nvidia-ctk runtime configure --runtime=containerd && sudo \
     systemctl restart containerd` (from nvidia-container-toolkit)";

/// The same on k3s/RKE2, whose embedded containerd's config is regenerated at every start: k3s
/// adds the `nvidia` runtime itself when it finds nvidia-container-runtime then (docs.k3s.io,
/// "Advanced Options": "NVIDIA Container Runtime Support").
const CONFIGURE_K3S: &str = "install nvidia-container-toolkit (nvidia-container-runtime in \
     /usr/bin or /usr/local/nvidia/toolkit), then restart k3s (`sudo systemctl restart k3s`, or \
     k3s-agent on an agent node; rke2-server/rke2-agent on RKE2): it adds the `nvidia` runtime \
     itself at start. Do not edit its config.toml, which it rewrites at every start \
     (changes go in config.toml.tmpl beside it)";

pub(super) fn check(ctx: &Ctx<'_>, _facts: &mut Facts) -> Check {
    let config = &ctx.paths.containerd_config;
    let configure = if is_embedded_containerd(config) {
        CONFIGURE_K3S
    } else {
        CONFIGURE
    };
    let containerd = read_containerd(&ctx.paths.root, config);
    let cdi = read_cdi(&ctx.paths.cdi_dirs);
    let nvidia: Vec<&Runtime> = containerd
        .runtimes
        .iter()
        .filter(|r| r.is_nvidia())
        .collect();
    let mut found = Vec::new();
    if containerd.files.is_empty() && config.exists() {
        found.push(format!(
            "containerd config {} is unreadable",
            config.display()
        ));
    } else if containerd.files.is_empty() {
        found.push(format!("no containerd config at {}", config.display()));
    } else if nvidia.is_empty() {
        found.push(format!(
            "containerd ({}) has no NVIDIA runtime{}",
            show_files(&containerd.files),
            if containerd.runtimes.is_empty() {
                String::new()
            } else {
                format!(
                    " (runtimes: {})",
                    containerd
                        .runtimes
                        .iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
    } else {
        let default = containerd.default_runtime.as_ref().map(|(n, _)| n.as_str());
        found.push(format!(
            "containerd runtime{} {}; default runtime: {}",
            if nvidia.len() == 1 { "" } else { "s" },
            nvidia
                .iter()
                .map(|r| format!("{} → {}", r.name, r.binary.as_deref().unwrap_or("?")))
                .collect::<Vec<_>>()
                .join(", "),
            default.unwrap_or("runc (containerd's built-in default)")
        ));
    }
    found.push(if cdi.specs.is_empty() {
        format!(
            "no CDI spec for nvidia.com/gpu in {}",
            show_files(&ctx.paths.cdi_dirs)
        )
    } else {
        format!("CDI: {}", cdi.specs.join("; "))
    });
    let mut check = Check::new(NAME, found.join("; "));
    if containerd.files.is_empty() && !config.exists() {
        check.details.push(
            "k3s and RKE2 keep containerd's config in \
             /var/lib/rancher/k3s/agent/etc/containerd/config.toml (or …/rke2/…): point \
             --containerd-config there"
                .into(),
        );
    }
    for u in containerd.unreadable.iter().chain(&cdi.unreadable) {
        check.warn(u.clone(), "correct or remove the file");
    }
    if nvidia.is_empty() {
        judge_no_runtime(
            &containerd,
            !cdi.specs.is_empty(),
            config,
            configure,
            &mut check,
        );
        return check;
    }
    for r in &nvidia {
        let binary = Path::new(r.binary.as_deref().unwrap_or_default());
        if find_program(&ctx.paths.root, binary).is_none() {
            check.fail(
                format!(
                    "runtime {:?} ({}) runs {}, which does not exist",
                    r.name,
                    r.file.display(),
                    binary.display()
                ),
                "install nvidia-container-toolkit (it provides nvidia-container-runtime), then \
                 restart containerd",
            );
        }
    }
    let default_is_nvidia = containerd
        .default_runtime
        .as_ref()
        .is_some_and(|(d, _)| nvidia.iter().any(|r| &r.name == d));
    if !default_is_nvidia {
        let fix = if is_embedded_containerd(config) {
            "on k3s keep runtimeClassName: nvidia on GPU pods (gpu-share's and the device \
             plugin's pods have it; k3s v1.29+ creates the RuntimeClass `nvidia`, older ones \
             need it applied: handler nvidia), or make it the node's default by starting k3s \
             with `--default-runtime nvidia` (k3s server/agent flag, or `default-runtime: \
             nvidia` in /etc/rancher/k3s/config.yaml) and restarting it"
        } else {
            "make it the default (`sudo nvidia-ctk runtime configure --runtime=containerd \
             --set-as-default && sudo systemctl restart containerd`), or create a RuntimeClass \
             `nvidia` (handler: nvidia) and set runtimeClassName: nvidia on GPU pods"
        };
        check.warn(
            "the NVIDIA runtime is not containerd's default: only pods with its \
             runtimeClassName get GPUs (the device plugin's pod too)",
            fix,
        );
    }
    check
}

/// No NVIDIA runtime in containerd's config: say why as precisely as the files allow.
fn judge_no_runtime(
    containerd: &Containerd,
    has_cdi: bool,
    config: &Path,
    configure: &str,
    check: &mut Check,
) {
    let nvidia_elsewhere: Vec<&PathBuf> = containerd
        .not_imported
        .iter()
        .filter(|f| fs::read_to_string(f).is_ok_and(|t| t.contains("nvidia-container-runtime")))
        .collect();
    let broken: Vec<&Runtime> = containerd
        .runtimes
        .iter()
        .filter(|r| r.name.contains("nvidia"))
        .collect();
    if !nvidia_elsewhere.is_empty() {
        check.fail(
            format!(
                "the NVIDIA runtime is configured in {}, which {} does not import, so \
                 containerd ignores it",
                show_files(&nvidia_elsewhere),
                config.display()
            ),
            format!(
                "add `imports = [\"/etc/containerd/conf.d/*.toml\"]` at the top of {} and \
                 restart containerd (or configure it again: {configure})",
                config.display()
            ),
        );
    } else if !broken.is_empty() {
        check.fail(
            format!(
                "runtime {:?} ({}) has no options.BinaryName = \"nvidia-container-runtime\": \
                 containerd runs plain runc for it and pods get no GPU",
                broken[0].name,
                broken[0].file.display()
            ),
            format!("configure it again: {configure}"),
        );
    } else if has_cdi {
        check.warn(
            "no NVIDIA runtime in containerd, only CDI specs: GPUs reach containers only if \
             containerd has CDI enabled (enable_cdi = true; the default in containerd 2.x) and \
             the device plugin uses deviceListStrategy cdi-cri",
            format!("configure the runtime as well: {configure}"),
        );
    } else {
        check.fail(
            "containers cannot get GPUs: no NVIDIA container runtime and no CDI spec",
            format!(
                "{configure}; for CDI also `sudo nvidia-ctk cdi generate \
                 --output=/var/run/cdi/nvidia.yaml`"
            ),
        );
    }
}

fn show_files<P: AsRef<Path>>(files: &[P]) -> String {
    files
        .iter()
        .map(|f| f.as_ref().display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
