"""Merges the per-seed precision.json files of run2.sh into one precision.json, NOTES.md and plot,
with benchmarks.precision's own summary and tables.

    python benchmarks/results/2026-12-05-h200-bf16-converge/merge.py DIR   (DIR holds converge-s<S>/)
"""

import glob
import json
import os
import sys

from benchmarks import precision

out = sys.argv[1]
parts = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(out, "converge-s*", "precision.json")))]
results = [r for p in parts for r in p["runs"]]
runs = list(dict.fromkeys((r["dtype"], r["rnn_impl"]) for r in results))
meta = dict(parts[0]["meta"], seeds=sorted(r["seed"] for r in results if (r["dtype"], r["rnn_impl"]) == runs[0]),
            command="run2.sh: one `python -m benchmarks.precision --seeds=S` per seed S, at once on the one GPU; "
                    "then merge.py")
rows = precision.summary(results, runs)
with open(os.path.join(out, "precision.json"), "w") as f:
    json.dump({"meta": meta, "runs": results, "summary": rows}, f, indent=1)
precision.plot(results, os.path.join(out, "precision.png"))
with open(os.path.join(out, "NOTES.md"), "w") as f:
    f.write(precision.notes(results, rows, meta))
print(precision.notes(results, rows, meta))
