#!/bin/bash
# The agent against the real node test bed (../shared/testbed: kube-apiserver, scheduler and
# kubelet 1.36.2), on the fake NVML: what a session checks before resolving kubelet- or
# API-facing work. Not run by CI (it needs root, the test bed and its kubelet sockets).
#
#   (cd ../shared/testbed && ./setup.sh && ./start.sh)     # MICROSHIFT=... on the first setup
#   cargo build --release && cargo build -p fake-nvml
#   docs/testbed/agent-checks.sh                           # prints what the real parts did
#   (cd ../shared/testbed && ./stop.sh)
#
# Checks: 1. `--plugin nvidia` with no NVIDIA plugin: `failed`, AllocatableMismatch with the
# counts; the Node's and Events' field manager is gpu-share. 2. `--plugin builtin` registered
# with the real kubelet: `success` once allocatable shows the plan. 3. A Deployment's pod holding
# a whole GPU, relabel to time-slicing: the pod is drained first (Reallocating), its successor
# runs on a replica. 4. A bare pod there: `blocked`, PodNotEvictable, nothing evicted.
# 5. A critical XID raised in the fake NVML under `--plugin builtin`: the kubelet's allocatable
# drops by the GPU's devices, Event DeviceUnhealthy. 6. `--plugin dra`: the kubelet's plugin
# watcher registers the driver (grpc-go's :authority), slices published, a pod with a MIG claim
# runs, the health stream is served (no "Unimplemented" in the kubelet log), and an XID on that
# MIG device shows Unhealthy in the pod's allocatedResourcesStatus. 7. `--plugin dra` with a
# `dynamicMig` profile: the real API server takes the counter slices, the real scheduler picks
# placements for pods asking for 1g.10gb and 3g.40gb, the agent makes the instances at Prepare
# and destroys them when the pods are deleted. 8. Leaving dynamic MIG while a pod holds an
# instance the new fixed geometry keeps: the pod is not evicted, the instance stays through the
# pod's deletion (the profile owns it now). 9. (only with the test bed started as
# `DRA_PD=false ./start.sh`: DRAPartitionableDevices off, the 1.34/1.35 default) a `dynamicMig`
# profile: the server drops the counters, the agent publishes the dynamic GPUs whole only
# (Event CountersDropped), a 1g.10gb pod stays Pending, a whole-GPU pod runs; a static MIG
# profile then serves the 1g.10gb pod. 10. Dynamic MIG with an instance made out of band on
# GPU 0 slot 5 (written into the fake NVML, as `nvidia-smi mig -cgi` would make it): the first
# 1g.10gb pod is allocated that slot by first fit, its Prepare is refused naming the instance,
# and the agent republishes at once without the devices it overlaps; a second pod runs beside it.
# 11. A Deployment's pod on a time-sliced replica (`--plugin builtin`), relabelled from 2 to 4
# replicas: its device ID stays advertised, but on other terms, so it is drained first
# (Reallocating names the change) and its successor runs on a replica of the new count.
# 12. `--plugin dra` with the overlay's extended-resource DeviceClasses: a Deployment asking
# `nvidia.com/gpu: 1` and a pod asking `nvidia.com/mig-1g.10gb: 1`, specs as for a device
# plugin, run on the DRA node: the scheduler makes each a claim (pod status
# extendedResourceClaimStatus), the agent prepares it (CDI spec); then GPU 1 goes from 2
# time-sliced shares to 2 MPS shares (same device names): the Deployment's pod is drained
# (Reallocating names the change) and its successor runs on an MPS share.
# 13. `--plugin dra --xid-heal-after 20s`, GPU 0 seven 1g.10gb: a pod's claim gets a MIG device
# D (first fit), the pod is deleted, XID 48 is raised on D: D is published with the taint
# gpu.gpu-share.dev/xid=48:NoSchedule; a pod whose claim asks for D by UUID stays Pending (the
# scheduler's reason printed), one whose claim also tolerates the taint runs on D, a plain
# 1g.10gb pod gets another device; 20 s later the taint is gone (DeviceHealed) and the pending
# pod runs on D. 14. (only with the test bed started as `FEATURE_GATES=DRADeviceTaints=false
# ./start.sh`) the same XID: the server drops the taint, the agent withdraws D instead (Event
# TaintsDropped), a 1g.10gb pod runs on another device, D comes back after the heal.
# 15. Fractional GPUs: GPU 0 `mps: {replicas: 16, consumable: ...}` (one 80 GB H100 device
# gpu-0-mps), six pods whose ResourceClaims ask different memory and compute: those that fit run
# (their consumedCapacity and shareID, and the CUDA_MPS_* limits of each claim's CDI spec
# printed), the others stay Pending with the scheduler's reason; deleting one lets a pending pod
# run. 16. (only with the test bed started as `FEATURE_GATES=DRAConsumableCapacity=false
# ./start.sh`) the same profile: the server drops allowMultipleAllocations, the agent publishes
# 16 fixed MPS shares instead (Event ConsumableCapacityDropped); what the server does with a
# claim's capacity requests, and a claim's pod on a share. 17. Fractional MIG devices: GPU 0
# `mig: {3g.40gb: 2}` beside `mps: {replicas: 8, consumable: ...}`: three pods asking memory and
# compute land on the two MIG devices as first fit allows, each claim's CDI spec names its MIG
# device, that device's MPS daemon and the claim's limits.
# Results of the session that wrote it: its closing note (issues stops).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TESTBED_DIR=${TESTBED_DIR:-$(cd "$ROOT/.." && pwd)/testbed-run}
export KUBECONFIG=$TESTBED_DIR/kubeconfig
K=$TESTBED_DIR/bin/kubectl
BIN=${BIN:-$ROOT/target/release/gpu-share}
NVML=${NVML:-$ROOT/target/debug/libnvidia_ml.so}
MPS_CONTROL=${MPS_CONTROL:-$ROOT/target/debug/nvidia-cuda-mps-control}
NODE=$($K get nodes -o jsonpath='{.items[0].metadata.name}')
W=$(mktemp -d)
trap 'pkill -f "$BIN agent" 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/host/proc/driver/nvidia" "$W/host/dev"
echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025" \
  > "$W/host/proc/driver/nvidia/version"
