"""Fine-tuning: a new run's first state taken from another workdir's checkpoint (config.init_from).

    python launch.py --config=configs/demo.py --workdir=W2 --config.init_from=W1[:STEP] \\
        [--config.freeze=ConvBlock]

The source's parameters, batch-norm statistics and feature normalization (per-bin mean/std of
its spectrogram) start the run; the step is 0 and the optimizer fresh (this run's settings).
The output layer (config.init_output): by default the source's whole layer where both alphabets
are the same, initialized afresh where they differ (another language: over 6 seeds on the bundled
Spanish corpus this beat mapping by symbol, benchmarks/results/2026-12-06-gpu-recipe). 'by_symbol'
maps it (`output_columns`): the blank's and each symbol both alphabets share keep the source's
unit, wherever it stands in this run's alphabet; a symbol the source lacks keeps this run's fresh
initialization; the log says how many of each (an alphabet of the same size but other symbols, or
the same in another order, is never taken unit by unit).
Any other difference of parameter shapes, or a spectrogram of another sample rate, window or
hop, is refused naming them. Used only while the
run's workdir has no checkpoint of its own (train._initial_or_restored): a rerun resumes those.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np

from ds2_jax import checkpoint, layout, settings, text, workdir_config
from ds2_jax.state import TrainState, copy_tree, restore_state

log = logging.getLogger("ds2_jax")
OUTPUT_LAYER = "output"  # model.DeepSpeech2's last Dense: its width is the alphabet's
SPECTROGRAM_KEYS = ("sample_rate", "window_ms", "hop_ms")  # what the source's features mean


def parse(init_from: str) -> tuple[str, int | None]:
    """'W' -> (W, None: the newest checkpoint); 'W:1200' -> (W, 1200)."""
    workdir, sep, step = init_from.rpartition(":")
    if sep and step.isdigit() and workdir:
        return workdir, int(step)
    return init_from, None


def source_config(init_from: str) -> tuple[str, int | None, settings.Settings]:
    """(workdir, step or None, its Settings) of config.init_from; a ValueError or FileNotFoundError
    naming init_from when it is no trained workdir."""
    workdir, step = parse(init_from)
    if not os.path.isdir(workdir):
        raise FileNotFoundError(f"init_from={init_from!r}: no such directory {workdir}")
    steps = checkpoint.manager(workdir).all_steps() if os.path.isdir(os.path.join(workdir, layout.CHECKPOINTS)) else []
    if not steps:
        raise FileNotFoundError(
            f"init_from={init_from!r}: {workdir} has no checkpoint (no "
            f"{os.path.join(workdir, layout.CHECKPOINTS)}/<step>); train it first, or name a workdir "
            "that has one"
        )
    if step is not None and step not in steps:
        raise FileNotFoundError(
            f"init_from={init_from!r}: {workdir} has no checkpoint at step {step} (it has {sorted(steps)})"
        )
    try:
        trained = workdir_config.load_config(workdir)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"init_from={init_from!r}: {e}") from e
    return workdir, step, trained


def check_features(init_from: str, trained: settings.Settings, config: settings.Settings) -> None:
    """A ValueError naming every spectrogram setting (sample rate, window, hop) that differs: the
    source's feature normalization and conv front end mean nothing for another spectrogram."""
    diff = [
        (k, getattr(trained.features, k), getattr(config.features, k))
        for k in SPECTROGRAM_KEYS
        if getattr(trained.features, k) != getattr(config.features, k)
    ]
    if diff:
        shown = ", ".join(f"features.{k} ({init_from}: {a!r}, this run: {b!r})" for k, a, b in diff)
        raise ValueError(
            f"init_from={init_from!r} was trained on another spectrogram: {shown}; a fine-tune keeps the "
            "source's features: set those to the source's values (its config.json)"
        )


def check_source(config: settings.Settings) -> None:
    """config.init_from names a trained workdir (and step) of this run's spectrogram; else the
    error naming what is wrong (train checks it before building data or compiling)."""
    _, _, trained = source_config(config.init_from)
    check_features(config.init_from, trained, config)


