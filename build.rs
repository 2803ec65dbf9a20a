//! Generates the kubelet's local gRPC APIs: the device-plugin API (v1beta1) client and server
//! for the built-in device plugin (`src/builtin_plugin/`), and the PodResources API (v1) with
//! which the agent finds the pods holding a device (`src/kubelet/`; its server half serves the
//! tests' fake kubelet), and the DRA plugin API (v1), its resource-health API (v1alpha1) and
//! the plugin-registration API that the DRA kubelet plugin serves (`src/dra/kubelet_plugin/`; their clients drive it in the tests'
//! simulated kubelet). The .protos are parsed by protox, a protobuf compiler written in Rust,
//! so building needs no system `protoc`.
//!
//! It passes no link options: the default binary must start on the glibc of the GPU nodes users
//! have (2.34+: Ubuntu 22.04, RHEL 9). Packed relative relocations (`-z pack-relative-relocs`)
//! would make it need `GLIBC_ABI_DT_RELR` (glibc 2.36); the image, whose runtime has 2.36, opts
//! in to them in the Dockerfile.
//!
//! It also tells the tests what this machine cannot check ([`probe_test_tools`]), so that those
//! tests are reported as ignored, with the reason, instead of passing without checking.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    probe_test_tools();
    const PROTOS: [&str; 5] = [
        "proto/deviceplugin-v1beta1.proto",
        "proto/podresources-v1.proto",
        "proto/dra-v1.proto",
        "proto/dra-health-v1alpha1.proto",
        "proto/pluginregistration-v1.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}

/// Test-only cfgs, read by `#[cfg_attr(…, ignore = "why")]` in tests/: `no_kubectl` where
/// `kubectl kustomize` does not run (the manifests are then checked with the tests' own
/// renderer only), `no_mount_namespace` where `unshare --mount` is refused (not root: the real
/// tmpfs mounts of `mps mount-shm` are not exercised), `root_without_mount_namespace` where the
/// tests run as root and cannot mount (root writes through a directory's read-only mode, so a
/// read-only state dir needs a read-only mount). Probed again when PATH changes.
fn probe_test_tools() {
    println!("cargo::rustc-check-cfg=cfg(no_kubectl)");
    println!("cargo::rustc-check-cfg=cfg(no_mount_namespace)");
    println!("cargo::rustc-check-cfg=cfg(root_without_mount_namespace)");
    println!("cargo::rerun-if-env-changed=PATH");
    if !runs("kubectl", &["kustomize", "--help"]) {
        println!("cargo::rustc-cfg=no_kubectl");
    }
    let mount_namespace = runs("unshare", &["--mount", "true"]);
    if !mount_namespace {
        println!("cargo::rustc-cfg=no_mount_namespace");
    }
    if is_root() && !mount_namespace {
        println!("cargo::rustc-cfg=root_without_mount_namespace");
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

fn runs(program: &str, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
