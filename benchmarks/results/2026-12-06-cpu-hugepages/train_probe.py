"""The demo model's training as conftest's `trained` fixture does it (STEPS steps of 16), timed, with
its process's threads' CPU ticks by name (user, system, count) at the end. From the repository root:

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 /usr/bin/time -f "wall %e user %U sys %S minflt %R" \
        python benchmarks/results/2026-12-06-cpu-hugepages/train_probe.py 60

PROBE_XLA replaces XLA_FLAGS (e.g. --xla_force_host_platform_device_count=1); PROBE_OVERRIDES adds
settings (JSON: {"model.scan_unroll": 4})."""

import collections
import json
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
from tests.conftest import _train_demo  # noqa: E402

os.environ["XLA_FLAGS"] = os.environ.get("PROBE_XLA", os.environ["XLA_FLAGS"])
root = pathlib.Path(tempfile.mkdtemp())
start = time.time()
_train_demo(root, root / "tfds", int(sys.argv[1]), **json.loads(os.environ.get("PROBE_OVERRIDES", "{}")))
print("train s", time.time() - start)
ticks = collections.defaultdict(lambda: [0, 0, 0])
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        name = f.read().strip()
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks[name][0] += int(fields[11])
    ticks[name][1] += int(fields[12])
    ticks[name][2] += 1
for name, (user, system, count) in sorted(ticks.items(), key=lambda kv: -kv[1][1])[:6]:
    print("threads", name, user, system, count)