for d in nvidiactl nvidia0 nvidia-uvm; do : > "$W/host/dev/$d"; done

# ONLY="5 6" runs those checks alone (all by default).
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
# The apiserver's DRAPartitionableDevices gate as start.sh set it (DRA_PD), "" = the default.
gate_pd() { tr '\0' '\n' < "/proc/$(cat "$TESTBED_DIR/run/kube-apiserver.pid")/cmdline" | grep -o 'DRAPartitionableDevices=[a-z]*' | cut -d= -f2; }
state() { $K get node "$NODE" -o jsonpath='{.metadata.labels.gpu-share\.dev/profile\.state}'; }
reason() { $K get node "$NODE" -o jsonpath='{.metadata.annotations.gpu-share\.dev/profile\.reason}'; }
wait_state() { for _ in $(seq 1 "$2"); do [ "$(state)" = "$1" ] && return 0; sleep 1; done; return 1; }
gpus() { $K get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
# Raise XID $2 on GPU $1 of the fake NVML (optionally on MIG device GI $3 / CI $4).
raise_xid() {
  python3 - "$W/nvml.json" "$@" <<'PY'
import json, os, sys
path, gpu, xid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(path))
g = s["gpus"][gpu]
events = g.setdefault("events", [])
e = {"seq": (events[-1]["seq"] if events else 0) + 1, "event_type": 8, "data": xid}
if len(sys.argv) > 5:
    e["gi_id"], e["ci_id"] = int(sys.argv[4]), int(sys.argv[5])
events.append(e)
json.dump(s, open(path + ".tmp", "w")); os.rename(path + ".tmp", path)
PY
}

# "uuid gi ci" of published MIG device $1 (its UUID from the slices, its ids from the fake NVML).
mig_ids() {
  python3 - "$W/nvml.json" "$1" "$($K get resourceslices -o json)" <<'PY'
import json, sys
state, device, slices = json.load(open(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3])
uuid = next(d["attributes"]["uuid"]["string"] for s in slices["items"] for d in s["spec"].get("devices", []) if d["name"] == device)
for g in state["gpus"]:
    for gi in g.get("gpu_instances", []):
        for ci in gi.get("compute_instances", []):
            if ci.get("uuid") == uuid:
                print(uuid, gi["id"], ci["id"])
PY
}
# A feature gate of the apiserver as start.sh set it ("" = the default).
gate() { tr '\0' '\n' < "/proc/$(cat "$TESTBED_DIR/run/kube-apiserver.pid")/cmdline" | grep -o "$1=[a-z]*" | cut -d= -f2; }

# The DeviceClasses, the example claim templates and the profiles ConfigMap with the given
# `--from-literal=KEY=TEXT` profiles.
dra_profiles() {
  $K apply -f "$ROOT/deploy/overlays/dra/device-classes.yaml" >/dev/null
  $K apply -n default -f "$ROOT/deploy/examples/dra/resource-claim-templates.yaml" >/dev/null
  $K -n gpu-share create configmap gpu-share-profiles "$@" --dry-run=client -o yaml | $K apply -f - >/dev/null
}
# Start the agent (fresh state and NVML each time) with extra flags; port $1.
agent() {
  local port=$1; shift
  rm -rf "$W/state" "$W/plugin" "$W/mps"; mkdir -p "$W/state" "$W/plugin" "$W/mps"
  cp "$ROOT/tests/data/simulated-h100x2.json" "$W/nvml.json"
  env NODE_NAME="$NODE" POD_NAMESPACE=gpu-share GPU_SHARE_NVML_LIB="$NVML" \
    FAKE_NVML_STATE="$W/nvml.json" GPU_SHARE_STATE_DIR="$W/state" \
    GPU_SHARE_PLUGIN_CONFIG="$W/plugin/config.yaml" GPU_SHARE_PLUGIN_RELOAD=none \
    GPU_SHARE_MPS_ROOT="$W/mps" GPU_SHARE_MPS_CONTROL="$MPS_CONTROL" \
    GPU_SHARE_HOST_ROOT="$W/host" GPU_SHARE_LISTEN="127.0.0.1:$port" \
    RUST_LOG=info "$BIN" agent --resync-period 300s "$@" > "$W/agent-$port.log" 2>&1 &
  sleep 3
}
stop_agent() { pkill -f "$BIN agent"; sleep 2; $K label node "$NODE" gpu-share.dev/profile- >/dev/null 2>&1; }
builtin() { agent "$1" --plugin builtin --device-plugin-dir /var/lib/kubelet/device-plugins \
  --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock --allocatable-timeout 60s; }
gpu_workload() { # $1: Deployment or Pod name; $2: deployment|pod
  local head
  if [ "$2" = deployment ]; then
    head="apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}}
    spec:"
  else
    head="apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {app: $1}}
spec:"
  fi
  local pad; [ "$2" = deployment ] && pad="      " || pad="  "
  { echo "$head"
    echo "${pad}automountServiceAccountToken: false"
    echo "${pad}terminationGracePeriodSeconds: 1"
    echo "${pad}containers:"
    echo "${pad}- {name: c, image: k8s.local/busybox:1.35, imagePullPolicy: Never, command: [sleep, '3600'], resources: {limits: {nvidia.com/gpu: 1}}}"
  } | $K apply -f - >/dev/null
  $K wait --for=condition=Ready pod -l "app=$1" --timeout=60s >/dev/null
}

$K create namespace gpu-share >/dev/null 2>&1
$K -n gpu-share create configmap gpu-share-profiles \
  --from-literal=whole="$(printf 'version: v1\nrules:\n- devices: all\n  exclusive: true\n')" \
  --from-literal=ts-2="$(printf 'version: v1\nrules:\n- devices: all\n  timeSlicing: {replicas: 2}\n')" \
  --from-literal=ts-4="$(printf 'version: v1\nrules:\n- devices: all\n  timeSlicing: {replicas: 4}\n')" \
  --dry-run=client -o yaml | $K apply -f - >/dev/null