def _shapes(tree) -> dict[str, tuple]:
    return {
        jax.tree_util.keystr(k, simple=True, separator="/"): tuple(np.shape(v))
        for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def output_columns(source_symbols: str, symbols: str) -> np.ndarray:
    """<int>[len(symbols) + 1]: for each output unit of this run (0 the blank, i + 1 symbol i), the
    source's unit of the same symbol, or -1 where the source has none."""
    where = {c: i + 1 for i, c in enumerate(source_symbols)}
    return np.array([0] + [where.get(c, -1) for c in symbols])


def _map_output(fresh_leaf, source_leaf, columns: np.ndarray):
    """The fresh output-layer leaf (<f32>[..., V + 1]) with the source's units moved to `columns`' places."""
    out = np.array(fresh_leaf)
    kept = columns >= 0
    out[..., kept] = np.asarray(source_leaf)[..., columns[kept]]
    return jax.numpy.asarray(out, dtype=fresh_leaf.dtype)


def merge(
    source: TrainState,
    fresh: TrainState,
    init_from: str,
    alphabets: tuple[str, str] | None = None,
    fresh_output: bool = False,
) -> tuple[TrainState, list[str]]:
    """`fresh` (this run's initial state, step 0) with `source`'s parameters, batch-norm statistics
    and feature statistics. The output layer: with fresh_output, `fresh`'s; else with `alphabets`
    (the source's symbols, this run's), mapped by symbol (output_columns); without, kept fresh where
    its shape differs. Returns the state and the output-layer parameter paths not taken whole from
    the source; any other difference is a ValueError naming the layers."""
    src, new = (
        _shapes({"params": source.params, "batch_stats": source.batch_stats}),
        _shapes({"params": fresh.params, "batch_stats": fresh.batch_stats}),
    )
    differing = sorted(p for p in set(src) | set(new) if src.get(p) != new.get(p))
    reinit = [p for p in differing if p.split("/")[1] == OUTPUT_LAYER]
    refused = [p for p in differing if p not in reinit]
    columns = None
    if fresh_output or (alphabets is not None and alphabets[0] != alphabets[1]):
        reinit = sorted(p for p in new if p.split("/")[1] == OUTPUT_LAYER)
        columns = None if fresh_output else output_columns(*alphabets)
    if refused:
        # the parameters (the batch-norm statistics beside them follow their shapes)
        named = [p for p in refused if p.startswith("params/")] or refused
        shown = "; ".join(
            f"{p.partition('/')[2]} (source {src.get(p, 'absent')}, this run {new.get(p, 'absent')})" for p in named[:8]
        )
        more = f" and {len(named) - 8} more" if len(named) > 8 else ""
        raise ValueError(
            f"init_from={init_from!r}: the model differs beyond the output layer: {shown}{more}. Only "
            "the output layer may change size (another alphabet); use the source's model settings "
            "(its config.json)"
        )

    def take(path_prefix: str, fresh_tree, source_tree):
        def pick(k, f):
            path = path_prefix + jax.tree_util.keystr(k, simple=True, separator="/")
            if path not in reinit:
                return _at(source_tree, k)
            return f if columns is None else _map_output(f, _at(source_tree, k), columns)

        return jax.tree_util.tree_map_with_path(pick, fresh_tree)

    params = take("params/", fresh.params, source.params)
    state = fresh.replace(
        params=params,
        batch_stats=take("batch_stats/", fresh.batch_stats, source.batch_stats),
        feature_mean=source.feature_mean,
        feature_std=source.feature_std,
        opt_state=fresh.tx.init(params),
        ema_params=None if fresh.ema_params is None else copy_tree(params),
    )
    return state, reinit


def _at(tree, keys):
    for k in keys:
        tree = tree[k.key]
    return tree


def output_afresh(init_output: str, alphabets: tuple[str, str]) -> bool:
    """Whether a fine-tune's output layer starts afresh (config.init_output; alphabets: the
    source's symbols, this run's)."""
    return init_output == "fresh" or (init_output == "auto" and alphabets[0] != alphabets[1])


def initial_state(config: settings.Settings, fresh: TrainState) -> tuple[TrainState, str]:
    """(this run's first state from config.init_from, init_from resolved as 'ABS_WORKDIR:STEP',
    what config.json records); logs what was taken and what was re-initialized."""
    workdir, step, trained = source_config(config.init_from)
    check_features(config.init_from, trained, config)
    source, step = restore_state(trained, workdir, step)
    symbols = (
        text.Alphabet.of_setting(trained.model.alphabet).symbols,
        text.Alphabet.of_setting(config.model.alphabet).symbols,
    )
    differ = symbols[0] != symbols[1]
    fresh_output = output_afresh(config.init_output, symbols)
    state, reinit = merge(source, fresh, config.init_from, symbols, fresh_output)
    resolved = f"{os.path.abspath(workdir)}:{step}"
    log.info(
        "fine-tuning from %s: parameters, batch-norm statistics and feature normalization of step %d; step 0, "
        "a fresh optimizer",
        resolved,
        step,
    )
    if fresh_output:
        log.warning(
            "init_from: the output layer is initialized afresh (init_output=%r; this run's alphabet %s the "
            "source's; init_output='by_symbol' keeps the units of the symbols both share)",
            config.init_output,
            "differs from" if differ else "is",
        )
    elif differ:
        columns = output_columns(*symbols)
        kept = [c for c, j in zip(symbols[1], columns[1:]) if j >= 0]
        afresh = [c for c, j in zip(symbols[1], columns[1:]) if j < 0]
        dropped = [c for c in symbols[0] if c not in symbols[1]]
        log.warning(
            "init_from: this run's alphabet differs from the source's: the output layer is mapped by symbol: "
            "%d units kept (the blank and %d shared symbols%s), %d initialized afresh (%s), %d of the source's "
            "symbols dropped (%s)",
            len(kept) + 1,
            len(kept),
            "" if kept == [c for c in symbols[0] if c in kept] else ", moved to this run's order",
            len(afresh),
            "".join(afresh) or "none",
            len(dropped),
            "".join(dropped) or "none",
        )
    elif reinit:
        src, new = _shapes(source.params), _shapes(fresh.params)
        log.warning(
            "init_from: the output layer differs in size (another alphabet?): %s re-initialized",
            ", ".join(
                f"{p.partition('/')[2]} {src.get(p.partition('/')[2], 'absent')} -> "
                f"{new.get(p.partition('/')[2], 'absent')}"
                for p in reinit
                if p.startswith("params/")
            ),
        )
    return state, resolved
