//! Generates the kubelet's local gRPC APIs: the device-plugin API (v1beta1) client and server
//! for the built-in device plugin (`src/builtin_plugin/`), and the PodResources API (v1) with
//! which the agent finds the pods holding a device (`src/kubelet/`; its server half serves the
//! tests' fake kubelet), and the DRA plugin API (v1) with the plugin-registration API that the
//! DRA kubelet plugin serves (`src/dra/kubelet_plugin/`; their clients drive it in the tests'
//! simulated kubelet). The .protos are parsed by protox, a protobuf compiler written in Rust,
//! so building needs no system `protoc`.
//!
//! It also passes the `gpu-share` binary two link options that shrink what an idle agent keeps
//! resident (issue 18; benches/README.md, "Agent memory"): see [`link_for_a_small_resident_agent`].

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: [&str; 4] = [
        "proto/deviceplugin-v1beta1.proto",
        "proto/podresources-v1.proto",
        "proto/dra-v1.proto",
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
    link_for_a_small_resident_agent()?;
    Ok(())
}

/// The functions an agent runs from start-up to idle (`link/agent-startup-order.txt`, made by
/// `link/README.md`'s steps) are laid out first and together, so its resident code is those
/// pages and not every 64 KiB window one of them falls in (the kernel maps a faulting page's
/// cached neighbours too). A name the build no longer has is skipped, so a stale list costs
/// resident memory, never correctness. Only rust-lld, the x86_64 Linux GNU target's default
/// linker since Rust 1.90, takes `--symbol-ordering-file`: an older rustc (the crate's
/// rust-version is 1.89) or RUSTFLAGS that choose the linker get the default layout.
///
/// Relative relocations are packed (`DT_RELR`): 464 KiB of `.rela.dyn` the loader reads at
/// every start become 6 KiB. glibc applies them from 2.36 (the image's Debian 12 has 2.36);
/// on an older build host the option is left out, as that host's loader would skip them.
fn link_for_a_small_resident_agent() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name: &str| std::env::var(name).unwrap_or_default();
    let rustflags = env("CARGO_ENCODED_RUSTFLAGS");
    let default_linker =
        !rustflags.contains("linker") && !rustflags.contains("link-self-contained");
    if env("TARGET") == "x86_64-unknown-linux-gnu" && default_linker && rustc_minor() >= 90 {
        let order = std::path::Path::new(&env("CARGO_MANIFEST_DIR")).join(ORDER);
        println!("cargo:rerun-if-changed={ORDER}");
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
    let gnu_linux = env("CARGO_CFG_TARGET_OS") == "linux" && env("CARGO_CFG_TARGET_ENV") == "gnu";
    if gnu_linux && env("HOST") == env("TARGET") && host_glibc_at_least(2, 36) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    Ok(())
}

const ORDER: &str = "link/agent-startup-order.txt";

/// The minor version of the rustc building this crate (`rustc 1.95.0 (...)` → 95; 0 if unknown).
fn rustc_minor() -> u32 {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = std::process::Command::new(rustc).arg("--version").output();
    let version = output
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|minor| minor.parse().ok())
        .unwrap_or(0)
}

/// Whether the glibc this build script runs on (the one the binary links against when host and
/// target are the same) is at least `major.minor`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn host_glibc_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
    let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let mut parts = version
        .to_str()
        .unwrap_or_default()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// Not a glibc host.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn host_glibc_at_least(_major: u32, _minor: u32) -> bool {
    false
}