if want 1; then
echo "== 1. --plugin nvidia, no NVIDIA plugin on the node"
agent 19601 --allocatable-timeout 8s
$K label node "$NODE" gpu-share.dev/profile=whole --overwrite >/dev/null
wait_state failed 30; echo "state $(state): $(reason)"
echo "field managers on the Node:"; $K get node "$NODE" -o yaml --show-managed-fields | grep "manager:" | sort | uniq -c
echo "field managers of Events:"; $K get events.events.k8s.io -A -o yaml --show-managed-fields | grep "manager:" | sort | uniq -c
stop_agent
fi

if want 2; then
echo "== 2. --plugin builtin with the real kubelet"
builtin 19602
t0=$(date +%s)
$K label node "$NODE" gpu-share.dev/profile=whole --overwrite >/dev/null
wait_state success 60; echo "state $(state) after $(( $(date +%s) - t0 )) s; nvidia.com/gpu $(gpus)"
fi

if want 3; then
echo "== 3. a Deployment's pod on a whole GPU, relabel to ts-2"
gpu_workload holder deployment
before=$($K get pod -l app=holder -o jsonpath='{.items[0].metadata.name}')
$K label node "$NODE" gpu-share.dev/profile=ts-2 --overwrite >/dev/null
for _ in $(seq 1 90); do [ "$(state)" = success ] && [ "$(gpus)" = 4 ] && break; sleep 1; done
echo "state $(state); nvidia.com/gpu $(gpus); pod before: $before; now:"
$K get pods -l app=holder --no-headers
grep -E "re-allocated|evicted" "$W/agent-19602.log" | cut -c1-300
$K delete deploy holder --wait=false >/dev/null
fi

if want 4; then
echo "== 4. a bare pod on a whole GPU, relabel to ts-2"
stop_agent; builtin 19603
$K label node "$NODE" gpu-share.dev/profile=whole --overwrite >/dev/null
wait_state success 60
gpu_workload bare pod
$K label node "$NODE" gpu-share.dev/profile=ts-2 --overwrite >/dev/null
wait_state blocked 30; echo "state $(state): $(reason)"; echo "nvidia.com/gpu $(gpus)"
$K delete pod bare --wait=false >/dev/null
stop_agent
fi

if want 5; then
echo "== 5. a critical XID under --plugin builtin"
builtin 19605
$K label node "$NODE" gpu-share.dev/profile=ts-2 --overwrite >/dev/null
for _ in $(seq 1 60); do [ "$(state)" = success ] && [ "$(gpus)" = 4 ] && break; sleep 1; done
echo "state $(state); nvidia.com/gpu $(gpus)"
t0=$(date +%s.%N)
raise_xid 1 79
for _ in $(seq 1 60); do [ "$(gpus)" = 2 ] && break; sleep 0.5; done
echo "after XID 79 on GPU 1: nvidia.com/gpu $(gpus) ($(echo "$(date +%s.%N) - $t0" | bc) s)"
$K get events.events.k8s.io -A --field-selector reason=DeviceUnhealthy -o jsonpath='{range .items[*]}{.type} {.reason}: {.note}{"\n"}{end}'
curl -s "127.0.0.1:19605/metrics" | grep -E "^gpu_share_(unhealthy_devices|critical_xids_total)"
stop_agent
fi

if want 11; then
echo "== 11. a Deployment's pod on a time-sliced replica, relabel ts-2 -> ts-4 (its ID stays)"
builtin 19611
$K label node "$NODE" gpu-share.dev/profile=ts-2 --overwrite >/dev/null
for _ in $(seq 1 60); do [ "$(state)" = success ] && [ "$(gpus)" = 4 ] && break; sleep 1; done
gpu_workload sliced deployment
before=$($K get pod -l app=sliced -o jsonpath='{.items[0].metadata.name}')
$K label node "$NODE" gpu-share.dev/profile=ts-4 --overwrite >/dev/null
for _ in $(seq 1 90); do [ "$(state)" = success ] && [ "$(gpus)" = 8 ] && break; sleep 1; done
echo "state $(state); nvidia.com/gpu $(gpus); pod before: $before; now:"
$K get pods -l app=sliced --no-headers
$K get events.events.k8s.io -A --field-selector reason=Reallocating -o jsonpath='{range .items[*]}{.note}{"\n"}{end}' | tail -1 | cut -c1-400
$K delete deploy sliced --wait=false >/dev/null
stop_agent
fi

# A pod with one claim from ResourceClaimTemplate $2, or with ResourceClaim $2 when $3 is `claim`.
pod() { # $1 name, $2 template (or claim), $3 `claim` or nothing
local source=resourceClaimTemplateName
[ "${3:-}" = claim ] && source=resourceClaimName
cat <<YAML | $K apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: mig, $source: $2}]
  containers:
  - {name: c, image: k8s.local/busybox:1.35, imagePullPolicy: Never, command: [sleep, "3600"], resources: {claims: [{name: mig}]}}
YAML
}
# GPU instances per GPU in the fake NVML state.
nvml_instances() {
python3 - "$W/nvml.json" <<'PY'
import json, sys
out = []
for i, g in enumerate(json.load(open(sys.argv[1]))["gpus"]):
    mig = "on" if (g.get("mig") or {}).get("current") else "off"
    gis = [f'GI {x["id"]} profile {x["profile_id"]} at {x["placement"]["start"]}:{x["placement"]["size"]} with {len(x.get("compute_instances", []))} CI'
           for x in g.get("gpu_instances", [])]
    out.append(f"GPU {i}: MIG {mig}, " + (", ".join(gis) or "no instances"))
print("; ".join(out))
PY
}
if want 6; then
echo "== 6. --plugin dra with the real kubelet"
dra_profiles \
  --from-literal=whole="$(printf 'version: v1\nrules:\n- devices: all\n  exclusive: true\n')" \
  --from-literal=ts-2="$(printf 'version: v1\nrules:\n- devices: all\n  timeSlicing: {replicas: 2}\n')" \
  --from-literal=mig="$(printf 'version: v1\nrules:\n- devices: [0]\n  mig: {1g.10gb: 7}\n- devices: [1]\n  exclusive: true\n')"
