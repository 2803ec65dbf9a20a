//! Generates the kubelet device-plugin API (v1beta1) client and server for the built-in device
//! plugin (`src/builtin_plugin/`). The .proto is parsed by protox, a protobuf compiler written
//! in Rust, so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/deviceplugin-v1beta1.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
