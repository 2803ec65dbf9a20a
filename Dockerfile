# syntax=docker/dockerfile:1
#
# gpu-share: the node agent and the CLI, one binary.
#
#   docker build -t registry.example.com/gpu-share:0.1.0 .
#
# The image holds no NVIDIA driver files. In the cluster the NVIDIA container runtime injects
# libnvidia-ml.so.1, nvidia-smi and nvidia-cuda-mps-control from the node's driver
# (deploy/base/daemonset.yaml: runtimeClassName nvidia, NVIDIA_VISIBLE_DEVICES=all), so the
# user-space always matches the kernel module. For the CLI on a workstation (validate, plan,
# schema, catalog) nothing else is needed.

# Build on Debian 12 (bookworm): the binary then needs no newer glibc than the runtime image's.
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target caches speed up rebuilds; the binary is copied out of the cache mount.
# `dist` is the release profile with fat LTO in one codegen unit, size-optimised (Cargo.toml).
# Packed relative relocations (DT_RELR): the loader reads 10 KB of relocations at start instead
# of 476 KB (benches/README.md, "Agent memory"). They need glibc 2.36, which the runtime image
# below has; the default build (`cargo build`) leaves them out so its binary starts on glibc 2.34.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    RUSTFLAGS="-C link-arg=-Wl,-z,pack-relative-relocs" \
    cargo build --profile dist --locked --package gpu-share --bin gpu-share \
 && install -D -m 0755 target/dist/gpu-share /out/gpu-share

# glibc and libgcc only (NVML is loaded with dlopen at run time), no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/gpu-share /usr/bin/gpu-share
# Non-root by default, for the CLI. The agent's DaemonSet runs it as root and privileged: MIG
# changes need CAP_SYS_ADMIN and the MIG capability devices (deploy/base/daemonset.yaml).
USER 65532:65532
ENTRYPOINT ["/usr/bin/gpu-share"]
CMD ["--help"]