unimplemented_before=$(grep -c "WatchResources.*Unimplemented" "$TESTBED_DIR/logs/kubelet.log")
kubelet_lines=$(wc -l < "$TESTBED_DIR/logs/kubelet.log")
agent 19606 --plugin dra --cdi-root "$W/cdi" \
  --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock
$K label node "$NODE" gpu-share.dev/profile=mig --overwrite >/dev/null
wait_state success 60; echo "state $(state): $(reason)"
sleep 2
echo "kubelet log since the agent started:"
tail -n +"$kubelet_lines" "$TESTBED_DIR/logs/kubelet.log" | grep -iE "gpu.gpu-share.dev|RegisterPlugin|WatchResources" | cut -c1-260 | head -8
echo "ResourceSlices:"; $K get resourceslices -o custom-columns=NAME:.metadata.name,DEVICES:.spec.devices[*].name --no-headers | cut -c1-200
pod dra-mig mig-1g-10gb
$K wait --for=condition=Ready pod/dra-mig --timeout=60s >/dev/null && echo "pod dra-mig Ready"
claim=$($K get pod dra-mig -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
device=$($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')
echo "claim $claim got $device"
echo "allocatedResourcesStatus: $($K get pod dra-mig -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}')"
read -r _ gi ci < <(mig_ids "$device")
t0=$(date +%s.%N)
raise_xid 0 48 "$gi" "$ci"
for _ in $(seq 1 60); do
  $K get pod dra-mig -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}' | grep -q Unhealthy && break; sleep 0.5
done
echo "after XID 48 on GI $gi CI $ci ($(echo "$(date +%s.%N) - $t0" | bc) s): $($K get pod dra-mig -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}')"
echo "kubelet 'WatchResources … Unimplemented' lines: $unimplemented_before before, $(grep -c "WatchResources.*Unimplemented" "$TESTBED_DIR/logs/kubelet.log") now"
$K delete pod dra-mig --wait=true --timeout=30s >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
fi

# The agent under `--plugin dra` on port $1 with profile `dyn` (every GPU dynamic MIG) applied;
# `static` (GPU 0 seven 1g.10gb, GPU 1 whole) is there to change to.
dynamic_agent() {
dra_profiles \
  --from-literal=dyn="$(printf 'version: v1\nrules:\n- devices: all\n  dynamicMig: true\n')" \
  --from-literal=static="$(printf 'version: v1\nrules:\n- devices: [0]\n  mig: {1g.10gb: 7}\n- devices: [1]\n  exclusive: true\n')"
agent "$1" --plugin dra --cdi-root "$W/cdi" --dra-plugin-dir "$W/dra" \
  --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock
$K label node "$NODE" gpu-share.dev/profile=dyn --overwrite >/dev/null
wait_state success 60
}
if want 7; then
echo "== 7. dynamic MIG with the real scheduler"
dynamic_agent 19607
echo "state $(state): $(reason)"
sleep 2
$K get resourceslices -o json > "$W/slices.json"
python3 - "$W/slices.json" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["items"]
devices = [d for s in items for d in s["spec"].get("devices", [])]
sets = [c for s in items for c in s["spec"].get("sharedCounters", [])]
sizes = [len(c["counters"]) for c in sets]
print(f"{len(items)} slices, {len(devices)} devices, {len(sets)} counter sets of {sizes} counters")
PY
grep -iE "SlicesRejected|refused" "$W/agent-19607.log" | head -3
template() { # $1 name, $2 MIG profile
cat <<YAML | $K apply -n default -f - >/dev/null
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.gpu-share.dev
          selectors: [{cel: {expression: 'device.attributes["gpu.gpu-share.dev"].migProfile == "$2"'}}]
YAML
}
template mig-3g-40gb 3g.40gb
for p in dyn-small-1 dyn-small-2; do pod $p mig-1g-10gb; $K wait --for=condition=Ready pod/$p --timeout=60s >/dev/null; done
pod dyn-medium mig-3g-40gb
$K wait --for=condition=Ready pod/dyn-medium --timeout=60s >/dev/null
for p in dyn-small-1 dyn-small-2 dyn-medium; do
  claim=$($K get pod $p -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
  echo "pod $p ($($K get pod $p -o jsonpath='{.status.phase}')): $($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')"
done
# A 7g claim: GPU 0 holds small instances, so first fit takes GPU 1 (its MIG turned on).
template mig-7g-80gb 7g.80gb
pod dyn-big mig-7g-80gb
sleep 5
claim=$($K get pod dyn-big -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
echo "pod dyn-big ($($K get pod dyn-big -o jsonpath='{.status.phase}')): $($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')"
echo "NVML: $(nvml_instances)"
$K delete pod dyn-small-1 dyn-small-2 dyn-medium dyn-big --wait=true --timeout=60s >/dev/null
sleep 3
echo "after deleting the pods, NVML: $(nvml_instances)"
echo "journal: $(cat "$W/dra/dynamic-mig.json" 2>/dev/null | tr -d ' \n')"
grep -E "made the claim|destroyed the claim|cannot" "$W/agent-19607.log" | cut -c1-220 | head -12
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
fi

if want 8; then
echo "== 8. leaving dynamic MIG with a pod on a kept instance"
dynamic_agent 19608; sleep 2
pod dyn-keep mig-1g-10gb
$K wait --for=condition=Ready pod/dyn-keep --timeout=60s >/dev/null
claim=$($K get pod dyn-keep -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
echo "pod dyn-keep: $($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')"
$K label node "$NODE" gpu-share.dev/profile=static --overwrite >/dev/null
sleep 2; wait_state success 60; echo "state $(state): $(reason)"
echo "pod dyn-keep after the change: $($K get pod dyn-keep -o jsonpath='{.status.phase}') (evictions in the agent log: $(grep -c 'evict' "$W/agent-19608.log"))"
echo "journal: $(tr -d ' \n' < "$W/dra/dynamic-mig.json")"
echo "NVML: $(nvml_instances)"
$K delete pod dyn-keep --wait=true --timeout=60s >/dev/null; sleep 3
echo "after deleting the pod, NVML: $(nvml_instances)"
grep -E "profile's now|destroyed the claim" "$W/agent-19608.log" | cut -c1-220
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
fi

if want 10 && [ "$(gate_pd)" != false ]; then
echo "== 10. an out-of-band MIG instance on a dynamic GPU"
dynamic_agent 19610; echo "state $(state): $(reason)"
python3 - "$W/nvml.json" <<'PY'
import json, os, sys
path = sys.argv[1]
s = json.load(open(path))
g = s["gpus"][0]
g["mig"] = {"current": True, "pending": True}
g.setdefault("gpu_instances", []).append({"id": 9, "profile_id": 19,
    "placement": {"start": 5, "size": 1}, "compute_instances": [{"id": 0, "profile_id": 0,
    "placement": {"start": 0, "size": 1}, "uuid": "MIG-out-of-band-0000"}]})
json.dump(s, open(path + ".tmp", "w")); os.rename(path + ".tmp", path)
PY
echo "NVML: $(nvml_instances)"
t0=$(date +%s.%N)
pod oob-1 mig-1g-10gb
for _ in $(seq 1 100); do
  $K get resourceslices -o jsonpath='{.items[*].spec.devices[*].name}' | tr ' ' '\n' | grep -qx gpu-0-mig-5-1g-10gb || break; sleep 0.1
done
echo "gpu-0-mig-5-1g-10gb withdrawn $(echo "$(date +%s.%N) - $t0" | bc) s after the pod was created"
claim=$($K get pod oob-1 -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
echo "pod oob-1 ($($K get pod oob-1 -o jsonpath='{.status.phase}')): $($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')"
$K get events -n default --field-selector involvedObject.name=oob-1 -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' | grep -v Scheduled | cut -c1-300 | sort -u | head -3
$K get events.events.k8s.io -A --field-selector reason=OutOfBandMig -o jsonpath='{range .items[*]}{.type} {.reason}: {.note}{"\n"}{end}' | head -1
grep -E "no claim made|republish" "$W/agent-19610.log" | cut -c1-200 | head -3
pod oob-2 mig-1g-10gb
$K wait --for=condition=Ready pod/oob-2 --timeout=60s >/dev/null
claim=$($K get pod oob-2 -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
echo "pod oob-2 ($($K get pod oob-2 -o jsonpath='{.status.phase}')): $($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')"
echo "NVML: $(nvml_instances)"
$K delete pod oob-1 oob-2 --wait=true --timeout=60s >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
fi


if want 12; then
echo "== 12. classic nvidia.com/gpu and nvidia.com/mig-1g.10gb pods on a --plugin dra node"
$K apply -f "$ROOT/deploy/overlays/dra/device-classes.yaml" \
  -f "$ROOT/deploy/overlays/dra/extended-resource-classes.yaml" >/dev/null
echo "DeviceClasses with an extendedResourceName: $($K get deviceclasses -o json | python3 -c '
import json, sys
print(sum(1 for c in json.load(sys.stdin)["items"] if c["spec"].get("extendedResourceName")))')"
$K -n gpu-share create configmap gpu-share-profiles \
  --from-literal=dra-ts="$(printf 'version: v1\nrules:\n- devices: [0]\n  mig: {1g.10gb: 7}\n- devices: [1]\n  timeSlicing: {replicas: 2}\n')" \
  --from-literal=dra-mps="$(printf 'version: v1\nrules:\n- devices: [0]\n  mig: {1g.10gb: 7}\n- devices: [1]\n  mps: {replicas: 2}\n')" \
  --dry-run=client -o yaml | $K apply -f - >/dev/null
agent 19612 --plugin dra --cdi-root "$W/cdi" --dra-plugin-dir "$W/dra" \
  --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock
$K label node "$NODE" gpu-share.dev/profile=dra-ts --overwrite >/dev/null
wait_state success 60; echo "state $(state): $(reason)"
echo "node allocatable nvidia.com/gpu: '$(gpus)' (0 or absent: the scheduler serves it from DRA)"
gpu_workload classic deployment
classic_claim() { # $1: pod name -> "claim device request"
  local c; c=$($K get pod "$1" -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')
  echo "$c $($K get resourceclaim "$c" -o jsonpath='{.status.allocation.devices.results[0].device} {.status.allocation.devices.results[0].request} class {.spec.devices.requests[0].exactly.deviceClassName}')"
}
before=$($K get pod -l app=classic -o jsonpath='{.items[0].metadata.name}')
echo "pod $before ($($K get pod "$before" -o jsonpath='{.status.phase}')): $($K get pod "$before" -o jsonpath='{.status.extendedResourceClaimStatus}')"
echo "its claim: $(classic_claim "$before")"
cat <<YAML | $K apply -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: classic-mig, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: k8s.local/busybox:1.35, imagePullPolicy: Never, command: [sleep, "3600"], resources: {limits: {nvidia.com/mig-1g.10gb: 1}}}
YAML
$K wait --for=condition=Ready pod/classic-mig --timeout=60s >/dev/null && echo "pod classic-mig Ready: $(classic_claim classic-mig)"
echo "prepared (agent log):"; grep -E "prepared|NodePrepareResources" "$W/agent-19612.log" | cut -c1-240 | tail -3
echo "CDI specs: $(ls "$W/cdi" 2>/dev/null | tr '\n' ' ')"
mig_uid=$($K get pod classic-mig -o jsonpath='{.metadata.uid}')
$K label node "$NODE" gpu-share.dev/profile=dra-mps --overwrite >/dev/null
for _ in $(seq 1 90); do
  [ "$(state)" = success ] && ! $K get pod "$before" >/dev/null 2>&1 && break; sleep 1
done
$K wait --for=condition=Ready pod -l app=classic --timeout=60s >/dev/null
after=$($K get pod -l app=classic -o jsonpath='{.items[0].metadata.name}')
echo "state $(state); pod before: $before; now: $after, its claim: $(classic_claim "$after")"
$K get events.events.k8s.io -A --field-selector reason=Reallocating -o jsonpath='{range .items[*]}{.note}{"\n"}{end}' | tail -1 | cut -c1-400
echo "classic-mig: uid $mig_uid before, $($K get pod classic-mig -o jsonpath='{.metadata.uid} {.status.phase}') now (its device kept its terms)"
$K delete deploy classic --wait=false >/dev/null
$K delete pod classic-mig --wait=true --timeout=30s >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
fi


# The agent under `--plugin dra --xid-heal-after 20s` on port $1 with profile `mig` (GPU 0 seven
# 1g.10gb, GPU 1 whole) applied.
healing_agent() {
dra_profiles \
  --from-literal=mig="$(printf 'version: v1\nrules:\n- devices: [0]\n  mig: {1g.10gb: 7}\n- devices: [1]\n  exclusive: true\n')"
agent "$1" --plugin dra --cdi-root "$W/cdi" --dra-plugin-dir "$W/dra" --xid-heal-after 20s \
  --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock
$K label node "$NODE" gpu-share.dev/profile=mig --overwrite >/dev/null
wait_state success 60; echo "state $(state): $(reason)"
}

if want 13; then
echo "== 13. a faulted MIG device tainted under the real scheduler, then healed"
healing_agent 19613
device_of() { # $1 pod -> its claim's device
  local c; c=$($K get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
  [ -n "$c" ] || c=$($K get pod "$1" -o jsonpath='{.spec.resourceClaims[0].resourceClaimName}')
  $K get resourceclaim "$c" -o jsonpath='{.status.allocation.devices.results[0].device}'
}
pod taint-first mig-1g-10gb
$K wait --for=condition=Ready pod/taint-first --timeout=60s >/dev/null
D=$(device_of taint-first); echo "first fit gave $D"
$K delete pod taint-first --wait=true --timeout=30s >/dev/null
read -r uuid gi ci < <(mig_ids "$D")
t0=$(date +%s.%N)
raise_xid 0 48 "$gi" "$ci"
taint_of() { $K get resourceslices -o json | python3 -c '
import json, sys
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"].get("devices", []):
        if d["name"] == sys.argv[1]: print(json.dumps(d.get("taints", [])))' "$1"; }
for _ in $(seq 1 40); do [ "$(taint_of "$D")" != "[]" ] && break; sleep 0.25; done
echo "XID 48 on $D ($uuid): published taints $(taint_of "$D") after $(echo "$(date +%s.%N) - $t0" | bc) s"
claim_pod() { # $1 name, $2 "tolerate" or "": ResourceClaim $1 asking for D by UUID, and pod $1
  local tol=""
  [ "$2" = tolerate ] && tol="
        tolerations: [{key: gpu.gpu-share.dev/xid, operator: Exists, effect: NoSchedule}]"
  cat <<YAML | $K apply -f - >/dev/null
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default}
spec:
  devices:
    requests:
    - name: mig
      exactly:
        deviceClassName: mig.gpu-share.dev
        selectors: [{cel: {expression: 'device.attributes["gpu.gpu-share.dev"].uuid == "$uuid"'}}]$tol
YAML
  pod "$1" "$1" claim
}
claim_pod wants-d ""
claim_pod tolerates-d tolerate
pod taint-next mig-1g-10gb
$K wait --for=condition=Ready pod/tolerates-d --timeout=60s >/dev/null && echo "tolerates-d Ready on $(device_of tolerates-d)"
$K wait --for=condition=Ready pod/taint-next --timeout=60s >/dev/null && echo "taint-next (plain 1g.10gb) Ready on $(device_of taint-next)"
$K delete pod tolerates-d --wait=true --timeout=30s >/dev/null; $K delete resourceclaim tolerates-d >/dev/null
sleep 2
echo "wants-d: $($K get pod wants-d -o jsonpath='{.status.phase}: {.status.conditions[?(@.type=="PodScheduled")].message}')"
for _ in $(seq 1 60); do [ "$(taint_of "$D")" = "[]" ] && break; sleep 1; done
echo "after $(echo "$(date +%s.%N) - $t0" | bc) s: taints on $D $(taint_of "$D")"
$K get events.events.k8s.io -A --field-selector reason=DeviceHealed -o jsonpath='{range .items[*]}{.type} {.reason}: {.note}{"\n"}{end}' | tail -1 | cut -c1-300
$K wait --for=condition=Ready pod/wants-d --timeout=90s >/dev/null && echo "wants-d Ready on $(device_of wants-d) after the heal"
$K delete pod wants-d taint-next --wait=true --timeout=30s >/dev/null; $K delete resourceclaim wants-d >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
fi

if want 14 && [ "$(gate DRADeviceTaints)" = false ]; then
echo "== 14. DRADeviceTaints off: a faulted MIG device withdrawn instead of tainted"
healing_agent 19614
sleep 1
names() { $K get resourceslices -o jsonpath='{.items[*].spec.devices[*].name}' | tr ' ' '\n' | sort; }
D=gpu-0-mig-0-1g-10gb
echo "devices published: $(names | wc -l), $D among them: $(names | grep -c "^$D$")"
read -r uuid gi ci < <(mig_ids "$D")
t0=$(date +%s.%N)
raise_xid 0 48 "$gi" "$ci"
for _ in $(seq 1 40); do names | grep -q "^$D$" || break; sleep 0.25; done
echo "XID 48 on $D: withdrawn after $(echo "$(date +%s.%N) - $t0" | bc) s; devices published: $(names | wc -l)"
echo "stored taints anywhere: $($K get resourceslices -o jsonpath='{.items[*].spec.devices[*].taints}')"
$K get events.events.k8s.io -A --field-selector reason=TaintsDropped -o jsonpath='{range .items[*]}{.type} {.reason}: {.note}{"\n"}{end}' | tail -1 | cut -c1-300
pod gate-off-next mig-1g-10gb
$K wait --for=condition=Ready pod/gate-off-next --timeout=60s >/dev/null
c=$($K get pod gate-off-next -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
echo "gate-off-next Ready on $($K get resourceclaim "$c" -o jsonpath='{.status.allocation.devices.results[0].device}')"
for _ in $(seq 1 60); do names | grep -q "^$D$" && break; sleep 1; done
echo "after $(echo "$(date +%s.%N) - $t0" | bc) s: $D published again: $(names | grep -c "^$D$")"
$K delete pod gate-off-next --wait=true --timeout=30s >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
elif want 14; then
echo "== 14. skipped: the test bed runs with DRADeviceTaints on (start it with FEATURE_GATES=DRADeviceTaints=false)"
fi

if want 9 && [ "$(gate_pd)" = false ]; then
echo "== 9. dynamic MIG on an API server that drops counters (DRAPartitionableDevices=false)"
dynamic_agent 19609; echo "state $(state): $(reason)"
sleep 2
slices_summary() {
  $K get resourceslices -o json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
devices = [d["name"] for s in items for d in s["spec"].get("devices", [])]
sets = [c for s in items for c in s["spec"].get("sharedCounters", [])]
gens = sorted({s["spec"]["pool"]["generation"] for s in items})
print(f"{len(items)} slices at generation(s) {gens}, devices {devices}, {len(sets)} counter sets")'
}
slices_summary
$K get events.events.k8s.io -A --field-selector reason=CountersDropped -o jsonpath='{range .items[*]}{.type} {.reason}: {.note}{"\n"}{end}'
grep -E "counters dropped|dropped the ResourceSlices" "$W/agent-19609.log" | cut -c1-200 | head -3
pod dyn-off-mig mig-1g-10gb
pod dyn-off-whole whole-gpu
$K wait --for=condition=Ready pod/dyn-off-whole --timeout=60s >/dev/null
sleep 3
for p in dyn-off-mig dyn-off-whole; do
  claim=$($K get pod $p -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
  echo "pod $p ($($K get pod $p -o jsonpath='{.status.phase}'); $($K get pod $p -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}' | cut -c1-160)): $($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')"
done
echo "NVML: $(nvml_instances)"
$K delete pod dyn-off-whole --wait=true --timeout=60s >/dev/null
$K label node "$NODE" gpu-share.dev/profile=static --overwrite >/dev/null
sleep 2; wait_state success 60; echo "static MIG: state $(state): $(reason)"
slices_summary
$K wait --for=condition=Ready pod/dyn-off-mig --timeout=60s >/dev/null
claim=$($K get pod dyn-off-mig -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
echo "pod dyn-off-mig ($($K get pod dyn-off-mig -o jsonpath='{.status.phase}')): $($K get resourceclaim "$claim" -o jsonpath='{.status.allocation.devices.results[0].device}')"
$K delete pod dyn-off-mig --wait=true --timeout=60s >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
elif want 9; then
echo "== 9. skipped: the test bed runs with DRAPartitionableDevices on (start it with DRA_PD=false)"
fi

# A ResourceClaim $1 asking the consumable device for memory $2 and compute $3, and pod $1.
share_pod() {
cat <<YAML | $K apply -f - >/dev/null
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $1, namespace: default}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: mps.gpu-share.dev
        capacity: {requests: {memory: "$2", compute: "$3"}}
YAML
pod "$1" "$1" claim
}
# Pod $1: phase, device, shareID, consumedCapacity, or the scheduler's reason.
share_status() {
  local phase dev
  phase=$($K get pod "$1" -o jsonpath='{.status.phase}')
  dev=$($K get resourceclaim "$1" -o jsonpath='{.status.allocation.devices.results[0].device} shareID={.status.allocation.devices.results[0].shareID} consumed={.status.allocation.devices.results[0].consumedCapacity}' 2>/dev/null)
  if [ "$phase" = Running ]; then echo "pod $1 Running: $dev"
  else echo "pod $1 $phase: $($K get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}' | cut -c1-220)"; fi
}
# The CUDA_MPS_* limits in claim $1's CDI spec.
share_limits() {
  local uid; uid=$($K get resourceclaim "$1" -o jsonpath='{.metadata.uid}')
  python3 - "$W/cdi/gpu.gpu-share.dev-claim_$uid.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
for d in spec["devices"]:
    env = [e for e in d["containerEdits"]["env"] if e.startswith(("CUDA_MPS_PINNED", "CUDA_MPS_ACTIVE"))]
    print("   ", d["name"].split("-", 5)[-1], " ".join(env))
PY
}
FRACTIONAL='version: v1
rules:
- devices: [0]
  mps:
    replicas: 16
    consumable: {memory: {default: 4Gi, min: 1Gi, step: 1Gi}, compute: {default: 10, min: 5, step: 5}}
- devices: [1]
  exclusive: true
'
fractional_agent() {
  dra_profiles --from-literal=fractional="$FRACTIONAL"
  agent "$1" --plugin dra --cdi-root "$W/cdi" --dra-plugin-dir "$W/dra" \
    --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock
  $K label node "$NODE" gpu-share.dev/profile=fractional --overwrite >/dev/null
  wait_state success 60; echo "state $(state): $(reason)"
}
stored_devices() { $K get resourceslices -o json | python3 -c '
import json, sys
devices = [d for s in json.load(sys.stdin)["items"] for d in s["spec"].get("devices", [])]
for d in devices[:4]:
    caps = {k: (v["value"], v.get("requestPolicy")) for k, v in d.get("capacity", {}).items()}
    print("   ", d["name"], "allowMultipleAllocations=%s" % d.get("allowMultipleAllocations"), caps)'; }

if want 15 && [ "$(gate DRAConsumableCapacity)" != false ]; then
echo "== 15. fractional GPUs: claims asking memory and compute of one consumable H100"
fractional_agent 19615
echo "stored devices:"; stored_devices
share_pod frac-a 30Gi 40
share_pod frac-b 20Gi 30
share_pod frac-off-step 9728Mi 12
for p in frac-a frac-b frac-off-step; do $K wait --for=condition=Ready pod/$p --timeout=60s >/dev/null; done
share_pod frac-c 40Gi 10
share_pod frac-d 10Gi 40
share_pod frac-too-big 100Gi 10
sleep 8
for p in frac-a frac-b frac-off-step frac-c frac-d frac-too-big; do share_status $p; done
echo "CDI limits of the running claims:"
for p in frac-a frac-b frac-off-step; do echo "  $p:"; share_limits $p; done
echo "commands the agent sent the MPS daemon: $(grep -rhao 'Cmd:[a-z_]*' "$W/mps" | sort | uniq -c | tr '\n' ' ')"
t0=$(date +%s.%N)
$K delete pod frac-a --wait=true --timeout=60s >/dev/null; $K delete resourceclaim frac-a >/dev/null
for _ in $(seq 1 60); do
  [ "$($K get pod frac-c -o jsonpath='{.status.phase}')" = Running ] && break
  [ "$($K get pod frac-d -o jsonpath='{.status.phase}')" = Running ] && break
  sleep 1
done
echo "frac-a deleted; $(echo "$(date +%s.%N) - $t0" | bc) s later:"
for p in frac-c frac-d frac-too-big; do share_status $p; done
for p in frac-c frac-d; do [ "$($K get pod $p -o jsonpath='{.status.phase}')" = Running ] && { echo "  $p:"; share_limits $p; }; done
echo "CDI specs left: $(ls "$W/cdi" | wc -l) (one per prepared claim)"
# A classic pod (`nvidia.com/gpu: 1`, served from DRA through the extended-resource class): the
# scheduler's own claim asks nothing, so it gets the policy's defaults.
$K apply -f "$ROOT/deploy/overlays/dra/extended-resource-classes.yaml" >/dev/null
gpu_workload frac-classic pod
c=$($K get pod frac-classic -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')
echo "classic pod frac-classic ($($K get pod frac-classic -o jsonpath='{.status.phase}')): $($K get resourceclaim "$c" -o jsonpath='{.status.allocation.devices.results[0].device} consumed={.status.allocation.devices.results[0].consumedCapacity}')"
$K delete pod frac-classic --wait=true --timeout=60s >/dev/null
$K delete -f "$ROOT/deploy/overlays/dra/extended-resource-classes.yaml" >/dev/null
$K delete pod frac-b frac-off-step frac-c frac-d frac-too-big --wait=true --timeout=60s >/dev/null
$K delete resourceclaim frac-b frac-off-step frac-c frac-d frac-too-big >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
elif want 15; then
echo "== 15. skipped: the test bed runs with DRAConsumableCapacity off"
fi

if want 16 && [ "$(gate DRAConsumableCapacity)" = false ]; then
echo "== 16. DRAConsumableCapacity off: a consumable GPU published as fixed MPS shares"
fractional_agent 19616
sleep 1
echo "devices published: $($K get resourceslices -o jsonpath='{.items[*].spec.devices[*].name}' | wc -w)"; stored_devices
$K get events.events.k8s.io -A --field-selector reason=ConsumableCapacityDropped -o jsonpath='{range .items[*]}{.type} {.reason}: {.note}{"\n"}{end}' | tail -1 | cut -c1-400
share_pod off-ask 10Gi 25
echo "claim off-ask as stored: $($K get resourceclaim off-ask -o jsonpath='{.spec.devices.requests[0].exactly}')"
$K wait --for=condition=Ready pod/off-ask --timeout=30s >/dev/null
share_status off-ask
[ "$($K get pod off-ask -o jsonpath='{.status.phase}')" = Running ] && share_limits off-ask
$K delete pod off-ask --wait=true --timeout=60s >/dev/null; $K delete resourceclaim off-ask >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
elif want 16; then
echo "== 16. skipped: the test bed runs with DRAConsumableCapacity on (start it with FEATURE_GATES=DRAConsumableCapacity=false)"
fi

if want 17 && [ "$(gate DRAConsumableCapacity)" != false ]; then
echo "== 17. fractional MIG devices: claims sharing 3g.40gb instances by memory and compute"
dra_profiles --from-literal=fractional-mig="$(printf 'version: v1\nrules:\n- devices: [0]\n  mig: {3g.40gb: 2}\n  mps:\n    replicas: 8\n    consumable: {memory: {default: 4Gi, min: 1Gi, step: 1Gi}, compute: {default: 10, min: 5, step: 5}}\n- devices: [1]\n  exclusive: true\n')"
agent 19617 --plugin dra --cdi-root "$W/cdi" --dra-plugin-dir "$W/dra" \
  --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock
$K label node "$NODE" gpu-share.dev/profile=fractional-mig --overwrite >/dev/null
wait_state success 90; echo "state $(state): $(reason)"
echo "stored devices:"; stored_devices
echo "NVML: $(nvml_instances)"
share_pod mig-a 20Gi 50
share_pod mig-b 12Gi 50
share_pod mig-c 10Gi 10
for p in mig-a mig-b mig-c; do $K wait --for=condition=Ready pod/$p --timeout=60s >/dev/null; done
for p in mig-a mig-b mig-c; do share_status $p; done
for p in mig-a mig-b mig-c; do
  [ "$($K get pod $p -o jsonpath='{.status.phase}')" = Running ] || continue
  uid=$($K get resourceclaim "$p" -o jsonpath='{.metadata.uid}')
  echo "  $p: $(python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["devices"][0]["containerEdits"]["env"]; print(" ".join(x for x in e if x.startswith(("NVIDIA_VISIBLE","CUDA_MPS"))))' "$W/cdi/gpu.gpu-share.dev-claim_$uid.json")"
done
$K delete pod mig-a mig-b mig-c --wait=true --timeout=60s >/dev/null
$K delete resourceclaim mig-a mig-b mig-c >/dev/null
$K label node "$NODE" gpu-share.dev/profile- >/dev/null
stop_agent
elif want 17; then
echo "== 17. skipped: the test bed runs with DRAConsumableCapacity off"
fi
