"""A run's curves as one PNG, from its metrics.jsonl: for those who would rather look than read.

    python -m ds2_jax.plot --workdir=W [--out=W/curves.png]

Panels: training (and eval) loss, gradient norm, eval WER/CER, and the input wait when the
rows have `input_wait_s`; a panel whose keys no row has is left out. TensorBoard
(W/tensorboard) shows the same scalars live.
"""

from __future__ import annotations

import os
import sys

from ds2_jax import files, layout, metrics

# (panel title, y label, [(metrics.jsonl key, legend label)], log-scale y)
PANELS = [
    ("loss", "CTC loss", [("loss", "train"), ("eval_loss", "eval")], True),
    ("gradient norm", "global norm", [("grad_norm", "train")], True),
    ("error rates (eval, greedy)", "rate", [("eval_wer", "WER"), ("eval_cer", "CER")], False),
    ("input wait", "s the devices waited, per log interval", [("input_wait_s", "input wait")], False),
]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that have a value of `key` (null: none, e.g. an interval of skipped steps),
    in step order."""
    points = sorted((r["step"], r[key]) for r in rows if r.get(key) is not None)
    return [s for s, _ in points], [v for _, v in points]


def draw(rows: list[dict], title: str = ""):
    """A matplotlib Figure with one panel per PANELS entry that has data."""
    from matplotlib.figure import Figure

    panels = [p for p in PANELS if any(series(rows, k)[0] for k, _ in p[2])]
    if not panels:
        raise ValueError(
            f"no curves to draw: the rows have none of the keys {sorted(k for p in PANELS for k, _ in p[2])}"
        )
    cols = 2 if len(panels) > 1 else 1
    nrows = -(-len(panels) // cols)
    fig = Figure(figsize=(6 * cols, 3.6 * nrows), layout="constrained")
    for i, (name, ylabel, keys, log_y) in enumerate(panels):
        ax = fig.add_subplot(nrows, cols, i + 1)
        for key, label in keys:
            steps, values = series(rows, key)
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=label)
        if log_y and all(v > 0 for k, _ in keys for v in series(rows, k)[1]):
            ax.set_yscale("log")
        ax.set(title=name, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    return fig


def plot_workdir(workdir: str, out: str = "") -> str:
    """Draws workdir/metrics.jsonl to `out` (default workdir/curves.png); returns the path."""
    path = os.path.join(workdir, layout.METRICS)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: is {workdir} a ds2_jax training workdir?")
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("plotting needs matplotlib: pip install -e '.[plot]'") from e
    out = out or os.path.join(workdir, layout.CURVES)
    fig = draw(metrics.read_jsonl(path), title=os.path.basename(os.path.normpath(workdir)))
    with files.replacing(out, "wb") as f:  # a kill mid-draw leaves the old picture, not half of one
        fig.savefig(f, dpi=110, format=os.path.splitext(out)[1][1:] or "png")
    return out


def define_flags(fv) -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "A training workdir (metrics.jsonl).", required=True, flag_values=fv)
    flags.DEFINE_string("out", "", "PNG path (default: WORKDIR/curves.png).", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    from ds2_jax import cli

    args, _ = cli.parse_args(argv, define_flags, __doc__)
    print(plot_workdir(args.workdir, args.out))
    return 0


if __name__ == "__main__":
    from ds2_jax import errors

    sys.exit(errors.run_explained(main, None, errors.traceback_wanted()))
