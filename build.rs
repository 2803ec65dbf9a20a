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

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
