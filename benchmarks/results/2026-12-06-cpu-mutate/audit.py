"""Issue 52's fresh self-audit: 20 wrong changes, written after the property tests landed, to code
no branch touched this round (ctc, geometry, features, decoding, pipeline/plan, pipeline/filters,
pipeline/batch), each run against the non-slow tests of its module's own test file(s). Not part of
tests/mutate.py's list: a survivor here is a class to test, not a named case.

    python benchmarks/results/2026-12-06-cpu-mutate/audit.py [--out=table.md] [--only=a02,a04] [--also=tests/x.py]

--only: those changes alone; --also: one more test file for each (the re-runs after the survivors' tests).
"""

import dataclasses
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
from tests.mutate import Mutation, apply, copy_tree, run_tests  # noqa: E402

FAST = ("-m", "not slow")
# Each module's own test file(s) (one test file per module), their non-slow tests.
CTC = ("tests/test_ctc.py", *FAST)
FEAT = ("tests/test_features.py", *FAST)
PLAN = ("tests/test_plan.py", "tests/test_tfds_source.py", *FAST)
GEOM = ("tests/test_ctc.py", "tests/test_tfds_source.py", *FAST)

AUDIT = [
    Mutation("a01", "ds2_jax/ctc.py", "(label_lengths > 0) & (", "(", CTC, "an empty transcript counts as feasible"),
    Mutation(
        "a02",
        "ds2_jax/ctc.py",
        "jnp.where(ok, jnp.maximum(loss, 0.0), 0.0)",
        "jnp.where(ok, loss, 0.0)",
        CTC,
        "a feasible loss rounded below zero is not clipped",
    ),
    Mutation(
        "a03",
        "ds2_jax/ctc.py",
        "loss = loss / jnp.maximum(logit_lengths, 1).astype(jnp.float32)",
        "loss = loss / float(logits.shape[1])",
        CTC,
        "norm_by_times divides by the padded length",
    ),
    Mutation(
        "a04",
        "ds2_jax/geometry.py",
        "frames = _floor_div(num_samples - window, hop) + 1",
        "frames = _floor_div(num_samples - window, hop)",
        GEOM,
        "one analysis frame fewer than fit",
    ),
    Mutation(
        "a05",
        "ds2_jax/geometry.py",
        "return int(len(labels) + np.sum(labels[1:] == labels[:-1]))",
        "return int(len(labels))",
        GEOM,
        "the host's CTC minimum ignores repeated labels",
    ),
    Mutation(
        "a06",
        "ds2_jax/geometry.py",
        "repeats = (labels[:, 1:] == labels[:, :-1]) & valid",
        "repeats = labels[:, 1:] == labels[:, :-1]",
        GEOM,
        "the step's CTC minimum counts the padding's zeros as repeats",
    ),
    Mutation(
        "a07",
        "ds2_jax/features.py",
        ".at[0].set(1.0 / scale).at[-1].set(1.0 / scale)",
        "",
        FEAT,
        "the DC and Nyquist bins are scaled twice as the others",
    ),
    Mutation(
        "a08",
        "ds2_jax/features.py",
        "jax.lax.broadcasted_iota(jnp.int32, feats.shape[:2], 1) < jnp.expand_dims(lengths, 1)",
        "jax.lax.broadcasted_iota(jnp.int32, feats.shape[:2], 1) <= jnp.expand_dims(lengths, 1)",
        FEAT,
        "one padded frame past each utterance keeps its features",
    ),
    Mutation(
        "a09",
        "ds2_jax/features.py",
        "std = np.sqrt(np.maximum(total_sq / count - mean**2, 1e-10))",
        "std = np.sqrt(np.maximum(total_sq / count - mean, 1e-10))",
        FEAT,
        "the feature std from a wrong variance",
    ),
    Mutation(
        "a10",
        "ds2_jax/features.py",
        "jax.random.randint(keys[k], (b, 1), 0, freq_mask_width + 1)",
        "jax.random.randint(keys[k], (b, 1), 0, freq_mask_width)",
        FEAT,
        "a frequency mask never reaches its maximum width",
    ),
    Mutation(
        "a11",
        "ds2_jax/features.py",
        "* jnp.maximum(lengths[:, None] - width, 1)).astype(jnp.int32)",
        "* jnp.maximum(t - width, 1)).astype(jnp.int32)",
        FEAT,
        "time masks fall on the padding",
    ),
    Mutation(
        "a12",
        "ds2_jax/decoding.py",
        '" ".join(alphabet.decode(text.collapse(path, n)).split())',
        "alphabet.decode(text.collapse(path, n))",
        ("tests/test_decoding.py", *FAST),
        "greedy texts keep stray spaces (scored against single-spaced references)",
    ),
    Mutation(
        "a13",
        "ds2_jax/pipeline/filters.py",
        "keep = ~(short | long | idx.bad_text | infeasible)",
        "keep = ~(short | long | infeasible)",
        PLAN,
        "utterances with characters outside the alphabet are kept",
    ),
    Mutation(
        "a14",
        "ds2_jax/pipeline/plan.py",
        'order = np.argsort(num_samples, kind="stable")',
        'order = np.argsort(label_lengths, kind="stable")',
        PLAN,
        "buckets by transcript length, not duration",
    ),
    Mutation(
        "a15",
        "ds2_jax/pipeline/plan.py",
        "return -(-int(x) // multiple) * multiple",
        "return int(x) // multiple * multiple",
        PLAN,
        "bucket shapes rounded down: the longest utterance does not fit",
    ),
    Mutation(
        "a16",
        "ds2_jax/pipeline/plan.py",
        "    if epoch == 0:  # the longest shape first",
        "    if epoch == 0 and not ascending:  # the longest shape first",
        PLAN,
        "with SortaGrad the longest batch comes last, not first (an OOM hours in)",
    ),
    Mutation(
        "a17",
        "ds2_jax/pipeline/plan.py",
        "shapes.append((max(extra[0], shapes[-1][0]), max(extra[1], shapes[-1][1])))",
        "shapes.append(extra)",
        PLAN,
        "the extra eval shape can be narrower than the largest bucket in one dimension",
    ),
    Mutation(
        "a18",
        "ds2_jax/geometry.py",
        "return [FIRST_CONV] + [LATER_CONV] * (num_conv_layers - 1)",
        "return [FIRST_CONV] * num_conv_layers",
        GEOM,
        "every conv layer strides in time as the first",
    ),
    Mutation(
        "a19",
        "ds2_jax/pipeline/batch.py",
        '        out["weights"][i] = 1.0\n',
        "",
        PLAN,
        "every row of a batch has weight 0 (real utterances count as padding)",
    ),
    Mutation(
        "a20",
        "ds2_jax/pipeline/plan.py",
        "    return sum(len(m) // global_batch for m in self.members)",
        "    return -(-sum(len(m) for m in self.members) // global_batch)",
        PLAN,
        "steps per epoch counts the bucket remainders as steps",
    ),
]


