#!/bin/bash
# Label change -> device-plugin config written, gpu-share's agent against NVIDIA's
# config-manager (k8s-device-plugin v0.20.0, cmd/config-manager), on the real API server of the
# node test bed (../shared/testbed), alternating, SAMPLES (default 200) changes each
# (issue 39 item 8; figures in benches/README.md). Not run by CI: it needs root, the test bed
# and a config-manager binary built from NVIDIA's source:
#
#   (cd ../shared/testbed && ./start.sh)
#   git -C <mirror of NVIDIA/k8s-device-plugin> archive v0.20.0 -- . ':!tests' | tar -x -C DIR
#   (cd DIR && GOFLAGS=-mod=vendor CGO_ENABLED=0 go build -o /tmp/config-manager ./cmd/config-manager)
#   cargo build --release && cargo build -p fake-nvml
#   CONFIG_MANAGER=/tmp/config-manager docs/testbed/label-to-config.sh
#
# Both watch the one Node and write a file; neither signals a plugin (the agent's reload is
# `none`, config-manager's --send-signal=false) and the agent does not wait for allocatable
# (--allocatable-timeout 0s), so both stop at "config written", where this measures.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TESTBED_DIR=${TESTBED_DIR:-$(cd "$ROOT/.." && pwd)/testbed-run}
export KUBECONFIG=$TESTBED_DIR/kubeconfig
K=$TESTBED_DIR/bin/kubectl
BIN=${BIN:-$ROOT/target/release/gpu-share}
NVML=${NVML:-$ROOT/target/debug/libnvidia_ml.so}
CONFIG_MANAGER=${CONFIG_MANAGER:?build NVIDIA config-manager first (see the head of this script)}
NODE=$($K get nodes -o jsonpath='{.items[0].metadata.name}')
W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  $K label node "$NODE" gpu-share.dev/profile- nvidia.com/device-plugin.config- >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/state" "$W/plugin" "$W/mps" "$W/cm-src" "$W/cm" "$W/host/proc/driver/nvidia" "$W/host/dev"
echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025" \
  > "$W/host/proc/driver/nvidia/version"
cp "$ROOT/tests/data/simulated-h100x2.json" "$W/nvml.json"
ts() { printf 'version: v1\nrules:\n  - devices: all\n    timeSlicing: {replicas: %s}\n' "$1"; }
ts 4 > "$W/ts-4.yaml"; ts 8 > "$W/ts-8.yaml"
$K create namespace gpu-share >/dev/null 2>&1 || true
$K -n gpu-share delete configmap gpu-share-profiles >/dev/null 2>&1 || true
$K -n gpu-share create configmap gpu-share-profiles \
  --from-file=ts-4="$W/ts-4.yaml" --from-file=ts-8="$W/ts-8.yaml" >/dev/null

env NODE_NAME="$NODE" POD_NAMESPACE=gpu-share GPU_SHARE_NVML_LIB="$NVML" \
  FAKE_NVML_STATE="$W/nvml.json" GPU_SHARE_STATE_DIR="$W/state" \
  GPU_SHARE_PLUGIN_CONFIG="$W/plugin/config.yaml" GPU_SHARE_PLUGIN_RELOAD=none \
  GPU_SHARE_MPS_ROOT="$W/mps" GPU_SHARE_HOST_ROOT="$W/host" GPU_SHARE_LISTEN="127.0.0.1:19464" \
  RUST_LOG=${AGENT_LOG:-warn} "$BIN" agent --resync-period 300s --allocatable-timeout 0s ${AGENT_FLAGS:-} > "$W/agent.log" 2>&1 &
PIDS+=($!)
# The agent writes each profile's config once; config-manager's sources are those bytes.
for v in 4 8; do
  $K label node "$NODE" --overwrite gpu-share.dev/profile="ts-$v" >/dev/null
  for _ in $(seq 1 100); do
    grep -q "replicas: $v" "$W/plugin/config.yaml" 2>/dev/null && break; sleep 0.1
  done
  cp "$W/plugin/config.yaml" "$W/cm-src/ts-$v"
done
"$CONFIG_MANAGER" --kubeconfig "$KUBECONFIG" --node-name "$NODE" \
  --config-file-srcdir "$W/cm-src" --config-file-dst "$W/cm/config.yaml" \
  --default-config ts-4 --send-signal=false > "$W/config-manager.log" 2>&1 &
PIDS+=($!)
$K proxy --port 18001 > "$W/proxy.log" 2>&1 &
PIDS+=($!)
sleep 3
NODE=$NODE GS_CONFIG="$W/plugin/config.yaml" CM_DST="$W/cm/config.yaml" CM_SRC="$W/cm-src" \
  OUT="${OUT:-/tmp/label-to-config.json}" python3 "$ROOT/docs/testbed/label-to-config.py"
echo "--- agent log ---"; tail -${AGENT_TAIL:-5} "$W/agent.log"
echo "--- config-manager log ---"; tail -3 "$W/config-manager.log"
