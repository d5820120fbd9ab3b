"""Merges per-seed precision.json files (one `benchmarks.precision --seeds=S` process per seed, the
run*.sh scripts of this folder) into one precision.json, NOTES.md and precision.png in OUT, with
benchmarks.precision's own summary and tables. Files of the same seed are joined (run6 adds a run to
run5's seeds); the reference is the first run found.

    python benchmarks/results/2026-12-05-h200-bf16-converge/merge.py OUT "COMMAND" FILE [FILE ...]
"""

import json
import os
import sys

from benchmarks import precision

out, command, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
parts = [json.load(open(p)) for p in paths]
results = [r for p in parts for r in p["runs"]]
runs = list(dict.fromkeys((r["dtype"], r["rnn_impl"]) for r in results))
meta = dict(parts[0]["meta"], seeds=sorted({r["seed"] for r in results}), command=command)
rows = precision.summary(results, runs)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "precision.json"), "w") as f:
    json.dump({"meta": meta, "runs": results, "summary": rows}, f, indent=1)
precision.plot(results, os.path.join(out, "precision.png"))
with open(os.path.join(out, "NOTES.md"), "w") as f:
    f.write(precision.notes(results, rows, meta))
print(precision.notes(results, rows, meta))
