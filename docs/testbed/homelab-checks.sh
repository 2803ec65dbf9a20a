#!/bin/bash
# The agent on a simulated Jetson of the real node test bed (../shared/testbed: kube-apiserver,
# scheduler and kubelet 1.36.2), beside NVIDIA's device plugin v0.20.0 built from its source,
# which must find the Tegra by itself. Not run by CI (root, the test bed, the plugin binary).
#
#   (cd ../shared/testbed && ./setup.sh && ./start.sh)
#   cargo build --release
#   # NVIDIA/k8s-device-plugin at tag v0.20.0, without its tests/ folder:
#   #   CGO_ENABLED=1 go build -mod=vendor -o nvidia-device-plugin ./cmd/nvidia-device-plugin
#   NVIDIA_PLUGIN=/path/to/nvidia-device-plugin docs/testbed/homelab-checks.sh
#   (cd ../shared/testbed && ./stop.sh)
#
# The Jetson: the agent reads a host root holding L4T R36.4's files (release file, soc0 family,
# device tree) and no NVML (GPU_SHARE_NVML_LIB names no file); NVIDIA's plugin runs in a mount
# namespace whose /etc holds the same nv_tegra_release, on a machine without libnvidia-ml, with
# CONTAINER_DRIVER_ROOT=/ (docs/homelab.md's patch), so go-nvlib's ResolvePlatform says tegra
# (HasTegraFiles and not HasNvml) exactly as on a Jetson. Without that variable the plugin looks
# under /driver-root, finds no Tegra file, says "Detected platform: unknown" and fails on NVML.
# The agent signals the plugin (SIGHUP, by pid file) after each config write.
#
# Checks: 1. homelab-timeslice → success; allocatable nvidia.com/gpu.shared 4 (the plugin's one
# `tegra` device, 4 replicas); the found-GPU labels; a pod asking for one replica runs and gets
# NVIDIA_VISIBLE_DEVICES=tegra. 2. exclusive → nvidia.com/gpu 1. 3. h100-mps (MPS) → failed,
# reason naming the Jetson; the plugin config unchanged.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TESTBED_DIR=${TESTBED_DIR:-$(cd "$ROOT/.." && pwd)/testbed-run}
export KUBECONFIG=$TESTBED_DIR/kubeconfig
K=$TESTBED_DIR/bin/kubectl
BIN=${BIN:-$ROOT/target/release/gpu-share}
PLUGIN=${NVIDIA_PLUGIN:?set NVIDIA_PLUGIN to NVIDIA k8s-device-plugin v0.20.0 built from source}
NODE=$($K get nodes -o jsonpath='{.items[0].metadata.name}')
W=$(mktemp -d)
trap 'kill $(cat "$W/plugin.pid" 2>/dev/null) 2>/dev/null; pkill -f "$BIN agent" 2>/dev/null;
      $K delete pod jetson-tenant --now >/dev/null 2>&1; $K label node "$NODE" gpu-share.dev/profile- >/dev/null 2>&1;
      rm -rf "$W"' EXIT

state() { $K get node "$NODE" -o jsonpath='{.metadata.labels.gpu-share\.dev/profile\.state}'; }
reason() { $K get node "$NODE" -o jsonpath='{.metadata.annotations.gpu-share\.dev/profile\.reason}'; }
wait_state() { for _ in $(seq 1 "$2"); do [ "$(state)" = "$1" ] && return 0; sleep 1; done; return 1; }
alloc() { $K get node "$NODE" -o json | python3 -c 'import json,sys; a=json.load(sys.stdin)["status"]["allocatable"]; print({k:v for k,v in a.items() if k.startswith("nvidia.com/")})'; }

# The Jetson's files, L4T R36.4.0 (JetPack 6.1) on an Orin Nano developer kit.
mkdir -p "$W/host/etc" "$W/host/sys/devices/soc0" "$W/host/proc/device-tree" "$W/plugin" "$W/state"
echo "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: Fri Sep 13 04:36:44 UTC 2024" \
  > "$W/host/etc/nv_tegra_release"
echo Tegra > "$W/host/sys/devices/soc0/family"
printf 'nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0nvidia,tegra234\0' > "$W/host/proc/device-tree/compatible"
printf 'NVIDIA Jetson Orin Nano Developer Kit\0' > "$W/host/proc/device-tree/model"

$K create namespace gpu-share >/dev/null 2>&1
$K -n gpu-share create configmap gpu-share-profiles \
  --from-file=homelab-timeslice="$ROOT/profiles/homelab-timeslice.yaml" \
  --from-file=exclusive="$ROOT/profiles/exclusive.yaml" \
  --from-file=h100-mps="$ROOT/profiles/h100-mps.yaml" \
  --dry-run=client -o yaml | $K apply -f - >/dev/null

