# syntax=docker/dockerfile:1
#
# gpu-share: the node agent and the CLI, one binary.
#
#   docker build -t registry.example.com/gpu-share:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t registry.example.com/gpu-share:0.1.0 --push .
#
# Both architectures are cross-compiled on the build machine's own (no emulation): arm64 for
# Jetson (Orin, Xavier) and Grace nodes, amd64 for the rest. The runtime image is multi-arch.
#
# The image holds no NVIDIA driver files. In the cluster the NVIDIA container runtime injects
# libnvidia-ml.so.1, nvidia-smi and nvidia-cuda-mps-control from the node's driver
# (deploy/base/daemonset.yaml: runtimeClassName nvidia, NVIDIA_VISIBLE_DEVICES=all), so the
# user-space always matches the kernel module. For the CLI on a workstation (validate, plan,
# schema, catalog) nothing else is needed.

# Build on Debian 12 (bookworm): the binary then needs no newer glibc than the runtime image's.
ARG RUST_VERSION=1.95
FROM --platform=$BUILDPLATFORM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# Set by buildx (and by plain `docker build` to the daemon's platform): amd64 or arm64.
ARG TARGETARCH
# The Rust target for TARGETARCH and, when it is not the build machine's own, Debian's cross C
# compiler (ring builds C) with its libc; the native gcc already answers to $gnu-gcc.
RUN case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu pkgs="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;; \
      arm64) target=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu pkgs="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;; \
      *) echo "gpu-share images are built for amd64 and arm64, not $TARGETARCH" >&2; exit 1 ;; \
    esac \
 && if [ "$(dpkg --print-architecture)" != "$TARGETARCH" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $pkgs \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && rustup target add "$target" \
 && printf 'target=%s\ngnu=%s\n' "$target" "$gnu" > /target.env
WORKDIR /src
COPY . .
# The registry and target caches speed up rebuilds; the binary is copied out of the cache mount.
# `dist` is the release profile with fat LTO in one codegen unit, size-optimised (Cargo.toml).
# Packed relative relocations (DT_RELR): the loader reads 10 KB of relocations at start instead
# of 476 KB (benches/README.md, "Agent memory"). They need glibc 2.36, which the runtime image
# below has; the default build (`cargo build`) leaves them out so its binary starts on glibc 2.34.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    . /target.env \
 && lower=$(echo "$target" | tr - _) && upper=$(echo "$lower" | tr a-z A-Z) \
 && export "CARGO_TARGET_${upper}_LINKER=$gnu-gcc" "CC_${lower}=$gnu-gcc" \
    RUSTFLAGS="-C link-arg=-Wl,-z,pack-relative-relocs" \
 && cargo build --profile dist --locked --target "$target" --package gpu-share --bin gpu-share \
 && install -D -m 0755 "target/$target/dist/gpu-share" /out/gpu-share

# glibc and libgcc only (NVML is loaded with dlopen at run time), no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/gpu-share /usr/bin/gpu-share
# Non-root by default, for the CLI. The agent's DaemonSet runs it as root and privileged: MIG
# changes need CAP_SYS_ADMIN and the MIG capability devices (deploy/base/daemonset.yaml).
USER 65532:65532
ENTRYPOINT ["/usr/bin/gpu-share"]
CMD ["--help"]