def main() -> int:
    flag = lambda name: next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith(f"--{name}=")), None)  # noqa: E731
    out, only, also = flag("out"), flag("only"), flag("also")
    chosen = [m for m in AUDIT if not only or m.name in only.split(",")]
    if also:
        chosen = [dataclasses.replace(m, tests=(also, *m.tests)) for m in chosen]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ds2_audit_") as copy:
        copy_tree(copy)
        for m in chosen:
            start = time.perf_counter()
            original = apply(copy, m)
            if original is None:
                rows.append((m, "not applied", ""))
                print(m.name, "not applied", flush=True)
                continue
            try:
                rc, last = run_tests(copy, m.tests, 900)
            finally:
                with open(os.path.join(copy, m.path), "w") as f:
                    f.write(original)
            result = {0: "SURVIVED", 1: "killed", 2: "killed (import)"}.get(rc, f"error (rc {rc})")
            rows.append((m, result, last))
            print(f"{m.name} {result:10} {time.perf_counter() - start:5.0f} s  {m.path}: {m.why} | {last}", flush=True)
    killed = sum(r.startswith("killed") for _, r, _ in rows)
    table = [
        f"{killed} of {len(rows)} killed",
        "",
        "| # | file | wrong version | result | last line |",
        "|---|---|---|---|---|",
    ]
    table += [f"| {m.name} | {m.path} | {m.why} | {r} | {last} |" for m, r, last in rows]
    print("\n".join(table))
    if out:
        with open(out, "w") as f:
            f.write("\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