echo "== NVIDIA's device plugin $("$PLUGIN" --version 2>&1 | head -n 1) in a namespace with /etc/nv_tegra_release"
ls /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 2>/dev/null && echo "WARNING: this machine has NVML; the plugin would not take the Tegra path"
GPU_SHARE_PLUGIN_CONFIG="$W/plugin/config.yaml" "$BIN" device-plugin init-config
cp -a /etc "$W/etc" && cp "$W/host/etc/nv_tegra_release" "$W/etc/nv_tegra_release"
# unshare execs the shell, which execs the plugin: $! is the plugin's pid.
# CONTAINER_DRIVER_ROOT=/ as docs/homelab.md's Jetson patch sets it (the plugin's default,
# /driver-root, holds no Tegra file in gpu-share's component).
CONTAINER_DRIVER_ROOT=/ unshare --mount --propagation private sh -c \
  "mount --bind '$W/etc' /etc && exec '$PLUGIN' --config-file '$W/plugin/config.yaml'" \
  > "$W/plugin.log" 2>&1 &
echo $! > "$W/plugin.pid"
sleep 3
grep -iE "tegra|platform|Registered|Starting" "$W/plugin.log" | head -n 8

echo "== the agent, no NVML, on the Jetson's host root"
env NODE_NAME="$NODE" POD_NAMESPACE=gpu-share GPU_SHARE_NVML_LIB=/nonexistent/libnvidia-ml.so.1 \
  GPU_SHARE_STATE_DIR="$W/state" GPU_SHARE_PLUGIN_CONFIG="$W/plugin/config.yaml" \
  GPU_SHARE_PLUGIN_RELOAD=signal GPU_SHARE_PLUGIN_PID_FILE="$W/plugin.pid" \
  GPU_SHARE_MPS_ROOT="$W/mps" GPU_SHARE_HOST_ROOT="$W/host" GPU_SHARE_LISTEN=127.0.0.1:19651 \
  RUST_LOG=info "$BIN" agent --resync-period 300s --allocatable-timeout 60s > "$W/agent.log" 2>&1 &
sleep 3
grep -E "Tegra|XID" "$W/agent.log" | head -n 3

echo "== 1. homelab-timeslice"
t0=$(date +%s.%N)
$K label node "$NODE" gpu-share.dev/profile=homelab-timeslice --overwrite >/dev/null
wait_state success 60; echo "state $(state) after $(python3 -c "import time; print(round(time.time()-$t0, 1))") s: $(reason)"
echo "allocatable: $(alloc)"
echo "plugin config: $(grep -A4 'timeSlicing' "$W/plugin/config.yaml" | tr -s ' \n' ' ')"
echo "node labels: $($K get node "$NODE" -o json | python3 -c 'import json,sys; l=json.load(sys.stdin)["metadata"]["labels"]; print({k:v for k,v in l.items() if k.startswith("gpu-share.dev/gpu.")})')"
grep -E "Received signal|SIGHUP|Restarting|Retreiving|tegra" "$W/plugin.log" | tail -n 4
cat <<EOF | $K apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: jetson-tenant, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: k8s.local/busybox:1.35, imagePullPolicy: Never, command: [sleep, '3600'],
     resources: {limits: {nvidia.com/gpu.shared: 1}}}
EOF
$K wait --for=condition=Ready pod/jetson-tenant --timeout=60s
echo "the tenant's NVIDIA_VISIBLE_DEVICES: $($K exec jetson-tenant -- env | grep NVIDIA_VISIBLE_DEVICES)"
$K delete pod jetson-tenant --now >/dev/null

echo "== 2. exclusive"
$K label node "$NODE" gpu-share.dev/profile=exclusive --overwrite >/dev/null
for _ in $(seq 1 60); do [ "$(state)" = success ] && [ "$($K get node "$NODE" -o jsonpath='{.metadata.annotations.gpu-share\.dev/profile\.reason}')" = "profile exclusive applied" ] && break; sleep 1; done
echo "state $(state): $(reason); allocatable: $(alloc)"

echo "== 3. h100-mps on the Jetson"
before=$(sha256sum < "$W/plugin/config.yaml")
$K label node "$NODE" gpu-share.dev/profile=h100-mps --overwrite >/dev/null
wait_state failed 30; echo "state $(state): $(reason)"
[ "$before" = "$(sha256sum < "$W/plugin/config.yaml")" ] && echo "plugin config unchanged" || echo "PLUGIN CONFIG CHANGED"
