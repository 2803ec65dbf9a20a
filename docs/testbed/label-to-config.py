#!/usr/bin/env python3
"""Label change -> device-plugin config written: gpu-share's agent against NVIDIA's
config-manager, on the same real API server (the test bed's), alternating, N samples each.

Both run as host processes watching the test bed's one Node. For each sample the harness sets
a label over HTTP (through `kubectl proxy`, the same hop for both) and waits, on inotify, for
the config file to hold the new content:
  - gpu-share: label gpu-share.dev/profile=ts-4|ts-8 (profiles in the gpu-share-profiles
    ConfigMap); the agent writes GPU_SHARE_PLUGIN_CONFIG.
  - config-manager: label nvidia.com/device-plugin.config=ts-4|ts-8; it points
    --config-file-dst at <srcdir>/<label value> (remove + symlink), as it does in the GPU
    Operator (its srcdir is the mounted ConfigMap there; here a directory with the same files
    gpu-share writes).
The order alternates each round (A then B, B then A), so a slow phase of the machine falls on
both. Prints p50/p90/p99 of each and the ratio at p50. Run by docs/testbed/label-to-config.sh.
"""
import ctypes
import json
import os
import select
import statistics
import struct
import sys
import time
import urllib.request

PROXY = os.environ.get("PROXY", "http://127.0.0.1:18001")
NODE = os.environ["NODE"]
SAMPLES = int(os.environ.get("SAMPLES", "200"))
GS_CONFIG = os.environ["GS_CONFIG"]
CM_DST = os.environ["CM_DST"]
CM_SRC = os.environ["CM_SRC"]
SETTLE = float(os.environ.get("SETTLE", "0.3"))

libc = ctypes.CDLL("libc.so.6", use_errno=True)
IN_CREATE, IN_MOVED_TO, IN_CLOSE_WRITE = 0x100, 0x80, 0x8


def patch_label(key, value):
    body = json.dumps({"metadata": {"labels": {key: value}}}).encode()
    req = urllib.request.Request(
        f"{PROXY}/api/v1/nodes/{NODE}",
        data=body,
        method="PATCH",
        headers={"Content-Type": "application/merge-patch+json"},
    )
    urllib.request.urlopen(req).read()


def content(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def timed_change(key, value, path, want):
    """Seconds from just before the label PATCH until `path` holds `want`."""
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    libc.inotify_add_watch(fd, os.path.dirname(path).encode(), IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE)
    try:
        t0 = time.perf_counter()
        patch_label(key, value)
        deadline = t0 + 30
        while content(path) != want:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"{path} never held the {value} config")
            select.select([fd], [], [], min(left, 0.05))
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                pass
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def figures(samples):
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000
    return pick(0.5), pick(0.9), pick(0.99)


def main():
    want = {v: open(os.path.join(CM_SRC, v), "rb").read() for v in ("ts-4", "ts-8")}
    systems = {
        "gpu-share": ("gpu-share.dev/profile", GS_CONFIG),
        "config-manager": ("nvidia.com/device-plugin.config", CM_DST),
    }
    times = {name: [] for name in systems}
    # Both start at ts-4, seen and written, before the clock runs.
    for name, (key, path) in systems.items():
        timed_change(key, "ts-4", path, want["ts-4"])
    time.sleep(SETTLE)
    value = "ts-4"
    for i in range(SAMPLES):
        value = "ts-8" if value == "ts-4" else "ts-4"
        order = list(systems) if i % 2 == 0 else list(reversed(systems))
        for name in order:
            key, path = systems[name]
            times[name].append(timed_change(key, value, path, want[value]))
            # Let the writer finish its pass (success/failed published) before the next change.
            time.sleep(SETTLE)
    for name in systems:
        p50, p90, p99 = figures(times[name])
        print(f"{name}: {len(times[name])} samples, p50 {p50:.2f} ms, p90 {p90:.2f} ms, p99 {p99:.2f} ms, "
              f"mean {statistics.mean(times[name]) * 1000:.2f} ms")
    ratio = figures(times["gpu-share"])[0] / figures(times["config-manager"])[0]
    print(f"gpu-share / config-manager at p50: {ratio:.2f}x")
    json.dump(times, open(os.environ.get("OUT", "/tmp/label-to-config.json"), "w"))


if __name__ == "__main__":
    main()
